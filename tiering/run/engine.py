"""The run engine: a run is a kind plus its typed options, and everything but the kind's own work is here.

A kind (compaction, key compaction, merging, storage tiering, rollback, cleanup) supplies only what is its
own: the partitions it works on and what it makes of each (its :class:`PartitionWork`; most kinds list the
prefix, :func:`listed`), the work on one partition under its lease, its settings in the run document and the
figures its results add to it (and, for a cleanup, some work on the run as a whole first). The engine does
the rest, the same way for every kind and every caller (the CLI in one process, the Spark job's driver and
executors, the DAG's tasks, directly or through the Spark job):

    plan      the kind's work on the run as a whole (:meth:`Kind.prepare`), the operations crashed runs left
              in flight finished (each partition under its lease), the
              kind's partitions written to the run's plan chunks on S3 as they come
              (``runs/<run>/<step>-plan/``), the partitions cut into units of whole partitions balanced by
              bytes; where a partition's planning refuses the run (a rollback while a later run is not
              undone), no unit is made and the refusals are the run's results
    unit      each partition of a unit read from its plan chunk and worked on under its lease (released on
              every way out), the results and the S3 requests by partition in the unit's step document
    collect   the step documents folded into the run document; the run's leases released (:func:`end_run`)

No step holds a whole plan: the planner keeps a reference of each partition (its directory, its chunk, its
weight), a unit reads only its own partitions' lines. The units are JSON (:meth:`Unit.to_json`) so that a
Spark task can carry one; the kind travels with the task.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Protocol, TypeVar

from tiering.commit.lease import Lease
from tiering.commit.operation import Context, SegmentResult
from tiering.documents import read
from tiering.errors import InvalidDataError, TieringError
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.document import PlannedSegment
from tiering.plan.planfile import GzipLines, json_lines
from tiering.plan.scan import ScanOptions, scan_partitions
from tiering.run.documents import RUN_SCOPE, RunResult, RunTally, StepResults, StepUsage
from tiering.run.segment import balanced, recover_pending, with_lease
from tiering.storage.layout import (
    StepDir,
    keys_unit_name,
    step_dir,
    step_key,
    work_plan_chunk_key,
    work_plan_dir,
)
from tiering.storage.objects import ObjectInfo, ObjectStore

Progress = Callable[[SegmentResult], None]
CHUNK_PARTITIONS: Final = 1_000  # a plan chunk is closed at this many partitions ...
CHUNK_SEGMENTS: Final = 20_000  # ... or this many segments, whichever comes first
NOTED_RESULTS: Final = 10_000  # a step document of noted results holds this many at most


class PartitionWork(Protocol):
    """What a kind makes of one partition: JSON-able, it travels to a Spark executor. ``todo``: the segments
    (base offsets) its work is on, reported as left where the partition is busy or the work stops (none: the
    partition only adds to what the plan sums up; no chunk holds it, no unit works on it); ``bytes``: what
    the work weighs. ``refused``: why the run must not go ahead at all, found planning this partition (then
    no partition is worked on, and these are the run's results). ``noted``: results the planning already
    knows (segments the run chose but leaves, or found done by an earlier attempt of the run), the run's
    results beside its units'."""

    @property
    def directory(self) -> str: ...

    @property
    def todo(self) -> tuple[int, ...]: ...

    @property
    def bytes(self) -> int: ...

    @property
    def refused(self) -> tuple[SegmentResult, ...]: ...

    @property
    def noted(self) -> tuple[SegmentResult, ...]: ...

    def to_json(self) -> dict[str, Any]: ...


class PartitionsOnly:
    """The :meth:`Kind.prepare` of a kind whose work is all in its partitions: nothing for the run as a whole."""

    __slots__ = ()

    def prepare(self, ctx: Context) -> dict[str, Counter[str]]:
        return {}


class OnListedSegments:
    """The :class:`PartitionWork` of a kind whose work is on listed segments (``segments``, a dataclass field
    of the class that takes this in): those with a ``.log`` to do, weighed by their bytes; never refused, and
    nothing noted."""

    __slots__ = ()
    segments: tuple[PlannedSegment, ...]
    refused: ClassVar[tuple[SegmentResult, ...]] = ()
    noted: ClassVar[tuple[SegmentResult, ...]] = ()

    @property
    def todo(self) -> tuple[int, ...]:
        return tuple(s.base_offset for s in self.segments if s.log is not None)

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self.segments)


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

    @property
    def plans_ahead(self) -> bool:
        """The kind's partitions come from a plan made before the run (compaction's scan and plan): the
        operations crashed runs left in flight in them are finished by the kind's work there, after their
        lease is taken, and only those elsewhere by the planner (after the plan is read). Else (a kind that
        lists the prefix) every one is finished before the listing, which then sees what they changed."""
        ...

    def prepare(self, ctx: Context) -> dict[str, Counter[str]]:
        """The kind's work on the run as a whole, the planner's first step (before the operations crashed
        runs left are finished): the figures it adds to the run document's usage."""
        ...

    def started(self: K, store: ObjectStore, prefix: str) -> K:
        """The kind as this run does it (its clock read once, at the start)."""
        ...

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[W], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        """Each partition the kind works on, handed to ``emit`` as it is found (``source``: an S3 Inventory
        report's objects to read instead of a listing, for a kind that lists the prefix)."""
        ...

    def partition_from_json(self, doc: Mapping[str, Any]) -> W: ...

    def work(self, ctx: Context, part: W, lease: Lease, out: list[SegmentResult], progress: Progress | None
             ) -> None:
        """The work on one partition, under its lease: its results appended to ``out``."""
        ...

    def settings_json(self) -> dict[str, Any]: ...

    def options_json(self) -> dict[str, Any]:
        """The kind's options as :func:`tiering.run.kinds.kind_from_json` reads them back."""
        ...

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        """What one step document's results add to the run document's usage (counts by figure, summed over
        the run's step documents)."""
        ...


@dataclass(frozen=True, slots=True)
class PartitionRef:
    """One planned partition of a run: where the kind's work on it is (a line of the plan chunk ``chunk``, an
    S3 key) and what it weighs (its listed segments and their bytes)."""

    directory: str
    chunk: str
    segments: int
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "chunk": self.chunk, "segments": self.segments, "bytes": self.bytes}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PartitionRef:
        return cls(str(doc["directory"]), str(doc["chunk"]), int(doc["segments"]), int(doc["bytes"]))


@dataclass(frozen=True, slots=True)
class Unit:
    """Whole partitions one task works on, one after the other (listed in directory order, worked on chunk by
    chunk; ``runs/<run>/<step>/<name>.json`` holds what became of their segments)."""

    name: str
    partitions: tuple[PartitionRef, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "partitions": [p.to_json() for p in self.partitions]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Unit:
        return cls(str(doc["name"]), tuple(PartitionRef.from_json(p) for p in doc["partitions"]))


@dataclass(frozen=True, slots=True)
class RunPlan:
    """A run's partitions cut into units, how many plan chunks hold their work, what the journals a crash
    left became, and why the run must not go ahead (then there is no unit)."""

    units: tuple[Unit, ...]
    recovered: tuple[SegmentResult, ...]
    chunks: int = 0
    refused: tuple[SegmentResult, ...] = ()
    figures: Mapping[str, Counter[str]] = field(default_factory=dict)  # what :meth:`Kind.prepare` did


class _PlanChunks:
    """The kind's work on each partition, written to the run's plan chunks as it comes (a chunk is put once it
    holds :data:`CHUNK_PARTITIONS` partitions or :data:`CHUNK_SEGMENTS` segments); a reference of each kept."""

    def __init__(self, store: ObjectStore, prefix: str, run_id: str, step: StepDir) -> None:
        self._store, self._where = store, (prefix, run_id, step)
        self.refs: list[PartitionRef] = []
        self.directories: set[str] = set()
        self.chunks = 0
        self._open()

    def _open(self) -> None:
        self._lines, self._partitions, self._segments = GzipLines(), 0, 0

    def _key(self, index: int) -> str:
        return work_plan_chunk_key(*self._where, index)

    def add(self, part: PartitionWork) -> None:
        if part.directory in self.directories:  # a unit reads one line a partition: the other's work would be lost
            raise InvalidDataError("a run's planning found a partition twice (a listing out of key order?)",
                                   path=part.directory, expected="each partition once", found="twice")
        self.directories.add(part.directory)
        key = self._key(self.chunks)
        self._lines.add([{"directory": part.directory, "work": part.to_json()}])
        self.refs.append(PartitionRef(part.directory, key, len(part.todo), part.bytes))
        self._partitions += 1
        self._segments += len(part.todo)
        if self._partitions >= CHUNK_PARTITIONS or self._segments >= CHUNK_SEGMENTS:
            self._flush()

    def _flush(self) -> None:
        if self._partitions:
            self._store.put(self._key(self.chunks), self._lines.finish())
            self.chunks += 1
            self._open()

    def close(self) -> list[PartitionRef]:
        self._flush()
        return self.refs


class _Noted:
    """The results a kind's planning noted, written to step documents ``noted-<n>`` as they come (each once
    it holds :data:`NOTED_RESULTS`)."""

    def __init__(self, store: ObjectStore, prefix: str, run_id: str, step: StepDir) -> None:
        self._store, self._where = store, (prefix, run_id, step)
        self._results: list[SegmentResult] = []
        self.documents = 0

    def add(self, results: Iterable[SegmentResult]) -> None:
        self._results += results
        if len(self._results) >= NOTED_RESULTS:
            self.close()

    def close(self) -> None:
        if self._results:
            write_results(self._store, step_key(*self._where, f"noted-{self.documents:05d}"), self._results)
            self.documents += 1
            self._results = []


def plan(store: ObjectStore, ctx: Context, kind: Kind[W], *, parallelism: int = 1,
         progress: Progress | None = None, source: Iterator[ObjectInfo] | None = None,
         seen: Callable[[W], None] | None = None) -> RunPlan:
    """Finish what a crashed run left in flight (under the partitions' leases; see :attr:`Kind.plans_ahead`),
    then take the kind's partitions
    (``source``: an S3 Inventory report's objects, for a kind that lists the prefix), each one's work written
    to the run's plan chunks where it has segments to work on (and every partition's handed to ``seen``, what
    the kind's plan adds up to); the work cut into about ``4 * parallelism`` units of whole partitions
    balanced by bytes (largest first), or none where a partition refuses the run. A retried run's step
    documents and plan chunks are deleted: it plans anew. The kind's work on the run as a whole
    (:meth:`Kind.prepare`) comes first."""
    prepared = kind.prepare(ctx)
    recovered = [] if kind.plans_ahead else recover_pending(ctx, kind.lease_ttl_seconds, progress)
    for stale in (step_dir(ctx.prefix, ctx.run_id, kind.step), work_plan_dir(ctx.prefix, ctx.run_id, kind.step)):
        for info in store.list(stale):
            store.delete(info.key, missing_ok=True)
    chunks = _PlanChunks(store, ctx.prefix, ctx.run_id, kind.step)
    noted = _Noted(store, ctx.prefix, ctx.run_id, kind.step)
    refused: list[SegmentResult] = []

    def add(part: W) -> None:
        refused.extend(part.refused)
        noted.add(part.noted)
        if part.todo:  # a partition with nothing to work on only adds to what ``seen`` sums
            chunks.add(part)
        if seen is not None:
            seen(part)

    kind.partitions(store, ctx.prefix, add, source)
    refs = chunks.close()
    noted.close()
    if kind.plans_ahead:
        recovered = recover_pending(ctx, kind.lease_ttl_seconds, progress, elsewhere=chunks.directories)
    groups = [] if refused else balanced(refs, 4 * parallelism, lambda p: p.bytes)
    units = tuple(Unit(keys_unit_name(i), tuple(sorted(g, key=lambda p: p.directory))) for i, g in enumerate(groups))
    return RunPlan(units, tuple(recovered), chunks.chunks, tuple(refused), prepared)


def listed(store: ObjectStore, prefix: str, options: ScanOptions,
           partition: Callable[[list[PlannedSegment]], W | None], emit: Callable[[W], None],
           source: Iterator[ObjectInfo] | None) -> None:
    """The partitions of the prefix's listing (or of ``source``) as ``options`` select their segments, each
    made into a kind's work by ``partition`` (None: nothing to do there) and handed to ``emit``: what a kind
    that lists the prefix gives as its :meth:`Kind.partitions`."""
    def add(segments: list[PlannedSegment]) -> None:
        if segments and (part := partition(segments)) is not None:
            emit(part)

    scan_partitions(store, prefix, options, add, source=source)


def preview(store: ObjectStore, prefix: str, kind: Kind[W], emit: Callable[[W], None], *,
            source: Iterator[ObjectInfo] | None = None) -> None:
    """A dry run of ``kind``: what it would make of each partition, as :func:`plan` makes it (from the listing,
    or from ``source``), handed to ``emit`` one partition at a time. Nothing is written and nothing is held: no
    plan chunk, no document, no operation a crashed run left finished (the next run finishes those)."""
    kind.started(store, prefix).partitions(store, prefix, emit, source)


_WORK_FIELD: Final = b',"work":'  # what follows a chunk line's directory (a JSON string holds no bare quote)


def _line_directory(line: bytes) -> str:
    """The directory of a plan chunk's line, read from its head only (the work after it is not parsed)."""
    end = line.find(_WORK_FIELD)
    if end < 0:
        raise ValueError("a line without its directory and work, in that order")
    return str(json.loads(line[:end] + b"}")["directory"])


def _wanted(directories: set[str]) -> Callable[[bytes], bool]:
    return lambda line: _line_directory(line) in directories


def _partitions(store: ObjectStore, kind: Kind[W], unit: Unit) -> Iterator[W]:
    """The kind's work on each partition of ``unit``, chunk by chunk (in a chunk, in the unit's order), read
    from the plan chunks: each chunk read once, whole, and only the unit's lines of it parsed and kept (no
    stream stays open while the work runs)."""
    by_chunk: dict[str, list[str]] = {}
    for ref in unit.partitions:
        by_chunk.setdefault(ref.chunk, []).append(ref.directory)
    for key, directories in by_chunk.items():
        where = f"s3://{store.bucket}/{key}"
        with store.open(key) as body:
            found = {doc["directory"]: doc["work"] for doc in json_lines(body, where, _wanted(set(directories)))}
        for directory in directories:
            if directory not in found:
                raise InvalidDataError("a plan chunk lacks a partition its unit names", path=where,
                                       expected=directory, found=f"{len(found)} of the unit's partitions")
            yield kind.partition_from_json(found.pop(directory))


def run_unit(store: ObjectStore, ctx: Context, kind: Kind[W], unit: Unit, progress: Progress | None = None
             ) -> dict[str, int]:
    """Each partition of ``unit`` under its lease; the results and the S3 requests by partition (the unit's
    reading of its plan chunks under the run's own) go to the unit's step document; the counts by status come
    back."""
    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    own: Counter[str] = Counter()
    parts = _partitions(store, kind, unit)
    key = step_key(ctx.prefix, ctx.run_id, kind.step, unit.name)
    while True:
        before = Counter(store.requests)
        try:
            part = next(parts, None)
        except TieringError:  # a chunk unreadable: what the unit did before it is kept, then the unit fails
            write_results(store, key, results, usage={**requests, RUN_SCOPE: dict(own)})
            raise
        own += Counter(store.requests) - before
        if part is None:
            break

        def work(lease: Lease, out: list[SegmentResult], part: W = part) -> None:
            kind.work(ctx, part, lease, out, progress)

        todo = [(part.directory, base) for base in part.todo]
        before = Counter(store.requests)
        results += with_lease(ctx, part.directory, kind.lease_ttl_seconds, work, todo)
        requests[part.directory] = dict(Counter(store.requests) - before)
    if own:
        requests[RUN_SCOPE] = dict(own)
    return write_results(store, key, results, usage=requests)


def unit_task(store: ObjectStore, ctx: Context, kind: Kind[W], unit: Mapping[str, Any]) -> dict[str, int]:
    """A Spark executor's unit, as the driver sent it (a task that fails is retried by Spark: the operation it
    left in flight is finished by the retry, which takes the run's lease back)."""
    return run_unit(store, ctx, kind, Unit.from_json(unit))


def collect(store: ObjectStore, ctx: Context, kind: Kind[W], planned: RunPlan, started: str,
            driver_requests: Counter[str]) -> RunResult:
    """The run document from its units' step documents (and the journals the planner finished, and the results
    its planning noted), with the S3 requests by partition (and those of the run's steps before the engine's,
    ``runs/<run>/usage/``) and the seconds the work took; written to ``runs/<run>/<kind>.json``."""
    tally = RunTally()
    tally.add_usage({RUN_SCOPE: driver_requests})
    for info in store.list(step_dir(ctx.prefix, ctx.run_id, StepDir.USAGE)):
        used = read(store.get_json(info.key)[0], StepUsage, what="a step's usage", where=f"s3://{store.bucket}/{info.key}")
        tally.add_usage({RUN_SCOPE: used.requests})
    for name, results in (("recovered", planned.recovered), ("refused", planned.refused)):
        if results:  # a step document like the units' (the report reads them all, whatever the run's size)
            write_results(store, step_key(ctx.prefix, ctx.run_id, kind.step, name), results)
    figures = kind.figures(())  # every figure present, zero where no result adds to it
    for name, counts in planned.figures.items():
        figures.setdefault(name, Counter()).update(counts)
    for step in step_documents(store, ctx.prefix, ctx.run_id, kind.step):
        for r in step.results:
            tally.add(r)
        for name, counts in kind.figures(step.results).items():
            figures.setdefault(name, Counter()).update(counts)
        tally.add_usage(step.requests, sum(r.seconds or 0.0 for r in step.results))
    return tally.write(store, kind.run_kind, ctx.run_id, ctx.prefix, started, kind.settings_json(),
                       tally.usage(**{name: dict(counts) for name, counts in figures.items()}))


def run(store: ObjectStore, ctx: Context, kind: Kind[W], progress: Progress | None = None, *,
        source: Iterator[ObjectInfo] | None = None, seen: Callable[[W], None] | None = None, workers: int = 1
        ) -> RunResult:
    """A whole run in this process: :func:`plan` (from a listing, or from ``source``; each partition's work
    handed to ``seen`` too), its units on ``workers`` threads, :func:`collect` (the Spark job runs the units
    on executors instead). A thread works through a client of its own (:meth:`ObjectStore.another`), so that
    each partition's requests are counted apart; ``progress`` is then called from those threads."""
    started = datetime.now(UTC).isoformat()
    at_start = Counter(store.requests)
    kind = kind.started(store, ctx.prefix)
    planned = plan(store, ctx, kind, parallelism=workers, progress=progress, source=source, seen=seen)
    driver = Counter(store.requests) - at_start
    if workers <= 1:
        for unit in planned.units:
            run_unit(store, ctx, kind, unit, progress)
    else:
        local = threading.local()

        def one(unit: Unit) -> dict[str, int]:
            if not hasattr(local, "ctx"):
                local.ctx = replace(ctx, store=store.another())  # the run's swap mode stays shared (learnt once)
            own: Context = local.ctx
            return run_unit(own.store, own, kind, unit, progress)

        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=kind.run_kind.value) as pool:
            list(pool.map(one, planned.units))
    return collect(store, ctx, kind, planned, started, driver)


def step_documents(store: ObjectStore, prefix: str, run_id: str, step: StepDir) -> Iterable[StepResults]:
    """The documents of one step of run ``run_id`` (its units', and the journals it finished first), in key
    order."""
    for info in store.list(step_dir(prefix, run_id, step)):
        yield StepResults.from_json(store.get_json(info.key)[0], f"s3://{store.bucket}/{info.key}")


def own_results(store: ObjectStore, prefix: str, run_id: str, step: StepDir) -> Iterator[SegmentResult]:
    """The results of run ``run_id``'s own work (its units' step documents; not the operations of other runs
    it finished first, which its run document counts too)."""
    for doc in step_documents(store, prefix, run_id, step):
        yield from (r for r in doc.results if not r.recovered)


def write_results(store: ObjectStore, key: str, results: Iterable[SegmentResult],
                  usage: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
    """Store a step's results (and the S3 requests per partition it made); counts by status."""
    step = StepResults(tuple(results), usage or {})
    store.put_json(key, step.to_json())
    return step.counts()
