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
   matters to a producer retrying a batch of a sealed segment, long after its session ended.
8. **Not empty.** A batch without records exists only for its producer state or its offsets (the cleaner
   leaves such batches behind): kept as it is.
9. **Bounded size.** A merged batch holds at most ``max_bytes`` of records, counted with room for the
   larger deltas it re-encodes (15 bytes a record) and its header: by default 1 MiB, Kafka's default
   ``max.message.bytes`` and ``message.max.bytes``, which a restored topic may enforce. A merged batch
   that still comes out larger than ``max_bytes`` (a codec's framing around incompressible records) is
   not written: its batches are, as they were.

The merged batch: ``baseOffset`` the first batch's, ``lastOffsetDelta`` reaching the last batch's last
offset (gaps inside stay as record offset deltas), timestamps recomputed from its records (the
LogAppendTime kept), the first batch's leader epoch, producer id, epoch and base sequence, the target
codec. A batch that merges with nothing is written as it was. The proof is the records digest
(``records_sha256``), which must equal the source's; the batch digest changes where batches merged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import BinaryIO, Final

from tiering.kafka.batch import V2_HEADER_SIZE, BatchHeader, TimestampType
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec
from tiering.kafka.reader import iter_batches
from tiering.kafka.segment import DecodedBatch, Digests, iter_decoded

DEFAULT_MAX_BYTES: Final = 1 << 20  # Kafka's default max.message.bytes / message.max.bytes
RECORD_SLACK: Final = 15  # a re-encoded record's deltas may take this many more bytes (varint growth)
NO_PRODUCER: Final = -1
SEQUENCE_LIMIT: Final = (1 << 31) - 1


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


@dataclass(frozen=True, slots=True)
class RebatchOptions:
    codec: Codec  # the merged batches' codec (batches left alone keep theirs)
    level: int | None = None
    max_bytes: int = DEFAULT_MAX_BYTES
    decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT


@dataclass
class RebatchStats:
    batches_in: int = 0
    batches_out: int = 0
    runs_merged: int = 0  # merged batches written
    batches_merged: int = 0  # source batches that went into them
    records: int = 0
    refusals: Counter[Refusal] = field(default_factory=Counter)
    records_sha256_in: str = ""
    batches_sha256_in: str = ""
    records_sha256_out: str = ""  # of the output, once proved (equal to the source's)
    batches_sha256_out: str = ""  # differs from the source's where batches merged

    def to_json(self) -> dict[str, object]:
        return {"batches_in": self.batches_in, "batches_out": self.batches_out, "runs_merged": self.runs_merged,
                "batches_merged": self.batches_merged, "records": self.records,
                "refusals": {str(k): v for k, v in sorted(self.refusals.items())},
                "records_sha256": {"in": self.records_sha256_in, "out": self.records_sha256_out},
                "batches_sha256": {"in": self.batches_sha256_in, "out": self.batches_sha256_out},
                "records_digest_equal": bool(self.records_sha256_out) and
                self.records_sha256_out == self.records_sha256_in,
                "batches_digest_changed": self.batches_sha256_out != self.batches_sha256_in}


def _alone(h: BatchHeader, producer_last: frozenset[int]) -> Refusal | None:
    """The rule that keeps batch ``h`` out of any run (as its first batch too), or None."""
    if h.magic < 2 or h.is_control:
        return Refusal.NOT_DATA
    if h.is_transactional:
        return Refusal.TRANSACTIONAL
    if h.delete_horizon_ms is not None:
        return Refusal.DELETE_HORIZON
    if h.records_count == 0:
        return Refusal.EMPTY
    if h.producer_id != NO_PRODUCER and h.offset in producer_last:
        return Refusal.PRODUCER_LAST
    return None


def joins(first: BatchHeader, h: BatchHeader) -> Refusal | None:
    """The rule that keeps batch ``h`` from joining the run that ``first`` opened (both passed
    :func:`_alone`), or None. Pure: headers in, verdict out."""
    if h.partition_leader_epoch != first.partition_leader_epoch:
        return Refusal.LEADER_EPOCH
    if h.timestamp_type is not first.timestamp_type or (
            h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp != first.max_timestamp):
        return Refusal.TIMESTAMP_TYPE
    if h.producer_id != first.producer_id:
        return Refusal.PRODUCER
    if h.producer_id != NO_PRODUCER:
        expected = first.base_sequence + (h.offset - first.offset)
        if (h.producer_epoch != first.producer_epoch or first.base_sequence < 0 or h.base_sequence != expected
                or expected + (h.last_offset - h.offset) > SEQUENCE_LIMIT):
            return Refusal.PRODUCER
    return None


def producer_last_batches(stream: BinaryIO, *, path: str | None = None) -> frozenset[int]:
    """The base offsets of each idempotent producer's last batch in the segment (rule 7): a pass over the
    batch headers only (nothing is decompressed)."""
    last: dict[int, int] = {}
    for raw in iter_batches(stream, path=path):
        h = raw.header
        if h.magic >= 2 and h.producer_id != NO_PRODUCER:
            last[h.producer_id] = h.offset
    return frozenset(last.values())


def _weight(batch: DecodedBatch) -> int:
    """What a batch adds to a merged batch's size bound (rule 9)."""
    return batch.uncompressed_bytes + RECORD_SLACK * len(batch.records)


def _runs(batches: Iterator[DecodedBatch], options: RebatchOptions, producer_last: frozenset[int],
          stats: RebatchStats) -> Iterator[list[DecodedBatch]]:
    """The source batches in file order, grouped into the runs to merge (a run of one is kept as it is)."""
    run: list[DecodedBatch] = []
    size = 0
    for batch in batches:
        h = batch.header
        refusal = _alone(h, producer_last)
        if refusal is None and run:
            refusal = joins(run[0].header, h)
            if refusal is None and size + _weight(batch) > options.max_bytes:
                refusal = Refusal.SIZE
        if run and refusal is None:
            run.append(batch)
            size += _weight(batch)
            continue
        if run:
            stats.refusals[refusal or Refusal.SIZE] += 1
            yield run
            run, size = [], 0
        if _alone(h, producer_last) is None and V2_HEADER_SIZE + _weight(batch) <= options.max_bytes:
            run, size = [batch], V2_HEADER_SIZE + _weight(batch)
        else:
            yield [batch]
    if run:
        yield run


def merged_batch(run: list[DecodedBatch], options: RebatchOptions) -> bytes:
    """One v2 batch holding every record of ``run`` (consecutive batches that :func:`joins` accepted)."""
    first, last = run[0].header, run[-1].header
    records = [r for b in run for r in b.records]
    spec = BatchSpec(first.offset, options.codec, options.level, first.partition_leader_epoch, first.producer_id,
                     first.producer_epoch, first.base_sequence if first.producer_id != NO_PRODUCER else -1,
                     log_append_time=first.max_timestamp
                     if first.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
                     last_offset_delta=last.last_offset - first.offset)
    return build_batch(spec, records)


def rebatch_segment(src: BinaryIO, dst: BinaryIO, options: RebatchOptions, *, producer_last: frozenset[int],
                    path: str | None = None) -> RebatchStats:
    """Write ``src``'s batches to ``dst`` with the runs of mergeable batches merged (see the module docs).
    ``producer_last``: from :func:`producer_last_batches` on the same segment. Returns what it did, with the
    source's records and batch digests (the output must have the same records digest)."""
    stats = RebatchStats()
    digests = Digests()

    def counted() -> Iterator[DecodedBatch]:
        for batch in iter_decoded(src, path=path, limit=options.decompression_limit):
            digests.update(batch)
            stats.batches_in += 1
            stats.records += len(batch.records)
            yield batch

    for run in _runs(counted(), options, producer_last, stats):
        built = merged_batch(run, options) if len(run) > 1 else b""
        if len(built) > options.max_bytes:  # codec framing past the bound (rule 9): the batches as they were
            stats.refusals[Refusal.SIZE] += 1
            built = b""
        if not built:
            for batch in run:
                dst.write(batch.raw.data)
            stats.batches_out += len(run)
            continue
        dst.write(built)
        stats.runs_merged += 1
        stats.batches_merged += len(run)
        stats.batches_out += 1
    stats.records_sha256_in, stats.batches_sha256_in = digests.records_sha256, digests.batches_sha256
    return stats


def digest_of(stream: BinaryIO, *, path: str | None = None) -> tuple[str, str]:
    """``(records_sha256, batches_sha256)`` of a segment stream."""
    digests = Digests()
    for batch in iter_decoded(stream, path=path):
        digests.update(batch)
    return digests.records_sha256, digests.batches_sha256

