"""Neighbouring segments of a partition merged into one: fewer, larger objects, every batch unchanged.

A segment's ``.log`` is nothing but its batches, each with its absolute offsets, so the merge of neighbours is
their batches one after the other, byte for byte, in a segment named by the first one's base offset. What
changes is what is relative to that base: the ``.index`` and ``.timeindex`` are rebuilt over the whole, as
Kafka's ``LogSegment.recover`` builds them (:mod:`tiering.kafka.index`), and the ``.txnindex`` holds the
sources' aborted transactions in order.

**Groups** (Kafka's ``LogCleaner.groupSegmentsBySize``): from the first segment on, the next one joins the
group while the group's ``.log`` bytes stay within ``segment.bytes``, its ``.index`` bytes and its
``.timeindex`` bytes each within ``segment.index.bytes``, and the joining segment's last offset stays within
``Int.MaxValue`` of the group's base offset (the indexes hold offsets as 32-bit deltas); an empty segment
joins whatever its offsets. A segment's last offset is taken, as the cleaner takes it, as the next segment's
base offset minus one (for the last one: ``end_offset`` minus one). The key-compaction pass groups the
segments it cleans with these rules; merging at rest applies them to runs of small neighbours
(:func:`merge_runs`).

**Checked while merged**: every batch as the reader checks it (header, CRC), offsets increasing from one
source to the next, and every offset within ``Int.MaxValue`` of the merged base (:class:`IndexMismatchError`
from the index builder otherwise). Nothing is decompressed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Final

from tiering.errors import ConfigError, CorruptBatchError
from tiering.kafka.batch import BatchHeader
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, AbortedTxn, IndexBuilder, Indexes, encode_txn_index
from tiering.kafka.reader import iter_batches

DEFAULT_SEGMENT_BYTES: Final = 1 << 30  # Kafka's segment.bytes
DEFAULT_INDEX_BYTES: Final = 10 << 20  # Kafka's segment.index.bytes
MAX_DELTA: Final = 0x7FFFFFFF  # Int.MaxValue: the largest offset delta the indexes hold


@dataclass(frozen=True, slots=True)
class Limits:
    """A merged segment's bounds: the topic's ``segment.bytes`` and ``segment.index.bytes``."""

    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    index_bytes: int = DEFAULT_INDEX_BYTES

    def __post_init__(self) -> None:
        if self.segment_bytes < 1 or self.index_bytes < 1:
            raise ConfigError("merge limits must be positive", expected="segment.bytes and segment.index.bytes >= 1",
                              found=f"{self.segment_bytes} and {self.index_bytes}")


@dataclass(frozen=True, slots=True)
class Sizes:
    """What grouping needs of a segment: its base offset and the bytes of its three files."""

    base_offset: int
    log_bytes: int
    index_bytes: int
    time_index_bytes: int


def group_by_size(segments: Sequence[Sizes], limits: Limits, end_offset: int) -> list[tuple[Sizes, ...]]:
    """``segments`` (in offset order) in groups, each to become one segment, by the cleaner's rules (see the
    module docstring); ``end_offset``: the offset after the last segment (the next one's base offset, or
    the first offset not cleaned)."""
    groups: list[tuple[Sizes, ...]] = []
    i = 0
    while i < len(segments):
        first = segments[i]
        group = [first]
        log, index, time_index = first.log_bytes, first.index_bytes, first.time_index_bytes
        i += 1
        while i < len(segments):
            seg = segments[i]
            last_offset = (segments[i + 1].base_offset if i + 1 < len(segments) else end_offset) - 1
            if not (log + seg.log_bytes <= limits.segment_bytes
                    and index + seg.index_bytes <= limits.index_bytes
                    and time_index + seg.time_index_bytes <= limits.index_bytes
                    and (seg.log_bytes == 0 or last_offset - first.base_offset <= MAX_DELTA)):
                break
            group.append(seg)
            log += seg.log_bytes
            index += seg.index_bytes
            time_index += seg.time_index_bytes
            i += 1
        groups.append(tuple(group))
    return groups


def merge_runs(segments: Sequence[Sizes], limits: Limits, end_offset: int,
               joins: Callable[[Sizes, Sizes], bool]) -> list[tuple[Sizes, ...]]:
    """The groups of two or more that merging at rest makes: runs of neighbouring segments each smaller than
    ``segment.bytes``, broken wherever ``joins(previous, next)`` is false (a gap in offsets), each run
    grouped by :func:`group_by_size`. A segment alone stays as it is."""
    out: list[tuple[Sizes, ...]] = []
    run: list[Sizes] = []

    def close(next_base: int) -> None:
        out.extend(g for g in group_by_size(run, limits, next_base) if len(g) > 1)
        run.clear()

    for seg in segments:
        if run and (seg.log_bytes >= limits.segment_bytes or not joins(run[-1], seg)):
            close(seg.base_offset)
        if seg.log_bytes < limits.segment_bytes:
            run.append(seg)
    if run:
        close(end_offset)
    return out


def next_offset(stream: BinaryIO, *, path: str | None = None) -> int | None:
    """The offset after a segment's last batch (headers read, CRCs not checked); None for an empty one."""
    last = None
    for raw in iter_batches(stream, path=path, verify_crc=False):
        last = raw.header.last_offset
    return None if last is None else last + 1


@dataclass(frozen=True, slots=True)
class Source:
    """A segment to merge: its base offset, a way to open its ``.log``, its aborted transactions."""

    base_offset: int
    open: Callable[[], BinaryIO]
    aborted: tuple[AbortedTxn, ...] = ()
    path: str | None = None


@dataclass(frozen=True, slots=True)
class Merged:
    """The merged segment's indexes and what it holds."""

    base_offset: int
    indexes: Indexes
    txn_index: bytes
    log_bytes: int
    batches: int
    next_offset: int  # the offset after its last batch (its base offset if it holds none)
    max_timestamp: int
    sources: int  # how many of the sources it holds (fewer than given when ``contiguous`` stopped it)


def merge(sources: Sequence[Source], out: BinaryIO, *,
          index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES, contiguous: bool = False) -> Merged:
    """Write the batches of ``sources`` (neighbours, in offset order) to ``out`` as one segment named by the
    first one's base offset; its indexes rebuilt over the whole. Raises on a corrupt batch (its file and
    position), on offsets that go back from one source to the next, or on one too far from the base. With
    ``contiguous`` it stops before the first source that does not start at the offset after its
    predecessor's last batch (the merged segment then holds the sources before it: ``Merged.sources``)."""
    if not sources:
        raise ConfigError("nothing to merge", expected="one segment or more", found="none")
    base = sources[0].base_offset
    builder = IndexBuilder(base, index_interval_bytes)
    position = batches = 0
    next_offset = base
    max_timestamp = -1
    count = 0
    for source in sources:
        if contiguous and count and source.base_offset != next_offset:
            break
        count += 1
        if source.base_offset < next_offset:
            raise CorruptBatchError("segments overlap: a segment starts below the offset its predecessor reached",
                                    path=source.path, expected=f"base offset >= {next_offset}",
                                    found=source.base_offset)
        for h, data in _batches(source):
            if h.offset < next_offset:
                raise CorruptBatchError("offsets go back from one segment to the next", path=source.path,
                                        position=h.position, base_offset=h.offset, expected=f">= {next_offset}",
                                        found=h.offset)
            builder.add(position, h.last_offset, h.max_timestamp)
            out.write(data)
            position += len(data)
            batches += 1
            next_offset = h.last_offset + 1
            max_timestamp = max(max_timestamp, h.max_timestamp)
    return Merged(base, builder.finish(), encode_txn_index([t for s in sources[:count] for t in s.aborted]),
                  position, batches, next_offset, max_timestamp, count)


def _batches(source: Source) -> Iterator[tuple[BatchHeader, memoryview]]:
    with source.open() as stream:
        for raw in iter_batches(stream, path=source.path):
            yield raw.header, raw.data
