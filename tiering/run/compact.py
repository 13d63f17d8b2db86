"""What runs are made of: one segment's work turned into a result, a partition's work under its lease, the
run document and its exit code; rolling a run back; cleaning up after the grace period.

The per-segment protocol lives in :mod:`tiering.commit`; compaction runs are driven by the one
orchestrator, :mod:`tiering.run.pipeline`. Every per-segment problem becomes a result, never a crash of
the whole run.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, LeaseGuard, LeaseHeld, LeaseLost
from tiering.commit.operation import (
    Context,
    SegmentResult,
    SourceChanged,
    SourceGone,
    Staged,
    record_state,
    state_entry,
)
from tiering.commit.recover import pending_journals, recover_partition, repair_segment, stage_rollback
from tiering.commit.stage import recheck_source, stage_segment
from tiering.commit.swap import finish_one
from tiering.documents import check_document
from tiering.errors import ConfigError, ExitCode, InvalidDataError, ProofError, StorageError, TieringError
from tiering.kafka.files import parse_segment_name
from tiering.lifecycle.vocabulary import NOTHING_TO_GAIN, Action, Cause, Pending, RunKind, Status
from tiering.plan.scan import PlannedSegment
from tiering.plan.state import Outcome, SegmentState, forget_keys_run, load_state, stamped
from tiering.storage.layout import (
    BACKUP_DIR,
    JOURNAL_DIR,
    STAGING_DIR,
    clock_key,
    journal_dir,
    lease_key,
    normalize_prefix,
    probe_key,
    reserved_dir,
    run_result_key,
)
from tiering.storage.objects import (
    ChecksumMismatch,
    EncryptedWithCustomerKey,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    delete_honours_etag,
)

RUN_SCHEMA_VERSION: Final = 1
DEFAULT_GRACE_DAYS: Final = 7
STAGED_STATUS: Final = Status.STAGED  # staged by a worker, waiting for the commit step
DEFAULT_STALE_HOURS: Final = 24  # staging objects and multipart uploads older than this are abandoned


def new_run_id() -> str:
    """A sortable, unique run id (the local clock only names it; nothing is decided by it)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class CompactOptions:
    max_segments: int | None = None
    max_bytes: int | None = None
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    workers: int = 1  # partitions compacted at once


MAX_LISTED_SEGMENTS: Final = 10_000  # segments a run document names one by one (the rest are counted)
DONE_STATUSES: Final = (Status.COMPACTED, Status.ROLLED_BACK)


def _outcomes_from_json(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, Status, Cause | None], int]:
    """A run document's outcome rows (version 2's by reason text: a text that is no cause's name counts under
    its status alone)."""
    out: Counter[tuple[str, Status, Cause | None]] = Counter()
    for o in rows:
        out[(str(o["topic"]), Status(o["status"]), Cause.named(o.get("cause", o.get("reason"))))] += int(o["segments"])
    return dict(out)


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run's document (``runs/<run>/<kind>.json``): its totals, the outcome of every segment counted by
    topic and reason, and the segments themselves up to :data:`MAX_LISTED_SEGMENTS` (those that failed or
    were left to a later run first), so that it stays small whatever the run's size. Every segment's
    result is in the run's step documents (``runs/<run>/stage/``, ``commit/``)."""

    SCHEMA_VERSION: ClassVar[int] = 3

    kind: RunKind
    run_id: str
    bucket: str
    prefix: str
    started_at: str
    finished_at: str
    settings: Mapping[str, Any]
    counts: Mapping[str, int]  # segments by status
    bytes_before: int  # of the segments compacted (or rolled back)
    bytes_after: int
    exit: ExitCode
    hard_failures: int  # failed for a reason a retry does not fix
    pending: int  # left to a later run (busy, transient)
    topics: Mapping[str, tuple[int, int, int]]  # compacted, bytes before, bytes after
    outcomes: Mapping[tuple[str, Status, Cause | None], int]  # every other outcome, by topic, status and cause
    segments: tuple[SegmentResult, ...]
    omitted: int = 0  # segments not listed
    usage: Mapping[str, Any] = field(default_factory=dict)  # S3 requests by partition and class, task seconds

    def outcome_rows(self) -> list[tuple[str, Status, Cause | None, int]]:
        """The outcomes other than compacted, by topic, status and cause (none for a repair or a move)."""
        return [(t, st, cause, n) for (t, st, cause), n in
                sorted(self.outcomes.items(), key=lambda o: (o[0][0], o[0][1], o[0][2] or ""))]

    def totals(self) -> dict[str, int]:
        return {"segments": sum(self.counts.values()), **dict(sorted(self.counts.items())),
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after}

    @property
    def failed(self) -> bool:
        """A segment failed for a reason a retry does not fix (invalid data, a proof failure, a refusal)."""
        return self.hard_failures > 0

    def exit_code(self) -> ExitCode:
        return self.exit

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.kind.value, "run_id": self.run_id,
                "bucket": self.bucket, "prefix": self.prefix, "started_at": self.started_at,
                "finished_at": self.finished_at, "settings": dict(self.settings), "totals": self.totals(),
                "exit_code": int(self.exit), "hard_failures": self.hard_failures, "pending": self.pending,
                "by_topic": [{"topic": t, "compacted": n, "bytes_before": b, "bytes_after": a}
                             for t, (n, b, a) in sorted(self.topics.items())],
                "outcomes": [{"topic": t, "status": st.value, "cause": cause.value if cause else None, "segments": n}
                             for t, st, cause, n in self.outcome_rows()],
                "segments": [s.to_json() for s in self.segments], "segments_omitted": self.omitted,
                **({"usage": dict(self.usage)} if self.usage else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> RunResult:
        version = doc.get("schema_version")
        if version == 1:  # every segment listed: counted again
            tally = RunTally()
            for s in doc["segments"]:
                tally.add(SegmentResult.from_json(s))
            return tally.result(RunKind(doc["kind"]), doc["run_id"], doc["bucket"], doc["prefix"], doc["started_at"],
                                doc.get("finished_at", ""), doc.get("settings") or {}, doc.get("usage") or {})
        if version == 2:  # outcomes by reason text: a text that is no cause's name reads back without one
            doc = {**doc, "schema_version": cls.SCHEMA_VERSION}
        check_document(doc, kind=None, version=cls.SCHEMA_VERSION, what="a run document", where=where)
        totals = dict(doc["totals"])
        before, after = int(totals.pop("bytes_before")), int(totals.pop("bytes_after"))
        totals.pop("segments")
        return cls(RunKind(doc["kind"]), str(doc["run_id"]), str(doc["bucket"]), str(doc["prefix"]),
                   str(doc["started_at"]), str(doc["finished_at"]), dict(doc.get("settings") or {}),
                   {k: int(v) for k, v in totals.items()}, before, after, ExitCode(doc["exit_code"]),
                   int(doc["hard_failures"]), int(doc["pending"]),
                   {t["topic"]: (int(t["compacted"]), int(t["bytes_before"]), int(t["bytes_after"]))
                    for t in doc["by_topic"]},
                   _outcomes_from_json(doc["outcomes"]),
                   tuple(SegmentResult.from_json(s) for s in doc["segments"]), int(doc["segments_omitted"]),
                   dict(doc.get("usage") or {}))


def topic_of(directory: str) -> str:
    return directory.rsplit("-", 1)[0]


class RunTally:
    """Folds a run's results, one at a time, into its :class:`RunResult`: memory for the listed segments
    and the counts, whatever the number of results."""

    def __init__(self, max_listed: int | None = None) -> None:
        self.max_listed = MAX_LISTED_SEGMENTS if max_listed is None else max_listed
        self.counts: Counter[str] = Counter()
        self.before = self.after = self.hard_failures = self.pending = self.omitted = 0
        self.codes: set[ExitCode] = set()
        self.topics: dict[str, list[int]] = {}
        self.outcomes: Counter[tuple[str, Status, Cause | None]] = Counter()
        self.problems: list[SegmentResult] = []  # failed or left to a later run: listed first
        self.others: list[SegmentResult] = []

    def add(self, r: SegmentResult) -> None:
        self.counts[str(r.status)] += 1
        self.codes.add(exit_code_of(r))
        topic = topic_of(r.directory)
        if r.status in DONE_STATUSES:
            self.before += r.bytes_before
            self.after += r.bytes_after
        if r.status is Status.COMPACTED:
            row = self.topics.setdefault(topic, [0, 0, 0])
            row[0] += 1
            row[1] += r.bytes_before
            row[2] += r.bytes_after
        else:
            self.outcomes[(topic, r.status, r.cause)] += 1
        problem = r.status is Status.FAILED or r.pending is not None
        self.hard_failures += r.status is Status.FAILED and r.pending is None
        self.pending += r.pending is not None
        kept = self.problems if problem else self.others
        if len(self.problems) + len(self.others) < self.max_listed:
            kept.append(r)
        elif problem and self.others:
            self.others.pop()  # a problem is listed in place of a segment that went well
            self.problems.append(r)
            self.omitted += 1
        else:
            self.omitted += 1

    def result(self, kind: RunKind, run_id: str, bucket: str, prefix: str, started_at: str, finished_at: str,
               settings: Mapping[str, object], usage: Mapping[str, object] | None = None) -> RunResult:
        listed = sorted(self.problems + self.others, key=lambda r: (r.directory, r.base_offset, not r.recovered))
        return RunResult(kind, run_id, bucket, prefix, started_at, finished_at, dict(settings), dict(self.counts),
                         self.before, self.after, worst(self.codes), self.hard_failures, self.pending,
                         {t: (n, b, a) for t, (n, b, a) in self.topics.items()}, dict(self.outcomes),
                         tuple(listed), self.omitted, dict(usage or {}))


@dataclass(frozen=True, slots=True)
class StepResults:
    """What one step of a run (a Spark unit, a commit task) did: its segments' results and the S3 requests it
    made, by partition. Stored at ``runs/<run>/stage/<unit>.json`` and ``runs/<run>/commit/<chunk>.json``."""

    KIND: ClassVar[str] = "tiering.step-results"
    SCHEMA_VERSION: ClassVar[int] = 1

    results: tuple[SegmentResult, ...]
    requests: dict[str, dict[str, int]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[str(r.status)] = out.get(str(r.status), 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND,
                "results": [r.to_json() for r in self.results], "usage": self.requests}

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str) -> StepResults:
        check_document(doc, kind=cls.KIND, version=cls.SCHEMA_VERSION, what="step results", where=where)
        return cls(tuple(SegmentResult.from_json(r) for r in doc["results"]),
                   {k: dict(v) for k, v in doc.get("usage", {}).items()})


@dataclass(frozen=True, slots=True)
class StepUsage:
    """The S3 requests a step made for the run outside any partition's work (``runs/<run>/usage/<step>.json``)."""

    KIND: ClassVar[str] = "tiering.step-usage"
    SCHEMA_VERSION: ClassVar[int] = 1

    requests: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND, "requests": self.requests}

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str) -> StepUsage:
        check_document(doc, kind=cls.KIND, version=cls.SCHEMA_VERSION, what="step usage", where=where)
        return cls({str(k): int(v) for k, v in doc["requests"].items()})


def exit_code_of(r: SegmentResult) -> ExitCode:
    """What one result says about the run's exit: a failed proof (our bug, or the store's), invalid or
    unreadable data (or data this version cannot handle), a refusal (access, configuration), S3 failing
    (retry), work left to a busy partition or a concurrent writer (run again later), else done."""
    if r.cause is Cause.UNSUPPORTED:
        return ExitCode.INVALID
    if r.status == Status.FAILED and r.pending is None:
        return (ExitCode.INTERNAL if r.cause is Cause.PROOF_FAILED else
                ExitCode.INVALID if r.cause in (Cause.INVALID, Cause.UNREADABLE) else ExitCode.USAGE)
    if r.pending is Pending.TRANSIENT:
        return ExitCode.RETRY
    if r.pending is Pending.BUSY:
        return ExitCode.BUSY
    return ExitCode.OK


def worst(codes: Iterable[ExitCode]) -> ExitCode:
    """The exit code that says the most, of several: in the order :func:`exit_code_of` lists them."""
    seen = set(codes)
    order = (ExitCode.INTERNAL, ExitCode.INVALID, ExitCode.USAGE, ExitCode.RETRY, ExitCode.BUSY)
    return next((c for c in order if c in seen), ExitCode.OK)


def outcome(results: Iterable[SegmentResult]) -> ExitCode:
    """The exit code of ``results`` (see :func:`exit_code_of`)."""
    return worst(exit_code_of(r) for r in results)


def run_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard, *, commit: bool = True) -> SegmentResult:
    """One planned segment: repair, or stage and (with ``commit``) swap; every per-segment problem becomes
    a result. Without ``commit`` the segment is left journalled as ``staged`` for a later commit step."""
    try:
        own = ctx.for_segment(seg)
    except ConfigError as e:  # e.g. a plan entry naming a codec this version does not know
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"not run: {e}", error=e.to_dict(),
                             cause=Cause.REFUSED)

    def attempt() -> SegmentResult:
        if seg.action == Action.REPAIR:
            return repair_segment(own, seg, lease)
        staged = stage_segment(own, seg, lease)
        if not isinstance(staged, Staged):
            if staged.cause in NOTHING_TO_GAIN:
                remember(own, seg, Outcome.NO_SAVINGS, staged.reason)
            return staged
        if not commit:
            return replace(staged.result, status=STAGED_STATUS)
        result = finish_one(own, staged.journal, staged.etag, lease, indexes=staged.indexes)
        return staged.result if result.status == staged.result.status else result

    return guarded(own, seg, attempt)


def guarded(ctx: Context, seg: PlannedSegment, attempt: Callable[[], SegmentResult]) -> SegmentResult:
    """``attempt`` (one segment's work), every per-segment problem turned into its result: a changed source,
    a failed proof, invalid or unreadable data, S3 failing, a refusal, a local error. A lost lease is raised
    (the partition's work stops)."""
    try:
        return attempt()
    except SourceChanged as e:  # a .log gone (retention) leaves nothing to do; any other change is left to a re-plan
        gone = isinstance(e, SourceGone)
        return SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, e.message, error=e.to_dict(),
                             pending=None if gone else Pending.BUSY, cause=Cause.ABANDONED if gone else Cause.BUSY)
    except ProofError as e:  # what we wrote or what S3 stored disagrees with the source: not the source's fault
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"proof failed, original untouched: {e}",
                             seg.size, error=e.to_dict(), cause=Cause.PROOF_FAILED)
    except InvalidDataError as e:
        return _judged_invalid(ctx, seg, e)
    except LeaseLost:
        raise
    except ChecksumMismatch as e:  # the store holds (or says it holds) other bytes than the proved ones
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"proof failed, original untouched: {e}",
                             seg.size, error=e.to_dict(), cause=Cause.PROOF_FAILED)
    except StorageError as e:
        if isinstance(e, EncryptedWithCustomerKey) or e.code == "InvalidObjectState":
            remember(ctx, seg, Outcome.UNREADABLE, str(e))  # this very object stays unreadable: do not retry it
            return replace(_failed(seg.directory, seg.base_offset, e, "unreadable, original untouched"),
                           cause=Cause.UNREADABLE)
        return _failed(seg.directory, seg.base_offset, e, "S3 error, original untouched")
    except ConfigError as e:  # e.g. a plan entry naming a codec this version does not know
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"not run: {e}", error=e.to_dict(),
                             cause=Cause.REFUSED)
    except OSError as e:  # this machine's side: a full disk or an unwritable --work-dir for the spool files
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"local error, original untouched: "
                             f"{e.strerror or e}", error={"error": type(e).__name__, "path": e.filename},
                             cause=Cause.LOCAL_ERROR)


def _failed(directory: str, base: int, e: TieringError, what: str) -> SegmentResult:
    return SegmentResult(directory, base, Status.FAILED, f"{what}: {e}", error=e.to_dict(),
                         pending=Pending.TRANSIENT if e.retryable else None,
                         cause=Cause.TRANSIENT if e.retryable else Cause.REFUSED)


def _judged_invalid(ctx: Context, seg: PlannedSegment, e: InvalidDataError) -> SegmentResult:
    """The source's bytes failed validation. Before the segment is called invalid (and remembered as such),
    a second download, checked against the ``.log``'s length and ETag, is validated again: bytes damaged on
    the way are a transport failure, never invalid data."""
    try:
        recheck_source(ctx, seg)
    except InvalidDataError as again:
        remember(ctx, seg, Outcome.INVALID, str(again))
        return SegmentResult(seg.directory, seg.base_offset, Status.FAILED,
                             f"invalid data, original untouched: {again}", seg.size, error=again.to_dict(),
                             cause=Cause.INVALID)
    except StorageError as check:
        return _failed(seg.directory, seg.base_offset, check, f"could not confirm that the data is invalid ({e})")
    return SegmentResult(seg.directory, seg.base_offset, Status.FAILED, "the first download was damaged on the way (a "
                         f"second one is valid; retryable), original untouched: {e}", error=e.to_dict(),
                         pending=Pending.TRANSIENT, cause=Cause.TRANSIENT)


def remember(ctx: Context, seg: PlannedSegment, outcome: Outcome, reason: str) -> None:
    """Note in the partition's state that this very ``.log`` (its ETag) gave nothing with this codec, level and
    re-batching bound,
    so that later scans do not read it again until the object or the target changes. Best effort: a failure
    here only means the next run reads the segment once more. An entry of a segment we compacted is kept."""
    if seg.log is None:
        return
    try:
        current = state_entry(ctx, seg.directory, seg.base_offset)
        if current is not None and current.compacted:
            return
        record_state(ctx, seg.directory, seg.base_offset, stamped(SegmentState(
            seg.log.etag, ctx.run_id, ctx.options.codec.label, ctx.options.level, outcome, reason[:300],
            rebatch_max_bytes=ctx.rebatch.max_bytes if ctx.rebatch is not None else None)))
    except TieringError:
        pass


Work = Callable[[Lease, list[SegmentResult]], None]


def with_lease(ctx: Context, directory: str, ttl: int, work: Work, todo: list[tuple[str, int]], *,
               keep: bool = False) -> list[SegmentResult]:
    """Run ``work`` under the partition's lease; it appends its results to the list it is given. Whatever
    stops it (the lease busy or lost, S3 failing, a journal it cannot read), the segments of ``todo`` it has
    not reported are reported with the reason, so the rest of the run goes on. ``keep``: the lease is not
    released at the end (a later step of the same run takes it back)."""
    lease = Lease(ctx.store, lease_key(ctx.prefix, directory), ctx.run_id, ttl)
    try:
        lease.acquire(ctx.prefix)
    except LeaseHeld as e:
        return [SegmentResult(d, b, Status.SKIPPED, f"partition busy: {e.message}", pending=Pending.BUSY,
                              cause=Cause.BUSY) for d, b in todo]
    except TieringError as e:
        return [_failed(d, b, e, "partition not touched") for d, b in todo]
    results: list[SegmentResult] = []

    stopped: TieringError | None = None
    try:
        work(lease, results)
    except TieringError as e:
        stopped = e
    except Exception:  # a bug: the partition is not left busy for the lease's TTL (a killed process is)
        lease.release()
        raise
    if not keep or stopped is not None:
        lease.release()
    if stopped is not None:
        seen = {(r.directory, r.base_offset) for r in results}
        for d, b in dict.fromkeys(todo):
            if (d, b) in seen:
                continue
            if isinstance(stopped, LeaseLost):
                results.append(SegmentResult(d, b, Status.SKIPPED, f"stopped: {stopped.message}", pending=Pending.BUSY,
                                             cause=Cause.BUSY))
            else:
                results.append(_failed(d, b, stopped, "stopped"))
    return results


def pending_bases(store: ObjectStore, prefix: str) -> dict[str, list[int]]:
    """The segments with a journal entry in flight, by partition directory (keys only: nothing is read)."""
    root = journal_dir(prefix)
    out: dict[str, list[int]] = {}
    for info in store.list(root):
        directory, _, name = info.key[len(root):].partition("/")
        parsed = parse_segment_name(name.removesuffix(".json") + ".log") if name.endswith(".json") else None
        if parsed is not None and "/" not in name:
            out.setdefault(directory, []).append(parsed[0])
    return out


def rollback(store: ObjectStore, ctx: Context, target_run: str, lease_ttl: int = DEFAULT_TTL_SECONDS) -> RunResult:
    """Put back the originals that run ``target_run`` replaced (wherever its ``.log`` is still in place)."""
    started = datetime.now(UTC).isoformat()
    tally = RunTally()
    root = reserved_dir(ctx.prefix, BACKUP_DIR, target_run)
    segments: dict[str, set[int]] = {}
    for info in store.list(root):
        directory, _, name = info.key[len(root):].partition("/")
        parsed = parse_segment_name(name)
        if parsed is not None:
            segments.setdefault(directory, set()).add(parsed[0])
    if not segments:
        raise ConfigError("no backups of that run: nothing to roll back (or its grace period is over)",
                          path=f"s3://{store.bucket}/{root}")
    for directory, bases in sorted(segments.items()):
        def work(lease: Lease, out: list[SegmentResult], directory: str = directory, bases: set[int] = bases) -> None:
            out += recover_partition(ctx, directory, lease)
            runs = load_state(store, ctx.prefix, directory).keys_runs
            if target_run in runs and runs[-1] != target_run:
                later = ", ".join(runs[runs.index(target_run) + 1:])
                out.extend(SegmentResult(directory, base, Status.FAILED,
                                         f"not rolled back: key-compaction run(s) {later} "
                                         "replaced segments here after it; roll those back first (this run's "
                                         "originals could bring back a value whose tombstone, or aborted data "
                                         "whose .txnindex entry, a later pass let go)", cause=Cause.LATER_RUN)
                           for base in sorted(bases))
                return
            restored = []
            for base in sorted(bases):
                staged = stage_rollback(ctx, directory, base, target_run)
                restored.append(staged if isinstance(staged, SegmentResult) else finish_one(ctx, *staged, lease))
            out.extend(restored)
            # Off the list once all of it is undone (a segment another run replaced since keeps this pass's
            # output), and the checkpoint cleared (records put back below it would be missed).
            if target_run in runs and all(r.status is Status.ROLLED_BACK for r in restored):
                forget_keys_run(store, ctx.prefix, directory, target_run)

        for result in with_lease(ctx, directory, lease_ttl, work, [(directory, b) for b in sorted(bases)]):
            tally.add(result)
    run = tally.result(RunKind.ROLLBACK, ctx.run_id, store.bucket, ctx.prefix, started, datetime.now(UTC).isoformat(),
                       {"restores_run": target_run})
    store.put_json(run_result_key(ctx.prefix, ctx.run_id, RunKind.ROLLBACK), run.to_json())
    return run


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """What a cleanup did: kept originals, staging objects and uploads removed, referenced ones kept, and the
    operations of crashed runs it finished first (or left pending)."""

    KIND: ClassVar[str] = "tiering.cleanup"
    SCHEMA_VERSION: ClassVar[int] = 1

    backups_deleted: int = 0
    backup_bytes_deleted: int = 0
    staging_deleted: int = 0
    uploads_aborted: int = 0
    kept_referenced: int = 0
    recovered: tuple[SegmentResult, ...] = ()

    @property
    def left_pending(self) -> tuple[SegmentResult, ...]:
        return tuple(r for r in self.recovered if r.pending is not None)

    def exit_code(self) -> ExitCode:
        return outcome(self.recovered)

    def summary(self) -> str:
        """One line for people."""
        left = len(self.left_pending)
        return (f"{self.backups_deleted:,} kept originals deleted ({self.backup_bytes_deleted:,} bytes), "
                f"{self.staging_deleted:,} staging objects deleted, {self.uploads_aborted:,} uploads aborted, "
                f"{self.kept_referenced:,} kept (still referenced), {len(self.recovered):,} interrupted operations "
                f"finished" + (f", {left:,} left to a later run" if left else ""))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND, "backups_deleted": self.backups_deleted,
                "backup_bytes_deleted": self.backup_bytes_deleted, "staging_deleted": self.staging_deleted,
                "uploads_aborted": self.uploads_aborted, "kept_referenced": self.kept_referenced,
                "recovered": [r.to_json() for r in self.recovered],
                "left_pending": [r.to_json() for r in self.left_pending]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> CleanupResult:
        check_document(doc, kind=cls.KIND, version=cls.SCHEMA_VERSION, what="a cleanup result", where=where)
        return cls(int(doc["backups_deleted"]), int(doc["backup_bytes_deleted"]), int(doc["staging_deleted"]),
                   int(doc["uploads_aborted"]), int(doc["kept_referenced"]),
                   tuple(SegmentResult.from_json(r) for r in doc["recovered"]))


def cleanup(store: ObjectStore, ctx: Context, *, grace_days: float = DEFAULT_GRACE_DAYS,
            stale_hours: float = DEFAULT_STALE_HOURS, lease_ttl: int = DEFAULT_TTL_SECONDS) -> CleanupResult:
    """Converge journal entries left by crashed runs, then delete kept originals past the grace period,
    abandoned staging objects, and incomplete multipart uploads; ages by S3's clock (LastModified)."""
    prefix = normalize_prefix(ctx.prefix)
    recovered: list[SegmentResult] = []
    counts: Counter[str] = Counter()
    for directory, bases in sorted(pending_bases(store, prefix).items()):
        def work(lease: Lease, done: list[SegmentResult], directory: str = directory) -> None:
            done += recover_partition(ctx, directory, lease)

        recovered += with_lease(ctx, directory, lease_ttl, work, [(directory, b) for b in bases])
    referenced: set[str] = set()
    for journal, _ in pending_journals(store, prefix):  # those still pending (their partition was busy)
        referenced.update(journal.new.present())
        referenced.update(v for v in (journal.backup or {}).values() if v)
        if journal.txn is not None:
            referenced.update(k for k in (journal.txn.new, journal.txn.backup) if k)
    now = store.now(clock_key(prefix))
    checked: bool | None = None  # whether the store's DeleteObjects checks each ETag (probed once, if needed)
    for sub, age in ((BACKUP_DIR, timedelta(days=grace_days)), (STAGING_DIR, timedelta(hours=stale_hours))):
        expired: dict[str, ObjectInfo] = {}
        for info in store.list(reserved_dir(prefix, sub)):
            if now - info.last_modified < age:
                continue
            if info.key in referenced:
                counts["kept_referenced"] += 1
                continue
            expired[info.key] = info
        if expired and checked is None:
            checked = delete_honours_etag(store, probe_key(prefix, ctx.run_id, secrets.token_hex(4), "delete-etag"))
        if expired and not checked:  # the store would delete a key rewritten since the listing: look again first
            expired = {key: info for key, info in expired.items() if _still(store, info)}
        deleted = store.delete_many([(info.key, info.etag) for info in expired.values()])
        if sub == BACKUP_DIR:
            counts["backups_deleted"] += len(deleted)
            counts["backup_bytes_deleted"] += sum(expired[key].size for key in deleted)
        else:
            counts["staging_deleted"] += len(deleted)
    for key, upload_id, initiated in store.list_uploads(reserved_dir(prefix)):
        if now - initiated > timedelta(hours=stale_hours):
            store.abort_upload(key, upload_id)
            counts["uploads_aborted"] += 1
    return CleanupResult(counts["backups_deleted"], counts["backup_bytes_deleted"], counts["staging_deleted"],
                         counts["uploads_aborted"], counts["kept_referenced"], tuple(recovered))


def _still(store: ObjectStore, info: ObjectInfo) -> bool:
    """Whether ``info``'s object is still the version listed (a HEAD)."""
    try:
        return store.head(info.key).etag == info.etag
    except ObjectNotFound:
        return False


__all__ = ["JOURNAL_DIR", "CompactOptions", "RunResult", "cleanup", "new_run_id", "rollback"]
