"""The dry run's forecast: recompress the first batches of a stratified sample of the planned segments.

Every topic to compact gets at least one sampled segment (the largest topics first when there are more
topics than the budget), the rest of the budget goes to topics in proportion to their bytes, and a topic's
share is spread over its partitions (the largest first) and over its segments' sizes. The first
``sample_bytes`` of each sampled segment is read with one ranged GET and recompressed as its plan entry
says. What the samples show becomes a :class:`tiering.cost.forecast.Forecast`: strata of topic and source
codec, each with its own ratio and range, and the verdict a run would reach on them. A sample is the
beginning of a segment: a topic whose data changes character along a segment is estimated less well,
which the range does not capture.
"""

from __future__ import annotations

import io
import random
from collections import Counter
from dataclasses import dataclass, replace
from typing import Final

from tiering.cost.forecast import NOT_SAMPLED, Forecast, SampleProblem, Stratum, ratio_and_stderr
from tiering.errors import TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.rewrite import RewriteOptions, process_batch, rewrite_segment
from tiering.lifecycle.vocabulary import StorageClass
from tiering.plan.document import PlannedSegment
from tiering.storage.objects import ObjectStore

DEFAULT_SAMPLE_SEGMENTS: Final = 16
RESERVOIR: Final = 256  # segments kept to sample from, whatever the plan's size (the sample spreads over them)
MIN_PER_TOPIC: Final = 2  # of them, each topic keeps at least this many
DEFAULT_SAMPLE_BYTES: Final = 4 << 20


@dataclass(frozen=True, slots=True)
class Sampling:
    """What a forecast may read: ``segments`` ranged GETs at most, the first ``bytes`` of a segment each."""

    segments: int = DEFAULT_SAMPLE_SEGMENTS
    bytes: int = DEFAULT_SAMPLE_BYTES
    seed: str = ""  # which segments the sample picks: the same bucket gives the same forecast


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
        self.classes.add(seg.log.storage_class if seg.log else StorageClass.STANDARD)
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


def _sample(store: ObjectStore, seg: PlannedSegment, options: RewriteOptions, sample_bytes: int) -> Sampled:
    """Bytes in and out over the whole batches within the segment's first ``sample_bytes`` (re-batched
    first where the plan says so), the codec most of those bytes had, and each batch's bytes in and out."""
    raws = sample_batches(store, seg, sample_bytes)
    codecs: Counter[str] = Counter()
    for raw in raws:
        codecs[raw.header.codec.label] += raw.header.size
    codec = codecs.most_common(1)[0][0] if codecs else NOT_SAMPLED
    if seg.rebatch_max_bytes is not None:
        data = b"".join(bytes(raw.data) for raw in raws)
        merge = RebatchOptions(options.codec, options.level, seg.rebatch_max_bytes, options.decompression_limit)
        result = rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=seg.base_offset,
                                 options=replace(options, proof=False), rebatch=merge)
        return Sampled(seg, codec, len(data), result.stats.bytes_out, ((len(data), result.stats.bytes_out),))
    batches = tuple((raw.header.size, sum(len(p) for p in process_batch(raw, options).parts)) for raw in raws)
    return Sampled(seg, codec, sum(i for i, _ in batches), sum(o for _, o in batches), batches)


@dataclass(frozen=True, slots=True)
class Sampled:
    """One sampled segment: its source codec (by bytes) and what its sampled batches became."""

    segment: PlannedSegment
    codec: str
    bytes_in: int
    bytes_out: int
    batches: tuple[tuple[int, int], ...]  # each batch's (bytes in, bytes out)


class _Topic:
    """One topic's segments to compact as they stream by: counts and bytes by partition, its policy's
    minimum savings, and a random sample of its segments (a reservoir, shrunk as topics arrive)."""

    def __init__(self, seed: str) -> None:
        self.count = self.bytes = 0
        self.partitions: dict[str, list[int]] = {}  # directory -> [segments, bytes]
        self.min_savings_ratio = 0.0
        self.sample: list[PlannedSegment] = []
        self._random = random.Random(seed)  # noqa: S311 - a sample, not a secret

    def add(self, seg: PlannedSegment, keep: int) -> None:
        self.count += 1
        self.bytes += seg.size
        part = self.partitions.setdefault(seg.directory, [0, 0])
        part[0] += 1
        part[1] += seg.size
        self.min_savings_ratio = max(self.min_savings_ratio, seg.min_savings_ratio)
        if len(self.sample) < keep:
            self.sample.append(seg)
        elif (i := self._random.randrange(self.count)) < keep:
            self.sample[i] = seg

    def shrink(self, keep: int) -> None:
        """Keep a uniform random ``keep`` of the reservoir (still a uniform sample of the topic)."""
        if len(self.sample) > keep:
            self.sample = self._random.sample(self.sample, keep)

    def pick(self, k: int) -> list[PlannedSegment]:
        """``k`` of its sampled segments, spread over its partitions (the largest first, in turn), and
        within a partition over the segments' sizes."""
        by_dir: dict[str, list[PlannedSegment]] = {}
        for seg in self.sample:
            by_dir.setdefault(seg.directory, []).append(seg)
        queues = [spread(by_dir[d], len(by_dir[d]))[::-1] for d in
                  sorted(by_dir, key=lambda d: (-self.partitions[d][1], d))]
        picked: list[PlannedSegment] = []
        while len(picked) < k and any(queues):
            for q in queues:
                if q and len(picked) < k:
                    picked.append(q.pop(0))
        return picked


class StratifiedSample:
    """Segments to compact, summed up by topic as they stream by, each topic with a bounded random sample
    of its own (``RESERVOIR`` segments in all, at least ``MIN_PER_TOPIC`` a topic): what the forecast
    samples from, whatever the plan's size."""

    def __init__(self, keep: int = RESERVOIR, seed: str = "") -> None:
        self.topics: dict[str, _Topic] = {}
        self._keep = keep
        self._seed = seed
        self._kept = keep  # the per-topic bound the reservoirs were last cut to

    @property
    def count(self) -> int:
        return sum(t.count for t in self.topics.values())

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.topics.values())

    def add(self, seg: PlannedSegment) -> None:
        topic = self.topics.get(seg.topic)
        if topic is None:
            topic = self.topics[seg.topic] = _Topic(f"{self._seed}/{seg.topic}")
            if self.per_topic < self._kept:  # the bound fell: cut every reservoir to it (once per new bound)
                self._kept = self.per_topic
                for t in self.topics.values():
                    t.shrink(self._kept)
        topic.add(seg, self.per_topic)

    @property
    def per_topic(self) -> int:
        return max(MIN_PER_TOPIC, self._keep // max(1, len(self.topics)))


def allocate(sizes: dict[str, int], available: dict[str, int], budget: int) -> dict[str, int]:
    """Segments to sample per topic: one each for the ``budget`` largest topics (by bytes), then the rest of
    the budget in proportion to their bytes (largest remainders), never more than a topic ``available``."""
    order = sorted(sizes, key=lambda t: (-sizes[t], t))
    chosen = [t for t in order[:budget] if available[t] > 0]
    out = dict.fromkeys(chosen, 1)
    left = budget - len(chosen)
    total = sum(sizes[t] for t in chosen)
    while left > 0 and total:
        room = [t for t in chosen if out[t] < available[t]]
        if not room:
            break
        share = {t: left * sizes[t] / sum(sizes[r] for r in room) for t in room}
        extra = {t: min(available[t] - out[t], int(share[t])) for t in room}
        if not any(extra.values()):  # hand out the remainders one at a time, the largest first
            best = max(room, key=lambda t: (share[t] - int(share[t]), sizes[t], t))
            extra[best] = 1
        for t, n in extra.items():
            out[t] += n
            left -= n
    return out


def _ratio(samples: list[Sampled]) -> tuple[float, float]:
    """The ratio of ``samples`` and its standard error (:func:`ratio_and_stderr`)."""
    return ratio_and_stderr([(s.bytes_in, s.bytes_out) for s in samples],
                            samples[0].batches if len(samples) == 1 else ())


def estimate_work(store: ObjectStore, work: StratifiedSample, options: RewriteOptions, *,
                  segments: int = DEFAULT_SAMPLE_SEGMENTS, sample_bytes: int = DEFAULT_SAMPLE_BYTES) -> Forecast:
    """The forecast (see :mod:`tiering.cost.forecast`) of the segments to compact ``work`` has seen as a stream
    (its sample stands for them): ``segments`` ranged GETs at most, spread over the topics by :func:`allocate`."""
    topics = work.topics
    plan = allocate({t: w.bytes for t, w in topics.items()}, {t: len(w.sample) for t, w in topics.items()},
                    segments)
    problems: list[SampleProblem] = []
    sampled: dict[str, list[Sampled]] = {}
    for name in sorted(plan):
        for seg in topics[name].pick(plan[name]):
            target = options if seg.codec is None else replace(options, codec=Codec.parse(seg.codec),
                                                               level=seg.level)
            try:
                s = _sample(store, seg, target, sample_bytes)
            except TieringError as e:
                problems.append(SampleProblem(f"{seg.directory}/{seg.base_offset}", str(e), seg.topic))
                continue
            if s.bytes_in:
                sampled.setdefault(name, []).append(s)
    everything = [s for rows in sampled.values() for s in rows]
    pooled = _ratio(everything)
    strata: list[Stratum] = []
    codecs: dict[str, str] = {}
    for name, topic in sorted(topics.items()):
        rows = sampled.get(name, [])
        if not rows:  # nothing of its own: the pooled ratio of every sample
            strata.append(Stratum(name, NOT_SAMPLED, len(topic.partitions), topic.count, topic.bytes, 0, 0,
                                  *pooled, topic.min_savings_ratio))
            continue
        by_bytes: dict[str, Counter[str]] = {}
        for s in rows:
            by_bytes.setdefault(s.segment.directory, Counter())[s.codec] += s.bytes_in
        part_codec = {d: c.most_common(1)[0][0] for d, c in by_bytes.items()}
        codecs.update(part_codec)
        for codec in sorted(set(part_codec.values())):
            own = [s for s in rows if part_codec[s.segment.directory] == codec]
            dirs = [d for d, c in part_codec.items() if c == codec]
            strata.append(Stratum(
                name, codec, len(dirs), sum(topic.partitions[d][0] for d in dirs),
                sum(topic.partitions[d][1] for d in dirs), len(own), sum(s.bytes_in for s in own),
                *_ratio(own),
                topic.min_savings_ratio))
        rest = [d for d in topic.partitions if d not in part_codec]
        if rest:  # its partitions no sample reached: the topic's whole sample stands for them
            strata.append(Stratum(
                name, NOT_SAMPLED, len(rest), sum(topic.partitions[d][0] for d in rest),
                sum(topic.partitions[d][1] for d in rest), 0, 0,
                *_ratio(rows),
                topic.min_savings_ratio))
    return Forecast(f"the first {sample_bytes:,} bytes of up to {segments} segments, spread over topics by bytes "
                    "(one at least each) and over each topic's partitions, recompressed", segments, sample_bytes,
                    tuple(strata), codecs, tuple(problems), tuple(sorted(t for t in topics if t not in sampled)))
