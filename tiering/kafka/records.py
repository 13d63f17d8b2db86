"""Records inside a batch: the v2 record layout and legacy (v0/v1) inner message sets.

Magic v2 record, inside the (decompressed) records section; varints are zigzag-encoded:

| field          | type    | notes                                         |
|----------------|---------|-----------------------------------------------|
| length         | varint  | bytes of the record after this field          |
| attributes     | int8    | unused                                        |
| timestampDelta | varlong | timestamp = baseTimestamp + delta (CreateTime) |
| offsetDelta    | varint  | offset = baseOffset + delta                   |
| keyLength      | varint  | -1 = null key                                 |
| key            | bytes   |                                               |
| valueLength    | varint  | -1 = null value (a tombstone)                 |
| value          | bytes   |                                               |
| headersCount   | varint  |                                               |
| headers        |         | keyLength varint (>= 0) + UTF-8 key,          |
|                |         | valueLength varint (-1 = null) + value        |

A legacy compressed wrapper's value decompresses to a message set of entries laid out like the
top-level ones (see batch.py). Inner offsets are absolute in v0; in v1 they are relative (0..n-1) and the
wrapper carries the absolute offset of the last one.

The hot path validates with the compiled walker (``_walker.walk_v2``); :func:`decode_v2` is the
readable reference used to print and digest records, and tests hold the two to the same verdicts.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from tiering.errors import CorruptBatchError, TieringError
from tiering.kafka import _walker
from tiering.kafka.batch import (
    INT64_MAX,
    LEGACY_ENTRY_PREFIX,
    LEGACY_MIN_MESSAGE_SIZE,
    LOG_OVERHEAD,
    V2_HEADER_SIZE,
    BatchHeader,
    TimestampType,
    crc_legacy,
    parse_legacy_header,
)
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec, decompress

_INT32: Final = struct.Struct(">i")


class Engine(StrEnum):
    """What does the record work of re-batching and key compaction: the compiled modules (records read as spans
    of the section) or the Python reference (a :class:`Record` each), which defines the outcome."""

    NATIVE = "native"
    PYTHON = "python"


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...] = ()


def _varint(buf: bytes | memoryview, pos: int, end: int, max_bytes: int, what: str, index: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(max_bytes):
        if pos + i >= end:
            raise CorruptBatchError(f"record {index}: truncated {what} varint")
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos + i + 1
        shift += 7
    raise CorruptBatchError(f"record {index}: overlong {what} varint")


def _int64(value: int) -> int:
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def decode_v2(header: BatchHeader, records: bytes | memoryview) -> list[Record]:
    """Decode an uncompressed v2 records section, with the same checks as the compiled walker."""
    buf = memoryview(records)
    end = len(buf)
    pos = 0
    out: list[Record] = []
    prev_delta = -1
    last_delta = header.last_offset - header.offset
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    while pos < end:
        i = len(out)
        length, pos = _varint(buf, pos, end, 5, "length", i)
        if length < 0 or length > end - pos:
            raise CorruptBatchError(f"record {i}: length outside the records section", expected=f"0..{end - pos}",
                                    found=length)
        rend = pos + length
        if pos >= rend:
            raise CorruptBatchError(f"record {i}: no attributes byte")
        pos += 1
        ts_delta, pos = _varint(buf, pos, rend, 10, "timestampDelta", i)
        off_delta, pos = _varint(buf, pos, rend, 5, "offsetDelta", i)
        if not prev_delta < off_delta <= last_delta:
            raise CorruptBatchError(f"record {i}: offset delta out of order or range",
                                    expected=f"in ({prev_delta}, {last_delta}]", found=off_delta)
        prev_delta = off_delta
        fields: list[bytes | None] = []
        for what in ("keyLength", "valueLength"):
            n, pos = _varint(buf, pos, rend, 5, what, i)
            if n < -1 or n > rend - pos:
                raise CorruptBatchError(f"record {i}: {what} outside the record", found=n)
            fields.append(None if n < 0 else bytes(buf[pos : pos + n]))
            pos += max(n, 0)
        count, pos = _varint(buf, pos, rend, 5, "headersCount", i)
        if count < 0 or count > rend - pos:
            raise CorruptBatchError(f"record {i}: headersCount outside the record", found=count)
        headers: list[tuple[bytes, bytes | None]] = []
        for _ in range(count):
            n, pos = _varint(buf, pos, rend, 5, "header keyLength", i)
            if n < 0 or n > rend - pos:
                raise CorruptBatchError(f"record {i}: header keyLength outside the record", found=n)
            hkey = bytes(buf[pos : pos + n])
            pos += n
            n, pos = _varint(buf, pos, rend, 5, "header valueLength", i)
            if n < -1 or n > rend - pos:
                raise CorruptBatchError(f"record {i}: header valueLength outside the record", found=n)
            headers.append((hkey, None if n < 0 else bytes(buf[pos : pos + n])))
            pos += max(n, 0)
        if pos != rend:
            raise CorruptBatchError(f"record {i}: bytes left after the last header", expected=0, found=rend - pos)
        # Java adds in int64 and wraps around; so do we (a CRC-valid batch can hold any delta).
        timestamp = header.max_timestamp if log_append else _int64(header.base_timestamp + ts_delta)
        out.append(Record(header.offset + off_delta, timestamp, fields[0], fields[1], tuple(headers)))
    if header.records_count is not None and len(out) != header.records_count:
        raise CorruptBatchError("record count differs from the header", expected=header.records_count,
                                found=len(out))
    return out


def validate_v2(header: BatchHeader, records: bytes | memoryview) -> int:
    """Deep-validate an uncompressed v2 records section with the compiled walker; returns the count."""
    assert header.records_count is not None
    return validate_v2_records(records, header.records_count, header.last_offset - header.offset)


def validate_v2_records(records: bytes | memoryview, records_count: int, last_offset_delta: int) -> int:
    """:func:`validate_v2` from the two header fields it needs; returns the count."""
    try:
        count: int = _walker.walk_v2(records, records_count, last_offset_delta)
    except ValueError as e:
        raise CorruptBatchError(str(e)) from None
    return count


# --- legacy ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    header: BatchHeader
    key: bytes | None
    value: bytes | None


def parse_legacy_message(entry: bytes | memoryview, header: BatchHeader) -> LegacyMessage:
    """Key and value of a whole legacy entry whose header was parsed (CRC not checked here)."""
    pos = header.payload_start
    fields: list[bytes | None] = []
    for what in ("keyLength", "valueLength"):
        if pos + 4 > len(entry):
            raise CorruptBatchError(f"legacy message {what} is truncated", position=header.position,
                                    base_offset=header.offset)
        (n,) = _INT32.unpack_from(entry, pos)
        pos += 4
        if n < -1 or n > len(entry) - pos:
            raise CorruptBatchError(f"legacy message {what} outside the message", position=header.position,
                                    base_offset=header.offset, expected=f"-1..{len(entry) - pos}", found=n)
        fields.append(None if n < 0 else bytes(entry[pos : pos + n]))
        pos += max(n, 0)
    if pos != len(entry):
        raise CorruptBatchError("bytes left after the legacy message value", position=header.position,
                                base_offset=header.offset, expected=0, found=len(entry) - pos)
    return LegacyMessage(header, fields[0], fields[1])


def iter_message_set(data: bytes | memoryview) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Entries of an (inner) legacy message set; positions are relative to ``data``."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        if pos + LEGACY_ENTRY_PREFIX.size > len(view):
            raise CorruptBatchError("inner message header is truncated", position=pos,
                                    expected=f"{LEGACY_ENTRY_PREFIX.size} bytes", found=len(view) - pos)
        _, size, _, magic, _ = LEGACY_ENTRY_PREFIX.unpack_from(view, pos)
        if magic not in LEGACY_MIN_MESSAGE_SIZE:
            raise CorruptBatchError("inner message magic", position=pos, expected="0 or 1", found=magic)
        if size < LEGACY_MIN_MESSAGE_SIZE[magic] or pos + LOG_OVERHEAD + size > len(view):
            raise CorruptBatchError("inner message size", position=pos,
                                    expected=f"{LEGACY_MIN_MESSAGE_SIZE[magic]}..{len(view) - pos - LOG_OVERHEAD}",
                                    found=size)
        entry = view[pos : pos + LOG_OVERHEAD + size]
        yield parse_legacy_header(entry, pos), entry
        pos += LOG_OVERHEAD + size


def wrapper_inner(header: BatchHeader, entry: bytes | memoryview, *,
                  limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> tuple[LegacyMessage, bytes]:
    """A compressed legacy wrapper's message and its decompressed value (the inner message set)."""
    message = parse_legacy_message(entry, header)
    if message.value is None:
        raise CorruptBatchError("compressed wrapper without a value", position=header.position,
                                base_offset=header.offset)
    return message, decompress(header.codec, message.value, magic=header.magic, limit=limit)


def decode_legacy(header: BatchHeader, entry: bytes | memoryview, *,
                  limit: int = DEFAULT_DECOMPRESSION_LIMIT, inner: bytes | None = None) -> list[Record]:
    """Records of a legacy entry: itself, or a compressed wrapper's inner messages with absolute offsets.

    ``inner`` is the already decompressed wrapper value, when the caller has it.
    """
    message = parse_legacy_message(entry, header)
    if header.codec is Codec.NONE:
        return [Record(header.offset, header.max_timestamp, message.key, message.value)]
    if inner is None:
        _, inner = wrapper_inner(header, entry, limit=limit)
    try:
        return _inner_records(header, inner)
    except TieringError as e:
        raise e.inside("inner message set", position=header.position, base_offset=header.offset) from None


def _inner_records(header: BatchHeader, inner: bytes) -> list[Record]:
    """Records of a wrapper's inner message set; errors name the inner byte (the caller adds the wrapper)."""
    entries = list(iter_message_set(inner))
    if not entries:
        raise CorruptBatchError("compressed wrapper holds no message", expected=">= 1 inner message", found=0)
    last_inner = entries[-1][0].offset
    out: list[Record] = []
    prev = None
    for ih, ientry in entries:
        at = ih.position
        if ih.magic != header.magic:
            raise CorruptBatchError("inner magic differs from the wrapper's", position=at, expected=header.magic,
                                    found=ih.magic)
        if ih.codec is not Codec.NONE:
            raise CorruptBatchError("nested compression", position=at, expected="none", found=ih.codec.label)
        computed = crc_legacy(ientry)
        if computed != ih.crc:
            raise CorruptBatchError("CRC mismatch", position=at, expected=f"stored crc {ih.crc}",
                                    found=f"computed {computed}")
        offset = ih.offset if header.magic == 0 else header.offset - last_inner + ih.offset
        if not 0 <= offset <= INT64_MAX:
            raise CorruptBatchError("inner offset outside 0..2^63-1", position=at, found=offset)
        if prev is not None and offset <= prev:
            raise CorruptBatchError("offsets not increasing", position=at, expected=f"> {prev}", found=offset)
        prev = offset
        msg = parse_legacy_message(ientry, ih)
        ts = header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else ih.max_timestamp
        out.append(Record(offset, ts, msg.key, msg.value))
    if out[-1].offset != header.offset:
        raise CorruptBatchError("wrapper offset is not its last inner message's offset", expected=header.offset,
                                found=out[-1].offset)
    return out


def records_section(entry: bytes | memoryview) -> memoryview:
    """The (possibly compressed) records section of a v2 batch."""
    return memoryview(entry)[V2_HEADER_SIZE:]
