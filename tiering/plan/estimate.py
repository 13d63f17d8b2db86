"""Dry-run savings estimate: recompress the first batches of a sample of the planned segments.

Segments are picked evenly across the size order (small and large ones), and the first ``sample_bytes``
of each is read with one ranged GET. The ratio is the sampled bytes' (out / in); its uncertainty is the
standard error of the per-segment ratios, and the range reported is the estimate +/- two standard errors.
A sample is the beginning of a segment: a topic whose data changes character along a segment is
estimated less well, which the range does not capture.
"""

from __future__ import annotations

import io
import math
import random
import statistics
from dataclasses import replace
from typing import Any, Final

from tiering.errors import TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.rewrite import RewriteOptions, process_batch, rewrite_segment
from tiering.plan.scan import COMPACT, Plan, PlannedSegment
from tiering.storage.objects import ObjectStore

DEFAULT_SAMPLE_SEGMENTS: Final = 16
RESERVOIR: Final = 256  # segments kept to sample from, whatever the plan's size (the sample spreads over them)
DEFAULT_SAMPLE_BYTES: Final = 4 << 20


class WorkSample:
    """Segments to compact, summed up as they stream by: their count, bytes, storage classes, and a bounded
    random sample of them (reservoir sampling, seeded: the same plan samples the same segments)."""

    def __init__(self, keep: int = RESERVOIR, seed: str = "") -> None:
        self.count = self.bytes = 0
        self.classes: set[str] = set()
        self.sample: list[PlannedSegment] = []
        self._keep = keep
        self._random = random.Random(seed)  # noqa: S311 - a sample, not a secret

    def add(self, seg: PlannedSegment) -> None:
        self.count += 1
        self.bytes += seg.size
        self.classes.add(seg.log.storage_class if seg.log else "STANDARD")
        if len(self.sample) < self._keep:
            self.sample.append(seg)
        elif (i := self._random.randrange(self.count)) < self._keep:
            self.sample[i] = seg


def spread(segments: list[PlannedSegment], k: int) -> list[PlannedSegment]:
    """At most ``k`` of ``segments``, picked evenly across their size order (small and large ones)."""
    ordered = sorted(segments, key=lambda s: (s.size, s.directory, s.base_offset))
    if len(ordered) <= k:
        return ordered
    return [ordered[round(i * (len(ordered) - 1) / (k - 1))] for i in range(k)] if k > 1 else [ordered[-1]]


def sample_batches(store: ObjectStore, seg: PlannedSegment, sample_bytes: int) -> list[RawBatch]:
    """The whole batches within the segment's first ``sample_bytes`` (one ranged GET; headers and CRCs
    checked). The sample's cut through a batch is not an error; anything else in it is."""
    assert seg.log is not None
    limit = min(sample_bytes, seg.log.size)
    with store.open(seg.log.key, if_match=seg.log.etag, first_bytes=limit) as body:
        data = body.read()
    batches: list[RawBatch] = []
    try:
        batches.extend(iter_batches(io.BytesIO(data), path=seg.log.key, size=len(data)))
    except TieringError:
        if not batches or limit == seg.log.size:
            raise  # not just the sample's cut through a batch
    return batches


def _sample(store: ObjectStore, seg: PlannedSegment, options: RewriteOptions, sample_bytes: int) -> tuple[int, int]:
    """(bytes in, bytes out) over the whole batches within the segment's first ``sample_bytes`` (re-batched
    first where the plan says so)."""
    if seg.rebatch_max_bytes is not None:
        data = b"".join(bytes(raw.data) for raw in sample_batches(store, seg, sample_bytes))
        merge = RebatchOptions(options.codec, options.level, seg.rebatch_max_bytes, options.decompression_limit)
        result = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=seg.base_offset,
                                 options=replace(options, proof=False), rebatch=merge)
        return len(data), result.stats.bytes_out
    bytes_in = bytes_out = 0
    for raw in sample_batches(store, seg, sample_bytes):
        bytes_in += raw.header.size
        bytes_out += sum(len(p) for p in process_batch(raw, options).parts)
    return bytes_in, bytes_out


def estimate(store: ObjectStore, plan: Plan, options: RewriteOptions, *, segments: int = DEFAULT_SAMPLE_SEGMENTS,
             sample_bytes: int = DEFAULT_SAMPLE_BYTES) -> dict[str, Any]:
    """Estimated bytes after compaction of the plan's ``compact`` segments, with its uncertainty."""
    work = WorkSample()
    for seg in plan.segments:
        if seg.action == COMPACT:
            work.add(seg)
    return estimate_work(store, work, options, segments=segments, sample_bytes=sample_bytes)


def estimate_work(store: ObjectStore, work: WorkSample, options: RewriteOptions, *,
                  segments: int = DEFAULT_SAMPLE_SEGMENTS, sample_bytes: int = DEFAULT_SAMPLE_BYTES
                  ) -> dict[str, Any]:
    """:func:`estimate` of segments seen as a stream (their sample stands for them)."""
    total = work.bytes
    ratios: list[float] = []
    sampled_in = sampled_out = 0
    problems = []
    for seg in spread(work.sample, segments):
        own = options if seg.codec is None else replace(options, codec=Codec.parse(seg.codec), level=seg.level)
        try:
            b_in, b_out = _sample(store, seg, own, sample_bytes)
        except TieringError as e:
            problems.append({"segment": f"{seg.directory}/{seg.base_offset}", "error": str(e)})
            continue
        if b_in:
            ratios.append(b_out / b_in)
            sampled_in += b_in
            sampled_out += b_out
    ratio = sampled_out / sampled_in if sampled_in else 1.0
    stderr = statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else (0.0 if ratios else 1.0)
    low, high = max(0.0, ratio - 2 * stderr), min(1.0, ratio + 2 * stderr)
    return {"estimate": True, "method": f"first {sample_bytes} bytes of up to {segments} segments, recompressed",
            "segments_planned": work.count, "segments_sampled": len(ratios), "bytes_sampled": sampled_in,
            "ratio": round(ratio, 6), "ratio_stderr": round(stderr, 6), "bytes_before": total,
            "bytes_after_estimate": round(total * ratio), "saved_bytes_estimate": round(total * (1 - ratio)),
            "saved_bytes_low": round(total * (1 - high)), "saved_bytes_high": round(total * (1 - low)),
            "sample_errors": problems}
