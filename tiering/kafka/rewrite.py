"""The segment rewriter: recompress every batch, keep every offset and header field, prove it, re-index.

Per batch, in file order, memory bounded by a read chunk and a few groups of batches, never the segment:

1. read and check the header and CRC (the compiled scanner for runs of ordinary v2 batches, reader.py's
   checks for anything else, and for reporting what the scanner stopped at);
2. decompress and deep-validate the records (compiled walker); decide to copy the batch as it is
   (control batch, already in the target codec, legacy zstd / legacy none) or to recompress it;
3. recompress; a batch that would not shrink is kept as it was (except with codec none);
4. proof: decompress the new bytes again and compare them with the original records byte for byte;
5. check offsets move forward, write the batch and feed its NEW position to the index builder.

The proof of v2 batches runs on a second thread, a group of batches (``GROUP_BYTES`` of records) at a
time, so that it overlaps the next group's work on another core. For zstd (the usual target) that thread
is the compiled prover of _proof.c, which never takes the GIL: each time a Python proof thread took the
GIL back, the main thread could be made to wait, and on a virtual machine each such hand-off took about a
millisecond. For gzip, or zstd without a libzstd shared library, a Python thread decodes the group
through the codec package and one compiled comparison checks it; lz4 and snappy decode too fast for a
thread to pay off and are proven inline (``PROOF_THREAD_CODECS``). A group is written only after its proof passed;
the first problem in file order is the one reported. The last group has nothing after it to overlap
with: the main thread proves half of it meanwhile. Legacy batches are proven inline.

Only codec bits, lengths, CRCs and the compressed bytes change; offsets, timestamps, producer fields,
leader epochs and control markers come out as they went in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import BinaryIO, Final, cast

import xxhash

from tiering.errors import ConfigError, DecompressionError, ProofError, TieringError
from tiering.kafka import _proof, _walker
from tiering.kafka.batch import (
    CONTROL_BIT,
    V2_HEADER_SIZE,
    BatchHeader,
    build_legacy_wrapper,
    build_v2,
    parse_v2_header,
)
from tiering.kafka.buffers import BufferPool, ChunkStream, collector_paused
from tiering.kafka.codecs import (
    CODEC_MASK,
    CODECS,
    DEFAULT_DECOMPRESSION_LIMIT,
    Codec,
    check_level,
    compress,
    compressor,
    decompress,
    decompress_all_known_size,
    decompress_known_size,
)
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, IndexBuilder, Indexes
from tiering.kafka.reader import (
    DEFAULT_MAX_BATCH_BYTES,
    READ_CHUNK_BYTES,
    RawBatch,
    V2Run,
    iter_batches,
    iter_entries,
)
from tiering.kafka.rebatch import RebatchOptions, RebatchStats, rebatched
from tiering.kafka.records import decode_legacy, validate_v2, validate_v2_records, wrapper_inner
from tiering.kafka.segment import OffsetOrder, payload_of

PROGRESS_BYTES: Final = 1 << 20  # report progress about once a MiB of input
GROUP_BYTES: Final = 4 << 20  # records per proof group: large enough to make the hand-off cheap, small for memory
GROUP_BATCHES: Final = 512
OUTPUT_BUFFER_BYTES: Final = 256 << 10  # the output is laid out in buffers of this size, reused from group to group
# Enough for the group being filled and the one being proven, each up to GROUP_BYTES and one more run (a read
# chunk) of batches that do not shrink; only as many are kept as were in use at once.
SPARE_OUTPUT_BUFFERS: Final = 2 * (GROUP_BYTES + READ_CHUNK_BYTES) // OUTPUT_BUFFER_BYTES + 2
NATIVE_ZSTD_PROOF: Final = _proof.available()  # libzstd found: zstd proofs run compiled, without the GIL
# Codecs proven on the second thread. lz4 and snappy decode a batch in microseconds: on a Python thread the GIL
# hand-offs cost more than the decoding saves (lz4 level 9, 64 MiB, two runs: 0.61 and 0.69 of the rewrite
# without proof with the thread, 0.73 and 0.75 inline; snappy the same either way; gzip 0.84 with the thread,
# 0.78 inline), so they are proven inline, as none is.
PROOF_THREAD_CODECS: Final = frozenset({Codec.ZSTD, Codec.GZIP})
MAX_SEGMENT_BYTES: Final = (1 << 31) - 1  # Kafka's positions and batch lengths are int32


@dataclass(frozen=True, slots=True)
class RewriteOptions:
    codec: Codec
    level: int | None = None
    force: bool = False
    deep_validation: bool = True
    proof: bool = True
    proof_thread: bool = True  # prove zstd and gzip on a second thread; False keeps the rewrite on one core (Spark)
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
    # xxh3-128 over the per-batch xxh3-128 digests of the source's records. One figure, not "in" and "out":
    # every written batch was decoded again and compared byte for byte with these records (the proof), so
    # the output holds them; read_back of the output computes the same figure independently.
    payload_xxh3: str = ""
    # With re-batching, the same figure over the source's batches (payload_xxh3 is over the merged ones): what
    # the original, and so a backup restored by a rollback, decodes to.
    source_payload_xxh3: str = ""
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
            "payload_xxh3": self.payload_xxh3,
            **({"source_payload_xxh3": self.source_payload_xxh3} if self.source_payload_xxh3 else {}),
            "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True, slots=True)
class RewriteResult:
    stats: RewriteStats
    indexes: Indexes
    rebatch: RebatchStats | None = None  # set when runs of batches were merged before the rewrite

    def to_json(self) -> dict[str, object]:
        doc = self.stats.to_json()
        if self.rebatch is not None:
            doc["rebatch"] = self.rebatch.to_json()
        return doc


@dataclass(slots=True)  # not frozen: built once per batch, and a frozen __init__ costs microseconds
class _Out:
    """One processed batch, ready to be written in file order."""

    header: BatchHeader
    parts: tuple[bytes | memoryview, ...]
    codec: Codec
    base_offset: int  # Kafka's baseOffset(): a legacy wrapper's is its first inner message's offset
    records: int
    uncompressed_bytes: int
    digest: bytes  # xxh3-128 of the original uncompressed records, which the written bytes decode to
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
    return _Out(raw.header, (raw.data,), raw.header.codec, base_offset, records, len(payload), digest, reason)


def _prepare_v2(raw: RawBatch, o: RewriteOptions, payload: bytes | memoryview | None = None) -> _Out | _ToRecompress:
    h = raw.header
    if payload is None:
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
    digest = xxhash.xxh3_128_digest(original)
    if o.proof:
        _prove_one(o.codec, new, original, h.magic)
    parts = build_v2(raw.data, o.codec, new) if h.magic >= 2 else (build_legacy_wrapper(raw.data, h, o.codec, new),)
    return _Out(h, parts, o.codec, item.base_offset, item.records, len(original), digest, None)


def _prove_one(codec: Codec, new: bytes | bytearray | memoryview, original: bytes | memoryview, magic: int) -> None:
    """Decode ``new`` again; :class:`ProofError` unless it gives back ``original`` byte for byte."""
    expected = f"{len(original)} bytes, xxh3 {xxhash.xxh3_128_hexdigest(original)}"
    try:
        back = decompress_known_size(codec, memoryview(new), len(original), magic=magic)
    except DecompressionError as e:
        raise ProofError(f"rewritten batch does not decode: {e.message}", expected=expected, found=e.found) from None
    if back != original:
        raise ProofError("rewritten batch does not decode to the original records", expected=expected,
                         found=f"{len(back)} bytes, xxh3 {xxhash.xxh3_128_hexdigest(back)}")


def _first_unproven(codec: Codec, news: Sequence[bytes | bytearray | memoryview],
                    originals: Sequence[bytes | memoryview]) -> int:
    """Index of the first batch of a group whose new bytes do not decode to its original records, or -1.
    Runs on the proof thread: one decode call and one comparison for the whole group."""
    try:
        backs = decompress_all_known_size(codec, news, [len(o) for o in originals])
    except DecompressionError:
        for i, (new, original) in enumerate(zip(news, originals, strict=True)):
            try:
                _prove_one(codec, new, original, 2)
            except ProofError:
                return i
        return 0  # the group failed as a whole but no batch alone does: report the first
    return _walker.first_difference(backs, originals)


def _half(originals: list[bytes | memoryview]) -> int:
    """Where to cut a group so that both parts hold about half of its records (the first part never empty)."""
    total, size = sum(len(o) for o in originals), 0
    for i, original in enumerate(originals):
        size += len(original)
        if 2 * size >= total:
            return i + 1
    return len(originals)


def process_batch(raw: RawBatch, options: RewriteOptions, payload: bytes | memoryview | None = None) -> _Out:
    """Validate one batch, then keep it or recompress and prove it (inline: the path for legacy batches).
    ``payload``: a v2 batch's records section, already decompressed."""
    h = raw.header
    try:
        item = _prepare_v2(raw, options, payload) if h.magic >= 2 else _prepare_legacy(raw, options)
        return item if isinstance(item, _Out) else _recompress(item, options)
    except TieringError as e:
        raise e.located(position=h.position, base_offset=h.offset) from None


def _raise_unproven(codec: Codec, g: _Group, failed: int) -> None:
    """Raise :class:`ProofError` naming the group's batch ``failed`` (the index :func:`_first_unproven` gave)."""
    if failed < 0:
        return
    _, _, _, position, base, _ = g.rows[g.proven_rows[failed]]
    try:
        _prove_one(codec, g.news[failed], g.originals[failed], 2)
    except ProofError as e:
        raise e.located(position=position, base_offset=base) from None
    raise ProofError("rewritten batch failed its group's proof", position=position, base_offset=base)


class _Group:
    """Batches processed but not yet written, in file order, laid out in output buffers as they will be
    written; the recompressed ones wait for their proof."""

    __slots__ = ("at", "buf", "digests", "filled", "news", "originals", "proven_rows", "records_bytes", "rows")

    def __init__(self) -> None:
        self.filled: list[memoryview] = []  # output buffers already full, in order; then ...
        self.buf = _NO_BUFFER  # ... the one being filled (taken when the first batch comes) ...
        self.at = 0  # ... up to here
        self.rows: list[_Row] = []
        self.digests: list[bytes] = []  # xxh3-128 of each batch's records (what its written bytes decode to)
        self.news: list[memoryview] = []  # recompressed records sections (in the output) awaiting the proof ...
        self.originals: list[bytes | memoryview] = []  # ... the records they must decode to ...
        self.proven_rows: list[int] = []  # ... and their index in rows
        self.records_bytes = 0

    def output(self) -> list[memoryview]:
        return [*self.filled, self.buf[: self.at]]


_NO_BUFFER: Final = memoryview(bytearray())

# One batch of a group: size written, last offset, max timestamp (for the index), then its position, base
# offset and size in the input (for error messages and progress).
_Row = tuple[int, int, int, int, int, int]


class _Output:
    """Where processed batches go: laid out in reused buffers a group at a time, the group proven (on a
    second thread), then written and indexed in order."""

    def __init__(self, dst: BinaryIO, base_offset: int, options: RewriteOptions,
                 progress: Callable[[int], None] | None) -> None:
        self.dst = dst
        self.codec = options.codec
        self.progress = progress
        self.builder = IndexBuilder(base_offset, options.index_interval_bytes)
        self.digest = xxhash.xxh3_128()
        self.position = 0
        self.reported = 0
        self.buffers = BufferPool(OUTPUT_BUFFER_BYTES, SPARE_OUTPUT_BUFFERS)
        self.group = _Group()
        self.proving: tuple[_Group, Callable[[], int]] | None = None  # a group and how to wait for its proof
        # zstd groups are proven by the compiled prover (without the GIL); other codecs through the codec packages.
        self.native = options.proof and options.codec is Codec.ZSTD and NATIVE_ZSTD_PROOF
        threaded = options.proof and options.proof_thread and options.codec in PROOF_THREAD_CODECS
        self.prover = _proof.ProofThread() if threaded and self.native else None
        self.executor = (ThreadPoolExecutor(1, thread_name_prefix="tiering-proof")
                         if threaded and not self.native else None)

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if isinstance(exc, TieringError):
                # A batch before the failing one may fail its proof: that would be the first problem in the file.
                self.seal(write=False)
                self.drain(write=False)
        finally:
            if self.prover is not None:
                self.prover.close()
            if self.executor is not None:
                self.executor.shutdown(wait=True, cancel_futures=True)

    def room(self, g: _Group, at: int, n: int) -> memoryview:
        """Close ``g``'s buffer at ``at`` (it has no room for ``n`` more bytes) and give it a new one. A buffer is
        reused once its group is written and its proof collected; writers must not keep what they are given
        beyond the call (io's contract for ``write``)."""
        if at:
            g.filled.append(g.buf[:at])
        g.buf, g.at = memoryview(self.buffers.take(n)), 0
        return g.buf

    def add(self, done: _Out) -> None:
        """Append one batch of the inline path (legacy, or what the scanner left to the Python reader)."""
        g = self.group
        size = sum(len(p) for p in done.parts)
        buf, at = (g.buf, g.at) if g.at + size <= len(g.buf) else (self.room(g, g.at, size), 0)
        for part in done.parts:
            buf[at : at + len(part)] = part
            at += len(part)
        g.at = at
        h = done.header
        g.rows.append((size, h.last_offset, h.max_timestamp, h.position, h.offset, h.size))
        g.digests.append(done.digest)
        g.records_bytes += done.uncompressed_bytes
        self.added()

    def added(self) -> None:
        """After batches were appended to the current group: seal it once it is large enough."""
        g = self.group
        # Without a proof thread to wait for, a run is proven (if at all) and written at once: less memory held.
        if not self.threaded or g.records_bytes >= GROUP_BYTES or len(g.rows) >= GROUP_BATCHES:
            self.seal()

    @property
    def threaded(self) -> bool:
        return self.prover is not None or self.executor is not None

    def prove(self, news: list[memoryview], originals: list[bytes | memoryview]) -> int:
        """The first batch of ``news`` not decoding to its original, or -1: proven on the calling thread."""
        if self.native:
            return _proof.first_mismatch(news, originals)
        return _first_unproven(self.codec, news, originals)

    def submit(self, news: list[memoryview], originals: list[bytes | memoryview]) -> Callable[[], int]:
        """Start proving a group on the proof thread; returns how to wait for the verdict. Verdicts are
        collected in submission order (the compiled prover answers the oldest group first)."""
        if self.prover is not None:
            self.prover.submit(news, originals)
            return self.prover.result
        if self.executor is not None:
            return self.executor.submit(_first_unproven, self.codec, news, originals).result
        failed = self.prove(news, originals)
        return lambda: failed

    def seal(self, *, write: bool = True, last: bool = False) -> None:
        """Close the current group: hand its proof to the proof thread, then finish the group before it.
        The ``last`` group has no work after it to overlap with, so the main thread proves half of it."""
        g = self.group
        if not g.rows:
            return
        self.group = _Group()
        if not g.news:
            self.drain(write=write)
            if write:
                self.write(g)
            return
        if not (last and self.threaded):
            wait = self.submit(g.news, g.originals)
            self.drain(write=write)
            self.proving = (g, wait)
            return
        half = _half(g.originals)
        first = self.submit(g.news[:half], g.originals[:half])
        second = self.prove(g.news[half:], g.originals[half:])
        self.drain(write=write)  # the group before: its verdict comes first
        failed = first()
        failed = failed if failed >= 0 or second < 0 else half + second
        self.proving = (g, lambda: failed)

    def drain(self, *, write: bool = True) -> None:
        """Wait for the group being proven: raise :class:`ProofError` for its first failing batch, else write it."""
        if self.proving is None:
            return
        g, wait = self.proving
        self.proving = None
        _raise_unproven(self.codec, g, wait())
        if write:
            self.write(g)

    def write(self, g: _Group) -> None:
        position = self.position
        if position + sum(row[0] for row in g.rows) > MAX_SEGMENT_BYTES:  # before the index: int32 positions
            for size, _, _, at, base, _ in g.rows:
                if position + size > MAX_SEGMENT_BYTES:
                    raise ConfigError("the rewritten segment would pass Kafka's 2 GiB segment size (int32 positions); "
                                      "choose a codec that compresses", position=at, base_offset=base,
                                      expected=f"<= {MAX_SEGMENT_BYTES} bytes", found=f"{position + size} bytes")
                position += size
        self.position = self.builder.add_all(g.rows, self.position)
        for part in g.output():  # one write an output buffer, not one a batch
            rest = part
            while rest:  # a raw (unbuffered) stream may take less than it is given; None: a file-like that
                written = self.dst.write(rest)  # does not count (a blocking destination took it all)
                rest = rest[len(rest) if written is None else written :]
        self.digest.update(b"".join(g.digests))
        _, _, _, at, _, size_in = g.rows[-1]
        if self.progress is not None and at + size_in >= self.reported + PROGRESS_BYTES:
            self.reported = at + size_in
            self.progress(self.reported)

    def finish(self) -> Indexes:
        self.seal(last=True)
        self.drain()
        return self.builder.finish()


def _rewrite_run(run: V2Run, o: RewriteOptions, order: OffsetOrder, stats: RewriteStats,
                 transitions: Counter[tuple[int, int]], out: _Output,
                 merged_sections: dict[int, tuple[bytes, int]]) -> None:
    """The hot path: a run of v2 batches the compiled scanner already checked (header, CRC), processed and
    laid out in the output's current group. Per batch only what must be per batch; the rest per run.

    ``merged_sections`` holds, by base offset, the batches re-batching merged and proved (their records section read
    back from their bytes): the xxh3-128 and length of that section. Such a batch, already in the target
    codec, is kept without decompressing it again."""
    buf, run_position = run.buffer, run.position
    target, target_id, force, deep, prove = o.codec, int(o.codec), o.force, o.deep_validation, o.proof
    recompress = compressor(target, o.level)
    put_v2 = _walker.put_v2
    limit = o.decompression_limit
    shrink_only = target is not Codec.NONE
    lowest = order.lowest_next()
    highest = order.highest_last()
    g = out.group
    rows, digests, news, originals, proven = g.rows, g.digests, g.news, g.originals, g.proven_rows
    dst, at = g.buf, g.at
    records = records_bytes = 0
    kept: list[str] = []
    try:
        for start, total, base, last, max_ts, attributes, count in run.batches:
            position = run_position + start
            batch = buf[start : start + total]
            codec_id = attributes & CODEC_MASK
            payload: bytes | memoryview = batch[V2_HEADER_SIZE:]
            known = merged_sections.pop(base, None) if merged_sections else None
            if known is not None and codec_id == target_id and not force:
                digest, payload_bytes = known
            else:
                if codec_id:
                    payload = decompress(CODECS[codec_id], payload, limit=limit)
                if deep:
                    validate_v2_records(payload, count, last - base)  # the count it returns equals the header's
                digest, payload_bytes = xxhash.xxh3_128_digest(payload), len(payload)
            if base < lowest or last > highest:  # after the records, as the inline path checks it
                order.check(parse_v2_header(batch, position), base)  # raises, saying why
            lowest = last + 1
            order.prev_last = last
            digests.append(digest)
            reason = None
            if attributes & CONTROL_BIT:
                reason = KEPT_CONTROL
            elif codec_id == target_id and not force:
                reason = KEPT_SAME_CODEC
            else:
                new = recompress(payload)
                if shrink_only and len(new) >= total - V2_HEADER_SIZE:
                    reason = KEPT_WOULD_GROW
            size = total if reason else V2_HEADER_SIZE + len(new)
            if at + size > len(dst):
                dst, at = out.room(g, at, size), 0
            if reason is None:
                end = put_v2(dst, at, batch, target_id, new)
                if prove:
                    proven.append(len(rows))
                    news.append(dst[at + V2_HEADER_SIZE : end])
                    originals.append(payload)
                transitions[codec_id, target_id] += 1
            else:
                dst[at : at + size] = batch
                transitions[codec_id, codec_id] += 1
                kept.append(reason)
            at += size
            rows.append((size, last, max_ts, position, base, total))
            records += count
            records_bytes += payload_bytes
    except TieringError as e:
        # (the batches before it in the group are proven when the output closes: see _Output.__exit__)
        raise e.located(position=position, base_offset=base) from None
    finally:
        g.at = at
    g.records_bytes += records_bytes
    batches = len(run.batches)
    stats.batches += batches
    stats.batches_rewritten += batches - len(kept)
    stats.kept.update(kept)
    stats.records += records
    stats.uncompressed_bytes += records_bytes
    stats.bytes_in += sum(b[1] for b in run.batches)
    out.added()


def rewrite_segment(src: BinaryIO, dst: BinaryIO, *, base_offset: int, options: RewriteOptions,
                    path: str | None = None, size: int | None = None,
                    progress: Callable[[int], None] | None = None,
                    rebatch: RebatchOptions | None = None) -> RewriteResult:
    """Rewrite the segment read from ``src`` into ``dst``; returns its stats and its rebuilt indexes.

    Raises an :class:`~tiering.errors.InvalidDataError` naming the file, byte and batch at the first
    problem (in file order); the caller discards ``dst`` then (the CLI writes to a temporary file).
    ``payload_xxh3`` is xxh3-128 over the per-batch xxh3-128 digests of the records.

    With ``rebatch``, the source goes through :func:`~tiering.kafka.rebatch.rebatched` on its way in (runs
    of small batches merged, proved by the records digest), in the same pass; ``result.rebatch`` says what
    was merged, and ``stats.bytes_in`` stays the source's size.
    """
    merged: RebatchStats | None = None
    merged_sections: dict[int, tuple[bytes, int]] = {}  # see _rewrite_run
    source_digest = xxhash.xxh3_128()
    source_codecs: Counter[Codec] = Counter()
    if rebatch is not None:
        merged = RebatchStats()
        quick = replace(options, proof=False, deep_validation=False)
        xxh3_digest = xxhash.xxh3_128_digest

        def on_source(raw: RawBatch, payload: bytes | memoryview | None) -> None:
            source_digest.update(xxh3_digest(payload) if payload is not None else _payload_digest(raw, quick))
            source_codecs[raw.header.codec] += 1

        def on_merged(base: int, section_digest: bytes, section_bytes: int) -> None:
            merged_sections[base] = (section_digest, section_bytes)

        src = cast(BinaryIO, ChunkStream(rebatched(src, rebatch, merged, path=path, progress=progress,
                                                   recompressed_size=_alone_size(quick), on_source=on_source,
                                                   on_merged=on_merged)))
        size, progress = None, None
    started = time.perf_counter()
    stats = RewriteStats(path, base_offset, options.codec.label, options.level)
    order = OffsetOrder(base_offset, path)
    transitions: Counter[tuple[int, int]] = Counter()
    try:
        with collector_paused(), _Output(dst, base_offset, options, progress) as out:
            for entry in iter_entries(src, path=path, size=size, max_batch_bytes=options.max_batch_bytes):
                if isinstance(entry, V2Run):
                    _rewrite_run(entry, options, order, stats, transitions, out, merged_sections)
                    continue
                done = process_batch(entry, options)
                h = done.header
                order.check(h, done.base_offset)
                out.add(done)
                stats.batches += 1
                stats.bytes_in += h.size
                stats.records += done.records
                stats.uncompressed_bytes += done.uncompressed_bytes
                transitions[h.codec, done.codec] += 1
                if done.kept is None:
                    stats.batches_rewritten += 1
                else:
                    stats.kept[done.kept] += 1
            indexes = out.finish()
    except TieringError as e:
        raise e.located(path=path) from None
    for (before, after), n in transitions.items():
        stats.codecs_before[CODECS[before].label] += n
        stats.codecs_after[CODECS[after].label] += n
    if merged is not None:  # the figures of the source, not of the merged stream the rewrite read
        stats.bytes_in = merged.bytes_in
        stats.source_payload_xxh3 = source_digest.hexdigest()
        stats.codecs_before = Counter({codec.label: n for codec, n in source_codecs.items()})
        if not options.force:  # a merged batch is new, in the target codec: rewritten, not kept
            stats.kept[KEPT_SAME_CODEC] -= merged.runs_merged
            stats.batches_rewritten += merged.runs_merged
            stats.kept = +stats.kept
    if progress is not None:
        progress(stats.bytes_in)
    stats.bytes_out = out.position
    stats.payload_xxh3 = out.digest.hexdigest()
    stats.seconds = time.perf_counter() - started
    return RewriteResult(stats, indexes, merged)


def _alone_size(quick: RewriteOptions) -> Callable[[RawBatch, bytes | memoryview | None], int]:
    """A batch's size after this rewrite on its own (kept, or recompressed), without the proof: what a batch
    that re-batching merged would have come to without it. The batch itself is not laid out: a v2 batch's
    header stays the size it is, so only its records section is compressed and measured."""
    recompress = compressor(quick.codec, quick.level)

    def size(raw: RawBatch, payload: bytes | memoryview | None) -> int:
        if payload is None or raw.header.magic < 2:
            return sum(len(part) for part in process_batch(raw, quick, payload).parts)
        item = _prepare_v2(raw, quick, payload)
        if isinstance(item, _Out):
            return len(raw.data)
        new = len(recompress(item.original))
        return len(raw.data) if quick.codec is not Codec.NONE and new >= item.old_size else V2_HEADER_SIZE + new

    return size


def _payload_digest(raw: RawBatch, quick: RewriteOptions) -> bytes:
    """The xxh3-128 of a batch's records as the rewrite digests them (``payload_xxh3`` is over these: a v2
    batch's records section), without recompressing it."""
    item = _prepare_v2(raw, quick) if raw.header.magic >= 2 else _prepare_legacy(raw, quick)
    return item.digest if isinstance(item, _Out) else xxhash.xxh3_128_digest(item.original)


@dataclass(frozen=True, slots=True)
class ReadBack:
    """What a rewritten segment holds, as read back from wherever it was written."""

    size: int
    batches: int
    records: int
    payload_xxh3: str  # comparable with RewriteStats.payload_xxh3 of the rewrite that produced it
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
