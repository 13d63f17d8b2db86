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
codec. A batch that merges with nothing is written as it was. The proof is the records digest
(``records_sha256``) of the output, every merged batch decoded again, which must equal the source's; the
batch digest changes where batches merged.

Two engines do the record work, chosen by :class:`Engine`: the compiled one (``_records.c``: records read
as spans of the decompressed section, re-encoded into the merged section without a Python object per
record, the digest's input made there too) and the Python reference (records decoded into
:class:`~tiering.kafka.records.Record` objects, :func:`~tiering.kafka.builder.build_batch`). The rules above
are decided from batch headers by the same code for both, and the tests demand the same bytes from both.
Where the compiled code does not vouch for a batch (a corrupt one, an arithmetic edge) it hands that batch or
that merge to the reference, which names the problem or defines the result.
"""

from __future__ import annotations

import io
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import BinaryIO, Final, Protocol, cast

from tiering.errors import ProofError, TieringError
from tiering.kafka import _records
from tiering.kafka.batch import V2_HEADER_SIZE, BatchHeader, TimestampType, timestamp_base
from tiering.kafka.builder import BatchSpec, assemble_batch, build_batch
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.records import Engine
from tiering.kafka.segment import DecodedBatch, Digests, decode_located, iter_decoded, payload_of

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
    records_sha256_in: str = ""
    batches_sha256_in: str = ""
    records_sha256_out: str = ""  # of the output, once proved (equal to the source's)
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
                "records_sha256": {"in": self.records_sha256_in, "out": self.records_sha256_out},
                "batches_sha256": {"in": self.batches_sha256_in, "out": self.batches_sha256_out},
                "records_digest_equal": bool(self.records_sha256_out) and
                self.records_sha256_out == self.records_sha256_in,
                "batches_digest_changed": self.batches_sha256_out != self.batches_sha256_in}


def _alone(h: BatchHeader) -> Refusal | None:
    """The rule that keeps batch ``h`` out of any run (as its first batch too), or None."""
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


@dataclass(frozen=True, slots=True)
class _Section:
    """A v2 batch the compiled engine vouched for: its decompressed records and their digest input."""

    raw: RawBatch
    section: bytes | memoryview
    encoded: bytes  # what Digests hashes for its records (_records.digest_v2)

    @property
    def header(self) -> BatchHeader:
        return self.raw.header

    @property
    def uncompressed_bytes(self) -> int:
        return len(self.section)

    @property
    def record_count(self) -> int:
        return self.raw.header.records_count or 0


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


def _merged_native(run: list[_Section], options: RebatchOptions) -> bytes | None:
    """:func:`merged_batch`'s bytes by the compiled engine, or None where it does not vouch for them."""
    first = run[0].header
    _, log_append = timestamp_base(first)
    merged = _records.merge_v2([b.section for b in run],
                               [(b.header.offset, timestamp_base(b.header)[0], b.header.last_offset - b.header.offset)
                                for b in run], log_append, first.offset)
    if merged is None:
        return None
    section, count, first_ts, max_ts = merged
    return assemble_batch(_spec(first, run[-1].header, options), section, count, first_ts, max_ts, 0)


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
                return _Section(raw, section, encoded)
    return decode_located(raw, path=path, limit=limit)


def _digest(digests: Digests, batch: _Source) -> None:
    if isinstance(batch, _Section):
        digests.update_encoded(batch.header, batch.record_count, batch.encoded)
    else:
        assert isinstance(batch, DecodedBatch)
        digests.update(batch)


def _source(raw: RawBatch, options: RebatchOptions, path: str | None) -> _Source:
    limit = options.decompression_limit
    if options.engine is Engine.NATIVE:
        return _native(raw, limit, path)
    return decode_located(raw, path=path, limit=limit)


def _merge(group: list[_Source], options: RebatchOptions, path: str | None) -> bytes:
    """The merged batch of a group, by the engine that holds its batches (the reference for a mixed group)."""
    if all(isinstance(b, _Section) for b in group):
        built = _merged_native(cast(list[_Section], group), options)
        if built is not None:
            return built
    return merged_batch([b if isinstance(b, DecodedBatch)
                         else decode_located(b.raw, path=path, limit=options.decompression_limit) for b in group],
                        options)


def rebatched(src: BinaryIO, options: RebatchOptions, stats: RebatchStats, *, path: str | None = None,
              lookahead_bytes: int = DEFAULT_LOOKAHEAD_BYTES,
              recompressed_size: Callable[[RawBatch, bytes | memoryview | None], int] | None = None,
              progress: Callable[[int], None] | None = None,
              on_source: Callable[[RawBatch, bytes | memoryview | None], None] | None = None
              ) -> Iterator[bytes | memoryview]:
    """``src``'s batches with the runs of mergeable batches merged (see the module docs), as the bytes of
    each batch in file order; ``stats`` filled in as it goes. One pass, memory bounded by
    ``lookahead_bytes`` (:func:`_groups`).

    Every merged batch is decoded again and the records of the whole output digested: once the source is
    read, a :class:`ProofError` unless the output's records digest equals the source's.
    ``recompressed_size`` gives a source batch's size after recompression alone (the counterfactual of
    ``stats.merged_bytes_recompressed``, measured on every merged batch or on a sample: MEASURE_ALL);
    ``progress`` gets the source bytes read so far; ``on_source`` sees each source batch in file order.
    Both callbacks get the batch's decompressed records section where the engine holds it (else None)."""
    digests_in, digests_out = Digests(), Digests()

    def counted() -> Iterator[_Source]:
        for raw in iter_batches(src, path=path):
            batch = _source(raw, options, path)
            _digest(digests_in, batch)
            stats.batches_in += 1
            stats.records += batch.record_count
            stats.bytes_in += len(batch.raw.data)
            if on_source is not None:
                on_source(batch.raw, _section_of(batch))
            if progress is not None:
                progress(stats.bytes_in)
            yield batch

    for group in _groups(counted(), options, stats, lookahead_bytes):
        built = _merge(group, options, path) if len(group) > 1 else b""
        if len(built) > options.max_bytes:  # codec framing past the bound (rule 9): the batches as they were
            stats.refusals[Refusal.SIZE] += 1
            built = b""
        if not built:
            for batch in group:
                _digest(digests_out, batch)
                yield batch.raw.data
            stats.batches_out += len(group)
            continue
        for raw in iter_batches(io.BytesIO(built), path=path):
            _digest(digests_out, _source(raw, options, path))
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
    stats.scale_measured()
    stats.records_sha256_in, stats.batches_sha256_in = digests_in.records_sha256, digests_in.batches_sha256
    stats.records_sha256_out, stats.batches_sha256_out = digests_out.records_sha256, digests_out.batches_sha256
    if stats.records_sha256_out != stats.records_sha256_in:
        raise ProofError("the re-batched segment does not hold the source's records", path=path,
                         expected=f"records_sha256 {stats.records_sha256_in}", found=stats.records_sha256_out)


def _section_of(batch: _Source) -> bytes | memoryview | None:
    return batch.section if isinstance(batch, _Section) else None


def rebatch_segment(src: BinaryIO, dst: BinaryIO, options: RebatchOptions, *, path: str | None = None,
                    lookahead_bytes: int = DEFAULT_LOOKAHEAD_BYTES) -> RebatchStats:
    """Write ``src``'s batches to ``dst`` re-batched (:func:`rebatched`); returns what it did."""
    stats = RebatchStats()
    for part in rebatched(src, options, stats, path=path, lookahead_bytes=lookahead_bytes):
        dst.write(part)
    return stats


def digest_of(stream: BinaryIO, *, path: str | None = None) -> tuple[str, str]:
    """``(records_sha256, batches_sha256)`` of a segment stream."""
    digests = Digests()
    for batch in iter_decoded(stream, path=path):
        digests.update(batch)
    return digests.records_sha256, digests.batches_sha256

