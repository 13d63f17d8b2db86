"""Batch headers of magic v2 record batches and of legacy (v0/v1) log entries.

Magic v2 record batch (DefaultRecordBatch), big-endian, a 61-byte header then the records:

| offset | size | field                | notes                                                      |
|--------|------|----------------------|------------------------------------------------------------|
| 0      | 8    | baseOffset           |                                                            |
| 8      | 4    | batchLength          | bytes after this field: whole batch = batchLength + 12     |
| 12     | 4    | partitionLeaderEpoch |                                                            |
| 16     | 1    | magic                | 2                                                          |
| 17     | 4    | crc                  | CRC-32C of bytes [21, end of batch)                        |
| 21     | 2    | attributes           | see :class:`Attr`; bits 0-2 the codec                      |
| 23     | 4    | lastOffsetDelta      |                                                            |
| 27     | 8    | baseTimestamp        | the delete horizon when hasDeleteHorizonMs is set          |
| 35     | 8    | maxTimestamp         |                                                            |
| 43     | 8    | producerId           | -1 = none                                                  |
| 51     | 2    | producerEpoch        |                                                            |
| 53     | 4    | baseSequence         |                                                            |
| 57     | 4    | recordsCount         |                                                            |
| 61     | ...  | records              | one compressed stream when the codec is not none           |

Legacy log entry (LegacyRecord), magic v0 (Kafka 0.8/0.9) and v1 (0.10):

| offset | size | field       | notes                                                              |
|--------|------|-------------|--------------------------------------------------------------------|
| 0      | 8    | offset      | a compressed wrapper carries the offset of its LAST inner message   |
| 8      | 4    | messageSize | bytes after this field                                             |
| 12     | 4    | crc         | CRC-32 (IEEE) of bytes [16, end of message)                        |
| 16     | 1    | magic       | 0 or 1                                                             |
| 17     | 1    | attributes  | bits 0-2 codec; v1 bit 3 timestamp type                            |
| 18     | 8    | timestamp   | v1 only                                                            |
| 18/26  | 4    | keyLength   | -1 = null, then the key                                            |
| ...    | 4    | valueLength | -1 = null, then the value (a wrapper's value: compressed messages) |

The magic byte sits at offset 16 in both layouts, which is how a reader tells them apart.
"""

from __future__ import annotations

import struct
import zlib
from enum import IntEnum, IntFlag
from typing import Final, NamedTuple

import crc32c

from tiering.errors import CorruptBatchError, UnsupportedError
from tiering.kafka.codecs import CODEC_MASK, CODECS, Codec

# --- shared prefix -----------------------------------------------------------------------------
LOG_OVERHEAD: Final = 12  # offset int64 + length int32, before every batch or legacy message
HEADER_SIZE_UP_TO_MAGIC: Final = 17
MAGIC_OFFSET: Final = 16

# --- magic v2 ----------------------------------------------------------------------------------
BASE_OFFSET_OFFSET: Final = 0
LENGTH_OFFSET: Final = BASE_OFFSET_OFFSET + 8
PARTITION_LEADER_EPOCH_OFFSET: Final = LENGTH_OFFSET + 4
V2_MAGIC_OFFSET: Final = PARTITION_LEADER_EPOCH_OFFSET + 4
CRC_OFFSET: Final = V2_MAGIC_OFFSET + 1
ATTRIBUTES_OFFSET: Final = CRC_OFFSET + 4
LAST_OFFSET_DELTA_OFFSET: Final = ATTRIBUTES_OFFSET + 2
BASE_TIMESTAMP_OFFSET: Final = LAST_OFFSET_DELTA_OFFSET + 4
MAX_TIMESTAMP_OFFSET: Final = BASE_TIMESTAMP_OFFSET + 8
PRODUCER_ID_OFFSET: Final = MAX_TIMESTAMP_OFFSET + 8
PRODUCER_EPOCH_OFFSET: Final = PRODUCER_ID_OFFSET + 8
BASE_SEQUENCE_OFFSET: Final = PRODUCER_EPOCH_OFFSET + 2
RECORDS_COUNT_OFFSET: Final = BASE_SEQUENCE_OFFSET + 4
RECORDS_OFFSET: Final = RECORDS_COUNT_OFFSET + 4
V2_HEADER_SIZE: Final = RECORDS_OFFSET  # 61
assert V2_HEADER_SIZE == 61

V2_HEADER: Final = struct.Struct(">qiibIhiqqqhii")  # the fields above, in order
assert V2_HEADER.size == V2_HEADER_SIZE
_ATTRIBUTES: Final = struct.Struct(">h")
_LENGTH: Final = struct.Struct(">i")
_CRC: Final = struct.Struct(">I")

# --- legacy v0/v1 -----------------------------------------------------------------------------
LEGACY_CRC_OFFSET: Final = LOG_OVERHEAD
LEGACY_MAGIC_OFFSET: Final = LEGACY_CRC_OFFSET + 4
LEGACY_ATTRIBUTES_OFFSET: Final = LEGACY_MAGIC_OFFSET + 1
LEGACY_TIMESTAMP_OFFSET: Final = LEGACY_ATTRIBUTES_OFFSET + 1
LEGACY_ENTRY_PREFIX: Final = struct.Struct(">qiIbb")  # offset, messageSize, crc, magic, attributes
_INT64: Final = struct.Struct(">q")
_INT32: Final = struct.Struct(">i")
# crc + magic + attributes (+ timestamp) + keyLength + valueLength
LEGACY_MIN_MESSAGE_SIZE: Final = {0: 4 + 1 + 1 + 4 + 4, 1: 4 + 1 + 1 + 8 + 4 + 4}

NO_TIMESTAMP: Final = -1
NO_PRODUCER_ID: Final = -1
INT64_MAX: Final = (1 << 63) - 1


class Attr(IntFlag):
    """Attribute bits above the codec (v2: all of them; v0/v1: only TIMESTAMP_TYPE, v1 only)."""

    LOG_APPEND_TIME = 0x08
    TRANSACTIONAL = 0x10
    CONTROL = 0x20
    DELETE_HORIZON = 0x40


# The same bits as plain ints for the per-batch hot path (an IntFlag operation costs a microsecond or two).
LOG_APPEND_TIME_BIT: Final = int(Attr.LOG_APPEND_TIME)
TRANSACTIONAL_BIT: Final = int(Attr.TRANSACTIONAL)
CONTROL_BIT: Final = int(Attr.CONTROL)
DELETE_HORIZON_BIT: Final = int(Attr.DELETE_HORIZON)


class TimestampType(IntEnum):
    NO_TIMESTAMP_TYPE = -1
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @classmethod
    def from_attributes(cls, attributes: int) -> TimestampType:
        """The timestamp type of a v1/v2 entry from its attributes (bit 3)."""
        return cls.LOG_APPEND_TIME if attributes & LOG_APPEND_TIME_BIT else cls.CREATE_TIME

    @property
    def label(self) -> str:
        return {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}[self.value]


def timestamp_base(h: BatchHeader) -> tuple[int, bool]:
    """What a v2 batch's record timestamps are taken from, and whether it is the LogAppendTime itself (the max
    timestamp every record of a LogAppendTime batch takes)."""
    if h.timestamp_type is TimestampType.LOG_APPEND_TIME:
        return h.max_timestamp, True
    return h.base_timestamp, False


class BatchHeader(NamedTuple):
    """The shallow view of one batch (v2) or one legacy log entry (v0/v1), as Kafka's RecordBatch sees it.

    For a legacy entry, ``offset`` is the entry's offset field: for a compressed wrapper the offset of its
    LAST inner message. ``last_offset`` is always right without decompressing anything.

    Immutable like the package's dataclasses, but a named tuple: every reader makes one per batch, and a
    tuple of sixteen fields is built several times faster than a frozen dataclass.
    """

    position: int
    size: int
    magic: int
    offset: int
    last_offset: int
    crc: int
    attributes: int
    codec: Codec
    timestamp_type: TimestampType
    base_timestamp: int
    max_timestamp: int
    partition_leader_epoch: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int | None  # v2 header field; None for legacy entries

    @property
    def is_transactional(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return self.magic >= 2 and bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        if self.magic >= 2 and self.attributes & DELETE_HORIZON_BIT:
            return self.base_timestamp
        return None

    @property
    def payload_start(self) -> int:
        """Where the records (v2) or the message key length (legacy) start inside the entry."""
        if self.magic >= 2:
            return V2_HEADER_SIZE
        return LEGACY_TIMESTAMP_OFFSET + (8 if self.magic == 1 else 0)


def crc_v2(data: bytes | memoryview | bytearray) -> int:
    """CRC-32C of a v2 batch: from the attributes to the end."""
    return int(crc32c.crc32c(memoryview(data)[ATTRIBUTES_OFFSET:]))


def crc_legacy(data: bytes | memoryview | bytearray) -> int:
    """CRC-32 of a legacy entry's message: from the magic to the end."""
    return zlib.crc32(memoryview(data)[LEGACY_MAGIC_OFFSET:])


_TIMESTAMP_TYPES: Final = {0: TimestampType.CREATE_TIME, LOG_APPEND_TIME_BIT: TimestampType.LOG_APPEND_TIME}


def parse_v2_header(data: bytes | memoryview, position: int) -> BatchHeader:
    """Parse and sanity-check a whole v2 batch's header (``data`` holds the whole batch)."""
    (base_offset, length, epoch, magic, crc, attributes, last_delta, base_ts, max_ts, pid, pepoch, base_seq,
     count) = V2_HEADER.unpack_from(data, 0)
    codec_id = attributes & CODEC_MASK
    if codec_id > Codec.ZSTD:
        raise CorruptBatchError("unknown compression codec", position=position, base_offset=base_offset,
                                expected="0..4", found=codec_id)
    if count < 0:
        raise CorruptBatchError("negative recordsCount", position=position, base_offset=base_offset,
                                expected=">= 0", found=count)
    if last_delta < 0:
        raise CorruptBatchError("negative lastOffsetDelta", position=position, base_offset=base_offset,
                                expected=">= 0", found=last_delta)
    if base_offset + last_delta > INT64_MAX:
        raise CorruptBatchError("last offset overflows int64", position=position, base_offset=base_offset,
                                expected=f"baseOffset + lastOffsetDelta <= {INT64_MAX}", found=base_offset + last_delta)
    if count > 0 and count - 1 > last_delta:
        raise CorruptBatchError("more records than offsets", position=position, base_offset=base_offset,
                                expected=f"recordsCount <= lastOffsetDelta + 1 = {last_delta + 1}", found=count)
    if attributes & CONTROL_BIT and codec_id != Codec.NONE:
        raise CorruptBatchError("compressed control batch", position=position, base_offset=base_offset,
                                expected="codec none", found=CODECS[codec_id].label)
    # positionally, in BatchHeader's field order: position, size, magic, offset, last_offset, crc, attributes,
    # codec, timestamp_type, base_timestamp, max_timestamp, partition_leader_epoch, producer_id,
    # producer_epoch, base_sequence, records_count (built per batch: keywords cost more)
    return BatchHeader(position, length + LOG_OVERHEAD, magic, base_offset, base_offset + last_delta, crc, attributes,
                       CODECS[codec_id], _TIMESTAMP_TYPES[attributes & LOG_APPEND_TIME_BIT], base_ts, max_ts, epoch,
                       pid, pepoch, base_seq, count)


def parse_legacy_header(data: bytes | memoryview, position: int) -> BatchHeader:
    """Parse and sanity-check a whole legacy log entry (``data`` holds the whole entry)."""
    offset, size, crc, magic, attributes = LEGACY_ENTRY_PREFIX.unpack_from(data, 0)
    codec_id = attributes & CODEC_MASK
    if codec_id > Codec.LZ4:
        what = "zstd needs magic v2" if codec_id == Codec.ZSTD else "unknown compression codec"
        raise CorruptBatchError(what, position=position, base_offset=offset, expected="0..3", found=codec_id)
    if magic == 1:
        (timestamp,) = _INT64.unpack_from(data, LEGACY_TIMESTAMP_OFFSET)
        ts_type = TimestampType.from_attributes(attributes)
    else:
        timestamp = NO_TIMESTAMP
        ts_type = TimestampType.NO_TIMESTAMP_TYPE
    return BatchHeader(
        position=position,
        size=size + LOG_OVERHEAD,
        magic=magic,
        offset=offset,
        last_offset=offset,
        crc=crc,
        attributes=attributes & 0xFF,
        codec=CODECS[codec_id],
        timestamp_type=ts_type,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        partition_leader_epoch=-1,
        producer_id=NO_PRODUCER_ID,
        producer_epoch=-1,
        base_sequence=-1,
        records_count=None,
    )


def check_crc(header: BatchHeader, data: bytes | memoryview, path: str | None = None) -> None:
    computed = crc_v2(data) if header.magic >= 2 else crc_legacy(data)
    if computed != header.crc:
        raise CorruptBatchError("CRC mismatch", path=path, position=header.position, base_offset=header.offset,
                                expected=f"stored crc {header.crc}", found=f"computed {computed}")


def entry_size_bounds(magic: int) -> int:
    """Smallest valid whole entry for ``magic`` (log overhead included)."""
    if magic == 2:
        return V2_HEADER_SIZE
    if magic in LEGACY_MIN_MESSAGE_SIZE:
        return LOG_OVERHEAD + LEGACY_MIN_MESSAGE_SIZE[magic]
    raise UnsupportedError("unknown magic", expected="0, 1 or 2", found=magic)


def build_v2(original: bytes | memoryview, codec: Codec, payload: bytes) -> tuple[bytes, bytes]:
    """A v2 batch equal to ``original`` except for its codec bits, length, CRC and records section.

    Returns (header, payload): the caller writes both, so the payload is never copied once more.
    """
    header = bytearray(original[:V2_HEADER_SIZE])
    (attributes,) = _ATTRIBUTES.unpack_from(header, ATTRIBUTES_OFFSET)
    _ATTRIBUTES.pack_into(header, ATTRIBUTES_OFFSET, (attributes & ~CODEC_MASK) | int(codec))
    _LENGTH.pack_into(header, LENGTH_OFFSET, V2_HEADER_SIZE - LOG_OVERHEAD + len(payload))
    crc = crc32c.crc32c(payload, crc32c.crc32c(memoryview(header)[ATTRIBUTES_OFFSET:]))
    _CRC.pack_into(header, CRC_OFFSET, crc)
    return bytes(header), payload


def build_legacy_wrapper(original: bytes | memoryview, header: BatchHeader, codec: Codec, value: bytes) -> bytes:
    """A legacy wrapper entry equal to ``original`` except for its codec bits, CRC, sizes and value."""
    start = header.payload_start
    (key_length,) = _INT32.unpack_from(original, start)
    key_end = start + 4 + max(key_length, 0)
    out = bytearray(original[:key_end])
    out[LEGACY_ATTRIBUTES_OFFSET] = (header.attributes & ~CODEC_MASK & 0xFF) | int(codec)
    out += _INT32.pack(len(value))
    out += value
    _INT32.pack_into(out, 8, len(out) - LOG_OVERHEAD)
    _CRC.pack_into(out, LEGACY_CRC_OFFSET, zlib.crc32(memoryview(out)[LEGACY_MAGIC_OFFSET:]))
    return bytes(out)
