"""The compiled walker (``_walker.walk_v2`` behind ``records.validate_v2``) and the pure-Python ``decode_v2`` must
reach the same verdict on every records section: valid ones, hand-made invalid ones, and fuzzed ones."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tiering.errors import CorruptBatchError
from tiering.kafka import _walker
from tiering.kafka.batch import V2_HEADER_SIZE, BatchHeader, parse_v2_header
from tiering.kafka.builder import BatchSpec, build_batch, encode_record
from tiering.kafka.records import Record, decode_v2, validate_v2

BASE_OFFSET = 1000
BASE_TS = 1_700_000_000_000


def _header(records_count: int, last_offset_delta: int) -> BatchHeader:
    """A parsed v2 header with the given count and lastOffsetDelta (nothing else matters to the walker)."""
    h = parse_v2_header(build_batch(BatchSpec(BASE_OFFSET), [Record(BASE_OFFSET, BASE_TS, None, None)]), 0)
    return h._replace(records_count=records_count, last_offset=BASE_OFFSET + last_offset_delta)


def _verdict_walker(h: BatchHeader, section: bytes) -> int | None:
    try:
        return validate_v2(h, section)
    except CorruptBatchError:
        return None


def _verdict_reference(h: BatchHeader, section: bytes) -> int | None:
    try:
        return len(decode_v2(h, section))
    except CorruptBatchError:
        return None


def _walk(section: bytes, count: int, last_delta: int, fast: bool) -> tuple[str, int | str]:
    try:
        return "accepted", _walker.walk_v2(section, count, last_delta, fast)
    except ValueError as e:
        return "rejected", str(e)


def _fast_same_as_careful(h: BatchHeader, section: bytes) -> None:
    """The fast walk, then the careful one from where it stopped, ends as the careful walk alone does: the same
    count, or the same message (record, position, what is wrong)."""
    assert h.records_count is not None
    last_delta = h.last_offset - h.offset
    assert _walk(section, h.records_count, last_delta, True) == _walk(section, h.records_count, last_delta, False)


def _same_verdict(h: BatchHeader, section: bytes) -> int | None:
    _fast_same_as_careful(h, section)
    walker = _verdict_walker(h, section)
    reference = _verdict_reference(h, section)
    assert walker == reference, f"walker {walker} vs reference {reference} on {section.hex()} ({h.records_count=})"
    event("rejected" if walker is None else "accepted")
    return walker


def _both_reject(h: BatchHeader, section: bytes) -> None:
    with pytest.raises(CorruptBatchError) as walker:
        validate_v2(h, section)
    with pytest.raises(CorruptBatchError):
        decode_v2(h, section)
    assert "record" in str(walker.value)


def _both_accept(h: BatchHeader, section: bytes, count: int) -> list[Record]:
    assert validate_v2(h, section) == count
    decoded = decode_v2(h, section)
    assert len(decoded) == count
    return decoded


# --- raw encoding helpers (independent of the builder) ----------------------------------------------


def uvarint(z: int) -> bytes:
    out = bytearray()
    while True:
        if z < 0x80:
            out.append(z)
            return bytes(out)
        out.append(z & 0x7F | 0x80)
        z >>= 7


def varint(v: int) -> bytes:
    return uvarint((v << 1) ^ (v >> 63) if v < 0 else v << 1)


def field_bytes(b: bytes | None) -> bytes:
    return varint(-1) if b is None else varint(len(b)) + b


def body(*, ts: bytes = b"\x00", off: bytes = b"\x00", key: bytes = b"\x01", value: bytes = b"\x01",
         headers: bytes = b"\x00", attributes: bytes = b"\x00") -> bytes:
    """A record body (everything after the length varint) from raw field bytes; defaults: null key and value."""
    return attributes + ts + off + key + value + headers


def rec(b: bytes) -> bytes:
    return varint(len(b)) + b


def offs(*deltas: int) -> bytes:
    return b"".join(rec(body(off=varint(d))) for d in deltas)


# --- valid sections -------------------------------------------------------------------------------

_bytes_or_none = st.one_of(st.none(), st.binary(max_size=40))
_headers = st.lists(st.tuples(st.binary(max_size=10), _bytes_or_none), max_size=3).map(tuple)


@st.composite
def _records(draw: st.DrawFn, max_records: int = 8) -> tuple[BatchSpec, list[Record]]:
    n = draw(st.integers(0, max_records))
    gaps = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    records = []
    offset = BASE_OFFSET + draw(st.integers(0, 2))
    for gap in gaps:
        offset += gap
        ts = BASE_TS + draw(st.integers(-(2**40), 2**40))
        records.append(Record(offset, ts, draw(_bytes_or_none), draw(_bytes_or_none), draw(_headers)))
        offset += 1
    last = records[-1].offset - BASE_OFFSET if records else 0
    spec = BatchSpec(BASE_OFFSET, last_offset_delta=last + draw(st.integers(0, 3)),
                     log_append_time=draw(st.one_of(st.none(), st.just(BASE_TS + 5))))
    return spec, records


def _section(spec: BatchSpec, records: Sequence[Record]) -> tuple[BatchHeader, bytes]:
    batch = build_batch(spec, records)
    return parse_v2_header(batch, 0), batch[V2_HEADER_SIZE:]


@settings(max_examples=200, deadline=None)
@given(_records())
def test_valid_sections_are_accepted_by_both(case: tuple[BatchSpec, list[Record]]) -> None:
    spec, records = case
    h, section = _section(spec, records)
    decoded = _both_accept(h, section, len(records))
    expected = records
    if spec.log_append_time is not None:
        expected = [dataclasses.replace(r, timestamp=spec.log_append_time) for r in records]
    assert decoded == expected


# --- fuzzed sections ------------------------------------------------------------------------------

_mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1, exclude_max=True), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True), st.just(0)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=6)),
    st.tuples(st.just("delete"), st.floats(0, 1, exclude_max=True), st.integers(1, 6)),
    st.tuples(st.just("set"), st.floats(0, 1, exclude_max=True), st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF])),
)


def _mutate(section: bytes, mutations: Sequence[tuple[str, float, object]]) -> bytes:
    out = bytearray(section)
    for kind, where, arg in mutations:
        if not out and kind != "insert":
            continue
        i = int(where * len(out)) if kind != "insert" else int(where * (len(out) + 1))
        i = min(i, len(out) - (kind != "insert"))
        if kind == "flip":
            assert isinstance(arg, int)
            out[i] ^= arg
        elif kind == "set":
            assert isinstance(arg, int)
            out[i] = arg
        elif kind == "truncate":
            del out[i:]
        elif kind == "insert":
            assert isinstance(arg, bytes)
            out[i:i] = arg
        else:
            assert isinstance(arg, int)
            del out[i : i + arg]
    return bytes(out)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_records(max_records=5), mutations=st.lists(_mutation, min_size=1, max_size=3),
       count_shift=st.sampled_from([0, 0, 0, -1, 1]), delta_shift=st.sampled_from([0, 0, 0, -1, 1, 5]))
def test_mutated_sections_get_the_same_verdict(case: tuple[BatchSpec, list[Record]],
                                               mutations: list[tuple[str, float, object]],
                                               count_shift: int, delta_shift: int) -> None:
    spec, records = case
    h, section = _section(spec, records)
    last_delta = h.last_offset - h.offset
    h = _header(max(0, len(records) + count_shift), max(0, last_delta + delta_shift))
    _same_verdict(h, _mutate(section, mutations))


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64), count=st.integers(0, 4), last_delta=st.integers(0, 10))
def test_random_bytes_get_the_same_verdict(data: bytes, count: int, last_delta: int) -> None:
    _same_verdict(_header(count, last_delta), data)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-3, 12), st.integers(-3, 12), st.integers(-3, 4), st.binary(max_size=4)),
                max_size=4), st.integers(0, 5), st.integers(0, 10))
def test_structured_fuzz_gets_the_same_verdict(fields: list[tuple[int, int, int, bytes]], count: int,
                                               last_delta: int) -> None:
    """Records with arbitrary (often lying) offset deltas, key lengths and header counts."""
    section = b""
    for off, key_len, headers, tail in fields:
        section += rec(body(off=varint(off), key=varint(key_len) + b"k" * max(key_len, 0), headers=varint(headers))
                       + tail)
    _same_verdict(_header(count, last_delta), section)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_records(max_records=30), mutations=st.lists(_mutation, max_size=2))
def test_fast_walk_hands_over_exactly(case: tuple[BatchSpec, list[Record]],
                                      mutations: list[tuple[str, float, object]]) -> None:
    """Longer sections, intact or mutated: wherever the fast walk stops, the careful one takes over to the same
    end as alone."""
    spec, records = case
    h, section = _section(spec, records)
    _fast_same_as_careful(h, _mutate(section, mutations))


_key_or_none = st.one_of(st.none(), st.binary(max_size=5))


@st.composite
def _loose_record(draw: st.DrawFn) -> bytes:
    """A record whose fields are often well formed and sometimes lie (lengths, counts, order, trailing bytes),
    with timestamp deltas of one to six varint bytes: the shapes the fast walk takes and the ones it hands over."""
    parts = [varint(draw(st.sampled_from([0, 1, -1, 300, -70_000, 2**20, 2**40]))), varint(draw(st.integers(-2, 12)))]
    for _ in range(2):  # key, value
        if draw(st.booleans()):
            parts.append(field_bytes(draw(_key_or_none)))
        else:
            parts.append(varint(draw(st.integers(-3, 6))) + draw(st.binary(max_size=4)))
    headers = draw(st.lists(st.tuples(st.binary(max_size=3), _key_or_none), max_size=2))
    parts.append(varint(len(headers) if draw(st.booleans()) else draw(st.integers(-2, 3))))
    parts += [field_bytes(key) + field_bytes(value) for key, value in headers]
    if draw(st.integers(0, 4)) == 0:
        parts.append(draw(st.binary(min_size=1, max_size=3)))
    return rec(b"\x00" + b"".join(parts))


@settings(max_examples=500, deadline=None)
@given(st.lists(_loose_record(), max_size=10), st.integers(0, 12), st.integers(0, 14))
def test_fast_walk_on_loose_records(records: list[bytes], count: int, last_delta: int) -> None:
    section = b"".join(records)
    for declared in (len(records), count):
        _same_verdict(_header(declared, last_delta), section)


def test_fast_walk_takes_every_ordinary_record_but_the_last() -> None:
    """Ordinary records (short varints) all go the fast way but the last, which has nothing readable after it;
    a record with a long varint (a timestamp delta of four bytes) hands over to the careful walk there."""
    records = [Record(BASE_OFFSET + i, BASE_TS + i, b"key", b"v" * 200, ((b"h%d" % i, b"x"),)) for i in range(20)]
    h, section = _section(BatchSpec(BASE_OFFSET), records)
    sizes = [len(encode_record(r, BASE_OFFSET, BASE_TS)) for r in records]
    assert _walker.fast_prefix(section, 19) == (sum(sizes[:-1]), 19)
    assert validate_v2(h, section) == 20
    late = [*records[:7], dataclasses.replace(records[7], timestamp=BASE_TS + 2**30), *records[8:]]
    h, section = _section(BatchSpec(BASE_OFFSET), late)
    assert _walker.fast_prefix(section, 19) == (sum(sizes[:7]), 7)
    assert validate_v2(h, section) == 20


# --- hand-made cases ------------------------------------------------------------------------------


def test_empty_section() -> None:
    _both_accept(_header(0, 0), b"", 0)
    _both_reject(_header(1, 0), b"")


def test_builder_records_decode_field_by_field() -> None:
    records = [
        Record(BASE_OFFSET, BASE_TS, None, b""),
        Record(BASE_OFFSET + 2, BASE_TS - 5, b"", None, ((b"h", None), (b"", b""), (b"k\x00", b"\xff" * 300))),
        Record(BASE_OFFSET + 3, BASE_TS + 2**50, b"\x00" * 200, b"v"),
    ]
    h, section = _section(BatchSpec(BASE_OFFSET), records)
    assert _both_accept(h, section, 3) == records


def test_longest_well_formed_varints_are_accepted() -> None:
    """5 bytes for a varint, 10 for a varlong (timestampDelta)."""
    ts = b"\xff" * 9 + b"\x01"  # zigzag 2**64 - 1: delta -2**63
    off = uvarint(2 * 0x7FFFFFFF)  # 5 bytes
    assert len(off) == 5
    section = rec(body(ts=ts, off=off))
    _both_accept(_header(1, 0x7FFFFFFF), section, 1)
    padded = rec(body(off=b"\x80\x80\x80\x80\x00"))  # 0, written in 5 bytes: allowed
    _both_accept(_header(1, 0), padded, 1)


@pytest.mark.parametrize("section", [
    pytest.param(b"\x80\x80\x80\x80\x80\x00" + body(), id="length-6-bytes"),
    pytest.param(rec(body(off=b"\x80\x80\x80\x80\x80\x00")), id="offsetDelta-6-bytes"),
    pytest.param(rec(body(ts=b"\x80" * 10 + b"\x00")), id="timestampDelta-11-bytes"),
    pytest.param(rec(body(key=b"\x80\x80\x80\x80\x80\x00")), id="keyLength-6-bytes"),
    pytest.param(rec(body(value=b"\x80\x80\x80\x80\x80\x00")), id="valueLength-6-bytes"),
    pytest.param(rec(body(headers=b"\x80\x80\x80\x80\x80\x00")), id="headersCount-6-bytes"),
    pytest.param(rec(body(headers=b"\x02" + b"\x80\x80\x80\x80\x80\x00" + b"\x01")), id="headerKey-6-bytes"),
    pytest.param(rec(body(headers=b"\x02\x00" + b"\x80\x80\x80\x80\x80\x00")), id="headerValue-6-bytes"),
])
def test_overlong_varints(section: bytes) -> None:
    _both_reject(_header(1, 0), section)


@pytest.mark.parametrize("section", [
    pytest.param(b"\x80", id="length"),
    pytest.param(rec(b"\x00"), id="timestampDelta-missing"),
    pytest.param(varint(2) + b"\x00\x80", id="timestampDelta-cut-by-record-length"),
    pytest.param(rec(b"\x00\x00"), id="offsetDelta-missing"),
    pytest.param(rec(b"\x00\x00\x00\x01"), id="headersCount-missing"),
    pytest.param(rec(b"\x00\x00\x00\x01\x01\x02"), id="headers-missing"),
])
def test_truncated_varints(section: bytes) -> None:
    _both_reject(_header(1, 0), section)


@pytest.mark.parametrize("section", [
    pytest.param(varint(-1) + body(), id="length-negative"),
    pytest.param(varint(-2) + body(), id="length-minus-2"),
    pytest.param(varint(0), id="length-zero-no-attributes"),
    pytest.param(varint(len(body()) + 1) + body(), id="length-past-the-section"),
    pytest.param(varint(2**31) + body(), id="length-huge"),
    pytest.param(rec(body(key=varint(-2))), id="keyLength-minus-2"),
    pytest.param(rec(body(value=varint(-2))), id="valueLength-minus-2"),
    pytest.param(rec(body(key=varint(-(2**31)))), id="keyLength-int-min"),
    pytest.param(rec(body(key=varint(2), value=b"")) + b"x", id="key-past-the-record"),
    pytest.param(rec(body(value=varint(5) + b"abcd", headers=b"")), id="value-past-the-record"),
    pytest.param(rec(body(headers=varint(-1))), id="headersCount-negative"),
    pytest.param(rec(body(headers=varint(3) + varint(0) + varint(0))), id="headersCount-more-than-present"),
    pytest.param(rec(body(headers=varint(1) + varint(-1) + varint(0))), id="headerKey-null"),
    pytest.param(rec(body(headers=varint(1) + varint(-2) + varint(0))), id="headerKey-minus-2"),
    pytest.param(rec(body(headers=varint(1) + varint(0) + varint(-2))), id="headerValue-minus-2"),
    pytest.param(rec(body(headers=varint(1) + varint(4) + b"ab")), id="headerKey-past-the-record"),
    pytest.param(rec(body(headers=varint(1) + varint(0) + varint(3) + b"a")), id="headerValue-past-the-record"),
])
def test_lengths_outside_the_record(section: bytes) -> None:
    _both_reject(_header(1, 0), section)


def test_null_and_empty_lengths_are_accepted() -> None:
    section = rec(body(key=varint(-1), value=varint(0), headers=varint(2) + varint(0) + varint(-1) + varint(1)
                       + b"k" + varint(0)))
    (record,) = _both_accept(_header(1, 0), section, 1)
    assert (record.key, record.value, record.headers) == (None, b"", ((b"", None), (b"k", b"")))


@pytest.mark.parametrize(("deltas", "last_delta"), [
    pytest.param((0, 0), 5, id="repeated"),
    pytest.param((2, 1), 5, id="decreasing"),
    pytest.param((-1,), 5, id="negative"),
    pytest.param((0, 6), 5, id="beyond-lastOffsetDelta"),
    pytest.param((3,), 2, id="first-beyond-lastOffsetDelta"),
    pytest.param((0, 2**31), 2**31 - 1, id="beyond-int32"),
])
def test_offset_deltas_out_of_order_or_range(deltas: tuple[int, ...], last_delta: int) -> None:
    _both_reject(_header(len(deltas), last_delta), offs(*deltas))


@pytest.mark.parametrize(("deltas", "last_delta"), [
    ((0, 1, 2), 2), ((3, 7), 7), ((5,), 9), ((0, 2**31 - 2), 2**31 - 1),
])
def test_offset_deltas_with_gaps_are_accepted(deltas: tuple[int, ...], last_delta: int) -> None:
    records = _both_accept(_header(len(deltas), last_delta), offs(*deltas), len(deltas))
    assert [r.offset - BASE_OFFSET for r in records] == list(deltas)


@pytest.mark.parametrize(("present", "declared"), [(2, 3), (2, 1), (2, 0), (0, 1), (1, 2**31 - 1)])
def test_record_count_mismatch(present: int, declared: int) -> None:
    _both_reject(_header(declared, 10), offs(*range(present)))


@pytest.mark.parametrize("section", [
    pytest.param(offs(0) + b"\x00", id="one-zero-byte-after-the-last-record"),
    pytest.param(offs(0) + varint(1) + b"\x00", id="a-record-of-only-attributes"),
    pytest.param(rec(body() + b"\x00"), id="bytes-left-in-the-record"),
    pytest.param(rec(body(headers=varint(1) + varint(0) + varint(0)) + b"junk"), id="bytes-after-the-last-header"),
])
def test_trailing_bytes(section: bytes) -> None:
    _both_reject(_header(1, 5), section)


def test_walker_error_names_the_record_and_position() -> None:
    section = offs(0, 1) + rec(body(off=varint(2), key=varint(-2)))
    with pytest.raises(CorruptBatchError) as info:
        validate_v2(_header(3, 5), section)
    assert "record 2" in str(info.value)
    assert "keyLength" in str(info.value)
    assert f"records byte {len(offs(0, 1))}" in str(info.value)
    with pytest.raises(CorruptBatchError, match="record 2"):
        decode_v2(_header(3, 5), section)


def test_walker_accepts_memoryview_and_bytearray() -> None:
    spec = BatchSpec(BASE_OFFSET)
    records = [Record(BASE_OFFSET + i, BASE_TS + i, b"k%d" % i, b"v" * i) for i in range(10)]
    h, section = _section(spec, records)
    assert validate_v2(h, memoryview(section)) == 10
    assert validate_v2(h, bytearray(section)) == 10
    assert validate_v2(h, memoryview(b"xx" + section)[2:]) == 10


def test_encode_record_matches_hand_encoding() -> None:
    """The builder (used to make test input elsewhere) lays out a record as the format says."""
    r = Record(BASE_OFFSET + 3, BASE_TS - 1, b"key", None, ((b"h", b"v"), (b"n", None)))
    expected = rec(b"\x00" + varint(-1) + varint(3) + field_bytes(b"key") + field_bytes(None) + varint(2)
                   + field_bytes(b"h") + field_bytes(b"v") + field_bytes(b"n") + field_bytes(None))
    assert encode_record(r, BASE_OFFSET, BASE_TS) == expected
