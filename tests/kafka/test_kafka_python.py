"""Interop with kafka-python (an independent implementation of the record formats, pure Python).

Both directions are held to kafka-python's view of the bytes:

- kafka-python writes v2 batches in every codec and legacy v0/v1 message sets (plain and gzip/snappy/lz4
  wrappers); we concatenate them into a segment, as a broker would after assigning offsets, and our
  reader must see exactly the records and header fields that kafka-python's ``MemoryRecords`` reports;
- our rewriter's output, for every target codec, of that segment and of every Kafka-written golden
  segment, must be read by kafka-python with the same records and the same header fields (all but the
  codec bits, the length and the CRC), every CRC valid;
- the codec layers alone: what one side compresses the other decompresses (xerial and raw snappy, lz4
  frames with and without the magic v0 header-checksum quirk, gzip, zstd).

kafka-python 3.0.12 supports every direction exercised here (``kafka/codec.py``: xerial snappy is read
and written, ``lz4_encode_old_kafka``/``lz4_decode_old_kafka`` handle the v0 checksum), so nothing is
skipped.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import random
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from kafka import codec as kp_codec
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecord, LegacyRecordBatch
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder
from kafka.record.util import calc_crc32c

from tests.golden import SEGMENTS, log_path, segment_id
from tiering.errors import DecompressionError
from tiering.kafka.batch import TimestampType
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec, compress, decompress
from tiering.kafka.records import Record
from tiering.kafka.rewrite import RewriteOptions, RewriteStats, read_back, rewrite_segment
from tiering.kafka.segment import DecodedBatch, iter_decoded, verify_segment

T0 = 1_717_000_000_000
CODEC_MASK = 0x07
LOG_APPEND_TIME = 0x08
LEGACY_CODECS = [Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4]


class Rec(NamedTuple):
    """A record as both readers must report it (v0 timestamps as -1, header keys as UTF-8 bytes)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...]


KpHeaders = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Msg:
    """One record to hand to kafka-python's builders."""

    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: KpHeaders = field(default_factory=list)


# --- sample records -------------------------------------------------------------------------------


def _json_value(rng: random.Random, i: int, size: int) -> bytes:
    words = ["alpha", "beta", "gamma", "delta", "kafka", "segment", "tier", "zstd", "snappy", "offset"]
    body = " ".join(rng.choice(words) for _ in range(size // 6))
    return f'{{"id": {i}, "user": "u{i % 13}", "body": "{body}"}}'.encode()


def _messages(n: int, seed: int, *, headers: bool = True, big: bool = False) -> list[Msg]:
    """Compressible records with every corner the format has: null and empty keys and values, tombstones,
    null/empty/non-ASCII headers, a timestamp that goes backwards, optionally one ~150 KB value (several
    lz4 64 KiB blocks, several xerial snappy 32 KiB blocks)."""
    rng = random.Random(seed)
    out: list[Msg] = []
    for i in range(n):
        ts = T0 + seed * 10_000 + i * 7 - (50 if i == 3 else 0)
        key: bytes | None = f"key-{i % 5}".encode()
        if i % 9 == 1:
            key = None
        elif i % 9 == 2:
            key = b""
        value: bytes | None = _json_value(rng, i, 40 + rng.randrange(400))
        if i % 10 == 4:
            value = None  # a tombstone
        elif i % 10 == 5:
            value = b""
        hdrs: KpHeaders = []
        if headers and i % 3 == 0:
            hdrs = [("trace-id", f"{seed:04x}{i:08x}".encode()), ("null", None), ("", b""), ("ключ-ü", b"\x00\xff\x80")]
        out.append(Msg(ts, key, value, hdrs))
    if big:
        blob = b"".join(_json_value(rng, j, 300) for j in range(500))[:146_000] + rng.randbytes(4096)
        out.append(Msg(T0 + seed * 10_000 + n * 7, b"big", blob, [("kind", b"big")]))
    return out


# --- segments written by kafka-python, offsets assigned as a broker would ----------------------------


def _fix_crc_legacy(buf: bytearray) -> None:
    struct.pack_into(">I", buf, 12, zlib.crc32(memoryview(buf)[16:]))


def _fix_crc_v2(buf: bytearray) -> None:
    struct.pack_into(">I", buf, 17, calc_crc32c(memoryview(buf)[21:]))


class SegmentWriter:
    """Batches built by kafka-python's own builders, laid one after another with increasing offsets.

    kafka-python writes what a producer sends (base offset 0, leader epoch 0, a v1 wrapper with offset 0
    and timestamp 0), so this does what the broker does on append: it assigns the base offset and leader
    epoch (outside the CRC), the wrapper's offset (its last inner message's), the wrapper's timestamp and,
    when asked, LogAppendTime (both inside the CRC, which is recomputed).
    """

    def __init__(self, base_offset: int = 0) -> None:
        self.next_offset = base_offset
        self.parts: list[bytes] = []
        self.kinds: list[tuple[int, Codec]] = []  # (magic, codec) of every batch kafka-python will see
        self.stored_gzip: set[int] = set()  # indexes (in ``kinds``) of the stored-gzip wrappers

    def v2(self, codec: Codec, msgs: list[Msg], *, producer_id: int = -1, producer_epoch: int = -1,
           base_sequence: int = -1, transactional: bool = False, leader_epoch: int = 0,
           log_append_time: int | None = None, gap_after: int | None = None) -> None:
        b = MemoryRecordsBuilder(2, int(codec), 1 << 24, offset=0, transactional=transactional,
                                 producer_id=producer_id, producer_epoch=producer_epoch,
                                 base_sequence=base_sequence)
        for i, m in enumerate(msgs):
            assert b.append(m.timestamp, m.key, m.value, m.headers) is not None
            if gap_after is not None and i == gap_after:
                b.skip(3)  # compaction-like hole inside the batch
        b.close()
        buf = bytearray(b.buffer())
        # kafka-python sends a batch uncompressed when compression does not pay: make sure it did compress.
        assert buf[22] & CODEC_MASK == codec, f"kafka-python did not use {codec.label}"
        struct.pack_into(">q", buf, 0, self.next_offset)
        struct.pack_into(">i", buf, 12, leader_epoch)
        if log_append_time is not None:
            buf[22] |= LOG_APPEND_TIME
            struct.pack_into(">q", buf, 35, log_append_time)
            _fix_crc_v2(buf)
        (last_delta,) = struct.unpack_from(">i", buf, 23)
        self.next_offset += last_delta + 1
        self.parts.append(bytes(buf))
        self.kinds.append((2, codec))

    def legacy(self, magic: int, codec: Codec, msgs: list[Msg], *, log_append_time: int | None = None,
               stored_gzip: bool = False) -> None:
        """``stored_gzip``: a gzip wrapper whose deflate stream only stores (gzip level 0, as a producer with
        compression.gzip.level=0 would send), so that any recompression shrinks it."""
        n = len(msgs)
        first = self.next_offset
        # Inner offsets: absolute in v0, relative (0..n-1) in a v1 wrapper; plain messages carry their own.
        inner_base = 0 if magic == 1 and codec is not Codec.NONE else first
        b = MemoryRecordsBuilder(magic, 0 if stored_gzip else int(codec), 1 << 24, offset=inner_base)
        for m in msgs:
            assert b.append(m.timestamp, m.key, m.value) is not None
        b.close()
        buf = bytearray(b.buffer())
        if stored_gzip:
            assert codec is Codec.GZIP
            value = gzip.compress(bytes(buf), compresslevel=0, mtime=0)
            buf = bytearray(struct.pack(">qiIbb", 0, 0, 0, magic, int(codec)))
            buf += struct.pack(">q", 0) if magic == 1 else b""
            buf += struct.pack(">ii", -1, len(value)) + value  # null key, the compressed message set
            struct.pack_into(">i", buf, 8, len(buf) - 12)
            _fix_crc_legacy(buf)
            self.stored_gzip.add(len(self.kinds))
        self.next_offset += n
        if codec is Codec.NONE:
            assert log_append_time is None
            self.parts.append(bytes(buf))
            self.kinds += [(magic, codec)] * n
            return
        assert buf[17] & CODEC_MASK == codec
        struct.pack_into(">q", buf, 0, first + n - 1)
        if magic == 1:
            if log_append_time is not None:
                buf[17] |= LOG_APPEND_TIME
                struct.pack_into(">q", buf, 18, log_append_time)
            else:
                struct.pack_into(">q", buf, 18, max(m.timestamp for m in msgs))
            _fix_crc_legacy(buf)
        else:
            assert log_append_time is None
        self.parts.append(bytes(buf))
        self.kinds.append((magic, codec))

    def data(self) -> bytes:
        return b"".join(self.parts)


def _v2_segment(codec: Codec) -> SegmentWriter:
    w = SegmentWriter(1000)
    w.v2(codec, _messages(30, 1, big=True), leader_epoch=3)
    w.v2(codec, _messages(25, 2), producer_id=4242, producer_epoch=7, base_sequence=100, leader_epoch=3)
    w.v2(codec, _messages(20, 3), producer_id=4243, producer_epoch=1, base_sequence=0, transactional=True,
         leader_epoch=4)
    w.v2(codec, _messages(15, 4), leader_epoch=4, log_append_time=T0 + 999_999)
    w.v2(codec, _messages(12, 5, headers=False), leader_epoch=4, gap_after=5)
    w.v2(codec, _messages(1, 6), leader_epoch=5)
    return w


def _legacy_segment(magic: int, codec: Codec) -> SegmentWriter:
    w = SegmentWriter(500)
    w.legacy(magic, codec, _messages(20, 11, headers=False))
    w.legacy(magic, codec, _messages(1, 12, headers=False))
    w.legacy(magic, codec, _messages(40, 13, headers=False, big=True))
    if magic == 1 and codec is not Codec.NONE:
        w.legacy(magic, codec, _messages(10, 14, headers=False), log_append_time=T0 + 555_555)
    return w


def _mixed_segment() -> SegmentWriter:
    """A partition through its history: v0, then v1 (0.10), then v2 (0.11+), every codec of each."""
    w = SegmentWriter(0)
    for magic in (0, 1):
        for i, codec in enumerate(LEGACY_CODECS):
            w.legacy(magic, codec, _messages(8 + i, 20 + magic * 10 + i, headers=False))
    w.legacy(1, Codec.GZIP, _messages(6, 40, headers=False), log_append_time=T0 + 4_000_000)
    for i, codec in enumerate(Codec):
        w.v2(codec, _messages(10 + i, 50 + i), producer_id=900 + i, producer_epoch=i, base_sequence=i * 100,
             leader_epoch=i)
    w.v2(Codec.ZSTD, _messages(5, 60), log_append_time=T0 + 5_000_000, leader_epoch=9)
    return w


# --- the two readers --------------------------------------------------------------------------------


def _kp_rec(r: Any) -> Rec:
    headers = tuple((k.encode(), v) for k, v in r.headers)
    return Rec(r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value, headers)


def _kp_batch_view(batch: Any) -> dict[str, Any]:
    """The header fields kafka-python reports, read before the batch is iterated (legacy batches replace
    their buffer with the decompressed one when iterated)."""
    if isinstance(batch, DefaultRecordBatch):
        return {
            "magic": batch.magic, "base_offset": batch.base_offset, "last_offset": batch.last_offset,
            "leader_epoch": batch.leader_epoch, "attributes": batch.attributes, "codec": batch.compression_type,
            "crc": batch.crc, "size": batch.size_in_bytes, "first_timestamp": batch.first_timestamp,
            "max_timestamp": batch.max_timestamp, "producer_id": batch.producer_id,
            "producer_epoch": batch.producer_epoch, "base_sequence": batch.base_sequence,
            "records_count": batch.records_count, "timestamp_type": batch.timestamp_type,
            "is_transactional": batch.is_transactional, "is_control": batch.is_control_batch,
        }
    assert isinstance(batch, LegacyRecordBatch)
    # kafka-python has no public accessor for a legacy entry's attributes and timestamp: its slots
    # (kafka-python 3.0.12, the version pinned in requirements.lock).
    return {
        "magic": batch.magic, "base_offset": batch.base_offset, "attributes": batch._attributes,
        "codec": batch.compression_type, "crc": batch._crc, "size": batch.size_in_bytes,
        "timestamp": batch._timestamp, "timestamp_type": batch.timestamp_type,
    }


@dataclass(frozen=True)
class KpBatch:
    view: dict[str, Any]
    records: list[Rec]

    def without(self, *volatile: str) -> dict[str, Any]:
        """The view without the given fields and without the codec bits of the attributes."""
        out = {k: v for k, v in self.view.items() if k not in volatile}
        out["attributes"] = self.view["attributes"] & ~CODEC_MASK
        return out


def kp_read(data: bytes) -> list[KpBatch]:
    """Every batch and record as kafka-python reads them; every CRC it can check must be valid and
    every byte must belong to a batch (``MemoryRecords`` silently stops at a truncated tail)."""
    out: list[KpBatch] = []
    consumed = 0
    for batch in MemoryRecords(data):
        view = _kp_batch_view(batch)
        assert batch.validate_crc(), f"kafka-python: bad CRC in batch {view}"
        records = []
        for r in batch:
            if isinstance(r, LegacyRecord):
                assert r.validate_crc(), f"kafka-python: bad inner CRC at offset {r.offset}"
            records.append(_kp_rec(r))
        consumed += batch.size_in_bytes
        out.append(KpBatch(view, records))
    assert consumed == len(data)
    return out


def our_read(data: bytes) -> list[DecodedBatch]:
    return list(iter_decoded(io.BytesIO(data)))


def _our_recs(batch: DecodedBatch) -> list[Rec]:
    return [Rec(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch.records]


def _all(recs: Iterator[list[Rec]]) -> list[Rec]:
    return [r for batch in recs for r in batch]


def canonical_records_sha256(records: list[Rec]) -> str:
    """records_sha256 exactly as the golden MANIFEST defines it, computed from kafka-python's records."""
    h = hashlib.sha256()
    for r in records:
        h.update(struct.pack(">qq", r.offset, r.timestamp))
        for part in (r.key, r.value):
            h.update(struct.pack(">i", -1) if part is None else struct.pack(">i", len(part)) + part)
        h.update(struct.pack(">i", len(r.headers)))
        for hk, hv in r.headers:
            h.update(struct.pack(">i", len(hk)) + hk)
            h.update(struct.pack(">i", -1) if hv is None else struct.pack(">i", len(hv)) + hv)
    return h.hexdigest()


def assert_same_batches(ours: list[DecodedBatch], theirs: list[KpBatch]) -> None:
    """Our reader and kafka-python agree on every batch boundary, header field and record."""
    assert len(ours) == len(theirs)
    for o, k in zip(ours, theirs, strict=True):
        h, v = o.header, k.view
        where = f"batch at byte {h.position}"
        assert _our_recs(o) == k.records, where
        assert (h.magic, h.offset, h.attributes, h.crc, h.size) == (
            v["magic"], v["base_offset"], v["attributes"], v["crc"], v["size"]), where
        assert int(h.codec) == v["codec"], where
        if h.magic >= 2:
            assert (h.last_offset, h.partition_leader_epoch, h.base_timestamp, h.max_timestamp, h.producer_id,
                    h.producer_epoch, h.base_sequence, h.records_count, h.timestamp_type.value,
                    h.is_transactional, h.is_control) == (
                v["last_offset"], v["leader_epoch"], v["first_timestamp"], v["max_timestamp"], v["producer_id"],
                v["producer_epoch"], v["base_sequence"], v["records_count"], v["timestamp_type"],
                v["is_transactional"], v["is_control"]), where
        else:
            ts_type = TimestampType.NO_TIMESTAMP_TYPE.value if v["timestamp_type"] is None else v["timestamp_type"]
            assert h.timestamp_type.value == ts_type, where
            assert h.max_timestamp == (-1 if v["timestamp"] is None else v["timestamp"]), where


def rewrite(data: bytes, codec: Codec, base_offset: int) -> tuple[bytes, RewriteStats]:
    out = io.BytesIO()
    result = rewrite_segment(io.BytesIO(data), out, base_offset=base_offset,
                             options=RewriteOptions(codec=codec, force=True))
    assert read_back(io.BytesIO(out.getvalue()), base_offset=base_offset).payload_xxh3 == result.stats.payload_xxh3
    return out.getvalue(), result.stats


# --- kafka-python writes, we read ---------------------------------------------------------------------


def test_kafka_python_segments_hold_what_was_appended() -> None:
    """The fixtures themselves, judged by kafka-python alone: the broker-side patching kept it readable
    and the records are the ones handed to its builders, so the reader tests below compare with a truth."""
    msgs = _messages(15, 4)
    w = SegmentWriter(77)
    w.v2(Codec.LZ4, msgs, log_append_time=T0 + 1)
    w.legacy(1, Codec.SNAPPY, msgs)
    w.legacy(0, Codec.GZIP, msgs)
    batches = kp_read(w.data())
    assert [b.view["codec"] for b in batches] == [Codec.LZ4, Codec.SNAPPY, Codec.GZIP]
    assert [r.offset for b in batches for r in b.records] == list(range(77, 77 + 45))
    assert [r.timestamp for r in batches[0].records] == [T0 + 1] * 15  # LogAppendTime
    assert [r.timestamp for r in batches[1].records] == [m.timestamp for m in msgs]
    assert [r.timestamp for r in batches[2].records] == [-1] * 15  # v0 has no timestamps
    for b in batches:
        assert [(r.key, r.value) for r in b.records] == [(m.key, m.value) for m in msgs]
    assert [r.headers for r in batches[0].records] == [tuple((k.encode(), v) for k, v in m.headers) for m in msgs]
    assert batches[1].view["base_offset"] == 77 + 29  # a wrapper carries its last inner offset


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.label)
def test_we_read_kafka_python_v2(codec: Codec) -> None:
    w = _v2_segment(codec)
    data = w.data()
    theirs = kp_read(data)
    ours = our_read(data)
    assert_same_batches(ours, theirs)
    assert {b.header.codec for b in ours} == {codec}
    summary = verify_segment(io.BytesIO(data), segment_base=1000)
    assert summary.batch_count == len(theirs)
    assert summary.record_count == sum(len(b.records) for b in theirs)
    assert summary.first_offset == 1000
    assert summary.last_offset == theirs[-1].view["last_offset"]
    assert summary.records_sha256 == canonical_records_sha256(_all(b.records for b in theirs))
    fast = verify_segment(io.BytesIO(data), segment_base=1000, digests=False)
    assert fast.record_count == summary.record_count


@pytest.mark.parametrize("magic", [0, 1], ids=lambda m: f"v{m}")
@pytest.mark.parametrize("codec", LEGACY_CODECS, ids=lambda c: c.label)
def test_we_read_kafka_python_legacy(magic: int, codec: Codec) -> None:
    w = _legacy_segment(magic, codec)
    data = w.data()
    theirs = kp_read(data)
    ours = our_read(data)
    assert_same_batches(ours, theirs)
    assert [(b.header.magic, b.header.codec) for b in ours] == w.kinds
    summary = verify_segment(io.BytesIO(data), segment_base=500)
    assert summary.record_count == sum(len(b.records) for b in theirs) == w.next_offset - 500
    assert summary.last_offset == w.next_offset - 1
    assert summary.records_sha256 == canonical_records_sha256(_all(b.records for b in theirs))
    for b in ours:
        assert b.base_offset == b.records[0].offset  # a wrapper's baseOffset is its first inner offset


def test_we_read_a_mixed_kafka_python_segment() -> None:
    w = _mixed_segment()
    data = w.data()
    theirs = kp_read(data)
    ours = our_read(data)
    assert_same_batches(ours, theirs)
    assert [(b.header.magic, b.header.codec) for b in ours] == w.kinds
    summary = verify_segment(io.BytesIO(data), segment_base=0)
    assert summary.magics == {0, 1, 2}
    assert set(summary.codecs) == {c.label for c in Codec}
    assert summary.record_count == w.next_offset
    assert summary.records_sha256 == canonical_records_sha256(_all(b.records for b in theirs))


def test_our_builder_lays_out_batches_like_kafka_python() -> None:
    """builder.py (used for samples and test inputs) against kafka-python's DefaultRecordBatchBuilder:
    uncompressed batches are byte-identical, compressed ones equal once decompressed."""
    msgs = _messages(40, 70)
    for codec in Codec:
        for pid, epoch, seq, txn in [(-1, -1, -1, False), (31, 2, 17, False), (32, 0, 0, True)]:
            kb = DefaultRecordBatchBuilder(2, int(codec), txn, pid, epoch, seq, 1 << 24)
            for i, m in enumerate(msgs):
                kb.append(i, m.timestamp, m.key, m.value, m.headers)
            theirs = bytes(kb.build())
            records = [Record(i, m.timestamp, m.key, m.value, tuple((k.encode(), v) for k, v in m.headers))
                       for i, m in enumerate(msgs)]
            ours = build_batch(BatchSpec(0, codec=codec, producer_id=pid, producer_epoch=epoch, base_sequence=seq,
                                         transactional=txn), records)
            if codec is Codec.NONE:
                assert ours == theirs
                continue
            # Everything but length (8..12) and CRC (17..21) is equal; the records decompress to the same.
            assert ours[12:17] == theirs[12:17]
            assert ours[:8] == theirs[:8]
            assert ours[21:61] == theirs[21:61]
            assert decompress(codec, ours[61:]) == decompress(codec, theirs[61:])
            assert [_kp_rec(r) for r in DefaultRecordBatch(ours)] == [_kp_rec(r) for r in DefaultRecordBatch(theirs)]


# --- we rewrite, kafka-python reads -----------------------------------------------------------------


def _rewrite_source() -> SegmentWriter:
    """The mixed segment and batches with the big record (several lz4/snappy blocks in one payload): stored
    gzip wrappers, which every legacy codec shrinks (so we write v0 and v1 wrappers in each), and an
    uncompressed v2 batch. (Legacy entries after v2 batches: what a broker whose message format version was
    lowered wrote; readers take each entry by its own magic.)"""
    w = _mixed_segment()
    for magic in (0, 1):
        w.legacy(magic, Codec.NONE, _messages(3, 80 + magic, headers=False))
        w.legacy(magic, Codec.GZIP, _messages(30, 82 + magic, headers=False, big=True), stored_gzip=True)
    w.legacy(1, Codec.GZIP, _messages(12, 86, headers=False), log_append_time=T0 + 6_000_000, stored_gzip=True)
    w.v2(Codec.NONE, _messages(30, 84, big=True), producer_id=5, producer_epoch=0, base_sequence=0)
    return w


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.label)
def test_kafka_python_reads_our_rewrite(codec: Codec) -> None:
    w = _rewrite_source()
    original = w.data()
    out, stats = rewrite(original, codec, 0)
    before = kp_read(original)
    after = kp_read(out)
    assert len(after) == len(before) == stats.batches
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        assert a.records == b.records
        assert a.without("codec", "crc", "size") == b.without("codec", "crc", "size")
        magic, old, new = b.view["magic"], Codec(b.view["codec"]), Codec(a.view["codec"])
        if magic >= 2 and codec is Codec.NONE:
            assert new is Codec.NONE  # --codec none always decompresses v2
        elif magic < 2 and (old is Codec.NONE or codec in (Codec.NONE, Codec.ZSTD)):
            assert new is old  # plain legacy messages stay; a legacy wrapper cannot hold zstd or be unwrapped
        else:
            assert new in (codec, old)  # recompressed, or kept because it would not shrink
            if old is Codec.NONE or i in w.stored_gzip:
                assert new is codec  # uncompressed batches and the stored-gzip wrappers always shrink
        if not (magic >= 2 and codec is Codec.NONE):
            assert a.view["size"] <= b.view["size"]  # kept as it was, or recompressed because it shrank
    # What kafka-python sees is what the stats say was written.
    seen: dict[str, int] = {}
    for a in after:
        label = Codec(a.view["codec"]).label
        seen[label] = seen.get(label, 0) + 1
    assert seen == dict(stats.codecs_after)
    # And our reader agrees with kafka-python on the output too.
    assert_same_batches(our_read(out), after)


@functools.cache
def _golden_original(path: str) -> tuple[bytes, list[KpBatch], list[Rec]]:
    """A golden segment, as kafka-python and our reader see it (read once per session, never mutated)."""
    data = Path(path).read_bytes()
    ours = [r for b in our_read(data) for r in _our_recs(b)]
    return data, kp_read(data), ours


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.label)
@pytest.mark.parametrize("seg", SEGMENTS, ids=segment_id)
def test_kafka_python_reads_rewritten_golden(seg: dict[str, Any], codec: Codec) -> None:
    """Kafka wrote it, we rewrote it, kafka-python reads it: the same records and batches as Kafka's."""
    original, before, ours_before = _golden_original(str(log_path(seg)))
    out, stats = rewrite(original, codec, seg["base_offset"])
    after = kp_read(out)
    assert len(after) == len(before) == seg["batch_count"] == stats.batches
    recs = [r for b in after for r in b.records]
    assert len(recs) == seg["record_count"]
    assert recs == [r for b in before for r in b.records]
    assert recs == ours_before
    assert canonical_records_sha256(recs) == seg["records_sha256"]
    for b, a in zip(before, after, strict=True):
        assert a.without("codec", "crc", "size") == b.without("codec", "crc", "size")
        if b.view["magic"] >= 2 and b.view["is_control"]:
            assert a.view == b.view  # control batches are copied as they are
    assert_same_batches(our_read(out), after)


# --- the codec layers alone -------------------------------------------------------------------------


def _payload() -> bytes:
    rng = random.Random(99)
    text = b"".join(_json_value(rng, i, 200) for i in range(400))
    return text[:100_000] + rng.randbytes(20_000) + text[100_000:180_000]


@pytest.mark.parametrize(("codec", "magic", "decode"), [
    (Codec.GZIP, 2, kp_codec.gzip_decode),
    (Codec.SNAPPY, 2, kp_codec.snappy_decode),
    (Codec.LZ4, 2, kp_codec.lz4_decode),
    (Codec.LZ4, 1, kp_codec.lz4_decode),
    (Codec.LZ4, 0, kp_codec.lz4_decode_old_kafka),
    (Codec.ZSTD, 2, kp_codec.zstd_decode),
], ids=["gzip", "snappy-xerial", "lz4-v2", "lz4-v1", "lz4-v0-checksum-quirk", "zstd"])
def test_kafka_python_decodes_our_compression(codec: Codec, magic: int, decode: Any) -> None:
    data = _payload()
    ours = compress(codec, data, magic=magic)
    assert bytes(decode(ours)) == data
    if codec is Codec.SNAPPY:
        assert ours.startswith(b"\x82SNAPPY\x00")
    if codec is Codec.LZ4 and magic == 0:
        with pytest.raises(RuntimeError):  # the v0 frame really carries Kafka 0.8's wrong header checksum
            kp_codec.lz4_decode(ours)


@pytest.mark.parametrize(("codec", "magic", "encode"), [
    (Codec.GZIP, 2, kp_codec.gzip_encode),
    (Codec.SNAPPY, 2, kp_codec.snappy_encode),
    (Codec.SNAPPY, 2, lambda d: kp_codec.snappy_encode(d, xerial_compatible=False)),
    (Codec.LZ4, 2, kp_codec.lz4_encode),
    (Codec.LZ4, 0, kp_codec.lz4_encode_old_kafka),
    (Codec.ZSTD, 2, kp_codec.zstd_encode),
], ids=["gzip", "snappy-xerial", "snappy-raw", "lz4-frame-with-content-size", "lz4-v0-checksum-quirk", "zstd"])
def test_we_decode_kafka_python_compression(codec: Codec, magic: int, encode: Any) -> None:
    data = _payload()
    theirs = bytes(encode(data))
    assert decompress(codec, theirs, magic=magic) == data
    # The bounded decompression holds for their framing too.
    with pytest.raises(DecompressionError):
        decompress(codec, theirs, magic=magic, limit=len(data) - 1)
