"""Re-batching at rest: runs of consecutive small batches of one segment merged into larger ones, every record
(offset, timestamp, key, value, headers) unchanged. Compression works per batch, so a topic written one
record a batch barely compresses, whatever the codec; merged, it compresses like a topic written in large
batches.

A batch joins the run before it only when every rule below holds; the first rule it breaks ends the run
(:class:`Refusal` names it). Each rule, and why:

1. **Magic v2 data batches only.** A control batch (a transaction marker) is one record the broker reads
   as a marker, by its batch attributes; legacy entries have no batch to merge into.
2. **Never a transactional batch.** Its records belong to a transaction that the markers and the
   ``.txnindex`` describe by producer and offset range; kept as it is, the ``.txnindex`` stays valid.
3. **The same partition leader epoch.** A broker rebuilds its leader-epoch cache from the batches' epochs
   and answers ``OffsetsForLeaderEpoch`` with it: a merged batch has one epoch.
4. **The same timestamp type; LogAppendTime batches only with the same timestamp.** A LogAppendTime
   record's timestamp is its batch's (max) timestamp, so only batches of one append time can share one.
5. **No delete horizon.** A batch the log cleaner stamped carries the horizon in its base timestamp, which
   then is not a record's time.
6. **One producer identity.** Batches without a producer id (``-1``: no idempotence) merge with each other.
   An idempotent producer's batches merge only with its own, of the same epoch, when their sequences run
   with their offsets (each batch's base sequence is the first's plus its offset distance, without a
   wrap past 2^31-1): the merged batch keeps the first's base sequence, and every record keeps its
   sequence, ``baseSequence + offsetDelta``.
7. **Never a producer's last batch in the segment.** On load a broker rebuilds each producer's state from
   its batches (last sequence, last offset, epoch, timestamp, and the last five batches' metadata for
   duplicate detection). The last batch is kept exactly as it is, so the restored last sequence, offset,
   epoch and timestamp are the original's; the five-batch history then holds merged batches, which only
   matters to a producer retrying a batch of a sealed segment, long after its session ended. The segment
   is read once: a run ending with a producer's batch waits until a later batch of that producer turns up
   (then it merges whole) or the segment ends (then that batch stays out), within a bounded lookahead past
   which the batch is kept out as if it were the last (:func:`_groups`).
8. **Not empty.** A batch without records exists only for its producer state or its offsets (the cleaner
   leaves such batches behind): kept as it is.
9. **Bounded size.** A merged batch holds at most ``max_bytes`` of records, counted with room for the
   larger deltas it re-encodes (15 bytes a record) and its header: by default 1 MiB, Kafka's default
   ``max.message.bytes`` and ``message.max.bytes``, which a restored topic may enforce. A merged batch
   that still comes out larger than ``max_bytes`` (a codec's framing around incompressible records) is
   not written: its batches are, as they were.

10. **Offsets within a batch's reach.** A merged batch's records sit at most 2^31-1 offsets past its base
    offset (``lastOffsetDelta`` is an int32).

The merged batch: ``baseOffset`` the first batch's, ``lastOffsetDelta`` reaching the last batch's last
offset (gaps inside stay as record offset deltas), timestamps recomputed from its records (the
LogAppendTime kept), the first batch's leader epoch, producer id, epoch and base sequence, the target
codec. A batch that merges with nothing is written as it was.

The proof, in two parts. Each merged batch is read back from its own bytes (header, CRC, its records section
decompressed, which must be the merged records byte for byte) and its records, in the digest's terms
(``records_sha256``'s input: offset, timestamp, key, value, headers), must be its batches' records. Then the
records digest input of the whole output must equal the source's (compared by xxh3-128), so no batch was
lost, repeated or reordered on the way. ``records_sha256`` is reported for the source; the batch digest
changes where batches merged.

Two engines do the record work, chosen by :class:`Engine`: the compiled one (``_records.c``: records read
as spans of the decompressed section, re-encoded into the merged section without a Python object per
record, the digest's input made there too) and the Python reference (records decoded into
:class:`~tiering.kafka.records.Record` objects, :func:`~tiering.kafka.builder.build_batch`). The rules above
are decided from batch headers by the same code for both, and the tests demand the same bytes from both.
Where the compiled code does not vouch for a batch (a corrupt one, an arithmetic edge) it hands that batch or
that merge to the reference, which names the problem or defines the result.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import BinaryIO, Final, NamedTuple, Protocol, cast

import xxhash

from tiering.errors import ProofError, TieringError
from tiering.kafka import _proof, _records
from tiering.kafka.batch import (
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    TRANSACTIONAL_BIT,
    V2_HEADER_SIZE,
    BatchHeader,
    TimestampType,
    check_crc,
    parse_v2_header,
    timestamp_base,
)
from tiering.kafka.builder import BatchSpec, assemble_batch, build_batch
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec, decompress
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.records import Engine, decode_v2, records_section
from tiering.kafka.segment import (
    DecodedBatch,
    Digests,
    decode_located,
    encoded_records,
    payload_of,
)

DEFAULT_MAX_BYTES: Final = 1 << 20  # Kafka's default max.message.bytes / message.max.bytes
RECORD_SLACK: Final = 15  # a re-encoded record's deltas may take this many more bytes (varint growth)
NO_PRODUCER: Final = -1
SEQUENCE_LIMIT: Final = (1 << 31) - 1
OFFSET_DELTA_LIMIT: Final = (1 << 31) - 1
DEFAULT_LOOKAHEAD_BYTES: Final = 32 << 20  # batches (uncompressed) held behind a run whose rule 7 is undecided
# What the merged batches would have come to recompressed one by one is measured on every merged batch up to
# MEASURE_ALL, then on one in MEASURE_EVERY, and scaled by source bytes: measuring them all costs as much as
# the recompression the merge replaces.
MEASURE_ALL: Final = 64
MEASURE_EVERY: Final = 16
IN_FLIGHT: Final = 2  # merged batches being compressed and proven while the next runs are read and merged
HASH_CHUNK_BYTES: Final = 16 << 10  # digest input hashed at once, at least (see _Feed)
NATIVE_ZSTD: Final = _proof.available()  # a libzstd the compiled proof may use (see _proof.c)


_ALONE_BITS: Final = CONTROL_BIT | TRANSACTIONAL_BIT | DELETE_HORIZON_BIT  # see _alone


class Refusal(StrEnum):
    """Why a batch does not join the run before it (the rule it breaks, numbered as in the module docs)."""

    NOT_DATA = "control batch or legacy entry"
    TRANSACTIONAL = "transactional"
    LEADER_EPOCH = "another partition leader epoch"
    TIMESTAMP_TYPE = "another timestamp type, or another LogAppendTime"
    DELETE_HORIZON = "delete horizon set"
    PRODUCER = "another producer, epoch, or sequences not contiguous"
    PRODUCER_LAST = "its producer's last batch in the segment"
    EMPTY = "no records"
    SIZE = "the merged batch would exceed the size limit"
    OFFSET_SPAN = "its offsets too far from the merged batch's base offset"


@dataclass(frozen=True, slots=True)
class RebatchOptions:
    codec: Codec  # the merged batches' codec (batches left alone keep theirs)
    level: int | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT
    engine: Engine = Engine.NATIVE


@dataclass
class RebatchStats:
    batches_in: int = 0
    batches_out: int = 0
    runs_merged: int = 0  # merged batches written
    batches_merged: int = 0  # source batches that went into them
    records: int = 0
    bytes_in: int = 0  # the source segment's bytes
    merged_bytes_in: int = 0  # the source bytes of the batches that were merged
    merged_bytes_recompressed: int = 0  # those batches' size after recompression alone, one by one (see below)
    measured_batches: int = 0  # merged batches whose recompression alone was measured (all, or a sample) ...
    measured_bytes_in: int = 0  # ... their source bytes ...
    measured_bytes_out: int = 0  # ... and their size recompressed alone
    merged_bytes_out: int = 0  # the merged batches' size
    undecided: int = 0  # runs whose last batch was kept out at the lookahead's bound, not at the segment's end
    refusals: Counter[Refusal] = field(default_factory=Counter)
    records_sha256: str = ""  # the source's records, which the output was proven to hold (rebatched)
    batches_sha256_in: str = ""
    batches_sha256_out: str = ""  # differs from the source's where batches merged

    @property
    def recompressed_is_estimate(self) -> bool:
        """Whether ``merged_bytes_recompressed`` is scaled from a sample of the merged batches."""
        return self.measured_batches < self.batches_merged

    def measured(self, source_bytes: int, alone_bytes: int) -> None:
        """One merged batch's recompression alone, measured; ``merged_bytes_recompressed`` follows."""
        self.measured_batches += 1
        self.measured_bytes_in += source_bytes
        self.measured_bytes_out += alone_bytes

    def scale_measured(self) -> None:
        """``merged_bytes_recompressed`` from what was measured: exact when every merged batch was, else the
        sample's ratio of recompressed to source bytes over all merged source bytes."""
        if self.measured_bytes_in:
            self.merged_bytes_recompressed = round(self.measured_bytes_out * self.merged_bytes_in
                                                   / self.measured_bytes_in)

    @property
    def saved_by_rebatching(self) -> int:
        """Bytes the merge saved beyond recompressing the same batches one by one."""
        return self.merged_bytes_recompressed - self.merged_bytes_out

    def to_json(self) -> dict[str, object]:
        return {"batches_in": self.batches_in, "batches_out": self.batches_out, "runs_merged": self.runs_merged,
                "batches_merged": self.batches_merged, "records": self.records, "bytes_in": self.bytes_in,
                "merged_bytes": {"in": self.merged_bytes_in, "recompressed_alone": self.merged_bytes_recompressed,
                                 "out": self.merged_bytes_out},
                "recompressed_alone_measured": {"batches": self.measured_batches, "of": self.batches_merged,
                                                "estimate": self.recompressed_is_estimate},
                "saved_by_rebatching": self.saved_by_rebatching, "undecided": self.undecided,
                "refusals": {str(k): v for k, v in sorted(self.refusals.items()) if v},
                "records_sha256": self.records_sha256,
                "batches_sha256": {"in": self.batches_sha256_in, "out": self.batches_sha256_out},
                "batches_digest_changed": self.batches_sha256_out != self.batches_sha256_in}


def _alone(h: BatchHeader) -> Refusal | None:
    """The rule that keeps batch ``h`` out of any run (as its first batch too), or None."""
    if h.magic >= 2 and not h.attributes & _ALONE_BITS and h.records_count:
        return None
    if h.magic < 2 or h.is_control:
        return Refusal.NOT_DATA
    if h.is_transactional:
        return Refusal.TRANSACTIONAL
    if h.delete_horizon_ms is not None:
        return Refusal.DELETE_HORIZON
    if h.records_count == 0:
        return Refusal.EMPTY
    return None


def joins(first: BatchHeader, h: BatchHeader) -> Refusal | None:
    """The rule that keeps batch ``h`` from joining the run that ``first`` opened (both passed
    :func:`_alone`), or None. Pure: headers in, verdict out."""
    if h.partition_leader_epoch != first.partition_leader_epoch:
        return Refusal.LEADER_EPOCH
    if h.timestamp_type is not first.timestamp_type or (
            h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp != first.max_timestamp):
        return Refusal.TIMESTAMP_TYPE
    if h.last_offset - first.offset > OFFSET_DELTA_LIMIT:
        return Refusal.OFFSET_SPAN
    if h.producer_id != first.producer_id:
        return Refusal.PRODUCER
    if h.producer_id != NO_PRODUCER:
        expected = first.base_sequence + (h.offset - first.offset)
        if (h.producer_epoch != first.producer_epoch or first.base_sequence < 0 or h.base_sequence != expected
                or expected + (h.last_offset - h.offset) > SEQUENCE_LIMIT):
            return Refusal.PRODUCER
    return None


class _Source(Protocol):
    """A source batch as the grouping sees it (a :class:`DecodedBatch`, or a :class:`_Section`)."""

    @property
    def raw(self) -> RawBatch: ...
    @property
    def header(self) -> BatchHeader: ...
    @property
    def uncompressed_bytes(self) -> int: ...
    @property
    def record_count(self) -> int: ...
    @property
    def base_offset(self) -> int: ...


class _Section(NamedTuple):
    """A v2 batch the compiled engine vouched for: its decompressed records and their digest input (a named
    tuple: one is made per source batch)."""

    raw: RawBatch
    header: BatchHeader
    section: bytes | memoryview
    encoded: bytes  # what Digests hashes for its records (_records.digest_v2)
    uncompressed_bytes: int
    record_count: int
    base_offset: int


def _weight(batch: _Source) -> int:
    """What a batch adds to a merged batch's size bound (rule 9)."""
    return batch.uncompressed_bytes + RECORD_SLACK * batch.record_count


@dataclass(slots=True)
class _Run:
    """Consecutive batches to merge (one: kept as it is)."""

    batches: list[_Source]
    weight: int
    held: bool = False  # its last batch is its producer's latest so far: whether it may be merged is undecided
    ended_by: Refusal | None = None  # why the next batch did not join (None: the segment ended)


def _groups(batches: Iterator[_Source], options: RebatchOptions, stats: RebatchStats,
            lookahead_bytes: int) -> Iterator[list[_Source]]:
    """The source batches in file order, in groups to merge (a group of one is written as it is).

    Rule 7 in one pass: a run that ends with an idempotent producer's batch is held until a later batch of
    that producer shows that batch was not its last (the run is merged whole), or the segment ends (it was:
    the run is merged without it, and it is written as it is). Everything after a held run waits behind it,
    up to ``lookahead_bytes`` of batches; past that the oldest held run is decided as if its last batch
    were its producer's last, which only merges less.
    """
    queue: deque[_Run] = deque()  # closed runs not written yet, in file order
    held: dict[int, _Run] = {}  # producer id -> the queued run ending with its latest batch
    queued = 0
    run: _Run | None = None  # the run the next batch may join

    def close(r: _Run, ended_by: Refusal | None = None) -> None:
        nonlocal queued
        r.ended_by = ended_by
        pid = r.batches[-1].header.producer_id
        if len(r.batches) > 1 and pid != NO_PRODUCER:
            r.held = True
            held[pid] = r
        queue.append(r)
        queued += r.weight

    def ready(end: bool) -> Iterator[list[_Source]]:
        nonlocal queued
        while queue and (not queue[0].held or end or queued > lookahead_bytes):
            r = queue.popleft()
            queued -= r.weight
            if not r.held:
                yield r.batches
                continue
            del held[r.batches[-1].header.producer_id]
            if r.ended_by is not None:  # the run ended at its last batch, which rule 7 keeps out
                stats.refusals[r.ended_by] -= 1
            stats.refusals[Refusal.PRODUCER_LAST] += 1
            if not end:
                stats.undecided += 1
            yield r.batches[:-1]
            yield r.batches[-1:]

    for batch in batches:
        h = batch.header
        w = _weight(batch)
        alone = _alone(h)
        if run is not None:
            refusal = alone or joins(run.batches[0].header, h)
            if refusal is None and run.weight + w > options.max_bytes:
                refusal = Refusal.SIZE
            if refusal is None:  # same producer as the run: no held run of it can be waiting
                run.batches.append(batch)
                run.weight += w
                continue
            stats.refusals[refusal] += 1
            close(run, refusal)
            run = None
        if h.magic >= 2 and h.producer_id != NO_PRODUCER and (waiting := held.pop(h.producer_id, None)):
            waiting.held = False  # its last batch was not its producer's last
        if alone is None and V2_HEADER_SIZE + w <= options.max_bytes:
            run = _Run([batch], V2_HEADER_SIZE + w)
        else:
            close(_Run([batch], w))
        yield from ready(False)
    if run is not None:
        close(run)
    yield from ready(True)


def _spec(first: BatchHeader, last: BatchHeader, options: RebatchOptions) -> BatchSpec:
    """The merged batch's header fields, for a run from ``first`` to ``last``."""
    return BatchSpec(first.offset, options.codec, options.level, first.partition_leader_epoch, first.producer_id,
                     first.producer_epoch, first.base_sequence if first.producer_id != NO_PRODUCER else -1,
                     log_append_time=first.max_timestamp
                     if first.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
                     last_offset_delta=last.last_offset - first.offset)


def merged_batch(run: list[DecodedBatch], options: RebatchOptions) -> bytes:
    """One v2 batch holding every record of ``run`` (consecutive batches that :func:`joins` accepted)."""
    return build_batch(_spec(run[0].header, run[-1].header, options), [r for b in run for r in b.records])


class _Merge(NamedTuple):
    """The compiled engine's merge of a run: the records section and what the batch header needs."""

    section: bytes
    records: int
    first_timestamp: int
    max_timestamp: int


def _merge_native(run: list[_Source]) -> _Merge | None:
    """The records of a run merged by the compiled engine, or None where it does not vouch for them (a batch
    the reference holds, a record it does not read, an arithmetic edge)."""
    if not all(isinstance(b, _Section) for b in run):
        return None
    sections = cast(list[_Section], run)
    first = run[0].header
    _, log_append = timestamp_base(first)
    merged = _records.merge_v2([b.section for b in sections],
                               [(b.header.offset, timestamp_base(b.header)[0], b.header.last_offset - b.header.offset)
                                for b in sections], log_append, first.offset)
    return None if merged is None else _Merge(*merged)


def _assembled(run: list[_Source], merge: _Merge, options: RebatchOptions) -> bytes:
    """The merged batch of ``run`` around its records' ``merge``: header, codec, CRC."""
    return assemble_batch(_spec(run[0].header, run[-1].header, options), merge.section, merge.records,
                          merge.first_timestamp, merge.max_timestamp, 0)


def _native(raw: RawBatch, limit: int, path: str | None) -> _Source:
    """A source batch for the compiled engine: its records as a section it vouched for, or else decoded by
    the Python reference (which raises the error naming the problem)."""
    h = raw.header
    if h.magic >= 2 and h.records_count is not None:
        try:
            section = payload_of(raw, limit)
        except TieringError:
            section = None  # decode_batch below says why, located
        if section is not None:
            ts, log_append = timestamp_base(h)
            encoded = _records.digest_v2(section, h.offset, ts, log_append, h.records_count, h.last_offset - h.offset)
            if encoded is not None:
                return _Section(raw, h, section, encoded, len(section), h.records_count, h.offset)
    return decode_located(raw, path=path, limit=limit)


def _encoded(batch: _Source) -> bytes:
    """What ``records_sha256`` hashes for a batch's records."""
    if isinstance(batch, _Section):
        return batch.encoded
    assert isinstance(batch, DecodedBatch)
    return encoded_records(batch.records)


def _source(raw: RawBatch, options: RebatchOptions, path: str | None) -> _Source:
    limit = options.decompression_limit
    if options.engine is Engine.NATIVE:
        return _native(raw, limit, path)
    return decode_located(raw, path=path, limit=limit)


class _Built(NamedTuple):
    """A merged batch, proven (:func:`_merged`)."""

    batch: bytes
    encoded: bytes  # its records' digest input, as read back from its bytes
    section_xxh3: bytes  # the xxh3-128 of its records section as read back (what the rewriter digests) ...
    section_bytes: int  # ... and that section's length


def _merged(group: list[_Source], merge: _Merge | None, options: RebatchOptions, path: str | None) -> _Built:
    """The merged batch of a group, laid out around the compiled engine's ``merge`` of its records, else by the
    reference, proven: read back from the merged batch's own bytes (header, CRC, records section
    decompressed), its records are the group's, in order, or :class:`ProofError`."""
    if merge is not None:
        built, section = _assembled(group, merge, options), merge.section
    else:
        section = None
        built = merged_batch([b if isinstance(b, DecodedBatch)
                              else decode_located(b.raw, path=path, limit=options.decompression_limit)
                              for b in group], options)
    raw = RawBatch(parse_v2_header(built, 0), memoryview(built))
    h = raw.header
    try:
        check_crc(h, raw.data)
        got, read_back = _proved_records(raw, section, options.decompression_limit)
    except ProofError as e:
        raise e.located(path=path) from None
    except TieringError as e:
        raise ProofError(f"merged batch unreadable: {e.message}", path=path, base_offset=h.offset,
                         expected=e.expected, found=e.found) from None
    expected = b"".join(_encoded(b) for b in group)
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                  min(len(got), len(expected)))
        raise ProofError("merged batch does not hold its batches' records", path=path, base_offset=h.offset,
                         expected=f"the records of {len(group)} batches: {len(expected)} bytes of digest input",
                         found=f"{len(got)} bytes, the first difference at byte {at}")
    return _Built(built, got, xxhash.xxh3_128_digest(read_back), len(read_back))


def _proved_records(raw: RawBatch, section: bytes | None, limit: int) -> tuple[bytes, bytes | memoryview]:
    """The digest input of a merged batch's records, and its records section, read from its bytes. Given the
    section it was built from (the compiled engine's), the batch's records section must decompress to it,
    byte for byte, and the compiled reader reads that; otherwise the Python reference decodes the batch."""
    h = raw.header
    if section is not None:
        frame = records_section(raw.data)
        if h.codec is Codec.ZSTD and NATIVE_ZSTD:
            same = _proof.first_mismatch([frame], [section]) < 0
        else:
            same = (frame if h.codec is Codec.NONE else decompress(h.codec, frame, limit=limit)) == section
        if not same:
            raise ProofError(f"merged batch's {h.codec.label} records section does not decompress to its records",
                             base_offset=h.offset)
        ts, log_append = timestamp_base(h)
        encoded = _records.digest_v2(section, h.offset, ts, log_append, h.records_count or 0,
                                     h.last_offset - h.offset)
        if encoded is not None:
            return encoded, section
    payload = payload_of(raw, limit)
    return encoded_records(decode_v2(h, payload)), payload


@dataclass(slots=True)
class _Feed:
    """One side's digests (the source's, or the output's), fed in file order: each batch header's into
    ``digests`` at once; the records' digest input in chunks (small batches' joined: a hash call costs more
    than it hashes) into ``stream`` (xxh3-128: the proof compares the two sides') and, where ``sha``, into
    ``digests`` (records_sha256, which the source's side reports)."""

    sha: bool
    digests: Digests = field(default_factory=Digests)
    stream: xxhash.xxh3_128 = field(default_factory=xxhash.xxh3_128)
    pending: list[bytes] = field(default_factory=list)
    size: int = 0

    def add(self, h: BatchHeader, base_offset: int, records: int, encoded: bytes) -> None:
        self.digests.update_batch(h, base_offset, records)
        if len(encoded) >= HASH_CHUNK_BYTES:
            self.flush()
            self.hash(encoded)
            return
        self.pending.append(encoded)
        self.size += len(encoded)
        if self.size >= HASH_CHUNK_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.hash(b"".join(self.pending) if len(self.pending) > 1 else self.pending[0])
            self.pending, self.size = [], 0

    def hash(self, chunk: bytes) -> None:
        self.stream.update(chunk)
        if self.sha:
            self.digests.update_records(chunk)


class _Worker:
    """The merged batches' layout, compression and proof (:func:`_merged`), on a thread beside the one that
    reads, groups and merges; at most ``IN_FLIGHT`` merged batches wait for it."""

    def __init__(self, options: RebatchOptions, path: str | None) -> None:
        self.options, self.path = options, path
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="tiering-rebatch")

    def merge(self, group: list[_Source]) -> Future[_Built]:
        """The group's merged batch: its records merged here (compiled), laid out, compressed and proven on the
        worker (the reference merges there too)."""
        merge = _merge_native(group) if self.options.engine is Engine.NATIVE else None
        return self.pool.submit(_merged, group, merge, self.options, self.path)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def rebatched(src: BinaryIO, options: RebatchOptions, stats: RebatchStats, *, path: str | None = None,
              lookahead_bytes: int = DEFAULT_LOOKAHEAD_BYTES,
              recompressed_size: Callable[[RawBatch, bytes | memoryview | None], int] | None = None,
              progress: Callable[[int], None] | None = None,
              on_source: Callable[[RawBatch, bytes | memoryview | None], None] | None = None,
              on_merged: Callable[[int, bytes, int], None] | None = None) -> Iterator[bytes | memoryview]:
    """``src``'s batches with the runs of mergeable batches merged (see the module docs), as the bytes of
    each batch in file order; ``stats`` filled in as it goes. One pass, memory bounded by
    ``lookahead_bytes`` (:func:`_groups`) and ``IN_FLIGHT`` merged batches.

    Every merged batch is proven as it is made (:func:`_merged`: read back from its bytes, it holds its
    batches' records), on a worker thread while the next run is read and merged; once the source is read,
    the records digest of the whole output must equal the source's (so no batch was lost, repeated or
    reordered), else :class:`ProofError`.
    ``recompressed_size`` gives a source batch's size after recompression alone (the counterfactual of
    ``stats.merged_bytes_recompressed``, measured on every merged batch or on a sample: MEASURE_ALL);
    ``progress`` gets the source bytes read so far; ``on_source`` sees each source batch in file order.
    Both callbacks get the batch's decompressed records section where the engine holds it (else None).
    ``on_merged`` gets each merged batch's base offset, the xxh3-128 of its records section as the proof read
    it back, and that section's length, before the batch is yielded."""
    worker = _Worker(options, path)
    source, output = _Feed(sha=True), _Feed(sha=False)

    def counted() -> Iterator[_Source]:
        for raw in iter_batches(src, path=path):
            batch = _source(raw, options, path)
            source.add(batch.header, batch.base_offset, batch.record_count, _encoded(batch))
            stats.batches_in += 1
            stats.records += batch.record_count
            stats.bytes_in += len(batch.raw.data)
            if on_source is not None:
                on_source(batch.raw, _section_of(batch))
            if progress is not None:
                progress(stats.bytes_in)
            yield batch

    def settle(group: list[_Source], merging: Future[_Built] | None) -> Iterator[bytes | memoryview]:
        """A group's output, in file order: its merged batch, or its batches as they were."""
        merged = merging.result() if merging is not None else None
        built = merged.batch if merged is not None else b""
        if len(built) > options.max_bytes:  # codec framing past the bound (rule 9): the batches as they were
            stats.refusals[Refusal.SIZE] += 1
            built = b""
        if not built:
            for batch in group:
                output.add(batch.header, batch.base_offset, batch.record_count, _encoded(batch))
                yield batch.raw.data
            stats.batches_out += len(group)
            return
        assert merged is not None
        output.add(parse_v2_header(built, 0), group[0].header.offset, sum(b.record_count for b in group),
                   merged.encoded)
        if on_merged is not None:
            on_merged(group[0].header.offset, merged.section_xxh3, merged.section_bytes)
        if recompressed_size is not None:
            for i, b in enumerate(group, stats.batches_merged):
                if i < MEASURE_ALL or i % MEASURE_EVERY == 0:
                    stats.measured(len(b.raw.data), recompressed_size(b.raw, _section_of(b)))
        stats.runs_merged += 1
        stats.batches_merged += len(group)
        stats.batches_out += 1
        stats.merged_bytes_in += sum(len(b.raw.data) for b in group)
        stats.merged_bytes_out += len(built)
        yield built

    queue: deque[tuple[list[_Source], Future[_Built] | None]] = deque()
    in_flight = 0
    try:
        for group in _groups(counted(), options, stats, lookahead_bytes):
            merging = worker.merge(group) if len(group) > 1 else None
            in_flight += merging is not None
            queue.append((group, merging))
            while queue and ((head := queue[0][1]) is None or head.done() or in_flight > IN_FLIGHT):
                done, merged = queue.popleft()
                in_flight -= merged is not None
                yield from settle(done, merged)
        while queue:
            yield from settle(*queue.popleft())
        source.flush()
        output.flush()
    finally:
        worker.close()
    stats.scale_measured()
    if output.stream.digest() != source.stream.digest():
        raise ProofError("the re-batched segment does not hold the source's records", path=path,
                         expected=f"records digest input xxh3-128 {source.stream.hexdigest()}",
                         found=output.stream.hexdigest())
    stats.records_sha256 = source.digests.records_sha256
    stats.batches_sha256_in, stats.batches_sha256_out = source.digests.batches_sha256, output.digests.batches_sha256


def _section_of(batch: _Source) -> bytes | memoryview | None:
    return batch.section if isinstance(batch, _Section) else None
