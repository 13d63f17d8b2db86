"""The compiled record layer (tiering/kafka/_records.c) against its Python reference, on records sections
written byte by byte here rather than by the project's builder: non-minimal varints, record attributes that
are not zero, timestamp deltas at the ends of int64 (10-byte varlongs, bits past the 64th), offsets near
int64's end, null and empty keys, values and headers, and broken records with a valid CRC. Both re-batching
engines must write the same bytes and say the same, or raise the same error."""

from __future__ import annotations

import io
import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka.passes import rebatch_segment
from tiering.errors import TieringError
from tiering.kafka import _records
from tiering.kafka.batch import CRC_OFFSET, LOG_OVERHEAD, V2_HEADER, V2_HEADER_SIZE, Attr, crc_v2
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import iter_batches
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.records import Engine, decode_v2
from tiering.kafka.segment import DecodedBatch, Digests

INT64 = (-(1 << 63), (1 << 63) - 1)


def varint(value: int, width: int = 0) -> bytes:
    """A zigzag varint of ``value`` (a 64-bit value's zigzag), padded with continuation bytes to ``width``."""
    z = ((value << 1) ^ (value >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while True:
        out.append(z & 0x7F)
        z >>= 7
        if not z:
            break
    while len(out) < width:
        out.append(0)
    for i in range(len(out) - 1):
        out[i] |= 0x80
    return bytes(out)


@st.composite
def field(draw: Any, value: int, max_width: int) -> bytes:
    return varint(value, draw(st.integers(0, max_width)))


@st.composite
def blob(draw: Any, nullable: bool = True) -> bytes:
    data = draw(st.one_of(st.none(), st.binary(max_size=12)) if nullable else st.binary(max_size=12))
    if data is None:
        return draw(field(-1, 5))
    return draw(field(len(data), 5)) + data


@st.composite
def record(draw: Any, offset_delta: int) -> bytes:
    body = bytes([draw(st.sampled_from([0, 0, 0, 1, 0x80, 0xFF]))])  # attributes: unused, kept as Kafka does
    ts = draw(st.one_of(st.integers(-1000, 1000), st.integers(*INT64)))
    if draw(st.integers(0, 19)) == 0:  # a 10-byte varlong with bits past the 64th
        raw = varint(ts, 10)
        body += raw[:9] + bytes([draw(st.integers(2, 0x7F))])
    else:
        body += draw(field(ts, 10))
    body += draw(field(offset_delta, 5)) + draw(blob()) + draw(blob())
    headers = draw(st.lists(st.tuples(blob(nullable=False), blob()), max_size=3))
    body += draw(field(len(headers), 5)) + b"".join(k + v for k, v in headers)
    return draw(field(len(body), 5)) + body


@st.composite
def batch(draw: Any, base_offset: int) -> bytes:
    n = draw(st.integers(0, 4))
    deltas = sorted(draw(st.sets(st.integers(0, 40), min_size=n, max_size=n)))
    section = b"".join(draw(record(d)) for d in deltas)
    if draw(st.integers(0, 9)) == 0 and section:  # damaged after the CRC was taken: a producer's bug
        at = draw(st.integers(0, len(section) - 1))
        section = section[:at] + bytes([section[at] ^ draw(st.integers(1, 255))]) + section[at + 1:]
    last_delta = (deltas[-1] if deltas else 0) + draw(st.integers(0, 2))
    attributes = int(Attr.LOG_APPEND_TIME) if draw(st.booleans()) else 0
    base_ts, max_ts = draw(st.integers(*INT64)), draw(st.integers(*INT64))
    header = bytearray(V2_HEADER.pack(base_offset, V2_HEADER_SIZE - LOG_OVERHEAD + len(section), 0, 2, 0, attributes,
                                      last_delta, base_ts, max_ts, -1, -1, -1, n))
    data = header + section
    struct.pack_into(">I", data, CRC_OFFSET, crc_v2(data))
    return bytes(data)


@st.composite
def segment(draw: Any) -> bytes:
    offset = draw(st.one_of(st.integers(0, 1000), st.integers((1 << 63) - 400, (1 << 63) - 300)))
    out = b""
    for _ in range(draw(st.integers(1, 6))):
        b = draw(batch(offset))
        out += b
        offset += struct.unpack_from(">i", b, 23)[0] + 1 + draw(st.integers(0, 3))
    return out


def _outcome(data: bytes, engine: Engine) -> tuple[str, Any]:
    out = io.BytesIO()
    try:
        stats = rebatch_segment(io.BytesIO(data), out, RebatchOptions(Codec.NONE, engine=engine), path="t-0/0.log")
    except (TieringError, OverflowError, struct.error) as e:  # what the reference raises, the native must too
        return "error", (type(e).__name__, str(e))
    return "ok", (out.getvalue(), stats.to_json())


@settings(max_examples=400, deadline=None)
@given(segment())
def test_both_engines_write_the_same_bytes_or_raise_the_same_error(data: bytes) -> None:
    assert _outcome(data, Engine.NATIVE) == _outcome(data, Engine.PYTHON)


@settings(max_examples=300, deadline=None)
@given(segment())
def test_the_digest_input_is_what_the_reference_hashes_or_none_where_it_does_not_vouch(data: bytes) -> None:
    """For every batch, digest_v2 gives exactly the bytes Digests feeds SHA-256 for the decoded records; where
    it answers None (broken records, or a timestamp varlong wider than 64 bits), the reference either
    rejects the batch or reads the bits Java would drop."""
    for raw in iter_batches(io.BytesIO(data)):
        h = raw.header
        section = raw.data[V2_HEADER_SIZE:]
        log_append = bool(h.attributes & Attr.LOG_APPEND_TIME)
        encoded = _records.digest_v2(section, h.offset, h.max_timestamp if log_append else h.base_timestamp,
                                     log_append, h.records_count, h.last_offset - h.offset)
        try:
            records = decode_v2(h, section)
            reference = Digests()
            reference.update(DecodedBatch(raw, records, len(section)))
        except TieringError:
            assert encoded is None
            continue
        if encoded is None:
            assert _has_wide_varlong(bytes(section))
            continue
        mine = Digests()
        mine.update_encoded(h, len(records), encoded)
        assert mine.records_sha256 == reference.records_sha256
        assert mine.batches_sha256 == reference.batches_sha256


def _has_wide_varlong(section: bytes) -> bool:
    """Whether nine continuation bytes are followed by a last byte holding bits past the 64th."""
    return any(all(b & 0x80 for b in section[i:i + 9]) and 2 <= section[i + 9] < 0x80
               for i in range(len(section) - 9))


def test_merge_answers_none_where_the_offsets_leave_int64_or_int32() -> None:
    body = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(-1) + varint(0)
    section = varint(len(body)) + body
    assert _records.merge_v2([section], [((1 << 63) - 1, 0, 0)], False, (1 << 63) - 1) is not None
    assert _records.merge_v2([section, section], [((1 << 63) - 1, 0, 0), (0, 0, 0)], False, (1 << 63) - 1) is None
    assert _records.merge_v2([section, section], [(0, 0, 0), (1 << 31, 0, 0)], False, 0) is None
    merged = _records.merge_v2([section, section], [(0, 5, 0), ((1 << 31) - 1, 7, 0)], False, 0)
    assert merged is not None
    assert merged[1:] == (2, 5, 7)


def test_a_batch_of_another_engine_is_merged_by_the_reference() -> None:
    """A group holding a batch the compiled engine did not vouch for (a 10-byte timestamp with bits past the
    64th, valid to the reference) is merged by the reference, the same as the Python engine does."""
    wide = varint(5, 10)
    body = b"\x00" + wide[:9] + b"\x02" + varint(0) + varint(-1) + varint(1) + b"v" + varint(0)
    section = varint(len(body)) + body
    plain = b"\x00" + varint(0) + varint(0) + varint(-1) + varint(1) + b"w" + varint(0)
    plain_section = varint(len(plain)) + plain
    data = b""
    for offset, sec in ((0, plain_section), (1, section), (2, plain_section)):
        header = bytearray(V2_HEADER.pack(offset, V2_HEADER_SIZE - LOG_OVERHEAD + len(sec), 0, 2, 0, 0, 0, 100, 100,
                                          -1, -1, -1, 1))
        whole = header + sec
        struct.pack_into(">I", whole, CRC_OFFSET, crc_v2(whole))
        data += bytes(whole)
    native, python = _outcome(data, Engine.NATIVE), _outcome(data, Engine.PYTHON)
    assert native == python
    assert native[0] == "ok"
    assert native[1][1]["runs_merged"] == 1
