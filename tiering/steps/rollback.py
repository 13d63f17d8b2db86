"""The task of the DAG ``kafka_segment_rollback``: every run one DAG run made, undone newest first (each a run
of the engine's kind :class:`~tiering.run.rollback.Rollback`).

A compaction DAG run ``R`` makes up to three runs, one after the other: ``R-keys`` (key compaction), then
``R-merge`` (merging), then ``R`` (recompression); a tiering DAG run makes ``R-tier`` (the two DAGs' scheduled
runs share their Airflow ids: which DAG made ``R`` is a param). Given ``R`` (the Airflow run id as the UI shows
it), the runs that DAG run made and that left something to undo are rolled back newest first: a run the DAG did
not finish (no run document: it stopped there) before those that finished, those by the time their document
was written. The first rollback that does not end cleanly stops the rest (they would be refused while it is
not undone) and fails the task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.commit.operation import Context
from tiering.errors import ConfigError, ExitCode, TieringError
from tiering.lifecycle.vocabulary import Cause, RunKind
from tiering.run.pipeline import safe_run_id
from tiering.run.rollback import Rollback, RollbackOptions, rollback
from tiering.steps import segment_lines
from tiering.storage.layout import run_result_key
from tiering.storage.objects import ObjectNotFound, ObjectStore

Log = Callable[[str], None]


class MadeBy(StrEnum):
    """What made the runs to undo: a DAG's run (its runs' ids are the DAG run's, with a suffix), or one run."""

    COMPACTION = "kafka_segment_compaction"
    TIERING = "kafka_segment_tiering"
    RUN = "one run"  # a run's own id, as the command line names it


# The suffixes of the ids of the runs a DAG run makes (what one run's id is, as it is).
SUFFIXES: Final = {MadeBy.COMPACTION: ("-keys", "-merge", ""), MadeBy.TIERING: ("-tier",), MadeBy.RUN: ("",)}


@dataclass(frozen=True, slots=True)
class RollbackParams:
    """A rollback of one DAG run as the DAG's params describe it, typed once."""

    bucket: str
    prefix: str
    run_id: str  # this rollback's own DAG run, key-safe: each rollback's id is made from it
    undo: str  # the DAG run (or run) to undo
    made_by: MadeBy = MadeBy.COMPACTION

    @classmethod
    def from_params(cls, params: Mapping[str, Any], run_id: str) -> RollbackParams:
        return cls(params["bucket"], params["prefix"].strip("/"), safe_run_id(run_id), str(params["undo"]).strip(),
                   MadeBy(params["dag"]))


@dataclass(frozen=True, slots=True)
class UndoneRun:
    """One run rolled back: its id and kind, the rollback's id, its segments by status and exit code."""

    run_id: str
    kind: RunKind | None  # None: a run that left no document (the DAG stopped there)
    rollback_id: str
    counts: Mapping[str, int]
    exit_code: ExitCode

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "kind": self.kind.value if self.kind is not None else None,
                "rollback_id": self.rollback_id, "counts": dict(self.counts), "exit_code": int(self.exit_code)}


@dataclass(frozen=True, slots=True)
class RollbackStep:
    """What the task undid, newest first, and why it stopped (``failure``: the task fails; ``retryable``:
    another attempt may do better, S3 having failed or a partition having been busy, where a refusal or an
    object that cannot be restored would meet the same again)."""

    undo: str
    runs: tuple[UndoneRun, ...]
    failure: str | None = None
    retryable: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"undo": self.undo, "runs": [r.to_json() for r in self.runs], "failure": self.failure,
                "retryable": self.retryable}


def run_ids(undo: str, made_by: MadeBy) -> list[str]:
    """The ids of the runs ``undo`` made, as ``made_by`` names them."""
    base = undo if made_by is MadeBy.RUN else safe_run_id(undo)
    return [base + suffix for suffix in SUFFIXES[made_by]]


def runs_to_undo(store: ObjectStore, prefix: str, undo: str, made_by: MadeBy) -> list[tuple[str, RunKind | None]]:
    """The runs DAG run ``undo`` made (or run ``undo`` itself) that left something to undo, newest first."""
    found: list[tuple[str, str, RunKind | None]] = []  # (finished at, run, kind); "~" sorts after any time
    for run_id in run_ids(undo, made_by):
        try:
            Rollback(RollbackOptions(run_id)).started(store, prefix)
        except ConfigError:
            continue  # it left nothing to undo (or never ran)
        finished = _finished(store, prefix, run_id)
        found.append((finished[0] if finished else "~", run_id, finished[1] if finished else None))
    return [(run_id, kind) for _, run_id, kind in sorted(found, reverse=True)]


def _finished(store: ObjectStore, prefix: str, run_id: str) -> tuple[str, RunKind] | None:
    """When run ``run_id``'s document was written (its clock, ISO 8601; "" in a document of a version that did
    not say) and its kind; None: it has none."""
    for kind in (RunKind.COMPACT, RunKind.COMPACT_KEYS, RunKind.MERGE, RunKind.TIER):
        try:
            doc = store.get_json(run_result_key(prefix, run_id, kind))[0]
        except ObjectNotFound:
            continue
        return (str(doc.get("finished_at") or "") if isinstance(doc, dict) else ""), kind
    return None


def rollback_dag_run(store: ObjectStore, params: RollbackParams, log: Log) -> RollbackStep:
    """Every run of DAG run ``params.undo`` rolled back, newest first (:func:`runs_to_undo`), each a rollback of
    its own (``<this run>-<undone run>``); the first that does not end cleanly stops the rest."""
    todo = runs_to_undo(store, params.prefix, params.undo, params.made_by)
    if not todo:
        names = " or ".join(run_ids(params.undo, params.made_by))
        return RollbackStep(params.undo, (), f"nothing to undo: no run {names} under s3://{store.bucket}/"
                            f"{params.prefix} left backups or storage-class moves (a run of another DAG, or their "
                            "grace period is over?)")
    log(f"rolling back, newest first: {', '.join(run for run, _ in todo)}")
    done: list[UndoneRun] = []
    for run_id, kind in todo:
        ctx = Context(store, params.prefix, f"{params.run_id}-{run_id}")
        try:
            result = rollback(store, ctx, run_id, DEFAULT_TTL_SECONDS, segment_lines(log))
        except TieringError as e:
            return RollbackStep(params.undo, tuple(done), f"rollback of run {run_id} stopped: {e}", e.retryable)
        undone = UndoneRun(run_id, kind, ctx.run_id, dict(result.counts), result.exit_code())
        done.append(undone)
        log(f"run {run_id}{f' ({kind.value})' if kind is not None else ''}: "
            + (", ".join(f"{n:,} {status}" for status, n in sorted(result.counts.items())) or "nothing left to undo"))
        if undone.exit_code is not ExitCode.OK:
            reasons = sorted({r.reason for r in result.segments if r.cause is not None and r.reason})[:3]
            final = any(cause in (Cause.LATER_RUN, Cause.NOT_RESTORABLE) for _, _, cause in result.outcomes)
            return RollbackStep(params.undo, tuple(done), f"rollback of run {run_id} exited {int(undone.exit_code)} "
                                f"({undone.exit_code.name.lower()}): {'; '.join(reasons) or 'see its run document'}"
                                + ("; the runs before it were not rolled back" if run_id != todo[-1][0] else ""),
                                not final and undone.exit_code in (ExitCode.RETRY, ExitCode.BUSY))
    return RollbackStep(params.undo, tuple(done))
