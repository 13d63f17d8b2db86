"""The chunked plan: chunk files, their bounds, the streaming budget, and a scan from an S3 Inventory report
that plans what a listing plans."""

from __future__ import annotations

import io
import json
import random
import threading
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.s3.conftest import BUCKET, PREFIX, TOPIC
from tiering.demo.inventory import write_inventory
from tiering.demo.seed import generate_partition, upload_partition
from tiering.errors import InvalidDataError
from tiering.kafka.codecs import Codec
from tiering.lifecycle.vocabulary import Action, Cause
from tiering.plan.document import ObjectRef, Plan, PlannedSegment
from tiering.plan.planfile import Budget, ChunkWriter, by_partition, chunk_limits, json_lines, read_chunk
from tiering.plan.scan import ScanOptions, scan
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import RunSettings, plan_files, plan_run, run_local, scan_run
from tiering.storage.layout import PlanName, work_plan_dir
from tiering.storage.s3 import S3Store


def select(plan: Plan, max_segments: int | None, max_bytes: int | None
           ) -> tuple[list[PlannedSegment], list[tuple[str, int, str]]]:
    """The oracle: the whole plan's work within the budget, largest first, smaller segments filling what
    the larger left of the bytes (what a whole-plan selection does); what it leaves out, with the reason."""
    chosen: list[PlannedSegment] = []
    left: list[tuple[str, int, str]] = []
    total = 0
    for seg in sorted((s for s in plan.segments if s.action == Action.COMPACT),
                      key=lambda s: (-s.size, s.directory, s.base_offset)):
        if max_segments is not None and len(chosen) >= max_segments:
            left.append((seg.directory, seg.base_offset, "over the --max-segments budget"))
        elif max_bytes is not None and total + seg.size > max_bytes:
            left.append((seg.directory, seg.base_offset, "over the --max-bytes budget"))
        else:
            chosen.append(seg)
            total += seg.size
    return chosen, left


def _segment(directory: str, base: int, size: int, action: str = Action.COMPACT) -> PlannedSegment:
    ref = ObjectRef(f"p/{directory}/{base:020d}.log", size, f'"{base:032x}"', "2026-01-01T00:00:00+00:00", "STANDARD")
    return PlannedSegment(directory, directory.rsplit("-", 1)[0], int(directory.rsplit("-", 1)[1]), base, action,
                          "sealed" if action == Action.COMPACT else "active: highest", log=ref,
                          cause=None if action != Action.SKIP else Cause.ACTIVE)


def _plan(sizes: list[list[int]]) -> list[PlannedSegment]:
    return [_segment(f"t-{p}", 100 * i, size) for p, part in enumerate(sizes) for i, size in enumerate(part)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=6), min_size=1, max_size=8),
       st.one_of(st.none(), st.integers(0, 30)), st.one_of(st.none(), st.integers(0, 400)))
def test_the_streaming_budget_chooses_what_the_whole_plan_selection_chooses(
        sizes: list[list[int]], max_segments: int | None, max_bytes: int | None) -> None:
    """Same segments and same reasons as :func:`select` on the whole plan (ties of equal sizes: plan order,
    which is the whole-plan selection's directory and offset order here)."""
    segments = _plan(sizes)
    plan = Plan(BUCKET, PREFIX, "zstd", None, 0, None, "2026-01-01T00:00:00+00:00", segments)
    chosen, left = select(plan, max_segments, max_bytes)
    budget = Budget(max_segments, max_bytes)
    tallies = [budget.tally(), budget.tally()]  # as by topic: any split of the sizes gives the same choices
    for i, s in enumerate(segments):
        tallies[i % 2].add(s.size)
    count, total = budget.measure(tallies)
    streamed = [budget.apply(s) for s in segments]
    assert {(s.directory, s.base_offset) for s in streamed if s.action == Action.COMPACT} == {
        (s.directory, s.base_offset) for s in chosen}
    assert (count, total) == (len(chosen), sum(s.size for s in chosen))
    assert {(s.directory, s.base_offset, s.reason) for s in streamed if s.action == Action.SKIP} == set(left)
    assert all(s.cause is Cause.BUDGET for s in streamed if s.action == Action.SKIP)


def test_repairs_and_skips_are_never_budgeted() -> None:
    segments = [_segment("t-0", 0, 50, Action.REPAIR), _segment("t-0", 100, 50, Action.SKIP), _segment("t-0", 200, 50)]
    budget = Budget(0, None)
    tally = budget.tally()
    tally.add(50)
    budget.measure([tally])
    assert [budget.apply(s).action for s in segments] == [Action.REPAIR, Action.SKIP, Action.SKIP]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 300), st.integers(0, 1 << 40)), min_size=1,
                max_size=60), st.integers(2, 12))
def test_a_plan_never_makes_more_chunks_than_allowed(partitions: list[tuple[int, int, int]], max_chunks: int) -> None:
    """Partitions of (segments, segments to compact, bytes to compact): chunked with the limits
    :func:`chunk_limits` gives for their totals, never more than ``max_chunks`` chunks."""
    parts = [(n, min(w, n), b if min(w, n) else 0) for n, w, b in partitions]
    limits = chunk_limits(max_chunks, segments=sum(n for n, _, _ in parts), work=sum(w for _, w, _ in parts),
                          work_bytes=sum(b for _, _, b in parts), min_work=1, min_segments=1, min_bytes=1)
    writer = ChunkWriter(lambda name, data: name, **limits)
    for p, (n, w, b) in enumerate(parts):
        writer.add([_segment(f"t-{p}", i, (b // w if i < w else 1), Action.COMPACT if i < w else Action.SKIP)
                    for i in range(n)])
    assert 1 <= len(writer.close()) <= max_chunks


def test_chunks_keep_partitions_whole_and_read_back_line_by_line() -> None:
    files: dict[str, bytes] = {}
    writer = ChunkWriter(lambda name, data: files.setdefault(name, data) and name, max_segments=5)
    parts = [[_segment(f"t-{p}", 100 * i, 10 + i) for i in range(n)] for p, n in enumerate([3, 4, 1, 6, 2])]
    for part in parts:
        writer.add(part)
    chunks = writer.close()
    assert [c.partitions for c in chunks] == [2, 2, 1]  # cut once 5 segments are reached, never inside one
    assert [(c.first, c.last) for c in chunks] == [("t-0", "t-1"), ("t-2", "t-3"), ("t-4", "t-4")]
    assert writer.totals.segments == 16
    assert writer.totals.bytes_to_compact == sum(s.size for p in parts for s in p)
    back = [s for c in chunks for s in read_chunk(io.BytesIO(files[c.key]), c.key)]
    assert back == [s for p in parts for s in p]
    assert [list(g) for g in by_partition(back)] == parts
    middle = list(read_chunk(io.BytesIO(files[chunks[1].key]), "x", start=1, stop=3))
    assert middle == [parts[3][0], parts[3][1]]  # lines 1 and 2 of the chunk (t-2 holds line 0)


def test_a_damaged_chunk_names_its_file_and_line() -> None:
    lines = b'{"directory": "t-0"}\n'  # not a planned segment
    body = zlib.compressobj(6, zlib.DEFLATED, 31)
    data = body.compress(lines) + body.flush()
    with pytest.raises(InvalidDataError, match="damaged") as e:
        list(read_chunk(io.BytesIO(data), "s3://b/k.jsonl.gz"))
    assert e.value.path == "s3://b/k.jsonl.gz"
    assert e.value.found == "line 1"
    with pytest.raises(InvalidDataError, match="damaged"):
        list(read_chunk(io.BytesIO(data[:-6]), "s3://b/k.jsonl.gz"))  # cut short


def _seed(store: S3Store, partitions: int) -> None:
    for p in range(partitions):
        generated = generate_partition(segments=3, kind="json", codec=Codec.SNAPPY, segment_bytes=20_000, seed=p)
        upload_partition(store, PREFIX, TOPIC, p, generated)
    store.put(f"{PREFIX}/{TOPIC}-0/stray.txt", b"not a segment")
    store.put(f"{PREFIX}/bogus/00000000000000000000.log", b"")


def test_a_scan_from_an_inventory_plans_what_a_listing_plans(store: S3Store) -> None:
    _seed(store, 5)
    options = ScanOptions("zstd", 3, min_age_minutes=0)
    listed = scan(store, PREFIX, options)
    objects = list(store.list(""))
    random.Random(7).shuffle(objects)  # an inventory promises no order
    uri = write_inventory(store, BUCKET, "inventory/segments/daily", objects, rows_per_file=7)
    settings_ = RunSettings(BUCKET, PREFIX, "inv-run", "zstd", 3)
    result = scan_run(store, settings_, options, inventory=uri)
    scanned = plan_files(store, settings_, PlanName.SCAN)
    manifest = scanned.manifest()
    from_inventory = sorted(scanned.segments(manifest), key=lambda s: (s.directory, s.base_offset))
    assert from_inventory == list(listed.segments)
    assert manifest.source == uri
    assert manifest.totals == listed.totals()
    assert result.totals.to_json() == listed.totals()
    assert manifest.header.objects_listed == listed.objects_listed
    # Every object not planned, with the same reasons (an inventory's partitions come in another order).
    assert sorted(manifest.header.ignored_keys, key=str) == sorted(listed.ignored_keys, key=str)
    assert manifest.header.ignored_by_reason == listed.ignored_by_reason
    assert listed.ignored_by_reason["not a Kafka file"] == 1
    assert manifest.header.skipped_dirs == listed.skipped_dirs


def test_an_inventory_of_another_bucket_is_refused(store: S3Store) -> None:
    from tiering.errors import ConfigError

    store.client.create_bucket(Bucket="other", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    uri = write_inventory(store, "other", "inventory/other/daily", [])
    with pytest.raises(ConfigError, match="another bucket"):
        scan_run(store, RunSettings(BUCKET, PREFIX, "r", "zstd"), ScanOptions("zstd"), inventory=uri)


def test_the_plan_is_chunked_within_its_limit_and_worked_in_units_of_whole_partitions(store: S3Store) -> None:
    from tiering.run import engine
    from tiering.run.pipeline import compaction_kind

    _seed(store, 6)
    run = RunSettings(BUCKET, PREFIX, "chunked", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    planned = plan_run(store, run, CompactOptions(max_segments=9), max_chunks=20, chunk_work=1)
    chunked = plan_files(store, run)
    manifest = chunked.manifest()
    assert 1 < len(manifest.chunks) == planned.chunks <= 20
    assert planned.segments == 9 == manifest.totals["to_compact"]
    assert manifest.totals["skipped_by_reason"]["over the budget"] == 12 - 9
    # Every segment of the plan is in exactly one chunk; partitions are never split.
    segments = list(chunked.segments(manifest))
    assert len(segments) == manifest.totals["segments"] == 18
    assert len({s.directory for s in segments}) == len(list(by_partition(segments)))
    kind = compaction_kind(run, CompactOptions(max_segments=9)).started(store, PREFIX)
    units = engine.plan(store, run.context(store), kind, parallelism=2).units
    assert 1 < len(units) <= 8
    refs = [ref for u in units for ref in u.partitions]
    assert sum(ref.segments for ref in refs) == 9
    assert sorted(ref.directory for ref in refs) == sorted({s.directory for s in segments
                                                            if s.action == Action.COMPACT})
    # the partitions' work as the units read it back: each compacting segment once, the budget's skips noted
    work = [kind.partition_from_json(doc["work"]) for info in store.list(work_plan_dir(PREFIX, "chunked", kind.step))
            for doc in json_lines(store.open(info.key), info.key)]
    assert sorted((s.directory, s.base_offset) for w in work for s in w.segments) == sorted(
        (s.directory, s.base_offset) for s in segments if s.action == Action.COMPACT)



@pytest.fixture
def atomic_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request to the in-process moto made atomic, as a real store's are: its backend is not thread-safe
    (a listing iterates the bucket's keys while another thread deletes one, and fails with a KeyError)."""
    from moto.core.botocore_stubber import BotocoreStubber

    lock = threading.Lock()
    answer = BotocoreStubber.__call__

    def atomic(self: BotocoreStubber, *args: Any, **kwargs: Any) -> Any:
        with lock:
            return answer(self, *args, **kwargs)

    monkeypatch.setattr(BotocoreStubber, "__call__", atomic)


def test_a_run_works_on_its_partitions_in_parallel_each_counted_apart(store: S3Store, atomic_requests: None
                                                                    ) -> None:
    """A compaction on 4 threads, each with its own client: every segment compacted, and each partition's
    requests are its own (3 copies a segment: the backups of .log, .index and .timeindex; moto ignores a
    copy's If-Match, so the .log is PUT)."""
    _seed(store, 6)
    run = RunSettings(BUCKET, PREFIX, "parallel", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    planned = plan_run(store, run, CompactOptions())
    result = run_local(store, run, run.context(store), CompactOptions(workers=4))
    assert result.totals()["compacted"] == planned.segments == 12
    copies = sorted(used.get("CopyObject", 0) for scope, used in result.usage["requests"].items()
                    if scope.startswith(TOPIC))
    assert copies == [3 * 2] * 5 + [3 * 2 + 1]  # one partition's first swap probed the store for the run
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))


def test_an_operation_in_flight_in_a_partition_without_work_is_finished_by_the_run(store: S3Store) -> None:
    """A crashed run's operation in a partition this run does not work in (all its segments over the
    budget) is finished (here abandoned: staged by another run) by the run all the same."""
    from tiering.commit.lease import Lease
    from tiering.commit.operation import Staged
    from tiering.commit.stage import stage_segment
    from tiering.lifecycle.vocabulary import Status
    from tiering.run.segment import pending_bases
    from tiering.storage.layout import lease_key

    _seed(store, 6)
    run = RunSettings(BUCKET, PREFIX, "budgeted", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    budget = CompactOptions(max_segments=2)
    plan_run(store, run, budget, chunk_work=1)
    worked = {s.directory for s in plan_files(store, run).segments() if s.action == Action.COMPACT}
    seg = next(s for s in plan_files(store, run, PlanName.SCAN).segments() if s.directory not in worked
               and s.action == Action.COMPACT)
    crashed = RunSettings(BUCKET, PREFIX, "crashed", "zstd", 3)
    lease = Lease(store, lease_key(PREFIX, seg.directory), "crashed", 60)
    lease.acquire(PREFIX)
    assert isinstance(stage_segment(crashed.context(store), seg, lease), Staged)  # then the process died
    lease.release()
    planned = plan_run(store, run, budget, chunk_work=1)
    assert planned.in_flight == 1
    result = run_local(store, run, run.context(store), budget)
    assert [(r.directory, r.status, r.recovered) for r in result.segments if r.directory == seg.directory
            and r.status is not Status.SKIPPED] == [(seg.directory, Status.ABORTED, True)]
    assert result.totals()["compacted"] == 2
    assert pending_bases(store, PREFIX) == {}
    # The report has one row a segment the scan saw: the segment's own outcome in this run (over the budget)
    # is its row, not the other run's operation this run abandoned there as well.
    from tiering.cost.model import CostOptions
    from tiering.cost.prices import load_prices
    from tiering.report.publish import assemble

    report = assemble(store, PREFIX, "budgeted", load_prices("us-east-1"), CostOptions(), [])
    plan = list(plan_files(store, run).segments())
    assert report.totals.segments_seen == len(plan) == 18
    rows = [(r.directory, r.base_offset) for r in report.segments]
    assert len(rows) == len(set(rows)) == 18
    [mine] = [r for r in report.segments if (r.directory, r.base_offset) == (seg.directory, seg.base_offset)]
    assert (mine.status, mine.cause) == (Status.SKIPPED, Cause.BUDGET)
    assert report.totals.segments_rewritten == 2


def test_step_documents_are_typed_and_versioned() -> None:
    from tiering.commit.operation import SegmentResult
    from tiering.documents import read, write
    from tiering.errors import ConfigError
    from tiering.lifecycle.vocabulary import Pending, Status
    from tiering.run.documents import StepResults, StepUsage

    results = (SegmentResult("t-0", 0, Status.STAGED, "sealed", 10, 4, seconds=0.5),
               SegmentResult("t-0", 100, Status.SKIPPED, "partition busy: x", pending=Pending.BUSY,
                             cause=Cause.BUDGET),
               SegmentResult("t-1", 0, Status.ABORTED, "abandoned", recovered=True, run_id="other"))
    step = StepResults(results, {"t-0": {"PutObject": 3}})
    again = StepResults.from_json(json.loads(json.dumps(step.to_json())), "s3://b/k")
    assert again == step
    assert step.counts() == {"staged": 1, "skipped": 1, "aborted": 1}
    assert read(write(StepUsage({"GetObject": 2})), StepUsage, what="usage") == StepUsage({"GetObject": 2})
    with pytest.raises(ConfigError, match="not step results"):
        StepResults.from_json({**step.to_json(), "schema_version": 2}, "s3://b/k")


class _Killed(BaseException):
    """Stands for the process dying: nothing of the run catches it."""


def test_an_operation_left_past_its_backup_in_a_partition_without_work_is_rolled_forward(store: S3Store) -> None:
    """A run killed at a .log swap leaves its journal past the backup in partition 3. The next run plans no
    work there (between partitions with work): it still finishes the operation, and nothing is left in
    flight."""
    import dataclasses
    import time

    from tests.s3.conftest import check_consistent, context, fresh_store, plan_for, seed
    from tests.s3.hooks import Step, key_ends
    from tiering.run.pipeline import compact
    from tiering.run.segment import pending_bases

    originals = {p: seed(store, partition=p) for p in range(7)}
    killed = fresh_store()
    first = sorted(originals[3])[0]

    def die(**_: object) -> None:
        raise _Killed

    Step(killed, "PutObject", key_ends(f"{TOPIC}-3/{first:020d}.log", IfMatch=True), die)
    everything = plan_for(store)
    only_3 = dataclasses.replace(everything, segments=[s for s in everything.segments if s.directory == f"{TOPIC}-3"])
    with pytest.raises(_Killed):
        compact(killed, only_3, context(killed, "run-x"), CompactOptions(lease_ttl_seconds=1))
    assert f"{TOPIC}-3" in pending_bases(store, PREFIX)
    time.sleep(2.5)  # run-x's lease expires (S3's clock counts whole seconds)
    nothing_in_3 = dataclasses.replace(plan_for(store), segments=[
        dataclasses.replace(s, action=Action.SKIP, reason="active: held back by the test", cause=Cause.ACTIVE)
        if s.directory == f"{TOPIC}-3" else s for s in plan_for(store).segments])
    run = compact(store, nothing_in_3, context(store, "run-y"), CompactOptions())
    assert pending_bases(store, PREFIX) == {}
    [finished] = [r for r in run.segments if r.directory == f"{TOPIC}-3" and r.recovered]
    assert (finished.base_offset, finished.status) == (first, "compacted")
    check_consistent(store, originals[3], partition=3)


def _crash_after_staging(store: S3Store, run: RunSettings, codec: str, level: int) -> PlannedSegment:
    """A run ``crashed`` that staged (and journalled) the first sealed segment of partition 0, then died."""
    from tiering.commit.lease import Lease
    from tiering.commit.operation import Staged
    from tiering.commit.stage import stage_segment
    from tiering.run.pipeline import plan_files
    from tiering.storage.layout import lease_key

    seg = next(s for s in plan_files(store, run, PlanName.SCAN).segments() if s.directory == f"{TOPIC}-0"
               and s.action == Action.COMPACT)
    lease = Lease(store, lease_key(PREFIX, seg.directory), "crashed", 60)
    lease.acquire(PREFIX)
    staged = stage_segment(RunSettings(BUCKET, PREFIX, "crashed", codec, level).context(store), seg, lease)
    assert isinstance(staged, Staged)
    lease.release()  # released (or expired): the next run may take the partition
    return seg


def _exists(store: S3Store, key: str) -> bool:
    from tiering.storage.objects import ObjectNotFound

    try:
        store.head(key)
    except ObjectNotFound:
        return False
    return True


@pytest.mark.parametrize("same", [True, False], ids=["same-codec", "another-level"])
def test_what_a_crashed_run_staged_is_taken_over_when_this_run_would_stage_the_same(store: S3Store,
                                                                                   same: bool) -> None:
    """A new run finds a crashed run's operation still ``staged`` in its partition: with the same source,
    codec and level it takes the operation over (its staged files, nothing staged again) and swaps it in
    under the new run's backups, and the crashed run's staging is gone; with another level it abandons it
    and compacts the segment itself."""
    from tiering.lifecycle.vocabulary import Status
    from tiering.run.segment import pending_bases
    from tiering.storage.layout import backup_key, staging_key

    _seed(store, 2)
    run = RunSettings(BUCKET, PREFIX, "next", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    seg = _crash_after_staging(store, run, "zstd", 3 if same else 9)
    assert seg.log is not None
    theirs = staging_key(PREFIX, "crashed", seg.directory, seg.base_offset, ".log")
    staged_bytes = store.get(theirs)
    plan_run(store, run, CompactOptions(), chunk_work=1)
    run_doc = run_local(store, run, run.context(store), CompactOptions())
    mine = [(r.status, r.recovered, r.run_id) for r in run_doc.segments
            if (r.directory, r.base_offset) == (seg.directory, seg.base_offset)]
    if same:
        assert mine == [(Status.COMPACTED, False, "next")]  # counted once
        assert "taken over" in next(r.reason for r in run_doc.segments if r.base_offset == seg.base_offset
                                    and r.directory == seg.directory)
    else:
        assert mine == [(Status.ABORTED, True, "crashed"), (Status.COMPACTED, False, "next")]  # then anew
    assert pending_bases(store, PREFIX) == {}
    assert not _exists(store, theirs)  # the crashed run's staging went with its operation
    assert _exists(store, backup_key(PREFIX, "next", seg.directory, seg.base_offset, ".log"))
    assert not _exists(store, backup_key(PREFIX, "crashed", seg.directory, seg.base_offset, ".log"))
    assert (store.get(seg.log.key) == staged_bytes) is same  # level 9's bytes differ from level 3's
    assert store.head(seg.log.key).metadata["tiering-run"] == "next"


def _crashed_then_compact(store: S3Store, damage: str) -> tuple[PlannedSegment, list[Any]]:
    """A crashed run's staged operation, ``damage``d, then a CLI compaction; that segment's results."""
    from tiering.run.pipeline import compact
    from tiering.storage.layout import staging_key

    _seed(store, 1)
    run = RunSettings(BUCKET, PREFIX, "next", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    seg = _crash_after_staging(store, run, "zstd", 3)
    staged = staging_key(PREFIX, "crashed", seg.directory, seg.base_offset, ".log")
    if damage == "corrupt":  # same size, other bytes: found only by the proof before the swap
        body = store.get(staged)
        store.put(staged, body[:100] + bytes(b ^ 0xFF for b in body[100:200]) + body[200:])
    elif damage == "gone":
        store.delete(staged)
    plan = scan(store, PREFIX, ScanOptions("zstd", 3, min_age_minutes=0))
    result = compact(store, plan, context_for(store, "next"), CompactOptions())
    return seg, [r for r in result.segments if (r.directory, r.base_offset) == (seg.directory, seg.base_offset)]


def test_a_taken_over_staged_copy_that_does_not_verify_is_dropped_and_the_segment_staged_anew(store: S3Store
                                                                                                ) -> None:
    """A crashed run's staged copy that does not verify (same size, other bytes) is never swapped in: the
    run that takes it over drops it (nothing final had changed) and compacts the segment itself; nothing is
    left in flight for every later run to meet again."""
    from tiering.lifecycle.vocabulary import Status
    from tiering.run.segment import pending_bases

    seg, results = _crashed_then_compact(store, "corrupt")
    assert [(r.status, r.recovered, r.run_id) for r in results] == [(Status.ABORTED, True, "crashed"),
                                                                     (Status.COMPACTED, False, "next")]
    assert "does not verify" in results[0].reason
    assert pending_bases(store, PREFIX) == {}
    assert seg.log is not None
    assert store.head(seg.log.key).metadata["tiering-run"] == "next"


def test_a_staged_operation_whose_staged_log_is_gone_is_abandoned_and_staged_again(store: S3Store) -> None:
    from tiering.lifecycle.vocabulary import Status

    _, results = _crashed_then_compact(store, "gone")
    assert [r.status for r in results] == [Status.ABORTED, Status.COMPACTED]


def test_an_index_that_appeared_since_the_crashed_run_staged_stops_the_takeover(store: S3Store) -> None:
    """Run A staged while the segment had no .index (a restore still uploading); the index is there when run B
    plans. B must not take A's operation over (its journal would back up and replace no index, and the swap
    would delete the one that appeared): it abandons it and stages the segment itself, with the index backed
    up."""
    import dataclasses

    from tiering.commit.lease import Lease
    from tiering.commit.operation import Staged
    from tiering.commit.stage import stage_segment
    from tiering.lifecycle.vocabulary import Status
    from tiering.run.pipeline import compact, plan_files
    from tiering.storage.layout import backup_key, lease_key

    _seed(store, 1)
    run = RunSettings(BUCKET, PREFIX, "next", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    seg = next(s for s in plan_files(store, run, PlanName.SCAN).segments() if s.action == Action.COMPACT)
    assert seg.index is not None
    index = store.get(seg.index.key)
    store.delete(seg.index.key)
    lease = Lease(store, lease_key(PREFIX, seg.directory), "crashed", 60)
    lease.acquire(PREFIX)
    staged = stage_segment(RunSettings(BUCKET, PREFIX, "crashed", "zstd", 3).context(store),
                           dataclasses.replace(seg, index=None), lease)
    assert isinstance(staged, Staged)
    lease.release()
    store.put(seg.index.key, index)  # the restore finished
    plan = scan(store, PREFIX, ScanOptions("zstd", 3, min_age_minutes=0))
    result = compact(store, plan, context_for(store, "next"), CompactOptions())
    mine = [r.status for r in result.segments if (r.directory, r.base_offset) == (seg.directory, seg.base_offset)]
    assert mine == [Status.ABORTED, Status.COMPACTED]
    assert store.get(backup_key(PREFIX, "next", seg.directory, seg.base_offset, ".index")) == index


def context_for(store: S3Store, run_id: str) -> Any:
    from tiering.commit.operation import Context
    from tiering.kafka.rewrite import RewriteOptions

    return Context(store, PREFIX, run_id, RewriteOptions(Codec.ZSTD, 3))
