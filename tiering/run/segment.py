"""What runs are made of: one segment's work turned into a result, a partition's work under its lease, the
operations crashed runs left in flight found and finished, work cut into balanced parts.

The per-segment protocol lives in :mod:`tiering.commit`; runs are driven by the engine
(:mod:`tiering.run.engine`). Every per-segment problem
becomes a result, never a crash of the whole run."""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import replace
from typing import TypeVar

from tiering.commit.finish import finish
from tiering.commit.lease import Lease, LeaseGuard, LeaseHeld, LeaseLost
from tiering.commit.operation import (
    Context,
    SegmentResult,
    SourceChanged,
    SourceGone,
    Staged,
    record_state,
    state_entry,
)
from tiering.commit.recover import recover_partition, repair_segment
from tiering.commit.stage import recheck_source, stage_segment
from tiering.errors import ConfigError, InvalidDataError, ProofError, StorageError, TieringError
from tiering.kafka.files import parse_segment_name
from tiering.lifecycle.state import Outcome, SegmentState, stamped
from tiering.lifecycle.vocabulary import NOTHING_TO_GAIN, Action, Cause, Pending, Status
from tiering.plan.document import PlannedSegment
from tiering.storage.layout import (
    journal_dir,
    lease_key,
)
from tiering.storage.objects import (
    ChecksumMismatch,
    EncryptedWithCustomerKey,
    ObjectStore,
)


def run_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard) -> SegmentResult:
    """One planned segment: repair, or stage and swap; every per-segment problem becomes a result."""
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
        [result] = finish(own, staged.journal, staged.etag, lease, indexes=staged.indexes)
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
            seg.log.etag, ctx.run_id, ctx.options.codec.label if ctx.options is not None else None,
            ctx.options.level if ctx.options is not None else None, outcome, reason[:300],
            rebatch_max_bytes=ctx.rebatch.max_bytes if ctx.rebatch is not None else None)))
    except TieringError:
        pass


Work = Callable[[Lease, list[SegmentResult]], None]


def with_lease(ctx: Context, directory: str, ttl: int, work: Work, todo: list[tuple[str, int]]
               ) -> list[SegmentResult]:
    """Run ``work`` under the partition's lease; it appends its results to the list it is given. Whatever
    stops it (the lease busy or lost, S3 failing, a journal it cannot read), the segments of ``todo`` it has
    not reported are reported with the reason, so the rest of the run goes on. The lease is released on
    every way out but a killed process."""
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


def stale_after_recovery(ctx: Context, segments: Sequence[PlannedSegment], lease: LeaseGuard,
                         report: Callable[[SegmentResult], None], what: str) -> bool:
    """Finish (or abandon) the partition's journals left in flight, reporting each; when there were any,
    the listing predates what they changed: every listed segment is reported not done (``what``: the work
    it was listed for, "cleaned" or "merged") and True comes back."""
    recovered = recover_partition(ctx, segments[0].directory, lease)
    for r in recovered:
        report(r)
    if not recovered:
        return False
    for seg in segments:
        report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, f"not {what}: another run's operation "
                             "was finished here after the listing; run again", pending=Pending.BUSY, cause=Cause.BUSY))
    return True


def pending_bases(store: ObjectStore, prefix: str, directory: str | None = None) -> dict[str, list[int]]:
    """The segments with a journal entry in flight, by partition directory (of ``directory`` alone, if given;
    keys only: nothing is read)."""
    root = journal_dir(prefix)
    out: dict[str, list[int]] = {}
    for info in store.list(journal_dir(prefix, directory)):
        directory, _, name = info.key[len(root):].partition("/")
        parsed = parse_segment_name(name.removesuffix(".json") + ".log") if name.endswith(".json") else None
        if parsed is not None and "/" not in name:
            out.setdefault(directory, []).append(parsed[0])
    return out


def recover_pending(ctx: Context, lease_ttl: int, progress: Callable[[SegmentResult], None] | None = None, *,
                    elsewhere: Container[str] = ()) -> list[SegmentResult]:
    """Every operation a crashed run left in flight under ``ctx.prefix`` finished (or abandoned), each
    partition under its lease, but in the partitions of ``elsewhere``; their results."""
    recovered: list[SegmentResult] = []
    for directory, bases in sorted(pending_bases(ctx.store, ctx.prefix).items()):
        if directory in elsewhere:
            continue
        def recover(lease: Lease, out: list[SegmentResult], directory: str = directory) -> None:
            out += recover_partition(ctx, directory, lease)

        for r in with_lease(ctx, directory, lease_ttl, recover, [(directory, b) for b in bases]):
            recovered.append(r)
            if progress is not None:
                progress(r)
    return recovered


T = TypeVar("T")


def balanced(items: Sequence[T], parts: int, weight: Callable[[T], int]) -> list[list[T]]:
    """``items`` cut into at most ``parts`` lists of about equal ``weight``, the heaviest placed first; empty
    lists left out."""
    loads = [0] * max(1, min(len(items), parts))
    out: list[list[T]] = [[] for _ in loads]
    for item in sorted(items, key=lambda i: -weight(i)):
        at = loads.index(min(loads))
        out[at].append(item)
        loads[at] += weight(item)
    return [group for group in out if group]
