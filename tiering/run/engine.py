"""The run engine: a run is a kind plus its typed options, and everything but the kind's own work is here.

A kind (key compaction, merging) supplies only what is its own: which segments a scan lists for it, what
one listed partition becomes (its :class:`PartitionWork`, or nothing to do there), the work on one partition
under its lease, its settings in the run document and the figures its results add to it. The engine does the
rest, the same way for every kind and every caller (the CLI in one process, the Spark job's driver and
executors, the DAG through the Spark job):

    plan      the operations crashed runs left in flight finished first (each partition under its lease), the
              partitions listed and handed to the kind, cut into units of whole partitions balanced by bytes
    unit      each partition of a unit under its lease (released on every way out), the kind's work, the
              results and the S3 requests by partition in the unit's step document
    collect   the step documents folded into the run document; the run's leases released (:func:`end_run`)

The units are JSON (:meth:`Unit.to_json`) so that a Spark task can carry one; the kind travels with the task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from tiering.commit.lease import Lease
from tiering.commit.operation import Context, SegmentResult
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.document import PlannedSegment
from tiering.plan.scan import ScanOptions, scan_partitions
from tiering.run.documents import RUN_SCOPE, RunResult, RunTally, StepResults
from tiering.run.maintenance import balanced, recover_pending
from tiering.run.segment import with_lease
from tiering.storage.layout import StepDir, keys_unit_name, step_dir, step_key
from tiering.storage.objects import ObjectInfo, ObjectStore

Progress = Callable[[SegmentResult], None]


class PartitionWork(Protocol):
    """What a kind makes of one listed partition: JSON-able, it travels to a Spark executor."""

    @property
    def directory(self) -> str: ...

    @property
    def segments(self) -> tuple[PlannedSegment, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


W = TypeVar("W", bound=PartitionWork)
K = TypeVar("K", bound="Kind[Any]")


class Kind(Protocol[W]):
    """A kind of run: only what is its own."""

    @property
    def run_kind(self) -> RunKind: ...

    @property
    def label(self) -> str: ...  # what the kind does, for people ("key compaction")

    @property
    def step(self) -> StepDir: ...  # where its units' step documents go

    @property
    def lease_ttl_seconds(self) -> int: ...

    def started(self: K, store: ObjectStore, prefix: str) -> K:
        """The kind as this run does it (its clock read once, at the start)."""
        ...

    def scan_options(self) -> ScanOptions: ...

    def partition(self, store: ObjectStore, segments: list[PlannedSegment]) -> W | None:
        """What the kind does with one listed partition (None: nothing)."""
        ...

    def partition_from_json(self, doc: Mapping[str, Any]) -> W: ...

    def work(self, ctx: Context, part: W, lease: Lease, out: list[SegmentResult], progress: Progress | None
             ) -> None:
        """The work on one partition, under its lease: its results appended to ``out``."""
        ...

    def settings_json(self) -> dict[str, Any]: ...

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        """What one step document's results add to the run document's usage (counts by figure, summed over
        the run's step documents)."""
        ...


@dataclass(frozen=True, slots=True)
class Unit(Generic[W]):
    """Whole partitions one task works on, one after the other (``runs/<run>/<step>/<name>.json`` holds what
    became of their segments)."""

    name: str
    partitions: tuple[W, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], kind: Kind[W]) -> Unit[W]:
        return cls(str(doc["name"]), tuple(kind.partition_from_json(p) for p in doc["partitions"]))


@dataclass(frozen=True, slots=True)
class RunPlan(Generic[W]):
    """A run's partitions cut into units, and what the journals a crash left became."""

    units: tuple[Unit[W], ...]
    recovered: tuple[SegmentResult, ...]


def plan(store: ObjectStore, ctx: Context, kind: Kind[W], *, parallelism: int = 1,
         progress: Progress | None = None, source: Iterator[ObjectInfo] | None = None) -> RunPlan[W]:
    """Finish what a crashed run left in flight (under the partitions' leases), then list the partitions (or
    read them from ``source``, an S3 Inventory report's objects) and hand each to the kind; the work cut into
    about ``4 * parallelism`` units of whole partitions balanced by bytes (largest first). A retried run's
    step documents are deleted: it plans anew."""
    recovered = recover_pending(ctx, kind.lease_ttl_seconds, progress)
    for info in store.list(step_dir(ctx.prefix, ctx.run_id, kind.step)):
        store.delete(info.key, missing_ok=True)
    partitions: list[W] = []

    def add(segments: list[PlannedSegment]) -> None:
        if segments and (part := kind.partition(store, segments)) is not None:
            partitions.append(part)

    scan_partitions(store, ctx.prefix, kind.scan_options(), add, source=source)
    groups = balanced(partitions, 4 * parallelism, lambda p: sum(s.size for s in p.segments))
    units = tuple(Unit(keys_unit_name(i), tuple(sorted(g, key=lambda p: p.directory))) for i, g in enumerate(groups))
    return RunPlan(units, tuple(recovered))


def run_unit(store: ObjectStore, ctx: Context, kind: Kind[W], unit: Unit[W], progress: Progress | None = None
             ) -> dict[str, int]:
    """Each partition of ``unit`` under its lease; the results and the S3 requests by partition go to the
    unit's step document; the counts by status come back."""
    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    for part in unit.partitions:
        def work(lease: Lease, out: list[SegmentResult], part: W = part) -> None:
            kind.work(ctx, part, lease, out, progress)

        todo = [(s.directory, s.base_offset) for s in part.segments if s.log is not None]
        before = Counter(store.requests)
        results += with_lease(ctx, part.directory, kind.lease_ttl_seconds, work, todo)
        requests[part.directory] = dict(Counter(store.requests) - before)
    return write_results(store, step_key(ctx.prefix, ctx.run_id, kind.step, unit.name), results, usage=requests)


def unit_task(store: ObjectStore, ctx: Context, kind: Kind[W], unit: Mapping[str, Any]) -> dict[str, int]:
    """A Spark executor's unit, as the driver sent it (a task that fails is retried by Spark: the operation it
    left in flight is finished by the retry, which takes the run's lease back)."""
    return run_unit(store, ctx, kind, Unit.from_json(unit, kind))


def collect(store: ObjectStore, ctx: Context, kind: Kind[W], planned: RunPlan[W], started: str,
            driver_requests: Counter[str]) -> RunResult:
    """The run document from its units' step documents (and the journals the planner finished), with the S3
    requests by partition and the seconds the work took; written to ``runs/<run>/<kind>.json``."""
    tally = RunTally()
    tally.add_usage({RUN_SCOPE: driver_requests})
    if planned.recovered:  # a step document like the units' (the report reads them all, whatever the run's size)
        write_results(store, step_key(ctx.prefix, ctx.run_id, kind.step, "recovered"), planned.recovered)
    figures = kind.figures(())  # every figure present, zero where no result adds to it
    for step in step_documents(store, ctx.prefix, ctx.run_id, kind.step):
        for r in step.results:
            tally.add(r)
        for name, counts in kind.figures(step.results).items():
            figures.setdefault(name, Counter()).update(counts)
        tally.add_usage(step.requests, sum(r.seconds or 0.0 for r in step.results))
    return tally.write(store, kind.run_kind, ctx.run_id, ctx.prefix, started, kind.settings_json(),
                       tally.usage(**{name: dict(counts) for name, counts in figures.items()}))


def run(store: ObjectStore, ctx: Context, kind: Kind[W], progress: Progress | None = None, *,
        source: Iterator[ObjectInfo] | None = None) -> RunResult:
    """A whole run in this process: :func:`plan` (from a listing, or from ``source``), each unit,
    :func:`collect` (the Spark job runs the units on executors instead)."""
    started = datetime.now(UTC).isoformat()
    at_start = Counter(store.requests)
    kind = kind.started(store, ctx.prefix)
    planned = plan(store, ctx, kind, progress=progress, source=source)
    driver = Counter(store.requests) - at_start
    for unit in planned.units:
        run_unit(store, ctx, kind, unit, progress)
    return collect(store, ctx, kind, planned, started, driver)


def step_documents(store: ObjectStore, prefix: str, run_id: str, step: StepDir) -> Iterable[StepResults]:
    """The documents of one step of run ``run_id`` (its units', and the journals it finished first), in key
    order."""
    for info in store.list(step_dir(prefix, run_id, step)):
        yield StepResults.from_json(store.get_json(info.key)[0], f"s3://{store.bucket}/{info.key}")


def write_results(store: ObjectStore, key: str, results: Iterable[SegmentResult],
                  usage: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
    """Store a step's results (and the S3 requests per partition it made); counts by status."""
    step = StepResults(tuple(results), usage or {})
    store.put_json(key, step.to_json())
    return step.counts()
