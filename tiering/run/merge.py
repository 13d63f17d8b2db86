"""Merging at rest on S3: runs of small neighbouring sealed segments replaced by fewer, larger ones.

Per partition, under its lease: the journals a crash left are finished first; the segments are listed; the
runs of neighbours each smaller than ``segment.bytes`` (broken by a segment that may not be merged: the
active one, one too young, archived, unreadable or invalid, one this run made by a merge) are grouped by the
cleaner's rules (:func:`tiering.kafka.merge.merge_runs`), and each group is merged and swapped in by the commit protocol
(:mod:`tiering.commit.regroup`). A group stops before a segment that does not start where its predecessor
ends (a gap in offsets: a missing segment, or records a cleaner removed), and the rest of it goes on as a
group of its own.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, ClassVar, Final

from tiering.commit.finish import finish
from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease
from tiering.commit.operation import Context, SegmentResult, uri
from tiering.commit.recover import pending_journals
from tiering.commit.regroup import stage_merge
from tiering.cost.document import MergeFigures
from tiering.cost.model import merge_figures
from tiering.cost.prices import PriceBook
from tiering.errors import ConfigError, InvalidDataError, TieringError
from tiering.kafka.merge import Limits, Sizes, merge_runs
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Cause, FileRole, Pending, RunKind, Status, StorageClass
from tiering.options import MERGE, MIN_AGE, Options
from tiering.plan.ages import max_timestamp
from tiering.plan.document import PlannedSegment
from tiering.plan.policy import Policy, policy_at, policy_ref
from tiering.plan.scan import ScanOptions
from tiering.run import engine
from tiering.run.documents import limits_json, limits_of
from tiering.run.segment import guarded, stale_after_recovery
from tiering.storage.layout import StepDir, clock_key, normalize_prefix
from tiering.storage.objects import ObjectInfo, ObjectStore

# Segments a merge never touches: each ends a run of neighbours.
_KEPT: Final = frozenset({Cause.ACTIVE, Cause.TOO_YOUNG, Cause.ARCHIVED, Cause.INCOMPLETE, Cause.INVALID,
                          Cause.UNREADABLE})


@dataclass(frozen=True, slots=True)
class MergeOptions(Options):
    """One merge run: the merged segments' bounds and which partitions (declared in
    :data:`tiering.options.MERGE`). With a policy, the topics whose ``merge.enable`` is true, each with its own
    bounds (``merge.target.bytes``, else ``segment.bytes``, and ``segment.index.bytes``) and
    ``min.segment.age.hours`` (by its newest record); ``limits`` is then not used."""

    DECLARED: ClassVar = MERGE
    WHAT: ClassVar = "merge options"

    limits: Limits = field(default_factory=Limits)
    topics: str | None = None  # a regular expression of topic names (None: every topic)
    min_age_minutes: int = MIN_AGE.default  # segments uploaded more recently are left, and end a run of neighbours
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    policy: Policy | None = None

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> MergeOptions:
        return cls(Limits(values["segment_bytes"], values["index_bytes"]), values["topics"],
                   values["min_age_minutes"], values["lease_ttl_seconds"], policy_at(values["policy"]))

    def values(self) -> dict[str, Any]:
        """The declared values (the policy by its file's path)."""
        return {"segment_bytes": self.limits.segment_bytes, "index_bytes": self.limits.index_bytes,
                "topics": self.topics, "min_age_minutes": self.min_age_minutes, "policy": policy_ref(self.policy),
                "lease_ttl_seconds": self.lease_ttl_seconds}

    def settings_json(self) -> dict[str, Any]:
        bounds: dict[str, Any] = ({"policy": self.policy.path} if self.policy is not None else
                                  {"segment_bytes": self.limits.segment_bytes, "index_bytes": self.limits.index_bytes})
        return {**bounds, "topics": self.topics, "min_age_minutes": self.min_age_minutes}

    def limits_for(self, topic: str) -> Limits | None:
        """The bounds of ``topic``'s merged segments; None when it is not to be merged."""
        if self.policy is None:
            return self.limits
        tp = self.policy.resolve(topic)
        return Limits(tp.merge_target_bytes, tp.segment_index_bytes) if tp.merge_enable else None

    def min_record_age_hours(self, topic: str) -> float:
        return self.policy.resolve(topic).min_age_hours if self.policy is not None else 0.0


def _by_record_age(store: ObjectStore, segments: list[PlannedSegment], hours: float, now: datetime
                   ) -> list[PlannedSegment]:
    """``segments`` with those whose newest record is younger than ``hours`` left as too young (each ends a run
    of neighbours); the newest record read from the end of the ``.timeindex`` and the ``.log``."""
    if hours <= 0:
        return segments
    out = []
    for seg in segments:
        aged = seg
        if seg.log is not None and seg.cause not in _KEPT:
            try:
                newest, _ = max_timestamp(store, seg)
            except TieringError:  # unreadable here: the merge reads it and says why
                newest = None
            age = None if newest is None else (now.timestamp() * 1000 - newest) / 3_600_000
            if age is not None and age < hours:
                aged = replace(seg, cause=Cause.TOO_YOUNG, reason=f"too young by its records: the newest is "
                               f"{age:.1f} h old, the policy's min.segment.age.hours is {hours:g}")
        out.append(aged)
    return out


def _sizes(seg: PlannedSegment) -> Sizes:
    assert seg.log is not None
    return Sizes(seg.base_offset, seg.log.size, seg.index.size if seg.index else 0,
                 seg.timeindex.size if seg.timeindex else 0)


def merge_groups(segments: Sequence[PlannedSegment], limits: Limits, breaks: frozenset[int] = frozenset()
                 ) -> list[list[PlannedSegment]]:
    """The groups to merge among a partition's listed segments (in offset order), by the cleaner's rules
    within runs of small neighbours; gaps in offsets are found while merging. A segment left as it is (its
    cause), or whose base offset is in ``breaks``, ends a run."""
    listed = [s for s in segments if s.log is not None]
    by_base = {s.base_offset: s for s in listed}
    groups: list[list[PlannedSegment]] = []
    run: list[PlannedSegment] = []

    def close(end: int) -> None:
        found = merge_runs([_sizes(s) for s in run], limits, end, lambda a, b: True)
        groups.extend([by_base[s.base_offset] for s in g] for g in found)
        run.clear()

    for seg in listed:
        if seg.cause in _KEPT or seg.base_offset in breaks:
            if run:
                close(seg.base_offset)
            continue
        run.append(seg)
    if run:  # no active segment listed (a partition archived whole): the last one's end is not known
        close(run[-1].base_offset + 1)
    return groups


@dataclass(frozen=True, slots=True)
class PlannedMerges:
    """A partition's merges as its listing plans them (a dry run): its segments and segment objects now,
    and after the groups are merged. A group may end earlier where merging finds a gap in offsets."""

    directory: str
    groups: tuple[tuple[int, ...], ...]  # the base offsets of each group
    segments_before: int
    objects_before: int
    segments_after: int
    objects_after: int
    bytes_merged: int  # the .log bytes of the segments in groups
    # Each group's objects as a merge's stats name them: their storage class and sizes before and after (a
    # merged file's size taken as the sum of its sources': the .log is, the rebuilt indexes are about it).
    group_stats: tuple[dict[str, Any], ...] = ()

    def figures(self, prices: PriceBook) -> MergeFigures | None:
        """What the planned groups' objects cost before and after, priced as a merge run's report prices them."""
        out: MergeFigures | None = None
        for stats in self.group_stats:
            f = merge_figures({"merge": stats}, prices)
            if f is not None:
                out = f if out is None else out.plus(f)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "groups": [list(g) for g in self.groups],
                "segments_before": self.segments_before, "objects_before": self.objects_before,
                "segments_after": self.segments_after, "objects_after": self.objects_after,
                "bytes_merged": self.bytes_merged}


def _objects(seg: PlannedSegment) -> int:
    return sum(ref is not None for ref in (seg.log, seg.index, seg.timeindex, seg.txnindex))


def planned_merges(segments: Sequence[PlannedSegment], limits: Limits) -> PlannedMerges:
    """What merging ``segments`` (one partition's listing) would make of them, by their sizes alone."""
    groups = merge_groups(segments, limits)
    listed = [s for s in segments if s.log is not None]
    before = sum(_objects(s) for s in segments)
    after = before - sum(_objects(s) for g in groups for s in g) + sum(
        3 + any(s.txnindex is not None for s in g) for g in groups)
    return PlannedMerges(segments[0].directory, tuple(tuple(s.base_offset for s in g) for g in groups),
                         len(listed), before, len(listed) - sum(len(g) - 1 for g in groups), after,
                         sum(s.size for g in groups for s in g), tuple(_merge_stats_json(g) for g in groups))


def _merge_stats_json(group: Sequence[PlannedSegment]) -> dict[str, Any]:
    """A planned group's objects as :func:`~tiering.commit.regroup.merge_stats` names a merged one's, each
    merged file's size the sum of its sources' files."""
    kinds = [[ref.size for s in group if (ref := getattr(s, name)) is not None]
             for name in (FileRole.LOG, FileRole.INDEX, FileRole.TIMEINDEX, FileRole.TXNINDEX)]
    first = group[0].log
    return {"segments_before": len(group), "segments_after": 1,
            "storage_class": first.storage_class if first is not None else StorageClass.STANDARD,
            "objects_before": [size for sizes in kinds for size in sizes],
            "objects_after": [sum(sizes) for i, sizes in enumerate(kinds) if i < 3 or sizes]}


def plan_merges(store: ObjectStore, prefix: str, options: MergeOptions, emit: Callable[[PlannedMerges], None],
                source: Iterator[ObjectInfo] | None = None) -> None:
    """A dry run: every partition of the chosen topics listed (or read from ``source``, an S3 Inventory
    report's objects) and its merges planned, handed to ``emit`` one partition at a time; nothing is written."""
    engine.preview(store, prefix, Merging(options), lambda part: emit(planned_merges(part.segments, part.limits)),
                   source=source)


def merge_partition(ctx: Context, segments: Sequence[PlannedSegment], limits: Limits, lease: Lease,
                    out: list[SegmentResult], progress: Callable[[SegmentResult], None] | None = None) -> None:
    """Merge one partition's groups under its lease: results appended to ``out``, one per listed segment."""
    def report(r: SegmentResult) -> None:
        out.append(r)
        if progress is not None:
            progress(r)

    if stale_after_recovery(ctx, segments, lease, report, "merged"):
        return
    # A segment this very run made by a merge is not merged again (a retry of the run would back it up over
    # the original its first attempt kept under the same key).
    state = load_state(ctx.store, ctx.prefix, segments[0].directory)
    mine = frozenset(s.base_offset for s in segments if (e := state.get(s.base_offset)) is not None
                     and e.run_id == ctx.run_id and e.merged_from)
    done: set[int] = set()
    stopped: SegmentResult | None = None
    for group in merge_groups(segments, limits, mine):
        queue = list(group)
        while len(queue) >= 2 and stopped is None:
            results = _merge_one(ctx, queue, lease)
            for r in results:
                report(r)
                done.add(r.base_offset)
            if any(r.status is Status.FAILED or r.pending is not None for r in results) and \
                    any(True for _ in pending_journals(ctx.store, ctx.prefix, segments[0].directory)):
                stopped = results[0]  # an operation left in flight: no other goes beside it in the partition
            queue = [s for s in queue[1:] if s.base_offset not in done]  # past what was merged or judged
    for seg in segments:
        if seg.log is not None and seg.base_offset not in done:
            if seg.base_offset in mine:
                report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, f"not merged: run {ctx.run_id} "
                                     "made it by a merge already", seg.size, seg.size, cause=Cause.ALREADY_COMPACTED))
                continue
            if stopped is not None:
                report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, "not merged: the merge at "
                                     f"{stopped.base_offset} is left in flight; a later run finishes it first",
                                     seg.size, seg.size, pending=Pending.BUSY, cause=Cause.BUSY))
                continue
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, _why_not(seg, limits),
                                 seg.size, seg.size, cause=seg.cause if seg.cause in _KEPT else Cause.NOTHING_TO_MERGE))


def _merge_one(ctx: Context, queue: list[PlannedSegment], lease: Lease) -> list[SegmentResult]:
    """Merge the first segments of ``queue`` (as many as are contiguous): a result per segment merged, or
    the first one's result alone when it was not; where a later source's bytes fail validation, that source's
    result too (judged as a first source is) after what became of those before it."""
    first = queue[0]
    results: list[SegmentResult] = []
    invalid: list[tuple[PlannedSegment, InvalidDataError]] = []  # a later source whose bytes failed validation

    def attempt() -> SegmentResult:
        try:
            staged = stage_merge(ctx, queue, lease)
        except InvalidDataError as e:
            named = next((s for s in queue[1:] if s.log is not None and e.path == uri(ctx.store, s.log.key)), None)
            if named is None:
                raise
            invalid.append((named, e))
            return SegmentResult(first.directory, first.base_offset, Status.SKIPPED, "not merged: segment "
                                 f"{named.base_offset}, in its group, failed validation ({e.message})",
                                 first.size, first.size, cause=Cause.NOTHING_TO_MERGE)
        if isinstance(staged, int):
            return SegmentResult(first.directory, first.base_offset, Status.SKIPPED,
                                 f"not merged: the next segment ({queue[1].base_offset}) does not start where this "
                                 "one ends (a gap in offsets)", first.size, first.size, cause=Cause.NOTHING_TO_MERGE)
        results.extend(finish(ctx, *staged, lease))
        return results[0]

    result = guarded(ctx, first, attempt)
    if not invalid:
        return results or [result]
    named, e = invalid[0]  # judged at once, as a first source is: read again, then remembered invalid
    judged = guarded(ctx, named, functools.partial(_raise, e))
    before = queue[:queue.index(named)]  # those before it may still merge together
    return [*(_merge_one(ctx, before, lease) if len(before) >= 2 else [result]), judged]


def _raise(e: TieringError) -> SegmentResult:
    raise e


def _why_not(seg: PlannedSegment, limits: Limits) -> str:
    if seg.cause in _KEPT:
        return f"not merged: {seg.reason}"
    if seg.size >= limits.segment_bytes:
        return f"not merged: {seg.size:,} bytes, at least segment.bytes ({limits.segment_bytes:,})"
    return "not merged: no neighbour to merge with within segment.bytes and segment.index.bytes"


@dataclass(frozen=True, slots=True)
class MergePartition(engine.OnListedSegments):
    """One partition to merge: its listed segments (aged by the policy) and the bounds of its merged ones;
    JSON-able, it travels to a Spark executor."""

    segments: tuple[PlannedSegment, ...]
    limits: Limits

    @property
    def directory(self) -> str:
        return self.segments[0].directory

    def to_json(self) -> dict[str, Any]:
        return {"segments": [s.to_json() for s in self.segments],
                "limits": limits_json(self.limits)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MergePartition:
        return cls(tuple(PlannedSegment.from_json(s) for s in doc["segments"]), limits_of(doc["limits"]))


@dataclass(frozen=True, slots=True)
class Merging(engine.PartitionsOnly):
    """Merging as a kind of run (:mod:`tiering.run.engine`): the runs of small neighbours of each partition of
    the chosen topics merged, segments aged by the clock read when the run starts."""

    options: MergeOptions
    now: datetime | None = None

    run_kind: ClassVar[RunKind] = RunKind.MERGE
    label: ClassVar[str] = "merge"
    step: ClassVar[StepDir] = StepDir.MERGE
    plans_ahead: ClassVar[bool] = False

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def started(self, store: ObjectStore, prefix: str) -> Merging:
        return replace(self, now=store.now(clock_key(normalize_prefix(prefix))))

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[MergePartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        options = ScanOptions("none", topics=self.options.topics, min_age_minutes=self.options.min_age_minutes)
        engine.listed(store, prefix, options, lambda segments: self.partition(store, segments), emit, source)

    def partition(self, store: ObjectStore, segments: list[PlannedSegment]) -> MergePartition | None:
        topic = segments[0].topic
        limits = self.options.limits_for(topic)
        if limits is None:
            return None
        if self.now is None:
            raise ConfigError("a merge run has no clock before it starts", expected="now", found=None)
        aged = _by_record_age(store, segments, self.options.min_record_age_hours(topic), self.now)
        return MergePartition(tuple(aged), limits)

    def partition_from_json(self, doc: Mapping[str, Any]) -> MergePartition:
        return MergePartition.from_json(doc)

    def work(self, ctx: Context, part: MergePartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        merge_partition(ctx, part.segments, part.limits, lease, out, progress)

    def settings_json(self) -> dict[str, Any]:
        return self.options.settings_json()

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        """The segment objects the merges replaced and made."""
        objects = Counter(before=0, after=0)
        for r in results:
            merged = (r.stats or {}).get("merge")
            if isinstance(merged, dict):
                objects["before"] += len(merged["objects_before"])
                objects["after"] += len(merged["objects_after"])
        return {"objects": objects}
