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

from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.recover import pending_journals
from tiering.commit.regroup import finish_regroup, stage_merge
from tiering.cost.document import MergeFigures
from tiering.cost.model import merge_figures
from tiering.cost.prices import PriceBook
from tiering.errors import TieringError
from tiering.kafka.merge import Limits, Sizes, merge_runs
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status
from tiering.plan.ages import max_timestamp
from tiering.plan.document import PlannedSegment
from tiering.plan.policy import Policy
from tiering.plan.scan import ScanOptions, scan_partitions
from tiering.run.documents import RUN_SCOPE, RunResult, RunTally
from tiering.run.maintenance import balanced, recover_pending
from tiering.run.pipeline import RunSettings, step_documents, write_results
from tiering.run.segment import guarded, stale_after_recovery, with_lease
from tiering.storage.layout import StepDir, clock_key, keys_unit_name, normalize_prefix, step_dir, step_key
from tiering.storage.objects import ObjectStore

# Segments a merge never touches: each ends a run of neighbours.
_KEPT: Final = frozenset({Cause.ACTIVE, Cause.TOO_YOUNG, Cause.ARCHIVED, Cause.INCOMPLETE, Cause.INVALID,
                          Cause.UNREADABLE})


@dataclass(frozen=True, slots=True)
class MergeOptions:
    """One merge run: the merged segments' bounds and which partitions. With a policy, the topics whose
    ``merge.enable`` is true, each with its own bounds (``merge.target.bytes``, else ``segment.bytes``, and
    ``segment.index.bytes``) and ``min.segment.age.hours`` (by its newest record); ``limits`` is then not
    used."""

    limits: Limits = field(default_factory=Limits)
    topics: str | None = None  # a regular expression of topic names (None: every topic)
    min_age_minutes: int = 0  # segments uploaded more recently are left, and end a run of neighbours
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    policy: Policy | None = None

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


def _partitions(store: ObjectStore, prefix: str, options: MergeOptions
                ) -> Iterator[tuple[list[PlannedSegment], Limits]]:
    """Each listed partition of a topic to merge, its segments aged by the policy, and its bounds."""
    listed: list[list[PlannedSegment]] = []
    scan_partitions(store, prefix, _scan_options(options),
                    lambda segments: listed.append(segments) if segments else None)
    now = store.now(clock_key(normalize_prefix(prefix)))
    for segments in listed:
        limits = options.limits_for(segments[0].topic)
        if limits is not None:
            yield _by_record_age(store, segments, options.min_record_age_hours(segments[0].topic), now), limits


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
             for name in ("log", "index", "timeindex", "txnindex")]
    first = group[0].log
    return {"segments_before": len(group), "segments_after": 1,
            "storage_class": first.storage_class if first is not None else "STANDARD",
            "objects_before": [size for sizes in kinds for size in sizes],
            "objects_after": [sum(sizes) for i, sizes in enumerate(kinds) if i < 3 or sizes]}


def plan_merges(store: ObjectStore, prefix: str, options: MergeOptions) -> list[PlannedMerges]:
    """A dry run: every partition of the chosen topics listed and its merges planned; nothing is written."""
    return [planned_merges(segments, limits) for segments, limits in _partitions(store, prefix, options)]


def _scan_options(options: MergeOptions) -> ScanOptions:
    return ScanOptions("none", topics=options.topics, min_age_minutes=options.min_age_minutes)


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
            queue = queue[max(1, len(results)):]
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
    the first one's result alone when it was not."""
    first = queue[0]
    results: list[SegmentResult] = []

    def attempt() -> SegmentResult:
        staged = stage_merge(ctx, queue, lease)
        if isinstance(staged, int):
            return SegmentResult(first.directory, first.base_offset, Status.SKIPPED,
                                 f"not merged: the next segment ({queue[1].base_offset}) does not start where this "
                                 "one ends (a gap in offsets)", first.size, first.size, cause=Cause.NOTHING_TO_MERGE)
        results.extend(finish_regroup(ctx, *staged, lease))
        return results[0]

    result = guarded(ctx, first, attempt)
    return results or [result]


def _why_not(seg: PlannedSegment, limits: Limits) -> str:
    if seg.cause in _KEPT:
        return f"not merged: {seg.reason}"
    if seg.size >= limits.segment_bytes:
        return f"not merged: {seg.size:,} bytes, at least segment.bytes ({limits.segment_bytes:,})"
    return "not merged: no neighbour to merge with within segment.bytes and segment.index.bytes"


@dataclass(frozen=True, slots=True)
class MergePartition:
    """One partition to merge: its listed segments (aged by the policy) and the bounds of its merged ones;
    JSON-able, it travels to a Spark executor."""

    segments: tuple[PlannedSegment, ...]
    limits: Limits

    @property
    def directory(self) -> str:
        return self.segments[0].directory

    def to_json(self) -> dict[str, Any]:
        return {"segments": [s.to_json() for s in self.segments],
                "limits": [self.limits.segment_bytes, self.limits.index_bytes]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MergePartition:
        return cls(tuple(PlannedSegment.from_json(s) for s in doc["segments"]), Limits(*doc["limits"]))


@dataclass(frozen=True, slots=True)
class MergeUnit:
    """Whole partitions one task merges, one after the other (``runs/<run>/merge/<name>.json`` holds what
    became of their segments)."""

    name: str
    partitions: tuple[MergePartition, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MergeUnit:
        return cls(str(doc["name"]), tuple(MergePartition.from_json(p) for p in doc["partitions"]))


@dataclass(frozen=True, slots=True)
class MergePlan:
    """A run's partitions cut into units, and what the journals a crash left became."""

    units: tuple[MergeUnit, ...]
    recovered: tuple[SegmentResult, ...]


def plan_merge_run(store: ObjectStore, ctx: Context, options: MergeOptions, *, parallelism: int = 1,
                   progress: Callable[[SegmentResult], None] | None = None) -> MergePlan:
    """Finish what a crashed run left in flight, then list the partitions of the topics to merge, each with
    its bounds, cut into about ``4 * parallelism`` units of whole partitions balanced by bytes."""
    recovered = recover_pending(ctx, options.lease_ttl_seconds, progress)
    for info in store.list(step_dir(ctx.prefix, ctx.run_id, StepDir.MERGE)):  # a retried run's: it plans anew
        store.delete(info.key, missing_ok=True)
    partitions = [MergePartition(tuple(segments), limits) for segments, limits in _partitions(store, ctx.prefix,
                                                                                              options)]
    groups = balanced(partitions, 4 * parallelism, lambda p: sum(s.size for s in p.segments))
    units = tuple(MergeUnit(keys_unit_name(i), tuple(sorted(g, key=lambda p: p.directory)))
                  for i, g in enumerate(groups))
    return MergePlan(units, tuple(recovered))


def run_merge_unit(store: ObjectStore, ctx: Context, unit: MergeUnit, lease_ttl_seconds: int,
                   progress: Callable[[SegmentResult], None] | None = None) -> dict[str, int]:
    """Each partition of ``unit`` merged under its lease; the results and the S3 requests by partition go to
    ``runs/<run>/merge/<unit>.json``; the counts by status come back."""
    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    for part in unit.partitions:
        def work(lease: Lease, out: list[SegmentResult], part: MergePartition = part) -> None:
            merge_partition(ctx, part.segments, part.limits, lease, out, progress)

        todo = [(s.directory, s.base_offset) for s in part.segments if s.log is not None]
        before = Counter(store.requests)
        results += with_lease(ctx, part.directory, lease_ttl_seconds, work, todo)
        requests[part.directory] = dict(Counter(store.requests) - before)
    return write_results(store, step_key(ctx.prefix, ctx.run_id, StepDir.MERGE, unit.name), results,
                         usage=requests)


def merge_unit_task(store: ObjectStore, unit: dict[str, Any], settings: dict[str, Any]) -> dict[str, int]:
    """Spark executor side of :func:`run_merge_unit` (a task that fails is retried by Spark: the operation
    it left in flight is finished by the retry, which takes the run's lease back)."""
    run = RunSettings.from_json(settings)
    return run_merge_unit(store, run.context(store, one_core=True), MergeUnit.from_json(unit), run.lease_ttl_seconds)


def collect_merge_run(store: ObjectStore, ctx: Context, plan: MergePlan, started: str,
                      settings: Mapping[str, object], driver_requests: Counter[str]) -> RunResult:
    """The run document from its units' step documents (and the journals the planner finished), with the
    segment objects the merges replaced and made; written to ``runs/<run>/merge.json``."""
    tally = RunTally()
    tally.add_usage({RUN_SCOPE: driver_requests})
    objects = {"before": 0, "after": 0}
    if plan.recovered:
        write_results(store, step_key(ctx.prefix, ctx.run_id, StepDir.MERGE, "recovered"), plan.recovered)
    for step in step_documents(store, ctx.prefix, ctx.run_id, StepDir.MERGE):
        for r in step.results:
            tally.add(r)
            merged = (r.stats or {}).get("merge")
            if isinstance(merged, dict):
                objects["before"] += len(merged["objects_before"])
                objects["after"] += len(merged["objects_after"])
        tally.add_usage(step.requests, sum(r.seconds or 0.0 for r in step.results))
    return tally.write(store, RunKind.MERGE, ctx.run_id, ctx.prefix, started, settings, tally.usage(objects=objects))


def merge_run(store: ObjectStore, ctx: Context, options: MergeOptions,
              progress: Callable[[SegmentResult], None] | None = None) -> RunResult:
    """A whole merge run in this process: :func:`plan_merge_run`, each unit, :func:`collect_merge_run` (the
    Spark job runs the units on executors instead)."""
    started = datetime.now(UTC).isoformat()
    at_start = Counter(store.requests)
    plan = plan_merge_run(store, ctx, options, progress=progress)
    driver = Counter(store.requests) - at_start
    for unit in plan.units:
        run_merge_unit(store, ctx, unit, options.lease_ttl_seconds, progress)
    return collect_merge_run(store, ctx, plan, started, options.settings_json(), driver)
