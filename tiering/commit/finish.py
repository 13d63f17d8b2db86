"""The commit state machine's one entry point: an operation finished, or given up, from its journal entry.

Every operation, whatever its kind, is staged into one journal shape (:class:`~tiering.lifecycle.journal.Journal`)
and then taken from wherever its state and the objects in place say it stands to its end by :func:`finish`:
a run finishing what it just staged, a run finishing what a crashed one left in flight, a rollback. The
entry's kind says how its targets go in: one segment over another at the same keys
(:mod:`tiering.commit.swap`: the ``.log`` overwritten ``If-Match``, its indexes beside it), or neighbours
replaced by others through ``.swap`` files that a broker restoring the bucket reads as one range
(:mod:`tiering.commit.regroup`). Both write the entry with the same steps (:mod:`tiering.commit.entry`:
advance, back up, forget), raise what stops them, and leave the rest to this module, the same for both
(docs/commit-protocol.md, "The journal entry", has the table):

- a source that changed or vanished before the targets went in: the operation is abandoned
  (:func:`abandon`); so is one whose copy to put in place is gone, which for a rollback (its copies are
  the backups) is a backup missing;
- a copy to put in place that does not verify: dropped with the operation while nothing final has changed,
  else the operation is left in flight; either way the run reports the failed proof;
- another run took the operation over: this one stops, touching nothing more;
- S3 failing, or any other error: left in flight, its journal saying where, for a later run;
- a lost lease stops the partition (raised).

Results come back for every segment the operation touches.
"""

from __future__ import annotations

from tiering.commit import regroup, swap
from tiering.commit.entry import Standing, forget, rewrite
from tiering.commit.lease import LeaseGuard, LeaseLost
from tiering.commit.operation import (
    Context,
    CopyGone,
    SegmentResult,
    SourceChanged,
    SourceGone,
    TakenOver,
    operation_results,
)
from tiering.errors import InvalidDataError, ProofError, TieringError
from tiering.kafka.index import Indexes
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.vocabulary import Cause, JournalState, Pending, Status


def finish(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard, *, indexes: Indexes | None = None,
           taken_from: str | None = None) -> list[SegmentResult]:
    """Roll ``journal`` (last written with ``etag``) forward from wherever it stands, or abandon it where its
    sources changed before anything final did. ``indexes``: an operation in place's new indexes, when the
    caller staged them (else read from staging); ``taken_from``: the run whose staged operation this run
    took over."""
    at = Standing(journal, etag)
    try:
        try:
            if at.journal.in_place:
                return swap.roll_forward(ctx, at, lease, indexes)
            return regroup.roll_forward(ctx, at, lease)
        except CopyGone as e:
            return _copy_gone(ctx, at, e)
        except SourceChanged as e:
            return abandon(ctx, at.journal, at.etag, e.message,
                           pending=None if isinstance(e, SourceGone) else Pending.BUSY)
        except (ProofError, InvalidDataError) as e:
            return _unverified(ctx, at, e, taken_from)
    except LeaseLost:
        raise
    except TakenOver as e:
        return operation_results(at.journal, Status.ABORTED, e.message, pending=Pending.BUSY, cause=Cause.BUSY)
    except TieringError as e:
        # An error while giving the operation up after another one: both are said.
        after = f" (while giving it up after: {e.__context__})" if isinstance(e.__context__, TieringError) else ""
        return operation_results(at.journal, Status.FAILED, f"left in flight ({at.journal.state}): {e}{after}",
                                 error=e.to_dict(), pending=Pending.TRANSIENT if e.retryable else None,
                                 cause=Cause.TRANSIENT if e.retryable else Cause.REFUSED)


def abandon(ctx: Context, journal: Journal, etag: str, reason: str,
            pending: Pending | None = Pending.BUSY) -> list[SegmentResult]:
    """Give ``journal`` up before anything final changed: the entry written again first (so that a run that
    took the operation over stops this one here), whatever the operation put in place removed (only its
    own objects), then the entry and its staging dropped; the backups stay. ``pending`` says whether a
    later run should try again."""
    try:
        etag = rewrite(ctx, journal, etag)
        if journal.in_place:
            swap.take_out(ctx, journal)
        else:
            regroup.take_out(ctx, journal)
        forget(ctx, journal, etag)
    except TakenOver as e:
        return operation_results(journal, Status.ABORTED, e.message, pending=Pending.BUSY, cause=Cause.BUSY)
    return operation_results(journal, Status.ABORTED, reason, pending=pending,
                             cause=Cause.BUSY if pending is Pending.BUSY else Cause.ABANDONED)


def _nothing_final(journal: Journal) -> bool:
    """Whether giving the operation up leaves every segment as it was: through ``.swap`` files nothing final
    goes in before the entry says ``swapped``; in place the original indexes go once it says ``backed-up``."""
    if journal.in_place:
        return journal.state is JournalState.STAGED
    return journal.state is not JournalState.SWAPPED


def _dropped(ctx: Context, at: Standing) -> list[SegmentResult] | None:
    """The operation abandoned for good (nothing pending), the caller then saying why; None once dropped, or
    the results that say another run took the entry over in between (left to it)."""
    dropped = abandon(ctx, at.journal, at.etag, "", pending=None)
    return dropped if any(r.pending is not None for r in dropped) else None


def _copy_gone(ctx: Context, at: Standing, e: CopyGone) -> list[SegmentResult]:
    """The copy to put in place is gone before anything final changed: the operation is abandoned. A staged
    copy is made anew by a later run; a rollback's copies are the run's backups, so what it would restore is
    missing."""
    journal = at.journal
    if journal.staging():
        return abandon(ctx, journal, at.etag, f"{e.message}: abandoned, made anew by a later run")
    if (taken := _dropped(ctx, at)) is not None:
        return taken
    return operation_results(journal, Status.FAILED, f"not restored, its backup is gone: {e}", error=e.to_dict(),
                             cause=Cause.BACKUP_MISSING)


def _unverified(ctx: Context, at: Standing, e: TieringError, taken_from: str | None) -> list[SegmentResult]:
    """A copy to put in place (staged, or a rollback's backup) that does not verify. While nothing final has
    changed the operation is dropped, so that it is made anew instead of every later run meeting the same
    bad copy; after that it stays in flight."""
    journal = at.journal
    if not _nothing_final(journal):
        return operation_results(journal, Status.FAILED, f"proof failed, left in flight: {e}",
                                 error=e.to_dict(), cause=Cause.PROOF_FAILED)
    if (taken := _dropped(ctx, at)) is not None:
        return taken
    if taken_from is not None:  # another run's copy: this run makes it anew
        return operation_results(journal, Status.ABORTED, f"the copy run {taken_from} staged does not verify, "
                                 f"dropped; the segment is compacted anew: {e}", error=e.to_dict(),
                                 run_id=taken_from, cause=Cause.ABANDONED)
    return operation_results(journal, Status.FAILED, "proof failed, the operation dropped before anything final "
                             f"changed: {e}", error=e.to_dict(), cause=Cause.PROOF_FAILED)
