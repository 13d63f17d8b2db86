"""The dry-run forecast: what a compaction would save, stratum by stratum, from sampled segments (pure).

:mod:`tiering.plan.estimate` samples the planned segments; this module holds what it found, typed, and
the arithmetic that turns it into bytes after and a range.

Strata
    A stratum is a topic's segments of one source codec. A segment's source codec is known only once a
    segment of its partition was read, so a topic's sampled partitions are split by the codec their
    sampled batches showed (one producer usually writes a partition in one codec), and the topic's other
    partitions form the stratum ``not sampled``, estimated with the ratio of the topic's whole sample. A
    topic the sample could not reach (more topics than the sampling budget, or every sampled segment
    unreadable) is one ``not sampled`` stratum estimated with the pooled ratio of every sample, and is
    flagged as such.

Ratio and range
    A stratum's ratio is its sampled bytes out over in. Its standard error is that of the per-segment
    ratios when two or more segments were sampled, else that of its batches' ratios (which cannot see
    how segments differ: a stratum of one sampled segment is flagged). The range is the ratio +/- two
    standard errors, clipped to [0, 1]. A stratum whose ratio saves nothing, or less than its topic's
    ``min.savings.ratio``, is predicted skipped: its bytes stay as they are, as a real run would leave
    them. Strata are sampled independently, so the ranges of a topic and of the total combine the strata's
    in quadrature (each stratum's half-range taken as two standard errors).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Final

from tiering.documents import check_document
from tiering.errors import ConfigError

FORECAST_KIND: Final = "tiering.forecast"
NOT_SAMPLED: Final = "not sampled"  # the source codec of a stratum no segment of which was read


class Verdict(StrEnum):
    """What a real run is predicted to do with a stratum's segments."""

    SAVES = "saves"
    NO_SAVINGS = "no savings"  # the sample did not shrink: the run skips them ("no savings")
    BELOW_MIN_SAVINGS = "below min.savings.ratio"  # it shrinks, by less than the topic's policy asks


@dataclass(frozen=True, slots=True)
class Stratum:
    """One topic's segments of one source codec: their bytes, their sample, and the verdict."""

    topic: str
    source_codec: str  # the codec of its sampled batches, or NOT_SAMPLED
    partitions: int
    segments: int
    bytes_before: int
    segments_sampled: int  # of this stratum's own (0 for a NOT_SAMPLED stratum: it borrows a ratio)
    bytes_sampled: int
    ratio: float  # bytes out / in, of its sample (or of the sample it borrows)
    ratio_stderr: float
    min_savings_ratio: float = 0.0

    @property
    def verdict(self) -> Verdict:
        return _verdict(self.ratio, self.min_savings_ratio)

    @property
    def saves(self) -> bool:
        return self.verdict is Verdict.SAVES

    @property
    def bytes_after(self) -> int:
        return self.bytes_before - self.saved_bytes

    @property
    def saved_bytes(self) -> int:
        return self._saved(self.ratio)

    @property
    def saved_low(self) -> int:
        return self._saved(min(1.0, self.ratio + 2 * self.ratio_stderr))

    @property
    def saved_high(self) -> int:
        return self._saved(max(0.0, self.ratio - 2 * self.ratio_stderr))

    def _saved(self, ratio: float) -> int:
        """Bytes saved were the ratio ``ratio``: none when a run would skip the stratum at that ratio."""
        if _verdict(ratio, self.min_savings_ratio) is not Verdict.SAVES:
            return 0
        return round(self.bytes_before * (1 - ratio))

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "source_codec": self.source_codec, "partitions": self.partitions,
                "segments": self.segments, "bytes_before": self.bytes_before,
                "segments_sampled": self.segments_sampled, "bytes_sampled": self.bytes_sampled,
                "ratio": self.ratio, "ratio_stderr": self.ratio_stderr,
                "min_savings_ratio": self.min_savings_ratio, "verdict": str(self.verdict),
                "bytes_after": self.bytes_after, "saved_bytes": self.saved_bytes,
                "saved_low": self.saved_low, "saved_high": self.saved_high}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Stratum:
        return cls(str(d["topic"]), str(d["source_codec"]), int(d["partitions"]), int(d["segments"]),
                   int(d["bytes_before"]), int(d["segments_sampled"]), int(d["bytes_sampled"]), float(d["ratio"]),
                   float(d["ratio_stderr"]), float(d.get("min_savings_ratio", 0.0)))


def _verdict(ratio: float, min_savings_ratio: float) -> Verdict:
    if ratio >= 1.0:
        return Verdict.NO_SAVINGS
    if 1.0 - ratio < min_savings_ratio:
        return Verdict.BELOW_MIN_SAVINGS
    return Verdict.SAVES


@dataclass(frozen=True, slots=True)
class Range:
    """Bytes before, forecast after, and the range of the bytes saved, over some strata."""

    segments: int
    bytes_before: int
    saved_bytes: int
    saved_low: int
    saved_high: int
    segments_skipped: int  # in strata predicted skipped
    segments_sampled: int

    @property
    def bytes_after(self) -> int:
        return self.bytes_before - self.saved_bytes

    @property
    def ratio(self) -> float | None:
        return self.bytes_after / self.bytes_before if self.bytes_before else None

    @property
    def ratio_range(self) -> tuple[float, float]:
        """The ratio at the most and the least saved of the range."""
        if not self.bytes_before:
            return 1.0, 1.0
        return ((self.bytes_before - self.saved_high) / self.bytes_before,
                (self.bytes_before - self.saved_low) / self.bytes_before)

    @classmethod
    def over(cls, strata: Iterable[Stratum]) -> Range:
        """The strata's figures summed, their ranges combined in quadrature (independent samples)."""
        rows = list(strata)
        saved = sum(s.saved_bytes for s in rows)
        below = math.sqrt(sum((s.saved_bytes - s.saved_low) ** 2 for s in rows))
        above = math.sqrt(sum((s.saved_high - s.saved_bytes) ** 2 for s in rows))
        before = sum(s.bytes_before for s in rows)
        return cls(sum(s.segments for s in rows), before, saved, max(0, round(saved - below)),
                   min(before, round(saved + above)), sum(s.segments for s in rows if not s.saves),
                   sum(s.segments_sampled for s in rows))

    def to_json(self) -> dict[str, Any]:
        return {"segments": self.segments, "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "ratio": self.ratio, "saved_bytes": self.saved_bytes, "saved_low": self.saved_low,
                "saved_high": self.saved_high, "segments_likely_skipped": self.segments_skipped,
                "segments_sampled": self.segments_sampled}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Range:
        return cls(int(d["segments"]), int(d["bytes_before"]), int(d["saved_bytes"]), int(d["saved_low"]),
                   int(d["saved_high"]), int(d["segments_likely_skipped"]), int(d["segments_sampled"]))


@dataclass(frozen=True, slots=True)
class SampleProblem:
    """A sampled segment that could not be read (the compaction will report it as well)."""

    segment: str  # <directory>/<base offset>
    error: str
    topic: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SampleProblem:
        return cls(str(d["segment"]), str(d["error"]), str(d["topic"]))


@dataclass(frozen=True, slots=True)
class Forecast:
    """The dry run's forecast of a plan's segments to compact: every stratum, the sampled partitions'
    codecs (which stratum a segment belongs to), and the sampling it rests on."""

    SCHEMA_VERSION: ClassVar[int] = 1

    method: str
    sample_segments: int  # the sampling budget: segments read at most, one ranged GET each
    sample_bytes: int  # read from the start of each
    strata: tuple[Stratum, ...]
    partition_codecs: Mapping[str, str] = field(default_factory=dict)  # sampled directory -> its stratum codec
    problems: tuple[SampleProblem, ...] = ()
    topics_not_sampled: tuple[str, ...] = ()  # topics estimated with the pooled ratio (no sample of their own)
    _by_key: dict[tuple[str, str], Stratum] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # a dry run's report looks up a stratum for every planned segment
        object.__setattr__(self, "_by_key", {(s.topic, s.source_codec): s for s in self.strata})

    @property
    def total(self) -> Range:
        return Range.over(self.strata)

    def by_topic(self) -> dict[str, Range]:
        topics: dict[str, list[Stratum]] = {}
        for s in self.strata:
            topics.setdefault(s.topic, []).append(s)
        return {t: Range.over(rows) for t, rows in sorted(topics.items())}

    def by_source_codec(self) -> dict[str, Range]:
        codecs: dict[str, list[Stratum]] = {}
        for s in self.strata:
            codecs.setdefault(s.source_codec, []).append(s)
        return {c: Range.over(rows) for c, rows in sorted(codecs.items())}

    def stratum(self, topic: str, directory: str) -> Stratum | None:
        """The stratum of a planned segment of ``topic`` in partition ``directory`` (None: not in the plan
        this forecast was made of)."""
        return self._by_key.get((topic, self.partition_codecs.get(directory, NOT_SAMPLED)))

    @property
    def segments_sampled(self) -> int:
        return sum(s.segments_sampled for s in self.strata)

    @property
    def bytes_sampled(self) -> int:
        return sum(s.bytes_sampled for s in self.strata)

    def to_json(self) -> dict[str, Any]:
        total = self.total
        return {"schema_version": self.SCHEMA_VERSION, "kind": FORECAST_KIND, "method": self.method,
                "sample_segments": self.sample_segments, "sample_bytes": self.sample_bytes,
                "segments_sampled": self.segments_sampled, "bytes_sampled": self.bytes_sampled,
                "total": total.to_json(),
                "by_topic": [{"topic": t, **r.to_json()} for t, r in self.by_topic().items()],
                "by_source_codec": [{"source_codec": c, **r.to_json()} for c, r in self.by_source_codec().items()],
                "strata": [s.to_json() for s in self.strata],
                "partition_codecs": dict(sorted(self.partition_codecs.items())),
                "problems": [{"segment": p.segment, "error": p.error, "topic": p.topic} for p in self.problems],
                "topics_not_sampled": list(self.topics_not_sampled)}

    @classmethod
    def from_json(cls, doc: Any, where: str = "forecast") -> Forecast:
        doc = check_document(doc, kind=FORECAST_KIND, version=cls.SCHEMA_VERSION, what="a forecast", where=where,
                             advice=" (a dry run of an earlier version: run it again)")
        try:
            return cls(str(doc["method"]), int(doc["sample_segments"]), int(doc["sample_bytes"]),
                       tuple(Stratum.from_json(s) for s in doc["strata"]),
                       {str(k): str(v) for k, v in doc["partition_codecs"].items()},
                       tuple(SampleProblem.from_json(p) for p in doc["problems"]),
                       tuple(str(t) for t in doc["topics_not_sampled"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError("forecast unreadable", path=where, expected="a forecast's fields",
                              found=f"{type(e).__name__}: {e}") from None


def ratio_and_stderr(samples: Sequence[tuple[int, int]], batches: Sequence[tuple[int, int]]) -> tuple[float, float]:
    """A stratum's ratio (bytes out / in over ``samples``, one (in, out) per sampled segment) and its standard
    error: of the per-segment ratios when there are two or more, else of the per-batch ratios ``batches``
    (in, out) of the one segment."""
    bytes_in = sum(i for i, _ in samples)
    if not bytes_in:
        return 1.0, 0.0
    ratio = sum(o for _, o in samples) / bytes_in
    units = [o / i for i, o in (samples if len(samples) > 1 else batches) if i]
    if len(units) < 2:
        return ratio, 0.0
    mean = sum(units) / len(units)
    var = sum((u - mean) ** 2 for u in units) / (len(units) - 1)
    return ratio, math.sqrt(var / len(units))
