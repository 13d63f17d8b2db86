"""The segment rewriter: recompress every batch, keep every offset and header field, prove it, re-index.

Per batch, in file order (one batch in memory at a time, plus the one whose proof is still running):

1. read and check the header and CRC (reader.py);
2. decompress and deep-validate the records (compiled walker), check offsets move forward;
3. decide: copy as it is (control batch, already in the target codec, legacy zstd / legacy none, or a
   recompression that would not shrink it) or recompress with the target codec and level;
4. proof: a rewritten batch is decompressed again, on a second thread while the next batch is being
   prepared, and must equal the original records byte for byte before it is written;
5. write it and feed its NEW position to the index builder.

Only codec bits, lengths, CRCs and the compressed bytes change; offsets, timestamps, producer fields,
leader epochs and control markers come out as they went in.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import BinaryIO

import xxhash

from tiering.errors import ConfigError, CorruptBatchError, ProofError, TieringError
from tiering.kafka.batch import V2_HEADER_SIZE, BatchHeader, build_legacy_wrapper, build_v2
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec, check_level, compress, decompress
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, IndexBuilder, Indexes
from tiering.kafka.reader import DEFAULT_MAX_BATCH_BYTES, RawBatch, iter_batches
from tiering.kafka.records import decode_legacy, parse_legacy_message, validate_v2
from tiering.kafka.segment import OffsetOrder, payload_of


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


@dataclass(slots=True)
class _Out:
    """A batch ready to write once its proof (if any) has passed."""

    header: BatchHeader
    parts: tuple[bytes | memoryview, ...]
    codec: Codec
    payload: bytes | memoryview  # the uncompressed records, digested on both sides
    records: int
    proof: Future[bytes] | None = None


def _prove(codec: Codec, compressed: bytes | memoryview, magic: int, limit: int) -> bytes:
    return decompress(codec, compressed, magic=magic, limit=limit)


class _Rewriter:
    def __init__(self, options: RewriteOptions, stats: RewriteStats, path: str | None,
                 submit: Callable[..., Future[bytes]] | None) -> None:
        self.o = options
        self.stats = stats
        self.path = path
        self.submit = submit
        self.order = OffsetOrder(stats.base_offset, path)

    def _proof(self, codec: Codec, compressed: bytes, magic: int) -> Future[bytes] | None:
        if self.submit is None:
            return None
        return self.submit(_prove, codec, compressed, magic, self.o.decompression_limit)

    def v2(self, raw: RawBatch) -> _Out:
        h = raw.header
        o = self.o
        self.order.check(h, h.offset)
        payload = payload_of(raw, o.decompression_limit)
        count = validate_v2(h, payload) if o.deep_validation else h.records_count or 0
        if h.is_control:
            return self._keep(raw, KEPT_CONTROL, payload, count)
        if h.codec is o.codec and not o.force:
            return self._keep(raw, KEPT_SAME_CODEC, payload, count)
        new = compress(o.codec, payload, level=o.level) if o.codec is not Codec.NONE else bytes(payload)
        if o.codec is not Codec.NONE and len(new) >= len(raw.data) - V2_HEADER_SIZE:
            return self._keep(raw, KEPT_WOULD_GROW, payload, count)
        self.stats.batches_rewritten += 1
        return _Out(h, build_v2(raw.data, o.codec, new), o.codec, payload, count, self._proof(o.codec, new, 2))

    def legacy(self, raw: RawBatch) -> _Out:
        h = raw.header
        o = self.o
        if h.codec is Codec.NONE:
            decode_legacy(h, raw.data)
            self.order.check(h, h.offset)
            return self._keep(raw, KEPT_LEGACY_PLAIN, raw.data, 1)
        message = parse_legacy_message(raw.data, h)
        if message.value is None:
            raise CorruptBatchError("compressed wrapper without a value")
        inner = decompress(h.codec, message.value, magic=h.magic, limit=o.decompression_limit)
        records = decode_legacy(h, raw.data, inner=inner)  # always: it yields the base offset
        self.order.check(h, records[0].offset)
        reason = None
        if o.codec is Codec.ZSTD:
            reason = KEPT_LEGACY_ZSTD
        elif o.codec is Codec.NONE:
            reason = KEPT_LEGACY_NONE
        elif h.codec is o.codec and not o.force:
            reason = KEPT_SAME_CODEC
        if reason is not None:
            return self._keep(raw, reason, inner, len(records))
        new = compress(o.codec, inner, level=o.level, magic=h.magic)
        if len(new) >= len(message.value):
            return self._keep(raw, KEPT_WOULD_GROW, inner, len(records))
        self.stats.batches_rewritten += 1
        return _Out(h, (build_legacy_wrapper(raw.data, h, o.codec, new),), o.codec, inner, len(records),
                    self._proof(o.codec, new, h.magic))

    def _keep(self, raw: RawBatch, reason: str, payload: bytes | memoryview, records: int) -> _Out:
        self.stats.kept[reason] += 1
        return _Out(raw.header, (raw.data,), raw.header.codec, payload, records)


def rewrite_segment(src: BinaryIO, dst: BinaryIO, *, base_offset: int, options: RewriteOptions,
                    path: str | None = None, size: int | None = None,
                    progress: Callable[[int], None] | None = None) -> RewriteResult:
    """Rewrite the segment read from ``src`` into ``dst``; returns its stats and its rebuilt indexes.

    Raises an :class:`~tiering.errors.InvalidDataError` naming the file, byte and batch at the first
    problem; the caller discards ``dst`` then (the CLI writes to a temporary file and renames).
    """
    started = time.perf_counter()
    stats = RewriteStats(path, base_offset, options.codec.label, options.level)
    builder = IndexBuilder(base_offset, options.index_interval_bytes)
    digest_in = xxhash.xxh3_128()
    digest_out = xxhash.xxh3_128()
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="proof") if options.proof else None
    rewriter = _Rewriter(options, stats, path, pool.submit if pool else None)
    pending: deque[_Out] = deque()
    position = 0

    def emit(out: _Out) -> None:
        nonlocal position
        h = out.header
        digest_in.update(out.payload)
        if out.proof is not None:
            decoded = out.proof.result()
            if decoded != out.payload:
                raise ProofError("rewritten batch does not decode to the original records", path=path,
                                 position=h.position, base_offset=h.offset,
                                 expected=f"{len(out.payload)} bytes, xxh3 {xxhash.xxh3_64_hexdigest(out.payload)}",
                                 found=f"{len(decoded)} bytes, xxh3 {xxhash.xxh3_64_hexdigest(decoded)}")
            digest_out.update(decoded)
        else:
            digest_out.update(out.payload)
        builder.add(position, h.last_offset, h.max_timestamp)
        for part in out.parts:
            dst.write(part)
            position += len(part)
        stats.codecs_after[out.codec.label] += 1

    try:
        for raw in iter_batches(src, path=path, size=size, max_batch_bytes=options.max_batch_bytes):
            h = raw.header
            try:
                out = rewriter.v2(raw) if h.magic >= 2 else rewriter.legacy(raw)
            except TieringError as e:
                raise e.located(path=path, position=h.position, base_offset=h.offset) from None
            stats.batches += 1
            stats.bytes_in += h.size
            stats.records += out.records
            stats.uncompressed_bytes += len(out.payload)
            stats.codecs_before[h.codec.label] += 1
            pending.append(out)
            if progress is not None:
                progress(stats.bytes_in)
            if len(pending) > 1:
                emit(pending.popleft())
        while pending:
            emit(pending.popleft())
    finally:
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    stats.bytes_out = position
    stats.payload_xxh3_in = digest_in.hexdigest()
    stats.payload_xxh3_out = digest_out.hexdigest()
    stats.seconds = time.perf_counter() - started
    return RewriteResult(stats, builder.finish())
