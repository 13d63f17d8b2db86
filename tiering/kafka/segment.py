"""Whole-segment reading: decode batches for people (dump), digest them for comparison, verify a segment.

The two digests are the ones defined by the golden MANIFEST, so they can be compared with any other
implementation (Kafka's own Java reader produced the MANIFEST):

- ``records_sha256``: per record in file order: int64 offset | int64 timestamp | int32 keyLen (-1 null) |
  key | int32 valueLen (-1 null) | value | int32 headerCount | per header int32 keyLen | key |
  int32 valueLen (-1 null) | value;
- ``batches_sha256``: per batch (each uncompressed legacy message is its own batch): int64 baseOffset |
  int64 lastOffset | int8 magic | int8 timestampType | int64 maxTimestamp | int64 producerId |
  int16 producerEpoch | int32 baseSequence | int8 isTransactional | int8 isControl |
  int32 partitionLeaderEpoch | int8 hasDeleteHorizon | int64 deleteHorizonMs (-1) | int32 records.

Both leave out codecs, sizes, CRCs and positions, so a recompression that keeps batches keeps them.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Final

from tiering.errors import CorruptBatchError, TieringError
from tiering.kafka.batch import (
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    LOG_APPEND_TIME_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
)
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec, decompress
from tiering.kafka.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    BatchPosition,
    IndexProblem,
    build_indexes,
    verify_offset_index,
    verify_time_index,
)
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.records import Record, decode_legacy, decode_v2, records_section, validate_v2, wrapper_inner

_QQ: Final = struct.Struct(">qq")
_I: Final = struct.Struct(">i")
_NULL: Final = _I.pack(-1)
_BATCH_DIGEST: Final = struct.Struct(">qqbbqqhibbibqi")
CONTROL_TYPES: Final = {0: "ABORT", 1: "COMMIT"}
MAX_RELATIVE_OFFSET: Final = 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    raw: RawBatch
    records: list[Record]
    uncompressed_bytes: int  # the records section after decompression (legacy: the inner set, or the entry)

    @property
    def header(self) -> BatchHeader:
        return self.raw.header

    @property
    def record_count(self) -> int:
        return len(self.records)

    @property
    def base_offset(self) -> int:
        """Kafka's baseOffset(): a legacy wrapper's is its first inner message's offset."""
        h = self.header
        if h.magic < 2 and self.records:
            return self.records[0].offset
        return h.offset

    @property
    def control_type(self) -> str | None:
        if not self.header.is_control or not self.records or self.records[0].key is None:
            return None
        key = self.records[0].key
        if len(key) < 4:
            return "UNKNOWN"
        return CONTROL_TYPES.get(struct.unpack_from(">h", key, 2)[0], "UNKNOWN")

    def to_json(self) -> dict[str, object]:
        """The batch as the golden ``batches/*.jsonl`` files describe it."""
        h = self.header
        offsets = [r.offset for r in self.records]
        ts = [r.timestamp for r in self.records]
        return {
            "type": "batch",
            "position": h.position,
            "size": h.size,
            "base_offset": self.base_offset,
            "last_offset": h.last_offset,
            "magic": h.magic,
            "codec": h.codec.label,
            "timestamp_type": h.timestamp_type.label,
            "max_timestamp": h.max_timestamp,
            "producer_id": h.producer_id,
            "producer_epoch": h.producer_epoch,
            "base_sequence": h.base_sequence,
            "is_transactional": h.is_transactional,
            "is_control": h.is_control,
            "partition_leader_epoch": h.partition_leader_epoch,
            "crc": h.crc,
            "delete_horizon_ms": h.delete_horizon_ms,
            "header_record_count": h.records_count,
            "record_count": len(self.records),
            "first_record_offset": offsets[0] if offsets else None,
            "last_record_offset": offsets[-1] if offsets else None,
            "control_type": self.control_type,
            "records_out_of_order_ts": any(b < a for a, b in itertools.pairwise(ts)),
            # records leave holes in [baseOffset, lastOffset] (compaction, or offsets skipped by a producer)
            "offset_gaps": bool(offsets) and len(offsets) != h.last_offset - self.base_offset + 1,
        }


def payload_of(raw: RawBatch, limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> bytes | memoryview:
    """The uncompressed records section of a v2 batch."""
    section = records_section(raw.data)
    if raw.header.codec is Codec.NONE:
        return section
    return decompress(raw.header.codec, section, magic=raw.header.magic, limit=limit)


def decode_batch(raw: RawBatch, *, limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> DecodedBatch:
    h = raw.header
    try:
        if h.magic >= 2:
            payload = payload_of(raw, limit)
            return DecodedBatch(raw, decode_v2(h, payload), len(payload))
        if h.codec is Codec.NONE:
            return DecodedBatch(raw, decode_legacy(h, raw.data), len(raw.data))
        _, inner = wrapper_inner(h, raw.data, limit=limit)
        return DecodedBatch(raw, decode_legacy(h, raw.data, inner=inner), len(inner))
    except TieringError as e:
        raise e.located(position=h.position, base_offset=h.offset) from None


def encoded_records(records: Iterable[Record]) -> bytes:
    """What ``records_sha256`` hashes for ``records`` (see the module docstring)."""
    parts: list[bytes] = []
    put = parts.append
    for r in records:
        put(_QQ.pack(r.offset, r.timestamp))
        for part in (r.key, r.value):
            if part is None:
                put(_NULL)
            else:
                put(_I.pack(len(part)))
                put(part)
        put(_I.pack(len(r.headers)))
        for hk, hv in r.headers:
            put(_I.pack(len(hk)))
            put(hk)
            if hv is None:
                put(_NULL)
            else:
                put(_I.pack(len(hv)))
                put(hv)
    return b"".join(parts)


@dataclass
class Digests:
    """Running records_sha256 and batches_sha256 (see the module docstring)."""

    _records: hashlib._Hash = field(default_factory=hashlib.sha256)
    _batches: hashlib._Hash = field(default_factory=hashlib.sha256)

    def update_batch(self, h: BatchHeader, base_offset: int, records: int) -> None:
        """A batch's part of ``batches_sha256`` (``base_offset``: its first record's offset)."""
        if h.magic >= 2:  # the flags from the attributes at once (BatchHeader's properties, per batch, cost)
            a = h.attributes
            horizon = (a & DELETE_HORIZON_BIT) > 0
            self._batches.update(_BATCH_DIGEST.pack(
                base_offset, h.last_offset, h.magic, (a & LOG_APPEND_TIME_BIT) > 0, h.max_timestamp,
                h.producer_id, h.producer_epoch, h.base_sequence, (a & TRANSACTIONAL_BIT) > 0,
                (a & CONTROL_BIT) > 0, h.partition_leader_epoch, horizon, h.base_timestamp if horizon else -1,
                records))
            return
        self._batches.update(_BATCH_DIGEST.pack(
            base_offset, h.last_offset, h.magic, h.timestamp_type.value, h.max_timestamp, h.producer_id,
            h.producer_epoch, h.base_sequence, False, False, h.partition_leader_epoch, False, -1, records))

    def update_records(self, encoded: bytes | memoryview) -> None:
        """Records' part of ``records_sha256``, as :func:`encoded_records` (or ``_records.digest_v2``) gives it."""
        self._records.update(encoded)

    def update_encoded(self, h: BatchHeader, records: int, encoded: bytes) -> None:
        """A v2 batch whose records ``encoded`` holds as :meth:`update` would feed them (``_records.digest_v2``)."""
        self.update_batch(h, h.offset, records)
        self._records.update(encoded)

    def update(self, batch: DecodedBatch) -> None:
        self.update_batch(batch.header, batch.base_offset, len(batch.records))
        self._records.update(encoded_records(batch.records))

    @property
    def records_sha256(self) -> str:
        return self._records.hexdigest()

    @property
    def batches_sha256(self) -> str:
        return self._batches.hexdigest()


def iter_decoded(stream: BinaryIO, *, path: str | None = None,
                 limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> Iterator[DecodedBatch]:
    for raw in iter_batches(stream, path=path):
        yield decode_located(raw, path=path, limit=limit)


def decode_located(raw: RawBatch, *, path: str | None, limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> DecodedBatch:
    """:func:`decode_batch`, its errors naming the file too."""
    try:
        return decode_batch(raw, limit=limit)
    except TieringError as e:
        raise e.located(path=path) from None


class OffsetOrder:
    """Checks that batches move forward: each one starts above the previous one's last offset."""

    def __init__(self, segment_base: int | None, path: str | None) -> None:
        self.prev_last: int | None = None
        self.segment_base = segment_base
        self.path = path

    def lowest_next(self) -> int:
        """The lowest base offset the next batch may have (the checks of :meth:`check`, for a hot loop)."""
        if self.prev_last is not None:
            return self.prev_last + 1
        return -(1 << 63) if self.segment_base is None else self.segment_base

    def highest_last(self) -> int:
        """The highest last offset any batch may have (Kafka's index offsets are int32 relative to the base)."""
        return (1 << 63) - 1 if self.segment_base is None else self.segment_base + MAX_RELATIVE_OFFSET

    def check(self, header: BatchHeader, base_offset: int) -> None:
        if self.segment_base is not None and base_offset < self.segment_base:
            raise CorruptBatchError("batch offset below the segment's base offset", path=self.path,
                                    position=header.position, base_offset=base_offset,
                                    expected=f">= {self.segment_base}", found=base_offset)
        if self.prev_last is not None and base_offset <= self.prev_last:
            raise CorruptBatchError("batch offsets do not increase", path=self.path, position=header.position,
                                    base_offset=base_offset, expected=f"> {self.prev_last}", found=base_offset)
        if self.segment_base is not None and header.last_offset - self.segment_base > MAX_RELATIVE_OFFSET:
            # Kafka's indexes hold int32 offsets relative to the segment's base (IndexOffsetOverflowException).
            raise CorruptBatchError("batch offset too far above the segment's base offset", path=self.path,
                                    position=header.position, base_offset=base_offset,
                                    expected=f"<= {self.segment_base + MAX_RELATIVE_OFFSET}", found=header.last_offset)
        self.prev_last = header.last_offset


@dataclass
class SegmentSummary:
    path: str | None
    size_bytes: int = 0
    batch_count: int = 0
    record_count: int = 0
    control_batch_count: int = 0
    empty_batch_count: int = 0
    magics: set[int] = field(default_factory=set)
    codecs: dict[str, int] = field(default_factory=dict)
    first_offset: int | None = None
    last_offset: int | None = None
    max_timestamp: int = -1
    uncompressed_record_bytes: int = 0
    records_sha256: str | None = None
    batches_sha256: str | None = None
    index_problems: list[IndexProblem] = field(default_factory=list)
    index_missing: list[str] = field(default_factory=list)
    index_equals_rebuild: dict[str, bool] = field(default_factory=dict)
    batches: list[BatchPosition] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "valid": not self.index_problems,
            "size_bytes": self.size_bytes,
            "batch_count": self.batch_count,
            "record_count": self.record_count,
            "control_batch_count": self.control_batch_count,
            "empty_batch_count": self.empty_batch_count,
            "magics": sorted(self.magics),
            "codecs": dict(sorted(self.codecs.items())),
            "first_offset": self.first_offset,
            "last_offset": self.last_offset,
            "next_offset": None if self.last_offset is None else self.last_offset + 1,
            "max_timestamp": self.max_timestamp,
            "uncompressed_record_bytes": self.uncompressed_record_bytes,
            "records_sha256": self.records_sha256,
            "batches_sha256": self.batches_sha256,
            "index_problems": [str(p) for p in self.index_problems],
            "index_missing": self.index_missing,
            "index_equals_rebuild": self.index_equals_rebuild,
        }


def verify_segment(
    stream: BinaryIO,
    *,
    path: str | None = None,
    segment_base: int | None = None,
    digests: bool = True,
    limit: int = DEFAULT_DECOMPRESSION_LIMIT,
    keep_batches: bool = True,
) -> SegmentSummary:
    """Read every batch: header sanity, CRC, decompression, deep validation of every record, offsets
    increasing across batches; optionally the canonical digests. Raises on the first problem.

    ``keep_batches`` keeps one small :class:`BatchPosition` per batch in the summary (what index checks
    and rebuilds need); without it memory does not grow with the segment."""
    summary = SegmentSummary(path)
    order = OffsetOrder(segment_base, path)
    digest = Digests() if digests else None
    for raw in iter_batches(stream, path=path):
        h = raw.header
        try:
            if digest is None and h.magic >= 2:
                payload = payload_of(raw, limit)
                count = validate_v2(h, payload)
                base = h.offset
                summary.uncompressed_record_bytes += len(payload)
            else:
                decoded = decode_batch(raw, limit=limit)
                count = len(decoded.records)
                base = decoded.base_offset
                summary.uncompressed_record_bytes += decoded.uncompressed_bytes
            order.check(h, base)
            if digest is not None:
                digest.update(decoded)
        except TieringError as e:
            raise e.located(path=path, position=h.position, base_offset=h.offset) from None
        summary.batch_count += 1
        summary.record_count += count
        summary.size_bytes += h.size
        summary.control_batch_count += h.is_control
        summary.empty_batch_count += count == 0
        summary.magics.add(h.magic)
        summary.codecs[h.codec.label] = summary.codecs.get(h.codec.label, 0) + 1
        if summary.first_offset is None:
            summary.first_offset = base
        summary.last_offset = h.last_offset
        summary.max_timestamp = max(summary.max_timestamp, h.max_timestamp)
        if keep_batches:
            summary.batches.append(BatchPosition(h.position, h.last_offset, h.max_timestamp))
    if digest is not None:
        summary.records_sha256 = digest.records_sha256
        summary.batches_sha256 = digest.batches_sha256
    return summary


def check_indexes(summary: SegmentSummary, base_offset: int, offset_index: bytes | None, time_index: bytes | None,
                  interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES) -> None:
    """Judge original index files by validity; also record whether each equals our rebuild.

    A missing index is noted, not a problem: a broker rebuilds a missing index when it loads the segment.
    """
    rebuilt = build_indexes(base_offset, summary.batches, interval_bytes)
    if offset_index is None:
        summary.index_missing.append("index")
    else:
        summary.index_problems += verify_offset_index(offset_index, base_offset, summary.batches,
                                                      summary.size_bytes)
        summary.index_equals_rebuild["index"] = offset_index == rebuilt.offset_index
    if time_index is None:
        summary.index_missing.append("timeindex")
    else:
        summary.index_problems += verify_time_index(time_index, base_offset, summary.batches)
        summary.index_equals_rebuild["timeindex"] = time_index == rebuilt.time_index
