"""Builds magic v2 batches from records, as Kafka's MemoryRecordsBuilder lays them out.

Used to generate sample partitions (the demo, the benchmark) and test inputs. Reading is checked
against Kafka-written golden files and kafka-python, so this writer is never its own only reference.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from tiering.kafka.batch import (
    BASE_OFFSET_OFFSET,
    BASE_TIMESTAMP_OFFSET,
    CRC_OFFSET,
    LOG_OVERHEAD,
    MAX_TIMESTAMP_OFFSET,
    V2_HEADER,
    V2_HEADER_SIZE,
    Attr,
    crc_v2,
)
from tiering.kafka.codecs import Codec, compress
from tiering.kafka.records import Record

_CRC: Final = struct.Struct(">I")


def _varint(value: int) -> bytes:
    z = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_record(record: Record, base_offset: int, base_timestamp: int) -> bytes:
    body = bytearray(b"\x00")  # attributes
    body += _varint(record.timestamp - base_timestamp)
    body += _varint(record.offset - base_offset)
    for part in (record.key, record.value):
        if part is None:
            body += _varint(-1)
        else:
            body += _varint(len(part))
            body += part
    body += _varint(len(record.headers))
    for hk, hv in record.headers:
        body += _varint(len(hk))
        body += hk
        if hv is None:
            body += _varint(-1)
        else:
            body += _varint(len(hv))
            body += hv
    return _varint(len(body)) + bytes(body)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """Header fields of a batch to build (the defaults are a plain non-idempotent producer's)."""

    base_offset: int
    codec: Codec = Codec.NONE
    level: int | None = None
    partition_leader_epoch: int = 0
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    transactional: bool = False
    control: bool = False
    log_append_time: int | None = None  # the broker's append time, for LogAppendTime batches
    last_offset_delta: int | None = None  # defaults to the last record's delta
    delete_horizon_ms: int | None = None  # the log cleaner's stamp: the base timestamp, and the attribute bit
    max_timestamp: int | None = None  # a batch without records keeps its original's (defaults to the records')


def build_batch(spec: BatchSpec, records: Sequence[Record]) -> bytes:
    """One whole v2 batch (log overhead included) holding ``records``."""
    base_ts = records[0].timestamp if records else -1
    if spec.delete_horizon_ms is not None:
        base_ts = spec.delete_horizon_ms  # the records' timestamp deltas are taken from it
    section = b"".join(encode_record(r, spec.base_offset, base_ts) for r in records)
    return assemble_batch(spec, section, len(records), base_ts, max((r.timestamp for r in records), default=-1),
                          records[-1].offset - spec.base_offset if records else 0)


def assemble_batch(spec: BatchSpec, section: bytes | memoryview, count: int, base_timestamp: int,
                   max_timestamp: int, last_offset_delta: int) -> bytes:
    """One whole v2 batch around an uncompressed records section of ``count`` records encoded against
    ``spec.base_offset`` and ``base_timestamp``; ``max_timestamp`` and ``last_offset_delta`` are the
    records' (``spec`` overrides both where it sets them)."""
    max_ts = max_timestamp
    if spec.max_timestamp is not None:
        max_ts = spec.max_timestamp
    if spec.log_append_time is not None:
        max_ts = spec.log_append_time
    payload = bytes(section) if spec.codec is Codec.NONE else compress(spec.codec, section, level=spec.level)
    attributes = int(spec.codec)
    if spec.log_append_time is not None:
        attributes |= Attr.LOG_APPEND_TIME
    if spec.transactional:
        attributes |= Attr.TRANSACTIONAL
    if spec.control:
        attributes |= Attr.CONTROL
    if spec.delete_horizon_ms is not None:
        attributes |= Attr.DELETE_HORIZON
    last_delta = spec.last_offset_delta if spec.last_offset_delta is not None else last_offset_delta
    header = bytearray(V2_HEADER.pack(
        spec.base_offset, V2_HEADER_SIZE - LOG_OVERHEAD + len(payload), spec.partition_leader_epoch, 2, 0,
        attributes, last_delta, base_timestamp, max_ts, spec.producer_id, spec.producer_epoch, spec.base_sequence,
        count))
    batch = header + payload
    _CRC.pack_into(batch, CRC_OFFSET, crc_v2(batch))
    return bytes(batch)


_REBASE_FIELDS: Final = struct.Struct(">q")


def rebase_batch(batch: bytes | bytearray, base_offset: int, timestamp_shift: int) -> bytes:
    """A copy of a whole v2 batch moved to ``base_offset`` with both header timestamps shifted.

    Records hold only deltas, so the records section stays as it is: a cheap way to lay out many batches
    from a few encoded templates (the sample generator does this for the demo and the benchmark).
    """
    out = bytearray(batch)
    _REBASE_FIELDS.pack_into(out, BASE_OFFSET_OFFSET, base_offset)
    for pos in (BASE_TIMESTAMP_OFFSET, MAX_TIMESTAMP_OFFSET):
        (ts,) = _REBASE_FIELDS.unpack_from(out, pos)
        _REBASE_FIELDS.pack_into(out, pos, ts + timestamp_shift)
    _CRC.pack_into(out, CRC_OFFSET, crc_v2(out))
    return bytes(out)
