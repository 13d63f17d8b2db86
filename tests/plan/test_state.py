"""The partition state document: typed entries, written once per batch, pruned to the live segments."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.s3.conftest import BUCKET, PREFIX, TOPIC, check_consistent, context, plan_for, seed
from tiering.documents import read, to_builtins, write
from tiering.errors import ConfigError
from tiering.kafka.files import SEGMENT_SUFFIXES
from tiering.lifecycle.state import (
    PRUNE_MARGIN,
    Outcome,
    PartitionState,
    Pruning,
    SegmentState,
    load_state,
    record_segments,
)
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.layout import segment_key, state_key
from tiering.storage.memory import MemoryStore

DIR = f"{TOPIC}-0"
LISTED = datetime(2026, 1, 1, 12, tzinfo=UTC)


def at(delta: timedelta) -> str:
    return (LISTED + delta).isoformat()


class CountingStore(MemoryStore):
    """A memory store that notes the key of every JSON document it writes."""

    def __init__(self) -> None:
        super().__init__(BUCKET)
        self.json_writes: list[str] = []

    def put_json(self, key: str, doc: object, **kwargs: Any) -> str:
        self.json_writes.append(key)
        return super().put_json(key, doc, **kwargs)


def test_a_document_of_the_earlier_untyped_writer_reads_back_the_same() -> None:
    doc = {"schema_version": 1, "segments": {
        "0": {"codec": "zstd", "level": None, "run_id": "r1", "log_etag": '"l"', "index_etag": '"i"',
              "timeindex_etag": '"t"', "source_log_etag": '"s"', "bytes_before": 10, "bytes_after": 4,
              "payload_xxh3": "ab"},
        "7": {"outcome": "no-savings", "codec": "lz4", "level": 3, "log_etag": '"m"', "run_id": "r2",
              "reason": "no savings"}}}
    state = read(doc, PartitionState, what="a partition state document", where="here")
    assert state.segments[0].compacted
    assert state.segments[0].bytes_after == 4
    assert state.segments[0].level is None
    assert state.segments[7].outcome is Outcome.NO_SAVINGS
    assert state.segments[7].level == 3
    assert not state.segments[7].compacted
    again = to_builtins(state)
    assert again["kind"] == "tiering.partition-state"
    assert "level" not in again["segments"]["0"]  # a field at its default is left out
    assert read(again, PartitionState, what="a partition state document") == state
    assert read(write(state), PartitionState, what="a partition state document") == state


@pytest.mark.parametrize("doc", [{"schema_version": 2, "segments": {}}, [], {"schema_version": 1, "segments": {
    "x": {"log_etag": "a", "run_id": "r"}}}, {"schema_version": 1, "segments": {"0": {"run_id": "r"}}}])
def test_an_unreadable_document_is_named(doc: Any) -> None:
    with pytest.raises(ConfigError) as e:
        read(doc, PartitionState, what="a partition state document", where="s3://b/state.json")
    assert e.value.path == "s3://b/state.json"


def test_pruning_drops_retention_s_segments_and_entries_older_than_the_listing() -> None:
    old = SegmentState('"a"', "r", recorded_at=at(-PRUNE_MARGIN - timedelta(seconds=1)))
    recent = SegmentState('"a"', "r", recorded_at=at(-PRUNE_MARGIN + timedelta(seconds=1)))
    unknown = SegmentState('"a"', "r")
    listing = Pruning(frozenset({100, 200, 300}), LISTED)
    assert [listing.drops(b, unknown) for b in (50, 100, 200)] == [True, False, False]  # below the lowest: gone
    assert (listing.drops(150, old), listing.drops(150, recent), listing.drops(150, unknown)) == (True, False, False)
    assert listing.drops(400, old)
    assert not listing.drops(400, recent)
    inventory = Pruning(frozenset({100, 200}), None)  # a snapshot older than the scan: retention only
    assert (inventory.drops(50, recent), inventory.drops(150, old)) == (True, False)


def test_one_write_sets_many_entries_and_prunes_what_is_gone() -> None:
    mem = MemoryStore(BUCKET)
    record_segments(mem, PREFIX, DIR, {b: SegmentState(f'"{b}"', "r1", recorded_at=at(-timedelta(days=1)))
                                       for b in (0, 10, 20, 30)})
    record_segments(mem, PREFIX, DIR, {40: SegmentState('"40"', "r2"), 20: None},
                    Pruning(frozenset({10, 30, 40}), LISTED))
    assert sorted(load_state(mem, PREFIX, DIR).segments) == [10, 30, 40]
    etag = mem.head(state_key(PREFIX, DIR)).etag
    record_segments(mem, PREFIX, DIR, {40: SegmentState('"40"', "r2", recorded_at=at(timedelta()))})
    assert mem.head(state_key(PREFIX, DIR)).etag == etag  # equal but for its time: not written again


def test_a_run_writes_a_partition_s_state_once_and_forgets_journals_only_after() -> None:
    mem = CountingStore()
    originals = seed(mem, segments=6)
    run = compact(mem, plan_for(mem), context(mem), CompactOptions())
    assert run.totals()["compacted"] == 5
    assert mem.json_writes.count(state_key(PREFIX, DIR)) == 1
    state = load_state(mem, PREFIX, DIR)
    assert sorted(state.segments) == sorted(originals)[:-1]
    assert all(e.recorded_at is not None for e in state.segments.values())
    check_consistent(mem, originals)


def test_a_later_run_drops_the_entries_of_segments_retention_deleted() -> None:
    mem = MemoryStore(BUCKET)
    bases = sorted(seed(mem, segments=5))
    first = compact(mem, plan_for(mem), context(mem), CompactOptions(max_segments=2))
    compacted = sorted(r.base_offset for r in first.segments if r.status == "compacted")
    assert sorted(load_state(mem, PREFIX, DIR).segments) == compacted
    gone = [b for b in bases if b <= compacted[0]]  # Kafka's retention deletes the oldest segments
    for base in gone:
        for suffix in SEGMENT_SUFFIXES:
            mem.delete(segment_key(PREFIX, TOPIC, 0, base, suffix), missing_ok=True)
    todo = [b for b in bases[:-1] if b not in gone and b not in compacted]
    assert todo  # the second run writes the state (and so prunes it)
    second = compact(mem, plan_for(mem), context(mem, "run-2"), CompactOptions())
    assert sorted(r.base_offset for r in second.segments if r.status == "compacted") == todo
    assert sorted(load_state(mem, PREFIX, DIR).segments) == sorted(set(compacted + todo) - set(gone))


class FailingStateWrites(MemoryStore):
    """A memory store whose writes of the partition state fail (S3 answering 503) while ``failing``."""

    def __init__(self) -> None:
        super().__init__(BUCKET)
        self.failing = True

    def put_json(self, key: str, doc: object, **kwargs: Any) -> str:
        if self.failing and key == state_key(PREFIX, DIR):
            from tiering.storage.objects import TransportError

            raise TransportError("PutObject: S3 at memory did not answer in time; retryable", path=key)
        return super().put_json(key, doc, **kwargs)


def test_segments_whose_state_write_failed_are_left_in_flight_not_reported_done() -> None:
    from tiering.errors import ExitCode
    from tiering.lifecycle.vocabulary import Pending
    from tiering.run.segment import pending_bases

    mem = FailingStateWrites()
    originals = seed(mem, segments=4)
    sealed = sorted(originals)[:-1]
    first = compact(mem, plan_for(mem), context(mem), CompactOptions())
    assert [(r.status, r.pending) for r in first.segments] == [("failed", Pending.TRANSIENT)] * 3
    assert first.exit_code() == ExitCode.RETRY  # not 0: the work is not recorded
    assert first.totals()["bytes_before"] == 0  # nothing counted as saved by this run
    assert sorted(pending_bases(mem, PREFIX)[DIR]) == sealed  # the journals stay
    check_consistent(mem, originals)  # the swaps themselves are whole
    mem.failing = False
    second = compact(mem, plan_for(mem), context(mem, "run-2"), CompactOptions())
    assert sorted(r.base_offset for r in second.segments if r.status == "compacted") == sealed
    assert all(r.recovered for r in second.segments if r.status == "compacted")
    assert pending_bases(mem, PREFIX) == {}
    assert sorted(load_state(mem, PREFIX, DIR).segments) == sealed


def test_a_scan_counts_every_generation_in_a_lineage_once_by_its_run() -> None:
    """A compaction (run C) of a merged segment (run B) whose sources were a compacted segment (run A) and an
    original: the tally has one generation of each run, at the storage class of the .log in place, and a
    remembered outcome below is no generation. Another segment's entry of run A counts at its own class."""
    from tiering.lifecycle.state import Replaced
    from tiering.plan.scan import CommittedTally
    from tiering.storage.objects import ObjectInfo

    a = SegmentState("etag-a", "run-A", "zstd", bytes_before=1000, bytes_after=400, recorded_at="2026-01-01T00:00:00")
    kept = SegmentState("etag-o", "run-X", "zstd", outcome=Outcome.NO_SAVINGS)
    b = SegmentState("etag-b", "run-B", bytes_before=900, bytes_after=900, merged_from=(0, 10),
                     recorded_at="2026-01-02T00:00:00",
                     replaced=(Replaced(0, 400, "etag-a", a), Replaced(10, 500, "etag-o", kept)))
    c = SegmentState("etag-c", "run-C", "gzip", bytes_before=900, bytes_after=700, recorded_at="2026-01-03T00:00:00",
                     replaced=(Replaced(0, 900, "etag-b", b),))
    assert [g.run_id for g in c.lineage()] == ["run-C", "run-B", "run-A"]
    tally = CommittedTally()
    tally.add(c, ObjectInfo("k/00000000000000000000.log", 700, "etag-c", LISTED, "STANDARD_IA"))
    tally.add(a, ObjectInfo("k/00000000000000000020.log", 400, "etag-a", LISTED, "STANDARD"))
    rows = {(t.run_id, t.storage_class): (t.segments, t.bytes_before, t.bytes_after, t.recorded_at)
            for t in tally.totals()}
    assert rows == {("run-A", "STANDARD"): (1, 1000, 400, "2026-01-01T00:00:00"),
                    ("run-A", "STANDARD_IA"): (1, 1000, 400, "2026-01-01T00:00:00"),
                    ("run-B", "STANDARD_IA"): (1, 900, 900, "2026-01-02T00:00:00"),
                    ("run-C", "STANDARD_IA"): (1, 900, 700, "2026-01-03T00:00:00")}
