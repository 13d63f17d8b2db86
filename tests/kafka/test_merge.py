"""Neighbouring segments merged (tiering.kafka.merge): Kafka's grouping rules, case by case; a merge of
Kafka-written segments holds their bytes, records and aborted transactions; bad neighbours are refused by
file, byte and batch. The broker's own verdict on merged partitions: tests/kafka_broker/test_merge_restore.py."""

from __future__ import annotations

import functools
import io
from pathlib import Path

import pytest

from tiering.errors import ConfigError, CorruptBatchError, IndexMismatchError
from tiering.kafka.index import AbortedTxn, build_indexes, encode_txn_index
from tiering.kafka.merge import MAX_DELTA, Limits, Sizes, Source, group_by_size, merge, merge_runs, next_offset
from tiering.kafka.segment import Digests, iter_decoded, verify_segment
from tiering.local import merge_dir, open_segment_file

GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "logdir"
ORDERS = GOLDEN / "orders-0"


def _bases(groups: list[tuple[Sizes, ...]]) -> list[list[int]]:
    return [[s.base_offset for s in g] for g in groups]


def test_a_group_grows_while_every_sum_stays_within_its_bound() -> None:
    limits = Limits(segment_bytes=100, index_bytes=24)
    segs = [Sizes(0, 40, 8, 12), Sizes(10, 60, 8, 12), Sizes(20, 1, 0, 0), Sizes(30, 50, 16, 0),
            Sizes(40, 50, 8, 24), Sizes(50, 10, 0, 12)]
    # 40 + 60 = 100 log bytes (the bound is inclusive) and a 1-byte segment would pass it; 1 + 50 then + 50
    # would too; 24 time-index bytes and 12 more would pass their bound.
    assert _bases(group_by_size(segs, limits, 60)) == [[0, 10], [20, 30], [40], [50]]


def test_the_offset_index_and_time_index_are_bounded_apart() -> None:
    limits = Limits(segment_bytes=1 << 30, index_bytes=16)
    assert _bases(group_by_size([Sizes(0, 1, 8, 0), Sizes(5, 1, 8, 0), Sizes(9, 1, 8, 0)], limits, 12)) == [
        [0, 5], [9]]
    assert _bases(group_by_size([Sizes(0, 1, 0, 12), Sizes(5, 1, 0, 12)], limits, 12)) == [[0], [5]]


def test_a_group_s_offsets_stay_within_the_indexes_32_bit_deltas() -> None:
    """The joining segment's last offset, taken as its successor's base offset minus one (the end offset
    minus one for the last), must be within Int.MaxValue of the group's base; an empty segment joins anyway."""
    limits = Limits()
    far = MAX_DELTA + 1
    assert _bases(group_by_size([Sizes(0, 10, 0, 0), Sizes(100, 10, 0, 0)], limits, far)) == [[0, 100]]
    assert _bases(group_by_size([Sizes(0, 10, 0, 0), Sizes(100, 10, 0, 0)], limits, far + 1)) == [[0], [100]]
    assert _bases(group_by_size([Sizes(0, 10, 0, 0), Sizes(100, 0, 0, 0), Sizes(far + 5, 10, 0, 0)], limits,
                                far + 10)) == [[0, 100], [far + 5]]


def test_merging_at_rest_takes_runs_of_small_neighbours_without_gaps() -> None:
    limits = Limits(segment_bytes=100, index_bytes=1 << 20)
    segs = [Sizes(0, 10, 0, 0), Sizes(10, 10, 0, 0), Sizes(20, 100, 0, 0), Sizes(30, 10, 0, 0),
            Sizes(40, 10, 0, 0), Sizes(50, 10, 0, 0), Sizes(70, 10, 0, 0), Sizes(80, 10, 0, 0)]
    nexts = {0: 10, 10: 20, 20: 30, 30: 40, 40: 50, 50: 60, 70: 80, 80: 90}  # 60..69 missing: a gap
    groups = merge_runs(segs, limits, 90, lambda a, b: nexts[a.base_offset] == b.base_offset)
    assert _bases(groups) == [[0, 10], [30, 40, 50], [70, 80]]  # the large one stays, no run crosses the gap
    assert merge_runs(segs[:1], limits, 10, lambda a, b: True) == []  # one segment alone is left as it is


def _source(path: Path, aborted: tuple[AbortedTxn, ...] = ()) -> Source:
    return Source(int(path.stem), functools.partial(open_segment_file, path), aborted, str(path))


def test_a_merge_of_kafka_written_neighbours_holds_their_batches_records_and_indexes(tmp_path: Path) -> None:
    logs = sorted(ORDERS.glob("*.log"))
    assert len(logs) == 2
    out = io.BytesIO()
    merged = merge([_source(p) for p in logs], out)
    data = out.getvalue()
    assert data == b"".join(p.read_bytes() for p in logs)  # every batch as it was, in order
    with logs[1].open("rb") as f:
        assert merged.next_offset == next_offset(f)
    sources = Digests()
    for p in logs:
        with p.open("rb") as f:
            for batch in iter_decoded(f):
                sources.update(batch)
    summary = verify_segment(io.BytesIO(data), segment_base=0)
    assert summary.records_sha256 == sources.records_sha256
    assert merged.indexes == build_indexes(0, summary.batches)  # as a broker recovering the segment builds them
    assert merged.batches == len(summary.batches)
    assert merged.log_bytes == len(data)
    with pytest.raises(CorruptBatchError, match="overlap"):
        merge([_source(logs[1]), Source(0, functools.partial(open_segment_file, logs[0]), (), str(logs[0]))],
              io.BytesIO())


def test_the_merged_txnindex_holds_the_sources_aborted_transactions_in_order() -> None:
    txn = GOLDEN / "txn-0" / "00000000000000000000.log"
    first = (AbortedTxn(3, 7, 9, 10),)
    second = (AbortedTxn(100, 8, 120, 121),)
    merged = merge([_source(txn, first), Source(10**6, functools.partial(io.BytesIO, b""), second)], io.BytesIO())
    assert merged.txn_index == encode_txn_index([*first, *second])


def test_a_corrupt_batch_is_named_by_file_byte_and_batch_and_nothing_else_is_read(tmp_path: Path) -> None:
    logs = sorted(ORDERS.glob("*.log"))
    bad = tmp_path / logs[1].name
    data = bytearray(logs[1].read_bytes())
    data[200] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(CorruptBatchError) as e:
        merge([_source(logs[0]), _source(bad)], io.BytesIO())
    assert e.value.path == str(bad)
    assert e.value.position is not None


def test_offsets_too_far_from_the_base_are_refused() -> None:
    logs = sorted(ORDERS.glob("*.log"))
    far = Source(-(MAX_DELTA + 1), functools.partial(open_segment_file, logs[0]), (), "far")
    with pytest.raises(IndexMismatchError):
        merge([far, _source(logs[1])], io.BytesIO())


def test_a_partition_directory_merged_keeps_the_active_segment_and_every_other_file(tmp_path: Path) -> None:
    part = tmp_path / "orders-0"
    part.mkdir()
    for f in ORDERS.iterdir():
        (part / f.name).write_bytes(f.read_bytes())
    (part / "00000000000000009999.log").write_bytes(b"")  # the active segment (empty)
    (part / "00000000000000001662.snapshot").write_bytes(b"snapshot")
    (part / "leader-epoch-checkpoint").write_bytes(b"0\n1\n0 0\n")
    done = merge_dir(part, tmp_path / "out", Limits())
    assert done.groups == ((0, 1662),)
    assert (done.segments_before, done.segments_after) == (3, 2)
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["00000000000000000000.index", "00000000000000000000.log", "00000000000000000000.timeindex",
                     "00000000000000009999.log", "leader-epoch-checkpoint"]  # the merged-away snapshot goes too
    assert (tmp_path / "out" / "00000000000000000000.log").stat().st_mtime == (part / "00000000000000001662.log"
                                                                               ).stat().st_mtime
    with pytest.raises(ConfigError, match="new or empty"):
        merge_dir(part, tmp_path / "out", Limits())


def test_an_empty_segment_ends_a_run_and_never_bridges_a_gap(tmp_path: Path) -> None:
    """An empty segment joins the run before it, but holds no offset to show that the next segment follows:
    the run ends there (a missing segment could be behind it)."""
    from tiering.kafka.builder import BatchSpec, build_batch
    from tiering.kafka.records import Record

    part = tmp_path / "orders-0"
    part.mkdir()
    for f in ORDERS.glob("*.log"):
        (part / f.name).write_bytes(f.read_bytes())
    with (ORDERS / "00000000000000001662.log").open("rb") as f:
        empty = next_offset(f)
    assert empty is not None
    (part / f"{empty:020d}.log").write_bytes(b"")
    far = empty + 1000  # offsets empty..far-1 are nowhere: a segment missing from the copy
    (part / f"{far:020d}.log").write_bytes(build_batch(BatchSpec(far), [Record(far, 1, b"k", b"v")]))
    (part / f"{far + 1:020d}.log").write_bytes(b"")  # the active segment
    done = merge_dir(part, tmp_path / "out", Limits())
    assert done.groups == ((0, 1662, empty),)
