"""Compaction (recompression, with re-batching) as a kind of run (:mod:`tiering.run.engine`): the segments a
run's plan selected, each recompressed, proved and swapped in, a partition at a time under its lease.

The plan is the run's own, made before the engine takes over (:mod:`tiering.run.pipeline`'s scan and plan:
the policy, the automatic codecs, the budget, largest segments first, in chunk files under
``runs/<run>/plan/``). The kind reads it a partition at a time: the segments to compact or repair are the
partition's work; the segments the budget left out, and those an earlier attempt of this very run id
compacted (a run killed and run again with its id), are its noted results, so that the run document counts
every segment the plan chose whichever attempt did the work.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.recover import iter_recover
from tiering.documents import known_fields, opt_int
from tiering.errors import ConfigError, TieringError
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.state import Pruning, SegmentState, StateBatch, load_state
from tiering.lifecycle.vocabulary import Action, Cause, FileRole, Pending, RunKind, Status
from tiering.options import LEASE_TTL
from tiering.plan.document import Plan, PlannedSegment
from tiering.plan.planfile import ChunkedPlan, by_partition
from tiering.run import engine
from tiering.run.documents import DONE_STATUSES
from tiering.run.segment import pending_bases, run_segment
from tiering.storage.layout import PlanName, StepDir
from tiering.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore

WORKED: Final = (Action.COMPACT, Action.REPAIR)


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    """The plan to carry out (that of run ``plan_run``, normally the run itself), the partitions' lease time,
    and the budget the plan was made with (recorded in the run document)."""

    plan_run: str
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    max_segments: int | None = None
    max_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"plan_run": self.plan_run, "lease_ttl_seconds": self.lease_ttl_seconds,
                "max_segments": self.max_segments, "max_bytes": self.max_bytes}

    @classmethod
    def from_json(cls, doc: object, where: str | None = None) -> CompactionOptions:
        """:meth:`to_json` read back; a field it does not write, one missing or of the wrong type is an error
        naming it (``where``: the document's origin)."""
        d = known_fields(doc, ("plan_run", "lease_ttl_seconds", "max_segments", "max_bytes"),
                         what="compaction options", where=where)
        plan_run = d.get("plan_run")
        if not isinstance(plan_run, str) or not plan_run:
            raise ConfigError("compaction options name no plan", path=where,
                              expected="plan_run: the id of the run whose plan to carry out", found=plan_run)
        try:
            budget = opt_int(d, "max_segments", None), opt_int(d, "max_bytes", None)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"compaction options of the wrong type: {e}", path=where,
                              expected="whole numbers (or null for no budget)", found=str(d)) from None
        return cls(plan_run, LEASE_TTL.read(d, where), *budget)


@dataclass(frozen=True, slots=True)
class CompactPartition:
    """One partition of the plan: the segments to compact or repair there, every base offset the scan found
    there and when (what a state write may prune), and the results the plan already holds (``noted``: a
    budget's skips, an earlier attempt's compactions)."""

    directory: str
    segments: tuple[PlannedSegment, ...]
    live: tuple[int, ...]
    listed_at: str | None
    noted: tuple[SegmentResult, ...] = ()
    refused: ClassVar[tuple[SegmentResult, ...]] = ()

    @property
    def todo(self) -> tuple[int, ...]:
        return tuple(s.base_offset for s in self.segments)

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def pruning(self) -> Pruning:
        return Pruning(frozenset(self.live), datetime.fromisoformat(self.listed_at) if self.listed_at else None)

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "segments": [s.to_json() for s in self.segments],
                "live": list(self.live), "listed_at": self.listed_at}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CompactPartition:
        return cls(str(doc["directory"]), tuple(PlannedSegment.from_json(s) for s in doc["segments"]),
                   tuple(int(b) for b in doc["live"]), doc.get("listed_at"))


@dataclass(frozen=True, slots=True)
class Compaction(engine.PartitionsOnly):
    """Compaction as a kind of run: each partition of run ``options.plan_run``'s plan with segments to compact
    or repair, its operations left in flight finished (or taken over) first, then each segment recompressed,
    proved and swapped in at once."""

    options: CompactionOptions
    header: Plan | None = None  # the plan's settings, read when the run starts
    source: str = "listing"

    run_kind: ClassVar[RunKind] = RunKind.COMPACT
    label: ClassVar[str] = "compaction"
    step: ClassVar[StepDir] = StepDir.COMPACT
    plans_ahead: ClassVar[bool] = True

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def _plan(self, store: ObjectStore, prefix: str) -> ChunkedPlan:
        return ChunkedPlan(store, prefix, self.options.plan_run, PlanName.PLAN)

    def started(self, store: ObjectStore, prefix: str) -> Compaction:
        """The kind with its plan's settings read (an error before anything changes when there is no plan)."""
        plan = self._plan(store, prefix)
        try:
            manifest = plan.manifest()
        except ObjectNotFound:
            raise ConfigError("no plan to carry out: a compaction runs after its scan and plan",
                              path=f"s3://{store.bucket}/{plan.manifest_key}") from None
        return replace(self, header=manifest.header, source=manifest.source)

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[CompactPartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        """Each partition of the plan, a chunk at a time (its scan read a listing or an inventory already)."""
        if source is not None:
            raise ConfigError("a compaction carries out its plan: the inventory is read by its scan",
                              expected="no inventory", found="an inventory's objects")
        plan = self._plan(store, prefix)
        manifest = plan.manifest()
        listed_at = manifest.header.created_at if manifest.source == "listing" else None
        for part in by_partition(plan.segments(manifest)):
            emit(self._partition(store, prefix, part, listed_at))

    def _partition(self, store: ObjectStore, prefix: str, part: list[PlannedSegment], listed_at: str | None
                   ) -> CompactPartition:
        run_id = self.options.plan_run
        noted = [_with_source(SegmentResult(s.directory, s.base_offset, Status.SKIPPED, s.reason,
                                            cause=Cause.BUDGET), s) for s in part if s.cause is Cause.BUDGET]
        earlier = [s for s in part if s.compacted_by == run_id]
        if earlier:
            noted += _earlier_attempts(store, prefix, run_id, earlier)
        return CompactPartition(part[0].directory, tuple(s for s in part if s.action in WORKED),
                                tuple(s.base_offset for s in part), listed_at,
                                tuple(sorted(noted, key=lambda r: r.base_offset)))

    def partition_from_json(self, doc: Mapping[str, Any]) -> CompactPartition:
        return CompactPartition.from_json(doc)

    def work(self, ctx: Context, part: CompactPartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        planned = {s.base_offset: s for s in part.segments}

        def sourced(result: SegmentResult) -> SegmentResult:
            seg = planned.get(result.base_offset)
            return _with_source(result, seg) if seg is not None and not result.recovered else result

        partition_work(ctx, part.directory, list(part.segments), part.pruning, lease, out, sourced, progress)

    def settings_json(self) -> dict[str, Any]:
        h = self.header
        estimate = h.estimate if h is not None else None
        return {"codec": h.codec if h is not None else None, "level": h.level if h is not None else None,
                "estimate": estimate.to_json() if estimate is not None else None,
                "max_segments": self.options.max_segments, "max_bytes": self.options.max_bytes,
                "plan_created_at": h.created_at if h is not None else None}

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        return {}


def _with_source(result: SegmentResult, seg: PlannedSegment) -> SegmentResult:
    """The result with its source ``.log``'s size, class and age in its stats (what the report prices it by)."""
    if seg.log is None:
        return result
    log = {"size": seg.log.size, "storage_class": seg.log.storage_class, "last_modified": seg.log.last_modified}
    return replace(result, stats={**(result.stats or {}), FileRole.LOG: log})


def _earlier_attempts(store: ObjectStore, prefix: str, run_id: str, segments: list[PlannedSegment]
                      ) -> list[SegmentResult]:
    """The segments an earlier attempt of this run (killed, then run again with the same id) compacted, counted
    from the partition's state (what is on S3), so that the run's savings are whole whatever attempt did
    the work. A segment whose operation is still in flight is left out: finishing it gives its result."""
    directory = segments[0].directory
    try:
        state = load_state(store, prefix, directory)
        in_flight = set(pending_bases(store, prefix, directory).get(directory, ()))
    except TieringError:  # the work is done and safe; only its count in this run's document is missing
        return []
    out = []
    for seg in segments:
        entry = state.get(seg.base_offset)
        if seg.base_offset in in_flight:
            continue
        if entry is not None and entry.run_id == run_id:
            out.append(_with_source(_earlier(seg, entry, run_id), seg))
    return out


def _earlier(seg: PlannedSegment, entry: SegmentState, run_id: str) -> SegmentResult:
    """A segment an earlier attempt of run ``run_id`` compacted, counted from its state entry."""
    return SegmentResult(seg.directory, seg.base_offset, Status.COMPACTED, "by an earlier attempt of this run",
                         entry.bytes_before, entry.bytes_after, run_id=run_id)


def partition_work(ctx: Context, directory: str, segments: list[PlannedSegment], pruning: Pruning | None,
                   lease: Lease, out: list[SegmentResult], sourced: Callable[[SegmentResult], SegmentResult],
                   progress: Callable[[SegmentResult], None] | None) -> None:
    """What the holder of a partition's lease does there: finish (or take over, or abandon) the operations a
    crashed or earlier run left in flight, then compact each planned segment they did not finish, swapped in
    at once; each result, as ``sourced`` completes it, appended to ``out``. A segment an earlier attempt of
    this very run compacted after the plan was made (a retried task: the plan is the same) is counted from
    its state entry, not compacted again. The partition's state changes are written in batches (pruned by
    ``pruning``)."""
    planned = {s.base_offset: s for s in segments if s.action == Action.COMPACT and s.log is not None}

    def adoptable(journal: Journal) -> bool:
        """This run would stage the very same: the same source objects (each index present or absent as
        planned), codec, level and re-batching."""
        seg = planned.get(journal.base_offset)
        if seg is None or any(journal.source_etag(name) != (ref.etag if ref is not None else None)
                              for name, ref in ((FileRole.LOG, seg.log), (FileRole.INDEX, seg.index),
                                                (FileRole.TIMEINDEX, seg.timeindex))):
            return False
        own = ctx.for_segment(seg)
        rebatch = own.rebatch.max_bytes if own.rebatch is not None else None
        return (journal.entry.codec, journal.entry.level, journal.entry.rebatch_max_bytes) == (
            own.rewrite.codec.label, own.rewrite.level, rebatch)

    def given(result: SegmentResult) -> None:
        out.append(sourced(result))
        if progress is not None:
            progress(out[-1])

    batch = StateBatch(ctx.store, ctx.prefix, directory, pruning)
    own = replace(ctx, state=batch)
    finished = set()
    with recorded(batch, out):
        for result in iter_recover(own, directory, lease, adoptable=adoptable):
            given(result)
            if result.status in (Status.COMPACTED, Status.ROLLED_BACK):
                finished.add(result.base_offset)  # done (taken over): nothing left to compact
        for seg in segments:
            if seg.base_offset in finished:
                continue
            if (done := _done_before(batch, seg, ctx.run_id)) is not None:
                given(done)
                continue
            if batch.full:
                batch.flush(lease.check)
            started = time.perf_counter()
            given(replace(run_segment(own, seg, lease), seconds=round(time.perf_counter() - started, 3)))
        batch.flush(lease.check)


def _done_before(batch: StateBatch, seg: PlannedSegment, run_id: str) -> SegmentResult | None:
    """The result of a planned segment whose state entry says this very run compacted it (an earlier attempt
    of the run, after the plan), or None."""
    if seg.action != Action.COMPACT:
        return None
    entry = batch.get(seg.base_offset)
    if entry is None or not entry.compacted or entry.run_id != run_id:
        return None
    return _earlier(seg, entry, run_id)


@contextlib.contextmanager
def recorded(batch: StateBatch, out: list[SegmentResult]) -> Iterator[None]:
    """Work whose state records ``batch`` writes: if it stops (the state write failed, the lease was lost),
    a segment swapped in whose record or journal delete is still queued is reported as left in flight,
    not done (its journal stays; the next run covering the partition finishes and counts it)."""
    try:
        yield
    except TieringError as e:
        unfinished = batch.unfinished()
        for i, r in enumerate(out):
            if r.base_offset in unfinished and r.directory == batch.directory and r.status in DONE_STATUSES:
                out[i] = SegmentResult(r.directory, r.base_offset, Status.FAILED,
                                       f"swapped in, but not recorded ({e}): left in flight for the next run",
                                       error=e.to_dict(), run_id=r.run_id, pending=Pending.TRANSIENT,
                                       recovered=r.recovered, seconds=r.seconds, cause=Cause.TRANSIENT)
        raise
