"""Re-batching: every merge rule of tiering/kafka/rebatch.py has a test here that fails if the rule is broken;
hypothesis over random batch sequences; the Kafka-written golden segments keep their records digest (the
MANIFEST's, computed by Kafka's own reader); kafka-python reads the merged batches."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from tests.golden import SEGMENTS, log_path, segment_id
from tests.kafka.passes import digest_of, rebatch_segment
from tiering.errors import CorruptBatchError, ProofError
from tiering.kafka._walker import crc32c as _crc32c
from tiering.kafka.batch import Attr, TimestampType
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.rebatch import (
    MEASURE_ALL,
    MEASURE_EVERY,
    RebatchOptions,
    Refusal,
)
from tiering.kafka.records import Engine, Record
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment
from tiering.kafka.segment import iter_decoded

ZSTD = RebatchOptions(Codec.ZSTD, 3)
T0 = 1_700_000_000_000


def rec(offset: int, value: bytes | None = None, ts: int | None = None, key: bytes | None = b"k",
        headers: tuple[tuple[bytes, bytes | None], ...] = ()) -> Record:
    return Record(offset, T0 + offset if ts is None else ts, key, b"v%d" % offset if value is None else value, headers)


def segment(*batches: tuple[BatchSpec, list[Record]]) -> bytes:
    return b"".join(build_batch(spec, records) for spec, records in batches)


def one_each(first: int, n: int, **spec: Any) -> list[tuple[BatchSpec, list[Record]]]:
    """``n`` one-record batches from offset ``first`` (with sequences running along for a producer)."""
    out = []
    for i in range(n):
        extra = dict(spec)
        if spec.get("producer_id", -1) >= 0 and "base_sequence" in spec:
            extra["base_sequence"] = spec["base_sequence"] + i
        out.append((BatchSpec(first + i, Codec.SNAPPY, **extra), [rec(first + i)]))
    return out


def run(data: bytes, options: RebatchOptions = ZSTD) -> tuple[list[Any], Any, bytes]:
    """Re-batch ``data`` by both engines, which must write the same bytes and say the same: the output's
    decoded batches, the stats, the output bytes; the records digest checked equal to the source's."""
    outputs = {}
    for engine in Engine:
        out = io.BytesIO()
        stats = rebatch_segment(io.BytesIO(data), out, replace(options, engine=engine))
        outputs[engine] = (out.getvalue(), stats.to_json())
    assert outputs[Engine.NATIVE] == outputs[Engine.PYTHON]
    records, _ = digest_of(io.BytesIO(out.getvalue()))
    assert records == stats.records_sha256 == digest_of(io.BytesIO(data))[0]
    return list(iter_decoded(io.BytesIO(out.getvalue()))), stats, out.getvalue()


def shape(batches: list[Any]) -> list[tuple[int, int, int]]:
    """(base offset, last offset, records) of each output batch."""
    return [(b.header.offset, b.header.last_offset, len(b.records)) for b in batches]


# --- What a merged batch is --------------------------------------------------------------------------------


def test_one_record_batches_of_a_plain_producer_become_one_batch_with_every_record_unchanged() -> None:
    data = segment(*one_each(100, 50))
    out, stats, _ = run(data)
    assert shape(out) == [(100, 149, 50)]
    [b] = out
    h = b.header
    assert (h.codec, h.producer_id, h.producer_epoch, h.base_sequence) == (Codec.ZSTD, -1, -1, -1)
    assert (h.base_timestamp, h.max_timestamp) == (T0 + 100, T0 + 149)
    assert [(r.offset, r.timestamp, r.key, r.value) for r in b.records] == [
        (o, T0 + o, b"k", b"v%d" % o) for o in range(100, 150)]
    assert (stats.batches_in, stats.batches_out, stats.runs_merged, stats.batches_merged) == (50, 1, 1, 50)


def test_offset_gaps_stay_as_record_offset_deltas_and_the_last_offset_is_kept() -> None:
    """A compacted topic's batches have holes, and a batch may end past its last record."""
    data = segment((BatchSpec(10, Codec.NONE, last_offset_delta=4), [rec(10), rec(13)]),
                   (BatchSpec(20, Codec.NONE, last_offset_delta=9), [rec(22)]))
    out, _, _ = run(data)
    assert shape(out) == [(10, 29, 3)]
    assert [r.offset for r in out[0].records] == [10, 13, 22]


def test_headers_null_keys_and_values_and_out_of_order_timestamps_survive() -> None:
    data = segment((BatchSpec(0), [rec(0, ts=T0 + 50, headers=((b"h", None), (b"x", b"1")))]),
                   (BatchSpec(1), [rec(1, key=None, ts=T0), Record(2, T0 + 7, b"k", None)]))
    out, _, _ = run(data)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in out[0].records] == [
        (0, T0 + 50, b"k", b"v0", ((b"h", None), (b"x", b"1"))), (1, T0, None, b"v1", ()), (2, T0 + 7, b"k", None, ())]
    assert out[0].header.max_timestamp == T0 + 50


def test_kafka_python_reads_the_merged_batch() -> None:
    _, _, data = run(segment(*one_each(0, 20)))
    batch = DefaultRecordBatch(data)
    assert batch.validate_crc()
    assert [(r.offset, r.timestamp, r.value) for r in batch] == [(o, T0 + o, b"v%d" % o) for o in range(20)]


# --- Every rule ----------------------------------------------------------------------------------------------


def test_rule_1_a_control_batch_is_never_merged_and_ends_the_run() -> None:
    marker = BatchSpec(3, Codec.NONE, producer_id=7, producer_epoch=0, transactional=True, control=True)
    data = segment(*one_each(0, 3), (marker, [Record(3, T0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")]),
                   *one_each(4, 3))
    out, stats, _ = run(data)
    assert shape(out) == [(0, 2, 3), (3, 3, 1), (4, 6, 3)]
    assert out[1].header.is_control
    assert stats.refusals[Refusal.NOT_DATA] == 1


@pytest.mark.parametrize("seg", [s for s in SEGMENTS if 2 not in s["magics"]], ids=segment_id)
def test_rule_1_legacy_entries_pass_through_byte_for_byte(seg: dict[str, Any]) -> None:
    """A v2 control batch is also transactional (rule 2 keeps it too); legacy entries are rule 1's alone."""
    data = log_path(seg).read_bytes()
    _, stats, written = run(data)
    assert written == data
    assert stats.runs_merged == 0
    assert stats.batches_in == stats.batches_out


def test_rule_2_transactional_batches_are_never_merged() -> None:
    txn = [(BatchSpec(i, Codec.NONE, producer_id=5, producer_epoch=0, base_sequence=i, transactional=True), [rec(i)])
           for i in range(4)]
    out, stats, _data = run(segment(*txn))
    assert shape(out) == [(i, i, 1) for i in range(4)]
    assert stats.runs_merged == 0


def test_rule_3_another_leader_epoch_ends_the_run() -> None:
    out, stats, _ = run(segment(*one_each(0, 3, partition_leader_epoch=1), *one_each(3, 3, partition_leader_epoch=2)))
    assert shape(out) == [(0, 2, 3), (3, 5, 3)]
    assert [b.header.partition_leader_epoch for b in out] == [1, 2]
    assert stats.refusals[Refusal.LEADER_EPOCH] == 1


def test_rule_4_timestamp_types_and_log_append_times() -> None:
    lat = [(BatchSpec(i, Codec.NONE, log_append_time=T0 + (0 if i < 6 else 1)), [rec(i)]) for i in range(3, 9)]
    out, stats, _ = run(segment(*one_each(0, 3), *lat))
    assert shape(out) == [(0, 2, 3), (3, 5, 3), (6, 8, 3)]
    assert [b.header.attributes & Attr.LOG_APPEND_TIME for b in out] == [0, Attr.LOG_APPEND_TIME, Attr.LOG_APPEND_TIME]
    assert [r.timestamp for r in out[1].records] == [T0] * 3  # a LogAppendTime record reads its batch's time
    assert stats.refusals[Refusal.TIMESTAMP_TYPE] == 2


def with_delete_horizon(batch: bytes) -> bytes:
    """``batch`` as the log cleaner stamps it: the delete-horizon attribute set (its base timestamp is then the
    horizon), the CRC computed again."""
    from tiering.kafka.batch import crc_v2

    stamped = bytearray(batch)
    stamped[22] |= int(Attr.DELETE_HORIZON)  # attributes (low byte)
    stamped[17:21] = crc_v2(bytes(stamped)).to_bytes(4, "big")
    return bytes(stamped)


def test_rule_5_a_batch_with_a_delete_horizon_is_kept_alone() -> None:
    stamped = with_delete_horizon(build_batch(BatchSpec(3, Codec.NONE), [rec(3)]))
    data = segment(*one_each(0, 3)) + stamped + segment(*one_each(4, 3))
    out, stats, _ = run(data)
    assert shape(out) == [(0, 2, 3), (3, 3, 1), (4, 6, 3)]
    assert stats.refusals[Refusal.DELETE_HORIZON] == 1


def test_rule_6_producers_epochs_and_sequences() -> None:
    a = {"producer_id": 11, "producer_epoch": 0, "base_sequence": 0}
    data = segment(*one_each(0, 4, **a),  # contiguous: merged
                   *one_each(4, 2, producer_id=11, producer_epoch=1, base_sequence=0),  # another epoch
                   *one_each(6, 2, producer_id=11, producer_epoch=1, base_sequence=5),  # sequence jump
                   *one_each(8, 2),  # no producer
                   *one_each(10, 2, producer_id=12, producer_epoch=0, base_sequence=0))  # another producer
    out, stats, _ = run(data)
    merged = out[0].header
    assert (merged.offset, merged.last_offset, merged.producer_id, merged.producer_epoch, merged.base_sequence) == (
        0, 3, 11, 0, 0)
    # Epoch 1 (0 and 1 run on), then its sequences jump to 5; producer 11's last batch (7) and producer 12's
    # (11) stay as they were; the plain producer's two merge.
    assert shape(out) == [(0, 3, 4), (4, 5, 2), (6, 6, 1), (7, 7, 1), (8, 9, 2), (10, 10, 1), (11, 11, 1)]
    assert (stats.refusals[Refusal.PRODUCER], stats.refusals[Refusal.PRODUCER_LAST]) == (3, 2)


def test_rule_6_sequences_near_the_wrap_are_not_merged() -> None:
    top = (1 << 31) - 2  # Kafka's sequences wrap from 2^31-1 to 0
    sequences = [top, top + 1, 0, 1, 2]
    data = segment(*((BatchSpec(i, Codec.NONE, producer_id=3, producer_epoch=0, base_sequence=seq), [rec(i)])
                     for i, seq in enumerate(sequences)))
    out, _, _ = run(data)
    assert shape(out) == [(0, 1, 2), (2, 3, 2), (4, 4, 1)]  # never across the wrap; the last batch kept


def test_rule_7_a_producers_last_batch_is_kept_exactly_as_it_was() -> None:
    data = segment(*one_each(0, 5, producer_id=9, producer_epoch=2, base_sequence=0))
    last = build_batch(BatchSpec(4, Codec.SNAPPY, producer_id=9, producer_epoch=2, base_sequence=4), [rec(4)])
    out, stats, written = run(data)
    assert shape(out) == [(0, 3, 4), (4, 4, 1)]
    assert written.endswith(last)
    assert stats.refusals[Refusal.PRODUCER_LAST] == 1


def test_rule_7_in_one_pass_a_run_waits_for_its_producer_s_next_batch() -> None:
    """Producer 9's run is closed by another producer's batches; 9's later batch shows the run's last batch
    was not 9's last, so the run merges whole, exactly as if the segment had been read twice."""
    a = {"producer_id": 9, "producer_epoch": 0}
    data = segment(*one_each(0, 3, base_sequence=0, **a), *one_each(3, 2), *one_each(5, 1, base_sequence=10, **a))
    out, stats, _ = run(data)
    assert shape(out) == [(0, 2, 3), (3, 4, 2), (5, 5, 1)]
    assert (stats.refusals[Refusal.PRODUCER_LAST], stats.undecided) == (0, 0)


def test_rule_7_past_the_lookahead_a_run_s_last_batch_is_kept_out_as_if_it_were_its_producer_s_last() -> None:
    a = {"producer_id": 9, "producer_epoch": 0}
    data = segment(*one_each(0, 3, base_sequence=0, **a), *one_each(3, 2), *one_each(5, 1, base_sequence=10, **a))
    written = io.BytesIO()
    stats = rebatch_segment(io.BytesIO(data), written, ZSTD, lookahead_bytes=0)
    out = list(iter_decoded(io.BytesIO(written.getvalue())))
    assert shape(out) == [(0, 1, 2), (2, 2, 1), (3, 4, 2), (5, 5, 1)]
    assert (stats.refusals[Refusal.PRODUCER_LAST], stats.undecided) == (1, 1)
    assert digest_of(io.BytesIO(written.getvalue()))[0] == digest_of(io.BytesIO(data))[0]


@pytest.mark.parametrize("engine", Engine)
def test_a_merged_batch_that_lost_a_record_fails_the_proof(monkeypatch: pytest.MonkeyPatch, engine: Engine) -> None:
    """Each engine's merged batch loses the run's last batch (its header still claims the run's offsets)."""
    from tiering.kafka import rebatch

    if engine is Engine.NATIVE:
        honest_merge = rebatch._merge_native
        monkeypatch.setattr(rebatch, "_merge_native", lambda group: honest_merge(group[:-1]))
    else:
        honest_batch = rebatch.merged_batch
        monkeypatch.setattr(rebatch, "merged_batch", lambda group, options: honest_batch(group[:-1], options))
    with pytest.raises(ProofError, match=r"t-0/0\.log, batch base offset 0: merged batch does not hold its batches'"):
        rebatch_segment(io.BytesIO(segment(*one_each(0, 5))), io.BytesIO(), replace(ZSTD, engine=engine),
                        path="t-0/0.log")


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.GZIP, Codec.NONE], ids=lambda c: c.label)
def test_a_merged_batch_whose_frame_is_not_its_section_fails_the_proof(monkeypatch: pytest.MonkeyPatch,
                                                                       codec: Codec) -> None:
    """The compiled merge's batch is laid out around a section one byte off the one it was merged into: the
    frame (zstd through the compiled proof, gzip through the codec package, none as it is) must decode to
    the merged records themselves."""
    from tiering.kafka import rebatch

    honest = rebatch.assemble_batch

    def off_by_a_byte(spec: BatchSpec, section: bytes | memoryview, *args: int) -> bytes:
        changed = bytearray(section)
        changed[-1] ^= 1
        return honest(spec, bytes(changed), *args)

    monkeypatch.setattr(rebatch, "assemble_batch", off_by_a_byte)
    with pytest.raises(ProofError, match=f"merged batch's {codec.label} records section does not decompress"):
        rebatch_segment(io.BytesIO(segment(*one_each(0, 5))), io.BytesIO(), RebatchOptions(codec, None),
                        path="t-0/0.log")


def test_a_grouping_that_loses_a_batch_fails_the_whole_segment_proof(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each merged batch holds its group's records, but a group never reaches the output: only the records
    digest of the whole output can tell."""
    from tiering.kafka import rebatch

    honest = rebatch._groups

    def losing(*args: Any) -> Iterator[list[Any]]:
        groups = honest(*args)
        yield next(groups)
        next(groups)
        yield from groups

    monkeypatch.setattr(rebatch, "_groups", losing)
    data = segment(*one_each(0, 3), *one_each(3, 1, partition_leader_epoch=1), *one_each(4, 3))  # 3 groups
    with pytest.raises(ProofError, match="does not hold the source's records"):
        rebatch_segment(io.BytesIO(data), io.BytesIO(), ZSTD, path="t-0/0.log")


def test_the_savings_split_counts_what_recompression_alone_would_have_written() -> None:
    """Every batch merges here, so recompression alone is the plain rewrite of the whole segment (an
    independent path: the rewriter, without re-batching)."""
    data = segment(*one_each(0, MEASURE_ALL))
    options = RewriteOptions(Codec.ZSTD, 3)
    alone = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=0, options=options)
    both = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=0, options=options, rebatch=ZSTD)
    rb = both.rebatch
    assert rb is not None
    assert rb.batches_merged == MEASURE_ALL
    assert rb.merged_bytes_in == rb.bytes_in == len(data) == both.stats.bytes_in
    assert rb.merged_bytes_recompressed == alone.stats.bytes_out
    assert rb.to_json()["recompressed_alone_measured"] == {"batches": MEASURE_ALL, "of": MEASURE_ALL,
                                                            "estimate": False}
    assert rb.merged_bytes_out == both.stats.bytes_out < alone.stats.bytes_out
    assert rb.saved_by_rebatching == alone.stats.bytes_out - both.stats.bytes_out
    # The source's records digest, as a plain rewrite computes it: what a rollback checks the original with.
    assert both.stats.source_payload_xxh3 == alone.stats.payload_xxh3 != both.stats.payload_xxh3
    assert (dict(both.stats.codecs_before), both.stats.batches_rewritten) == ({"snappy": MEASURE_ALL}, 1)


def test_past_the_first_merged_batches_recompression_alone_is_measured_on_a_sample() -> None:
    """2,000 one-record batches: the first 64 merged batches measured, then one in sixteen; the estimate
    against the plain rewrite of the same segment (every batch recompressed alone, exactly)."""
    n = 2_000
    data = segment(*one_each(0, n))
    options = RewriteOptions(Codec.ZSTD, 3)
    alone = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=0, options=options)
    rb = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=0, options=options, rebatch=ZSTD).rebatch
    assert rb is not None
    assert rb.batches_merged == n
    assert rb.measured_batches == MEASURE_ALL + len(range(MEASURE_ALL, n, MEASURE_EVERY)) < n
    assert rb.to_json()["recompressed_alone_measured"] == {"batches": rb.measured_batches, "of": n, "estimate": True}
    assert rb.merged_bytes_recompressed != rb.measured_bytes_out
    assert abs(rb.merged_bytes_recompressed - alone.stats.bytes_out) <= 0.02 * alone.stats.bytes_out


@pytest.mark.parametrize("engine", Engine)
def test_a_corrupt_source_is_reported_at_its_own_byte_position(engine: Engine) -> None:
    data = bytearray(segment(*one_each(0, 10)))
    second = len(build_batch(BatchSpec(0, Codec.SNAPPY), [rec(0)]))
    data[second + 70] ^= 0xFF  # inside batch 1's records: its CRC no longer matches
    with pytest.raises(CorruptBatchError) as e:
        rewrite_segment(io.BytesIO(bytes(data)), io.BytesIO(), base_offset=0, options=RewriteOptions(Codec.ZSTD),
                        path="t-0/0.log", rebatch=replace(ZSTD, engine=engine))
    assert (e.value.position, e.value.base_offset, e.value.path) == (second, 1, "t-0/0.log")


@pytest.mark.parametrize("engine", Engine)
def test_a_batch_with_a_valid_crc_and_broken_records_is_named_by_both_engines(engine: Engine) -> None:
    """A producer bug, not a transport one: the CRC covers the broken records. The compiled engine does not
    vouch for the batch and the Python reference names the record."""
    good = build_batch(BatchSpec(1, Codec.NONE), [rec(1)])
    broken = bytearray(good)
    broken[61] = 0x7E  # the record's length varint: 63 bytes, past the section's end
    broken[17:21] = _crc32c(bytes(broken[21:])).to_bytes(4, "big")
    data = segment(*one_each(0, 1)) + bytes(broken)
    with pytest.raises(CorruptBatchError, match="record 0: length outside the records section") as e:
        rebatch_segment(io.BytesIO(data), io.BytesIO(), replace(ZSTD, engine=engine), path="t-0/0.log")
    assert (e.value.base_offset, e.value.path) == (1, "t-0/0.log")


def test_rule_8_an_empty_batch_is_kept() -> None:
    data = segment(*one_each(0, 2), (BatchSpec(2, Codec.NONE, last_offset_delta=0), []), *one_each(3, 2))
    out, stats, _ = run(data)
    assert shape(out) == [(0, 1, 2), (2, 2, 0), (3, 4, 2)]
    assert stats.refusals[Refusal.EMPTY] == 1


def test_rule_9_counts_the_larger_deltas_a_merged_batch_re_encodes() -> None:
    """One-record batches with timestamps far apart: each record's deltas take 2 bytes where it was alone and
    up to 10 once merged; the bound still holds for the batch as written."""
    far = [(BatchSpec(i, Codec.NONE), [rec(i, value=b"x" * 40, ts=T0 + i * (1 << 40))]) for i in range(200)]
    out, _, _ = run(segment(*far), RebatchOptions(Codec.NONE, max_bytes=4_000))
    assert len(out) > 1
    assert all(b.raw.header.size <= 4_000 for b in out)
    assert [r.timestamp for b in out for r in b.records] == [T0 + i * (1 << 40) for i in range(200)]


def test_rule_9_a_merged_batch_that_comes_out_too_large_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """The slack (15 bytes a record) covers any codec's framing in practice; without it, a batch of
    incompressible records comes out larger than the bound its records fit, and the batches are written as
    they were."""
    import os

    from tiering.kafka import rebatch

    monkeypatch.setattr(rebatch, "RECORD_SLACK", 0)
    noise = [(BatchSpec(i, Codec.NONE), [rec(i, value=os.urandom(300))]) for i in range(10)]
    data = segment(*noise)
    cap = 61 + sum(b.uncompressed_bytes for b in iter_decoded(io.BytesIO(data)))  # the records fit exactly
    _, stats, written = run(data, RebatchOptions(Codec.GZIP, 1, max_bytes=cap))
    assert written == data
    assert (stats.runs_merged, stats.batches_out, stats.refusals[Refusal.SIZE]) == (0, 10, 1)


def test_rule_9_a_merged_batch_stays_under_the_size_limit() -> None:
    big = [(BatchSpec(i, Codec.NONE), [rec(i, value=bytes(900))]) for i in range(100)]
    out, stats, _ = run(segment(*big), RebatchOptions(Codec.ZSTD, 3, max_bytes=10_000))
    assert len(out) > 1
    assert all(b.uncompressed_bytes + 61 <= 10_000 for b in out)
    assert sum(len(b.records) for b in out) == 100
    assert stats.refusals[Refusal.SIZE] == len(out) - 1


# --- Properties ------------------------------------------------------------------------------------------------


@st.composite
def batch_runs(draw: st.DrawFn) -> bytes:
    offset, parts = 0, []
    sequences: dict[tuple[int, int], int] = {}
    for _ in range(draw(st.integers(1, 25))):
        n = draw(st.integers(0, 4))
        pid = draw(st.sampled_from([-1, -1, 1, 2]))
        epoch = draw(st.integers(0, 1)) if pid >= 0 else -1
        seq = sequences.get((pid, epoch), 0) + draw(st.sampled_from([0, 0, 0, 3])) if pid >= 0 else -1
        gap = draw(st.integers(0, 2))
        records = [rec(offset + i * (gap + 1), ts=T0 + draw(st.integers(-5, 5))) for i in range(n)]
        last_delta = (n - 1) * (gap + 1) if n else 0
        spec = BatchSpec(offset, draw(st.sampled_from([Codec.NONE, Codec.GZIP, Codec.ZSTD])),
                         partition_leader_epoch=draw(st.integers(0, 1)), producer_id=pid, producer_epoch=epoch,
                         base_sequence=seq, transactional=pid >= 0 and draw(st.booleans()) and n > 0,
                         log_append_time=draw(st.sampled_from([None, None, T0, T0 + 1])),
                         last_offset_delta=last_delta)
        if pid >= 0:
            sequences[pid, epoch] = seq + last_delta + 1
        built = build_batch(spec, records)
        parts.append(with_delete_horizon(built) if n and draw(st.integers(0, 6)) == 0 else built)
        offset += last_delta + 1
    return b"".join(parts)


@settings(max_examples=150, deadline=None)
@given(batch_runs(), st.sampled_from([200, 2000, 1 << 20]))
def test_any_segment_keeps_its_records_and_every_merged_batch_obeys_the_rules(data: bytes, cap: int) -> None:
    source = list(iter_decoded(io.BytesIO(data)))
    out, stats, _written = run(data, RebatchOptions(Codec.ZSTD, 1, max_bytes=cap))
    assert stats.batches_out == len(out) <= stats.batches_in == len(source)
    by_base = {b.header.offset: b for b in source}
    last_of_producer = {b.header.producer_id: b.header.offset for b in source if b.header.producer_id >= 0}
    for b in out:
        h = b.header
        members = [s for s in source if h.offset <= s.header.offset <= h.last_offset]
        if len(members) == 1:
            assert bytes(b.raw.data) == bytes(by_base[h.offset].raw.data)  # kept as it was
            continue
        assert len({(m.header.partition_leader_epoch, m.header.timestamp_type, m.header.producer_id,
                     m.header.producer_epoch) for m in members}) == 1
        assert not any(m.header.is_transactional or m.header.is_control or not m.records
                       or m.header.delete_horizon_ms is not None for m in members)
        if h.timestamp_type is TimestampType.LOG_APPEND_TIME:  # one append time: every record reads it
            assert {m.header.max_timestamp for m in members} == {h.max_timestamp}
        assert not any(last_of_producer.get(m.header.producer_id) == m.header.offset for m in members)
        assert (h.offset, h.last_offset) == (members[0].header.offset, members[-1].header.last_offset)
        assert h.base_sequence == members[0].header.base_sequence
        if h.producer_id >= 0:  # sequences run with the offsets
            assert all(m.header.base_sequence == h.base_sequence + m.header.offset - h.offset for m in members)
        assert b.uncompressed_bytes + 61 <= cap


# --- Kafka-written segments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seg", SEGMENTS, ids=segment_id)
def test_golden_segments_keep_the_records_digest_kafka_computed(seg: dict[str, Any], tmp_path: Path) -> None:
    data = log_path(seg).read_bytes()
    out, stats, written = run(data)
    assert stats.records_sha256 == seg["records_sha256"]  # Kafka's own reader's digest
    assert digest_of(io.BytesIO(written))[0] == seg["records_sha256"]
    assert stats.records == seg["record_count"]
    assert len(out) <= seg["batch_count"]


BROKER = Path(__file__).resolve().parents[1] / "data" / "broker"


def _broker_logs() -> list[Path]:
    return sorted(BROKER.glob("*/*.log"))


@pytest.mark.parametrize("path", _broker_logs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_segments_a_real_broker_wrote_keep_their_records(path: Path) -> None:
    """Java and librdkafka producers, idempotent and transactional (tests/data/broker): the records digest is
    unchanged, transactional batches and markers come through as they were."""
    data = path.read_bytes()
    out, stats, _written = run(data)
    source = list(iter_decoded(io.BytesIO(data)))
    kept = {bytes(b.raw.data) for b in source if b.header.is_transactional or b.header.is_control}
    assert kept <= {bytes(b.raw.data) for b in out}
    assert stats.batches_out == len(out) <= len(source)
    assert sum(len(b.records) for b in out) == sum(len(b.records) for b in source)
