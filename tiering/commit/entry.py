"""The steps every operation takes on its journal entry, whatever it replaces (one segment by another in
place, :mod:`tiering.commit.swap`; neighbours by others holding the same batches, :mod:`tiering.commit.regroup`):
written again over the version last written (``If-Match``, so that a run that took the operation over stops
the one it took it from), the originals backed up, and the entry forgotten (then its staging objects).
"""

from __future__ import annotations

from dataclasses import dataclass

from tiering.commit.operation import Context, SourceChanged, TakenOver, uri
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.vocabulary import JournalState
from tiering.storage.layout import journal_key
from tiering.storage.objects import ObjectNotFound, PreconditionFailed

TAKEN_OVER = "another run took this operation over while it was stalled (its lease had expired): left to that run"


@dataclass(slots=True)
class Standing:
    """Where an operation stands while the state machine moves it on: its journal entry as last written and
    the ETag it was written with. Each step that writes the entry replaces both, so that whatever stops the
    operation is judged on the state it really reached."""

    journal: Journal
    etag: str


def _key(ctx: Context, journal: Journal) -> str:
    return journal_key(ctx.prefix, journal.directory, journal.base_offset)


def rewrite(ctx: Context, journal: Journal, etag: str) -> str:
    """``journal`` written over the version we last wrote (``etag``): its new ETag; :class:`TakenOver` when
    another run wrote it since (or forgot it)."""
    key = _key(ctx, journal)
    try:
        return ctx.store.put_json(key, journal.to_json(), if_match=etag)
    except (PreconditionFailed, ObjectNotFound):
        raise TakenOver(TAKEN_OVER, path=uri(ctx.store, key)) from None


def advance(ctx: Context, journal: Journal, etag: str, state: JournalState) -> tuple[Journal, str]:
    """The journal entry in its next state, written over the one we last wrote (:func:`rewrite`)."""
    advanced = journal.advanced(state)
    return advanced, rewrite(ctx, advanced, etag)


def back_up(ctx: Context, journal: Journal) -> None:
    """Server-side copies of the originals the operation replaces (:meth:`Journal.backups`). moto ignores a
    copy's source condition, so each original is looked at again after its copy: one that changed meanwhile
    stops the operation (:class:`SourceChanged`) before anything final is replaced."""
    store = ctx.store
    for c in journal.backups():
        try:
            attrs = c.attrs if c.attrs is not None else store.describe(c.final)[1]
            store.copy(c.final, c.target, source_etag=c.etag, attrs=attrs)
            copied = store.head(c.target).size if c.size is not None else None
            after = store.head(c.final)
        except (PreconditionFailed, ObjectNotFound):
            raise SourceChanged(f"{c.what} changed while it was backed up", path=uri(store, c.final)) from None
        if after.etag != c.etag or copied != c.size:
            raise SourceChanged(f"{c.what} changed while it was backed up", path=uri(store, c.final),
                                expected=c.etag, found=after.etag)


def backed_up(ctx: Context, journal: Journal, etag: str) -> tuple[Journal, str]:
    """Step 2 for an entry still ``staged``: its sources copied to their backups (:func:`back_up`), then the
    entry advanced to ``backed-up``; an entry past it is returned as it is."""
    if journal.state is not JournalState.STAGED:
        return journal, etag
    back_up(ctx, journal)
    return advance(ctx, journal, etag, JournalState.BACKED_UP)


def forget(ctx: Context, journal: Journal, etag: str) -> None:
    """Delete a finished (or given up) operation's journal entry, then its staging objects: a crash in between
    leaves only staging objects that no journal names (cleanup removes them), never a journal whose staged
    copy is gone. :class:`TakenOver` if the entry is no longer the one we wrote (nothing is deleted then)."""
    key = _key(ctx, journal)
    try:
        ctx.store.delete(key, if_match=etag, missing_ok=True)
    except PreconditionFailed:
        raise TakenOver(TAKEN_OVER, path=uri(ctx.store, key)) from None
    for staged in journal.staging():
        ctx.store.delete(staged, missing_ok=True)
