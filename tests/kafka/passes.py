"""Whole-segment and whole-partition conveniences over the package's streaming passes, for the tests: the
product streams a segment through its passes and never needs them whole."""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

from tiering.kafka.keycompact import CleanedSegment, CleanOptions, CleanStats, PartitionFacts, Segment, clean, survey
from tiering.kafka.rebatch import DEFAULT_LOOKAHEAD_BYTES, RebatchOptions, RebatchStats, rebatched
from tiering.kafka.segment import Digests, iter_decoded


def compact_partition(segments: Sequence[Segment], options: CleanOptions,
                      stats: CleanStats | None = None) -> tuple[PartitionFacts, list[CleanedSegment]]:
    """Both passes of key compaction over a partition's segments (the last one active): the survey, then the
    cleaned segments in offset order."""
    facts = survey(segments, options)
    return facts, list(clean(segments, facts, options, stats))


def rebatch_segment(src: BinaryIO, dst: BinaryIO, options: RebatchOptions, *, path: str | None = None,
                    lookahead_bytes: int = DEFAULT_LOOKAHEAD_BYTES) -> RebatchStats:
    """``src``'s batches written to ``dst`` re-batched; what the pass did."""
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
