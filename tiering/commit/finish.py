"""The commit state machine's one entry point: an operation finished, or given up, from its journal entry.

Every operation, whatever its kind, is staged into one journal shape (:class:`~tiering.lifecycle.journal.Journal`)
and then taken from wherever its state and the objects in place say it stands to its end by :func:`finish`:
a run finishing what it just staged, a run finishing what a crashed one left in flight, a rollback. The
entry's kind says how its targets go in: one segment over another at the same keys
(:mod:`tiering.commit.swap`: the ``.log`` overwritten ``If-Match``, its indexes beside it), or neighbours
replaced by others through ``.swap`` files that a broker restoring the bucket reads as one range
(:mod:`tiering.commit.regroup`). Both write the entry with the same steps (:mod:`tiering.commit.entry`:
advance, back up, forget). Results come back for every segment the operation touches; only a lost lease
is raised.
"""

from __future__ import annotations

from tiering.commit.lease import LeaseGuard
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.regroup import abandon_regroup, finish_regroup
from tiering.commit.swap import abandon_in_place, finish_one
from tiering.kafka.index import Indexes
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.vocabulary import Pending


def finish(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard, *, indexes: Indexes | None = None,
           taken_from: str | None = None) -> list[SegmentResult]:
    """Roll ``journal`` (last written with ``etag``) forward from wherever it stands, or abandon it where its
    sources changed before anything final did. ``indexes``: an operation in place's new indexes, when the
    caller staged them (else read from staging); ``taken_from``: the run whose staged operation this run
    took over."""
    if journal.in_place:
        return [finish_one(ctx, journal, etag, lease, taken_from=taken_from, indexes=indexes)]
    return finish_regroup(ctx, journal, etag, lease)


def abandon(ctx: Context, journal: Journal, etag: str, reason: str,
            pending: Pending | None = Pending.BUSY) -> list[SegmentResult]:
    """Give ``journal`` up before its swap: whatever it put in place removed (only its own objects), its
    staging and entry dropped, the backups kept; ``pending`` says whether a later run should try again."""
    if journal.in_place:
        return [abandon_in_place(ctx, journal, etag, reason, pending=pending)]
    return abandon_regroup(ctx, journal, etag, reason, pending=pending)
