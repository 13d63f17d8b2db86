"""The segment rewriter: recompress every batch, keep every offset and header field, prove it, re-index.

Per batch, in file order, one batch in memory at a time (memory never grows with the segment's size):

1. read and check the header and CRC (reader.py);
2. decompress and deep-validate the records (compiled walker); decide to copy the batch as it is
   (control batch, already in the target codec, legacy zstd / legacy none) or to recompress it;
3. recompress; a batch that would not shrink is kept as it was (except with codec none);
4. proof: decompress the new bytes again and compare them with the original records byte for byte;
5. check offsets move forward, write the batch and feed its NEW position to the index builder.

Everything runs in the calling thread. Overlapping the proof on worker threads (Python threads, and
the zstd library's own multi-threaded batch calls) was measured slower on the 2-vCPU machine this was
built on: the hand-offs cost more than the work they moved (see README, "Benchmark").

Only codec bits, lengths, CRCs and the compressed bytes change; offsets, timestamps, producer fields,
leader epochs and control markers come out as they went in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO, Final

import xxhash

from tiering.errors import ConfigError, DecompressionError, ProofError, TieringError
from tiering.kafka.batch import V2_HEADER_SIZE, BatchHeader, build_legacy_wrapper, build_v2
from tiering.kafka.codecs import (
    DEFAULT_DECOMPRESSION_LIMIT,
    Codec,
    check_level,
    compress,
    decompress_known_size,
)
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, IndexBuilder, Indexes
from tiering.kafka.reader import DEFAULT_MAX_BATCH_BYTES, RawBatch, iter_batches
from tiering.kafka.records import decode_legacy, validate_v2, wrapper_inner
from tiering.kafka.segment import OffsetOrder, payload_of

PROGRESS_BYTES: Final = 1 << 20  # report progress about once a MiB of input
MAX_SEGMENT_BYTES: Final = (1 << 31) - 1  # Kafka's positions and batch lengths are int32


@dataclass(frozen=True, slots=True)
class RewriteOptions:
    codec: Codec
    level: int | None = None
    force: bool = False
    deep_validation: bool = True
    proof: bool = True
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES

    def __post_init__(self) -> None:
        object.__setattr__(self, "level", check_level(self.codec, self.level))
        if not 0 <= self.decompression_limit <= MAX_SEGMENT_BYTES - V2_HEADER_SIZE:
            raise ConfigError("decompression limit out of range (a batch's length is an int32)",
                              expected=f"0..{MAX_SEGMENT_BYTES - V2_HEADER_SIZE}", found=self.decompression_limit)
        if self.index_interval_bytes < 0:
            raise ConfigError("index interval must not be negative", expected=">= 0",
                              found=self.index_interval_bytes)


# Why a batch was copied rather than recompressed (keys of RewriteStats.kept).
KEPT_CONTROL = "control batch"
KEPT_SAME_CODEC = "already in the target codec"
KEPT_WOULD_GROW = "recompression would not shrink it"
KEPT_LEGACY_ZSTD = "legacy magic cannot hold zstd (needs v2)"
KEPT_LEGACY_NONE = "legacy wrapper kept compressed (unwrapping changes its batch boundaries)"
KEPT_LEGACY_PLAIN = "uncompressed legacy message (never merged into a wrapper)"


@dataclass
class RewriteStats:
    path: str | None
    base_offset: int
    codec: str
    level: int | None
    bytes_in: int = 0
    bytes_out: int = 0
    batches: int = 0
    records: int = 0
    batches_rewritten: int = 0
    uncompressed_bytes: int = 0
    kept: Counter[str] = field(default_factory=Counter)
    codecs_before: Counter[str] = field(default_factory=Counter)
    codecs_after: Counter[str] = field(default_factory=Counter)
    payload_xxh3_in: str = ""
    payload_xxh3_out: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "base_offset": self.base_offset,
            "codec": self.codec,
            "level": self.level,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "ratio": round(self.bytes_out / self.bytes_in, 6) if self.bytes_in else None,
            "saved_bytes": self.bytes_in - self.bytes_out,
            "batches": self.batches,
            "records": self.records,
            "batches_rewritten": self.batches_rewritten,
            "batches_kept": dict(self.kept),
            "codecs_before": dict(self.codecs_before),
            "codecs_after": dict(self.codecs_after),
            "uncompressed_bytes": self.uncompressed_bytes,
            "payload_xxh3_in": self.payload_xxh3_in,
            "payload_xxh3_out": self.payload_xxh3_out,
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class RewriteResult:
    stats: RewriteStats
    indexes: Indexes


@dataclass(slots=True)  # not frozen: built once per batch, and a frozen __init__ costs microseconds
class _Out:
    """One processed batch, ready to be written in file order."""

    header: BatchHeader
    parts: tuple[bytes | memoryview, ...]
    codec: Codec
    base_offset: int  # Kafka's baseOffset(): a legacy wrapper's is its first inner message's offset
    records: int
    uncompressed_bytes: int
    digest_in: bytes  # xxh3-128 of the original uncompressed records
    digest_out: bytes  # xxh3-128 of what the written bytes decode to
    kept: str | None  # why the batch was copied as it was, or None when it was recompressed


@dataclass(slots=True)  # not frozen, like _Out: one per batch
class _ToRecompress:
    """A valid batch whose records are to be recompressed."""

    raw: RawBatch
    base_offset: int
    records: int
    original: bytes | memoryview  # the uncompressed records section (legacy: the inner message set)
    old_size: int  # bytes the new compressed section must stay under, or the batch is kept


def _keep(raw: RawBatch, reason: str, payload: bytes | memoryview, base_offset: int, records: int) -> _Out:
    digest = xxhash.xxh3_128_digest(payload)
    return _Out(raw.header, (raw.data,), raw.header.codec, base_offset, records, len(payload), digest, digest, reason)


def _prepare_v2(raw: RawBatch, o: RewriteOptions) -> _Out | _ToRecompress:
    h = raw.header
    payload = payload_of(raw, o.decompression_limit)
    count = validate_v2(h, payload) if o.deep_validation else h.records_count or 0
    if h.is_control:
        return _keep(raw, KEPT_CONTROL, payload, h.offset, count)
    if h.codec is o.codec and not o.force:
        return _keep(raw, KEPT_SAME_CODEC, payload, h.offset, count)
    return _ToRecompress(raw, h.offset, count, payload, len(raw.data) - V2_HEADER_SIZE)


def _prepare_legacy(raw: RawBatch, o: RewriteOptions) -> _Out | _ToRecompress:
    h = raw.header
    if h.codec is Codec.NONE:
        decode_legacy(h, raw.data)  # validates the message's fields
        return _keep(raw, KEPT_LEGACY_PLAIN, raw.data, h.offset, 1)
    message, inner = wrapper_inner(h, raw.data, limit=o.decompression_limit)
    assert message.value is not None
    records = decode_legacy(h, raw.data, inner=inner)  # always: it yields the base offset
    base = records[0].offset
    reason = None
    if o.codec is Codec.ZSTD:
        reason = KEPT_LEGACY_ZSTD
    elif o.codec is Codec.NONE:
        reason = KEPT_LEGACY_NONE
    elif h.codec is o.codec and not o.force:
        reason = KEPT_SAME_CODEC
    if reason is not None:
        return _keep(raw, reason, inner, base, len(records))
    return _ToRecompress(raw, base, len(records), inner, len(message.value))


def _recompress(item: _ToRecompress, o: RewriteOptions) -> _Out:
    """Recompress a batch (or keep it when that would not shrink it), then prove the new bytes."""
    raw, original = item.raw, item.original
    h = raw.header
    new = compress(o.codec, original, level=o.level, magic=h.magic)
    if o.codec is not Codec.NONE and len(new) >= item.old_size:
        return _keep(raw, KEPT_WOULD_GROW, original, item.base_offset, item.records)
    digest_in = digest_out = xxhash.xxh3_128_digest(original)
    if o.proof:
        expected = f"{len(original)} bytes, xxh3 {digest_in.hex()}"
        try:
            back = decompress_known_size(o.codec, new, len(original), magic=h.magic)
        except DecompressionError as e:
            raise ProofError(f"rewritten batch does not decode: {e.message}", expected=expected,
                             found=e.found) from None
        digest_out = xxhash.xxh3_128_digest(back)
        if back != original:
            raise ProofError("rewritten batch does not decode to the original records", expected=expected,
                             found=f"{len(back)} bytes, xxh3 {digest_out.hex()}")
    parts = build_v2(raw.data, o.codec, new) if h.magic >= 2 else (build_legacy_wrapper(raw.data, h, o.codec, new),)
    return _Out(h, parts, o.codec, item.base_offset, item.records, len(original), digest_in, digest_out, None)


def process_batch(raw: RawBatch, options: RewriteOptions) -> _Out:
    """Validate one batch, then keep it or recompress and prove it."""
    h = raw.header
    try:
        item = _prepare_v2(raw, options) if h.magic >= 2 else _prepare_legacy(raw, options)
        return item if isinstance(item, _Out) else _recompress(item, options)
    except TieringError as e:
        raise e.located(position=h.position, base_offset=h.offset) from None


def rewrite_segment(src: BinaryIO, dst: BinaryIO, *, base_offset: int, options: RewriteOptions,
                    path: str | None = None, size: int | None = None,
                    progress: Callable[[int], None] | None = None) -> RewriteResult:
    """Rewrite the segment read from ``src`` into ``dst``; returns its stats and its rebuilt indexes.

    Raises an :class:`~tiering.errors.InvalidDataError` naming the file, byte and batch at the first
    problem (in file order); the caller discards ``dst`` then (the CLI writes to a temporary file).
    ``payload_xxh3_in``/``_out`` are xxh3-128 over the per-batch xxh3-128 digests of the records.
    """
    started = time.perf_counter()
    stats = RewriteStats(path, base_offset, options.codec.label, options.level)
    builder = IndexBuilder(base_offset, options.index_interval_bytes)
    order = OffsetOrder(base_offset, path)
    digest_in = xxhash.xxh3_128()
    digest_out = xxhash.xxh3_128()
    position = 0
    transitions: Counter[tuple[Codec, Codec]] = Counter()
    reported = [0]

    def emit(out: _Out) -> None:
        nonlocal position
        h = out.header
        order.check(h, out.base_offset)
        size = 0
        for part in out.parts:
            size += len(part)
        if position + size > MAX_SEGMENT_BYTES:
            raise ConfigError("the rewritten segment would pass Kafka's 2 GiB segment size (int32 positions); "
                              "choose a codec that compresses", position=h.position, base_offset=h.offset,
                              expected=f"<= {MAX_SEGMENT_BYTES} bytes", found=f"{position + size} bytes")
        builder.add(position, h.last_offset, h.max_timestamp)
        for part in out.parts:
            dst.write(part)
            position += len(part)
        digest_in.update(out.digest_in)
        digest_out.update(out.digest_out)
        stats.batches += 1
        stats.bytes_in += h.size
        stats.records += out.records
        stats.uncompressed_bytes += out.uncompressed_bytes
        transitions[h.codec, out.codec] += 1
        if out.kept is None:
            stats.batches_rewritten += 1
        else:
            stats.kept[out.kept] += 1
        if progress is not None and stats.bytes_in >= reported[0] + PROGRESS_BYTES:
            reported[0] = stats.bytes_in
            progress(stats.bytes_in)

    try:
        for raw in iter_batches(src, path=path, size=size, max_batch_bytes=options.max_batch_bytes):
            emit(process_batch(raw, options))
    except TieringError as e:
        raise e.located(path=path) from None
    for (before, after), n in transitions.items():
        stats.codecs_before[before.label] += n
        stats.codecs_after[after.label] += n
    if progress is not None:
        progress(stats.bytes_in)
    stats.bytes_out = position
    stats.payload_xxh3_in = digest_in.hexdigest()
    stats.payload_xxh3_out = digest_out.hexdigest()
    stats.seconds = time.perf_counter() - started
    return RewriteResult(stats, builder.finish())


@dataclass(frozen=True, slots=True)
class ReadBack:
    """What a rewritten segment holds, as read back from wherever it was written."""

    size: int
    batches: int
    records: int
    payload_xxh3: str  # comparable with RewriteStats.payload_xxh3_in of the rewrite that produced it
    indexes: Indexes  # rebuilt from the bytes read back


def read_back(src: BinaryIO, *, base_offset: int, path: str | None = None, size: int | None = None,
              index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
              decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> ReadBack:
    """Re-read a segment end to end (header sanity, CRC, every record, offset order) and compute the same
    records digest the rewriter computes, so that a copy read back from storage can be compared with the
    source it was made from, whatever codec each one uses."""
    builder = IndexBuilder(base_offset, index_interval_bytes)
    order = OffsetOrder(base_offset, path)
    digest = xxhash.xxh3_128()
    batches = records = position = 0
    for raw in iter_batches(src, path=path, size=size):
        h = raw.header
        try:
            if h.magic >= 2:
                payload = payload_of(raw, decompression_limit)
                count, base = validate_v2(h, payload), h.offset
            elif h.codec is Codec.NONE:
                payload, count, base = raw.data, len(decode_legacy(h, raw.data)), h.offset
            else:
                _, payload = wrapper_inner(h, raw.data, limit=decompression_limit)
                inner = decode_legacy(h, raw.data, inner=payload)
                count, base = len(inner), inner[0].offset
            order.check(h, base)
        except TieringError as e:
            raise e.located(path=path, position=h.position, base_offset=h.offset) from None
        builder.add(h.position, h.last_offset, h.max_timestamp)
        digest.update(xxhash.xxh3_128_digest(payload))
        batches += 1
        records += count
        position = h.position + h.size
    return ReadBack(position, batches, records, digest.hexdigest(), builder.finish())
