"""Hypothesis round trips: records -> v2 batches (any codec) -> segment -> read back; rewrite to any codec keeps
every record, both canonical digests and every header field, and its indexes equal a rebuild over its output."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tiering.kafka.batch import parse_v2_header
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import LEVEL_RANGE, Codec
from tiering.kafka.index import build_indexes
from tiering.kafka.records import Record
from tiering.kafka.rewrite import RewriteOptions, read_back, rewrite_segment
from tiering.kafka.segment import iter_decoded, verify_segment

_bytes_or_none = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=60),
                           st.binary(min_size=1, max_size=6).map(lambda b: b * 50))
_headers = st.lists(st.tuples(st.binary(max_size=8), st.one_of(st.none(), st.binary(max_size=12))),
                    max_size=3).map(tuple)


@st.composite
def _level(draw: st.DrawFn, codec: Codec) -> int | None:
    if codec not in LEVEL_RANGE or draw(st.booleans()):
        return None
    low, high = LEVEL_RANGE[codec]
    return draw(st.integers(max(low, -10), min(high, 12)))


@dataclasses.dataclass(frozen=True)
class Planned:
    spec: BatchSpec
    records: list[Record]

    def expected(self) -> list[Record]:
        """What a reader must give back: LogAppendTime batches report the append time for every record."""
        if self.spec.log_append_time is None:
            return self.records
        return [dataclasses.replace(r, timestamp=self.spec.log_append_time) for r in self.records]


@st.composite
def _segment(draw: st.DrawFn) -> tuple[int, list[Planned]]:
    segment_base = draw(st.sampled_from([0, 7, 1_000_000, 2**40]))
    offset = segment_base + draw(st.integers(0, 3))
    planned: list[Planned] = []
    for _ in range(draw(st.integers(1, 6))):
        base = offset
        kind = draw(st.sampled_from(["data", "data", "data", "empty", "control"]))
        ts = draw(st.integers(5000, 2**42))
        if kind == "control":
            pid = draw(st.integers(0, 2**40))
            marker = b"\x00\x00\x00" + draw(st.sampled_from([b"\x00", b"\x01"]))
            spec = BatchSpec(base, producer_id=pid, producer_epoch=draw(st.integers(0, 5)), transactional=True,
                             control=True, partition_leader_epoch=draw(st.integers(0, 9)))
            records = [Record(base, ts, marker, b"\x00\x00\x00\x00\x00\x05")]
        else:
            records = []
            n = 0 if kind == "empty" else draw(st.integers(1, 12))
            off = base + draw(st.integers(0, 2))
            for _ in range(n):
                records.append(Record(off, ts + draw(st.integers(-5000, 5000)), draw(_bytes_or_none),
                                      draw(_bytes_or_none), draw(_headers)))
                off += 1 + draw(st.sampled_from([0, 0, 0, 1, 7]))
            last_delta = (records[-1].offset - base if records else 0) + draw(st.sampled_from([0, 0, 2]))
            codec = draw(st.sampled_from(list(Codec)))
            idempotent = draw(st.booleans())
            spec = BatchSpec(
                base,
                codec=codec,
                level=draw(_level(codec)),
                partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
                producer_id=draw(st.integers(0, 2**50)) if idempotent else -1,
                producer_epoch=draw(st.integers(0, 32767)) if idempotent else -1,
                base_sequence=draw(st.integers(0, 2**31 - 1)) if idempotent else -1,
                log_append_time=draw(st.one_of(st.none(), st.integers(0, 2**42))),
                last_offset_delta=last_delta,
            )
        planned.append(Planned(spec, records))
        last = parse_v2_header(build_batch(spec, records), 0).last_offset
        offset = last + 1 + draw(st.sampled_from([0, 0, 1, 100]))
    return segment_base, planned


def _build(planned: list[Planned]) -> bytes:
    return b"".join(build_batch(p.spec, p.records) for p in planned)


def _records(data: bytes) -> list[list[Record]]:
    return [b.records for b in iter_decoded(io.BytesIO(data))]


_VOLATILE = {"codec", "size", "crc", "position"}


def _views(data: bytes) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.to_json().items() if k not in _VOLATILE} for b in iter_decoded(io.BytesIO(data))]


@settings(max_examples=200, deadline=None)
@given(_segment())
def test_built_segment_reads_back(case: tuple[int, list[Planned]]) -> None:
    segment_base, planned = case
    data = _build(planned)
    assert _records(data) == [p.expected() for p in planned]
    summary = verify_segment(io.BytesIO(data), segment_base=segment_base)
    fast = verify_segment(io.BytesIO(data), segment_base=segment_base, digests=False)
    assert summary.batch_count == fast.batch_count == len(planned)
    assert summary.record_count == fast.record_count == sum(len(p.records) for p in planned)
    assert summary.control_batch_count == sum(p.spec.control for p in planned)
    assert summary.size_bytes == len(data)
    assert summary.first_offset == planned[0].spec.base_offset
    decoded = list(iter_decoded(io.BytesIO(data)))
    for p, d in zip(planned, decoded, strict=True):
        h = d.header
        assert h.codec is p.spec.codec
        assert (h.producer_id, h.producer_epoch, h.base_sequence) == (
            p.spec.producer_id, p.spec.producer_epoch, p.spec.base_sequence)
        assert h.partition_leader_epoch == p.spec.partition_leader_epoch
        assert h.is_control == p.spec.control
        assert h.records_count == len(p.records)


@settings(max_examples=200, deadline=None)
@given(case=_segment(), target=st.sampled_from(list(Codec)), force=st.booleans(), data=st.data(),
       interval=st.sampled_from([0, 1, 100, 4096]))
def test_rewrite_keeps_records_digests_and_indexes(case: tuple[int, list[Planned]], target: Codec, force: bool,
                                                   data: st.DataObject, interval: int) -> None:
    segment_base, planned = case
    source = _build(planned)
    level = data.draw(_level(target))
    before = verify_segment(io.BytesIO(source), segment_base=segment_base)
    out = io.BytesIO()
    result = rewrite_segment(io.BytesIO(source), out, base_offset=segment_base,
                             options=RewriteOptions(codec=target, level=level, force=force,
                                                    index_interval_bytes=interval))
    rewritten = out.getvalue()
    after = verify_segment(io.BytesIO(rewritten), segment_base=segment_base)

    assert _records(rewritten) == [p.expected() for p in planned]
    assert after.records_sha256 == before.records_sha256
    assert after.batches_sha256 == before.batches_sha256
    assert _views(rewritten) == _views(source)
    assert result.indexes == build_indexes(segment_base, after.batches, interval)

    stats = result.stats
    assert stats.batches == len(planned)
    assert stats.records == before.record_count
    assert stats.bytes_in == len(source)
    assert stats.bytes_out == len(rewritten)
    assert read_back(io.BytesIO(rewritten), base_offset=segment_base).payload_xxh3 == stats.payload_xxh3
    assert stats.batches_rewritten + sum(stats.kept.values()) == len(planned)

    for p, b in zip(planned, iter_decoded(io.BytesIO(rewritten)), strict=True):
        original = build_batch(p.spec, p.records)
        if p.spec.control:
            assert bytes(b.raw.data) == original  # control batches are copied as they are
        elif p.spec.codec is target and not force:
            assert bytes(b.raw.data) == original  # already in the target codec: copied
        elif target is Codec.NONE:
            assert b.header.codec is Codec.NONE  # --codec none always decompresses v2 batches
        else:
            # Recompressed, or kept because it would not shrink.
            assert b.header.codec is target or bytes(b.raw.data) == original
            assert b.header.size <= len(original)


@settings(max_examples=50, deadline=None)
@given(_segment(), st.sampled_from(list(Codec)))
def test_rewrite_is_idempotent(case: tuple[int, list[Planned]], target: Codec) -> None:
    """Rewriting a rewritten segment to the same codec (without force) gives the same bytes: batches already in
    the target codec are copied, and those kept because they would not shrink are kept again."""
    segment_base, planned = case
    first = io.BytesIO()
    rewrite_segment(io.BytesIO(_build(planned)), first, base_offset=segment_base,
                    options=RewriteOptions(codec=target))
    second = io.BytesIO()
    result = rewrite_segment(io.BytesIO(first.getvalue()), second, base_offset=segment_base,
                             options=RewriteOptions(codec=target))
    assert second.getvalue() == first.getvalue()
    assert result.stats.batches_rewritten == 0


@pytest.mark.parametrize("source", list(Codec), ids=lambda c: c.label)
@pytest.mark.parametrize("target", list(Codec), ids=lambda c: c.label)
def test_rewrite_empty_batches(source: Codec, target: Codec) -> None:
    """Compaction leaves empty batches (recordsCount 0, lastOffsetDelta kept) in any codec: they rewrite like any
    other batch."""
    planned = [
        Planned(BatchSpec(0, codec=source, last_offset_delta=4), []),
        Planned(BatchSpec(5, codec=source), [Record(5, 1000, b"k", b"v" * 100)]),
        Planned(BatchSpec(6, codec=source, last_offset_delta=0), []),
    ]
    source_bytes = _build(planned)
    for force in (False, True):
        out = io.BytesIO()
        result = rewrite_segment(io.BytesIO(source_bytes), out, base_offset=0,
                                 options=RewriteOptions(codec=target, force=force))
        assert _records(out.getvalue()) == [[], planned[1].records, []]
        assert _views(out.getvalue()) == _views(source_bytes)
        assert result.stats.batches == 3
