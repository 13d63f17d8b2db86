"""Rollback as a kind of run (:mod:`tiering.run.engine`): what one run changed, undone a partition at a time
under the partition's lease. How depends on what the run kept:

    restore   a compaction, merge or key-compaction run keeps each original it replaced
              (``backup/<run>/<partition>/``): put back wherever what the run wrote is still in place, judged
              by the partition's lineage (a merged segment is split back into its sources in one operation)
    unmove    a tiering run keeps no backup: it marks each move in the partition's state before its copy;
              each object it moved goes back to the class it found it in, where the object in place is the
              one it moved (its class, size and ETag, or, a copy having changed the ETag, its generation)

Runs are rolled back newest first. Where a later run replaced what this one made, or moved it, planning that
partition refuses the run: the engine then works on no partition at all, and each such segment names the runs
to roll back first. A tiering run whose document lists moves but left no mark (one made before moves were
marked) is refused the same way, each object still where it moved it named.
"""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from msgspec import structs

from tiering.commit.finish import finish
from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, LeaseLost
from tiering.commit.moves import follow_etags, in_flight_groups, moved_objects, operation_pending
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.recover import recover_partition, stage_rollback
from tiering.commit.regroup import stage_unmerge
from tiering.errors import ConfigError, TieringError
from tiering.kafka.files import parse_segment_name
from tiering.lifecycle.state import (
    Marks,
    PartitionState,
    SegmentState,
    TierMark,
    forget_keys_run,
    generation_in_place,
    load_state,
)
from tiering.lifecycle.vocabulary import Cause, FileRole, Pending, RunKind, Status
from tiering.options import ROLLBACK, Options
from tiering.run import engine
from tiering.run.documents import RunResult
from tiering.storage.layout import (
    BACKUP_DIR,
    StepDir,
    dir_segment_key,
    reserved_dir,
    run_result_key,
    state_dir,
    state_directory,
    work_plan_dir,
)
from tiering.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore


class Undo(StrEnum):
    """How a partition's part of a run is undone."""

    RESTORE = "restore"  # the originals the run's backups keep put back
    UNMOVE = "unmove"  # the objects a tiering run moved put back in the classes it found them in


@dataclass(frozen=True, slots=True)
class RollbackOptions(Options):
    """The run to roll back, and the partitions' lease time (declared in :data:`tiering.options.ROLLBACK`)."""

    DECLARED: ClassVar = ROLLBACK
    WHAT: ClassVar = "rollback options"

    target_run: str
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS


@dataclass(frozen=True, slots=True)
class RollbackPartition:
    """One partition's part of the rollback: how it is undone, the segments to undo there and their bytes,
    and, found planning it, why the whole rollback must not go ahead (its JSON, the work a unit reads back,
    leaves that out: a refused run has no unit)."""

    directory: str
    undo: Undo
    todo: tuple[int, ...]
    bytes: int
    refused: tuple[SegmentResult, ...] = ()
    noted: ClassVar[tuple[SegmentResult, ...]] = ()

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "undo": self.undo.value, "todo": list(self.todo), "bytes": self.bytes}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RollbackPartition:
        return cls(str(doc["directory"]), Undo(doc["undo"]), tuple(int(b) for b in doc["todo"]), int(doc["bytes"]))


@dataclass(frozen=True, slots=True)
class Rollback(engine.PartitionsOnly):
    """Rollback as a kind of run: the partitions where run ``options.target_run`` kept originals (or marked
    moves), each undone under its lease."""

    options: RollbackOptions

    run_kind: ClassVar[RunKind] = RunKind.ROLLBACK
    label: ClassVar[str] = "rollback"
    step: ClassVar[StepDir] = StepDir.ROLLBACK
    plans_ahead: ClassVar[bool] = False

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def started(self, store: ObjectStore, prefix: str) -> Rollback:
        """The rollback, once the run it undoes is known to have left something to undo: a backup, a tiering
        run's plan (its marks come after it) or its document. Else an error, before the run changes anything
        (it would first finish what crashed runs left in flight)."""
        target = self.options.target_run
        left = (reserved_dir(prefix, BACKUP_DIR, target), work_plan_dir(prefix, target, StepDir.TIER))
        if not any(next(iter(store.list(where)), None) for where in left):
            try:
                store.head(run_result_key(prefix, target, RunKind.TIER))
            except ObjectNotFound:
                raise ConfigError("no backups of that run and no storage-class moves of it: nothing to roll back "
                                  "(or its grace period is over)", path=f"s3://{store.bucket}/{left[0]}") from None
        return self

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[RollbackPartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        """The partitions the run kept originals in (its backups listed), or else those whose state marks its
        moves (every state document read), or else, for a tiering run that left its document and no mark, its
        moves still in place, refused (none: every move is undone already, and the rollback does nothing)."""
        if source is not None:
            raise ConfigError("a rollback finds its partitions from the run's backups and the partitions' states",
                              expected="no inventory", found="an inventory's objects")
        target = self.options.target_run
        if _backed_up(store, prefix, target, emit) or _marked(store, prefix, target, emit):
            return
        try:
            doc = store.get_json(run_result_key(prefix, target, RunKind.TIER))[0]
        except ObjectNotFound:  # a tiering run killed after its plan, before any move
            return
        # a run document of an earlier version held the run's results itself; the engine's are in step documents
        results = ([SegmentResult.from_json(r) for r in doc["results"]] if isinstance(doc, dict) and "results" in doc
                   else list(engine.own_results(store, prefix, target, StepDir.TIER)))
        unmarked = _unmarked_moves(store, target, results)
        for directory, found in itertools.groupby(sorted(unmarked, key=lambda r: r.directory), lambda r: r.directory):
            emit(RollbackPartition(directory, Undo.UNMOVE, (), 0, tuple(found)))

    def partition_from_json(self, doc: Mapping[str, Any]) -> RollbackPartition:
        return RollbackPartition.from_json(doc)

    def work(self, ctx: Context, part: RollbackPartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        out += recover_partition(ctx, part.directory, lease)
        state = load_state(ctx.store, ctx.prefix, part.directory)
        undo = _restore if part.undo is Undo.RESTORE else _unmove
        for result in undo(ctx, state, part, self.options.target_run, lease):
            out.append(result)
            if progress is not None:
                progress(result)

    def settings_json(self) -> dict[str, Any]:
        return {"restores_run": self.options.target_run}

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        return {}


def rollback(store: ObjectStore, ctx: Context, target_run: str, lease_ttl: int = DEFAULT_TTL_SECONDS,
             progress: Callable[[SegmentResult], None] | None = None, *, workers: int = 1) -> RunResult:
    """Roll back run ``target_run`` in this process, as run ``ctx.run_id`` (:class:`Rollback`, through the
    engine; ``workers`` partitions at once)."""
    return engine.run(store, ctx, Rollback(RollbackOptions(target_run, lease_ttl)), progress, workers=workers)


def _backed_up(store: ObjectStore, prefix: str, target_run: str, emit: Callable[[RollbackPartition], None]
               ) -> bool:
    """Each partition run ``target_run`` keeps originals of (its backups listed, a partition at a time: the
    listing holds each partition's keys together), handed to ``emit``; whether there was any."""
    root = reserved_dir(prefix, BACKUP_DIR, target_run)
    found = False
    for directory, infos in itertools.groupby(store.list(root), lambda i: i.key[len(root):].partition("/")[0]):
        sizes: dict[int, int] = {}
        for info in infos:
            parsed = parse_segment_name(info.key[len(root):].partition("/")[2])
            if parsed is not None:
                sizes[parsed[0]] = sizes.get(parsed[0], 0) + (info.size if parsed[1] == ".log" else 0)
        if sizes:
            found = True
            state = load_state(store, prefix, directory)
            emit(RollbackPartition(directory, Undo.RESTORE, tuple(sorted(sizes)), sum(sizes.values()),
                                   tuple(_later_runs(state, directory, target_run, set(sizes)))))
    return found


def _marked(store: ObjectStore, prefix: str, target_run: str, emit: Callable[[RollbackPartition], None]) -> bool:
    """Each partition whose state marks moves of tiering run ``target_run`` (every state document read),
    handed to ``emit``; whether there was any."""
    found = False
    for info in store.list(state_dir(prefix)):
        directory = state_directory(prefix, info.key)
        if directory is None:
            continue
        state = load_state(store, prefix, directory)
        marks = {b: m for b, stack in sorted(state.tiered.items()) for m in stack if m.run_id == target_run}
        if marks:
            found = True
            weight = sum(move.size for m in marks.values() for move in m.moves)
            emit(RollbackPartition(directory, Undo.UNMOVE, tuple(marks), weight,
                                   tuple(tiering_blocked(state, directory, target_run))))
    return found


def _restore(ctx: Context, state: PartitionState, part: RollbackPartition, target_run: str, lease: Lease
             ) -> list[SegmentResult]:
    """The originals run ``target_run`` replaced in the partition put back, or why not (a run since planning
    replaced what it wrote: every segment names it)."""
    bases = set(part.todo)
    if later := _later_runs(state, part.directory, target_run, bases):
        return later
    restored: list[SegmentResult] = []
    # A segment that run merged is split back into the segments it holds, in one operation.
    merges = {b: e for b, e in state.segments.items() if e.run_id == target_run and e.merged_from and e.compacted}
    merged = {b for e in merges.values() for b in e.merged_from}
    for base in sorted(merges):
        unmerge = stage_unmerge(ctx, part.directory, merges[base], target_run)
        restored += unmerge if isinstance(unmerge, list) else finish(ctx, *unmerge, lease)
    for base in sorted(bases - merged):
        staged = stage_rollback(ctx, part.directory, base, target_run)
        restored += [staged] if isinstance(staged, SegmentResult) else finish(ctx, *staged, lease)
    # Off the list once all of it is undone (a segment another run replaced since keeps this pass's output),
    # and the checkpoint cleared (records put back below it would be missed).
    if target_run in state.keys_runs and all(r.status is Status.ROLLED_BACK for r in restored):
        forget_keys_run(ctx.store, ctx.prefix, part.directory, target_run)
    return restored


def _unmove(ctx: Context, state: PartitionState, part: RollbackPartition, target_run: str, lease: Lease
            ) -> list[SegmentResult]:
    """The objects tiering run ``target_run`` moved in the partition put back in their classes, or why not (a
    run since planning moved or replaced them: every such segment names it)."""
    if later := tiering_blocked(state, part.directory, target_run):
        return later
    busy = in_flight_groups(ctx.store, ctx.prefix, part.directory)
    out = []
    for base, marks in sorted(state.tiered.items()):
        mark = next((m for m in marks if m.run_id == target_run), None)
        if mark is not None:
            out.append(_unmove_segment(ctx.store, ctx.prefix, part.directory, base, mark, state.get(base), lease,
                                       busy))
    return out


def _later_runs(state: PartitionState, directory: str, target_run: str, bases: set[int]) -> list[SegmentResult]:
    """Why run ``target_run`` cannot be rolled back in this partition yet, per segment: a later run replaced
    what it put in place (its lineage says so), a tiering run moved it (its mark says so), or a later
    key-compaction pass ran here (an earlier pass's
    originals could bring back a value whose tombstone, or aborted data whose ``.txnindex`` entry, it let go).
    Empty when nothing stands in the way."""
    def later(runs: Sequence[str], what: str, did: str = "replaced segments here") -> str:
        return (f"not rolled back: {what} {', '.join(runs)} {did} after run {target_run}; "
                f"roll {'it' if len(runs) == 1 else 'those'} back first (newest first)")

    keys = state.keys_runs
    if target_run in keys and keys[-1] != target_run:
        reason = later(list(reversed(keys[keys.index(target_run) + 1:])), "key-compaction run(s)")
        return [SegmentResult(directory, b, Status.SKIPPED, reason, cause=Cause.LATER_RUN) for b in sorted(bases)]
    blocked: dict[int, SegmentResult] = {}
    for base, marks in sorted(state.tiered.items()):  # a tiering run moved the objects this run put in place
        if tiering := [m.run_id for m in reversed(marks) if m.generation == target_run]:
            reason = later(tiering, "tiering run(s)", "moved this segment's objects to another class")
            blocked[base] = SegmentResult(directory, base, Status.SKIPPED, reason, cause=Cause.LATER_RUN)
    for base, entry in sorted(state.segments.items()):
        found = entry.generation_of(target_run, base)
        if found is not None and found.above:
            reason = later(found.above, "run(s)")
            blocked |= {b: SegmentResult(directory, b, Status.SKIPPED, reason, cause=Cause.LATER_RUN)
                        for b in found.bases}
    return [blocked[b] for b in sorted(blocked)]


def tiering_blocked(state: PartitionState, directory: str, target_run: str) -> list[SegmentResult]:
    """Why tiering run ``target_run`` cannot be rolled back in this partition yet, per segment: a later tiering
    run moved the objects again, or a later run replaced the generation it moved (the partition's lineage
    says which). Empty when nothing stands in the way."""
    out = []
    for base, marks in sorted(state.tiered.items()):
        at = next((i for i, m in enumerate(marks) if m.run_id == target_run), None)
        if at is None:
            continue
        moved = [m.run_id for m in reversed(marks[at + 1:])]  # each moved what the one before it left, or above it
        later = moved + [r for r in state.replacing_runs(base, marks[at].generation) if r not in moved]
        if later:
            out.append(SegmentResult(directory, base, Status.SKIPPED, f"not rolled back: run(s) {', '.join(later)} "
                                     f"moved or replaced this segment's objects after tiering run {target_run}; roll "
                                     f"{'it' if len(later) == 1 else 'those'} back first (newest first)",
                                     cause=Cause.LATER_RUN))
    return out


def _unmarked_moves(store: ObjectStore, run_id: str, results: Iterable[SegmentResult]) -> list[SegmentResult]:
    """The objects a tiering run's results say it moved that are still in the class it moved them to though
    no mark of the move is left (a run made before moves were marked, or a mark lost): not moved back, each
    segment reported (a rollback whose every move is undone finds none)."""
    out = []
    for r in results:
        still = []
        for m in moved_objects([r]):
            with contextlib.suppress(ObjectNotFound):
                if store.head(str(m["key"])).storage_class == m.get("to"):
                    still.append(f"{str(m['key']).rsplit('/', 1)[-1]} is still in {m['to']}")
        if still:
            out.append(SegmentResult(r.directory, r.base_offset, Status.SKIPPED, "; ".join(still) + f", where run "
                                     f"{run_id} moved it, and the partition's state keeps no mark of the move (a "
                                     "run made before moves were marked, or an object an earlier rollback found "
                                     "replaced): not moved back",
                                     cause=Cause.NOT_RESTORABLE))
    return out


def _unmove_segment(store: ObjectStore, prefix: str, directory: str, base: int, mark: TierMark,
                    entry: SegmentState | None, lease: Lease, busy: Mapping[int, str]) -> SegmentResult:
    """One segment's objects moved back to the classes ``mark``'s run found them in. A move leaves the mark
    once its object is back, or once the object in place is not the one it moved (gone, or another writer's:
    reported, and nothing of the run is left there to undo); one S3 stopped stays in it. ``busy``: the
    segments of merges in flight in the partition."""
    if base in busy:
        return SegmentResult(directory, base, Status.SKIPPED, f"a merge of segments {busy[base]} is in flight: roll "
                             "back again later", pending=Pending.BUSY, cause=Cause.BUSY)
    if operation_pending(store, prefix, directory, base):
        return SegmentResult(directory, base, Status.SKIPPED, "an operation on this segment is in progress (its "
                             "journal entry exists): roll back again later", pending=Pending.BUSY, cause=Cause.BUSY)
    in_place = generation_in_place(entry)
    restored: list[dict[str, Any]] = []
    problems: list[str] = []
    settled: set[FileRole] = set()  # the files whose moves leave the mark
    etags: dict[FileRole, tuple[str, str]] = {}
    failed: TieringError | None = None
    for m in mark.moves:
        key = dir_segment_key(prefix, directory, base, f".{m.file}")
        try:
            lease.check()
            try:
                info, attrs = store.describe(key)
            except ObjectNotFound:
                problems.append(f"the .{m.file} is gone")
                settled.add(m.file)
                continue
            # our entry names the object by the ETag it had when the entry last followed it
            named = _named_etag(entry, m.file)
            old = named if named is not None and named in (m.etag_before, m.etag_after) else info.etag
            if info.storage_class == m.from_class:  # back already (an attempt killed before its state write), or
                settled.add(m.file)  # never moved (the run stopped before its copy)
                if old != info.etag:
                    etags[m.file] = (old, info.etag)
                continue
            ours = info.etag == m.etag_after if m.etag_after is not None else (
                info.etag == m.etag_before or in_place == mark.generation)  # a crash between copy and mark
            if info.storage_class != m.to_class or info.size != m.size or not ours:
                problems.append(f"the .{m.file} in place ({info.storage_class}, {info.size:,} bytes) is not the "
                                f"object run {mark.run_id} moved to {m.to_class}: not moved over it")
                settled.add(m.file)
                continue
            etags[m.file] = (old, store.transition(key, etag=info.etag, attrs=attrs, storage_class=m.from_class))
            settled.add(m.file)
            restored.append({"key": key, "from": m.to_class, "to": m.from_class, "bytes": info.size})
        except LeaseLost:
            raise  # nothing more is written: the partition is another's now
        except TieringError as e:
            failed = e
            break
    follow_etags(store, prefix, directory, base, entry, etags, _unmarked(base, mark.run_id, settled, etags))
    moved = sum(int(r["bytes"]) for r in restored)  # the bytes moved back, the same in any class
    if failed is not None:
        return SegmentResult(directory, base, Status.FAILED, f"stopped: {failed}", moved, moved,
                             stats={"moved": restored}, error=failed.to_dict(),
                             pending=Pending.TRANSIENT if failed.retryable else None,
                             cause=Cause.TRANSIENT if failed.retryable else Cause.REFUSED)
    if problems:
        return SegmentResult(directory, base, Status.SKIPPED, "; ".join(problems), moved, moved,
                             stats={"moved": restored},
                             cause=Cause.NOT_RESTORABLE)
    if not restored:
        return SegmentResult(directory, base, Status.SKIPPED, "its objects are in the classes run "
                             f"{mark.run_id} found them in already: nothing to move back", cause=Cause.RESTORED)
    return SegmentResult(directory, base, Status.ROLLED_BACK, "", moved, moved, stats={"moved": restored})


def _named_etag(entry: SegmentState | None, file: FileRole) -> str | None:
    """The ETag our compacted entry names for one of the segment's files (None: no entry names it)."""
    if entry is None or not entry.compacted:
        return None
    named = {FileRole.LOG: entry.log_etag, FileRole.INDEX: entry.index_etag, FileRole.TIMEINDEX: entry.timeindex_etag}
    return named.get(file)


def _unmarked(base: int, run_id: str, settled: set[FileRole], etags: Mapping[FileRole, tuple[str, str]]
              ) -> Callable[[Marks], Marks]:
    """Run ``run_id``'s mark of segment ``base`` without the moves of the files ``settled`` (gone when none is
    left); the mark below it, now the newest, naming the ETags the rollback's copies made where it moved the
    same generation."""
    def change(marks: Marks) -> Marks:
        stack = list(marks.get(base, ()))
        at = next((i for i, m in enumerate(stack) if m.run_id == run_id), None)
        if at is None:
            return marks
        undone = {m.file: m.from_class for m in stack[at].moves if m.file in etags}
        generation = stack[at].generation
        left = tuple(m for m in stack[at].moves if m.file not in settled)
        if left:
            stack[at] = structs.replace(stack[at], moves=left)
        else:
            del stack[at]
        if at > 0 and stack[at - 1].generation == generation:  # the same objects, moved before
            below = stack[at - 1]
            stack[at - 1] = structs.replace(below, moves=tuple(
                structs.replace(m, etag_after=etags[m.file][1])
                if m.file in etags and undone.get(m.file) == m.to_class else m for m in below.moves))
        return {**marks, base: tuple(stack)}
    return change
