"""Steps 2-4 of the commit protocol for an operation in place (one segment replaced by one at the same keys):
back up, swap, put the indexes, record, forget.

The machine's strategy for one segment over another (:mod:`tiering.commit.finish` is the way in):
:func:`roll_forward` takes a journal entry in any state and rolls it forward from wherever it is: it looks at
the final ``.log`` first (the planned original, ours, gone, or someone else's), so the same code finishes a
segment this run just staged, one a crashed run left behind and a rollback. A source that changed is raised,
and the operation abandoned by the entry point; :func:`take_out` is what abandoning it removes here: the
indexes this operation had put beside a ``.log`` that is not ours, and a ``.txnindex`` it swapped first.
"""

from __future__ import annotations

import contextlib
import secrets
from dataclasses import dataclass
from typing import BinaryIO, Final

from tiering.commit.entry import TAKEN_OVER, Standing, backed_up, forget
from tiering.commit.lease import LeaseGuard
from tiering.commit.operation import (
    META_OP,
    Context,
    CopyGone,
    SegmentResult,
    SourceChanged,
    SourceGone,
    TakenOver,
    kms,
    record_state,
    uri,
)
from tiering.commit.verify import copy_source, download_verified
from tiering.kafka.index import Indexes
from tiering.kafka.rewrite import read_back
from tiering.lifecycle.journal import INDEX_FILES, Journal
from tiering.lifecycle.vocabulary import Cause, FileRole, OpKind, Pending, Status, Swap
from tiering.storage.layout import (
    journal_key,
    probe_key,
)
from tiering.storage.objects import (
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    copy_honours_if_match,
)

REPLACE_ATTEMPTS: Final = 3  # another writer's index beside our .log: deleted and ours put, at most this often


def swap_mode(ctx: Context) -> Swap:
    """The run's :class:`Swap`: as given, else learnt from the store once (:func:`copy_honours_if_match`)."""
    with ctx.swap.lock:
        if ctx.swap.mode is None:
            honoured = copy_honours_if_match(ctx.store, probe_key(ctx.prefix, ctx.run_id, secrets.token_hex(4)))
            ctx.swap.mode = Swap.COPY if honoured else Swap.PUT
        return ctx.swap.mode


def _exists(ctx: Context, key: str) -> bool:
    try:
        ctx.store.head(key)
    except ObjectNotFound:
        return False
    return True


def roll_forward(ctx: Context, at: Standing, lease: LeaseGuard, indexes: Indexes | None = None
                 ) -> list[SegmentResult]:
    """Steps 2-4 (or the rest of them, after a crash) for the entry ``at`` stands at: idempotent, and safe to
    call with any entry. ``indexes``: the staged indexes' bytes, when the caller staged them (else they are
    read from staging). What stops the operation is raised for :func:`tiering.commit.finish.finish`.

    The final ``.log`` decides where the operation stands: gone (retention) or another writer's, the
    sources changed (:class:`SourceGone`, :class:`SourceChanged`); the planned original, the new ``.log``
    is swapped in (:func:`_swap_log`); ours already (a crash after the swap), the swap is done. Then the
    indexes, the state and the journal (:func:`_complete`)."""
    journal = at.journal
    try:
        current, _ = ctx.store.describe(journal.final(FileRole.LOG))
    except ObjectNotFound:
        raise SourceGone("the .log disappeared (deleted by retention?): nothing to replace",
                         path=uri(ctx.store, journal.final(FileRole.LOG))) from None
    if current.metadata.get(META_OP) == journal.op:
        return [_complete(ctx, at, current.etag, indexes)]
    if current.etag != journal.source_etag(FileRole.LOG):
        raise SourceChanged("the .log changed after planning: the new object is left untouched",
                            path=uri(ctx.store, journal.final(FileRole.LOG)),
                            expected=journal.source_etag(FileRole.LOG), found=current.etag)
    return [_complete(ctx, at, _swap_log(ctx, at, lease), indexes)]


def _swap_log(ctx: Context, at: Standing, lease: LeaseGuard) -> str:
    """Steps 2 and 3, with the original ``.log`` still in place: the copy to put in place verified, the
    originals backed up (state ``backed-up``), a ``.txnindex`` that goes first swapped, the old indexes
    deleted (``If-Match``), the new ``.log`` put over the original (``If-Match`` its ETag): the ETag of the
    ``.log`` now in place."""
    spool: BinaryIO | None = None
    try:
        staged, spool = _copy_to_put(ctx, at.journal)
        at.journal, at.etag = backed_up(ctx, at.journal, at.etag)
        lease.check()
        if at.journal.txn_first:
            _swap_txn_index(ctx, at.journal)
        _delete_old_indexes(ctx, at.journal, at.etag)
        lease.check()
        return _put_log(ctx, at.journal, staged, spool)
    finally:
        if spool is not None:
            spool.close()


def _copy_to_put(ctx: Context, journal: Journal) -> tuple[str | None, BinaryIO | None]:
    """The new ``.log``, verified, as the run's :class:`Swap` puts it: the ETag a server-side copy is held
    to, or a spool file holding its bytes for a PUT."""
    try:
        if swap_mode(ctx) is Swap.COPY:
            return copy_source(ctx, journal), None
        return None, download_verified(ctx, journal)
    except ObjectNotFound:
        raise CopyGone("the copy to put in place is gone", path=uri(ctx.store, str(journal.targets[0].log.copy))
                       ) from None


def _attrs(journal: Journal, name: FileRole) -> ObjectAttrs:
    """What the target file ``name`` gets in place."""
    f = journal.target(name)
    return f.attrs if f is not None and f.attrs is not None else ObjectAttrs()


def _delete_old_indexes(ctx: Context, journal: Journal, etag: str) -> None:
    """The original indexes go before the ``.log`` is replaced (``If-Match``: a changed one stops the swap), so
    that no index is ever beside a ``.log`` it was not made for."""
    for name in INDEX_FILES:
        if (source := journal.source(name)) is not None and source.etag:
            try:
                ctx.store.delete(source.final, if_match=source.etag, missing_ok=True)
            except PreconditionFailed:
                _still_ours(ctx, journal, etag)
                raise SourceChanged(f"the .{name} changed after planning", path=uri(ctx.store, source.final),
                                    expected=source.etag) from None


def _put_log(ctx: Context, journal: Journal, staged: str | None, spool: BinaryIO | None) -> str:
    """Put the new ``.log`` over the original (``If-Match`` the planned ETag): a server-side copy of the
    staged version ``staged``, else a PUT of ``spool``. The ETag now in place; :class:`SourceChanged` when
    another writer's object is there."""
    store, new = ctx.store, journal.targets[0].log
    key, planned = journal.final(FileRole.LOG), journal.source_etag(FileRole.LOG)
    try:
        if staged is not None:
            assert new.copy is not None
            return store.copy_over(new.copy, key, source_etag=staged, if_match=str(planned),
                                   attrs=_attrs(journal, FileRole.LOG), size=new.bytes).etag
        assert spool is not None
        spool.seek(0)
        return store.put_object(key, spool, _attrs(journal, FileRole.LOG), if_match=planned).etag
    except ObjectNotFound:
        if staged is not None and _exists(ctx, key):
            raise CopyGone("the copy to put in place is gone", path=uri(store, str(new.copy))) from None
        raise SourceGone("the .log disappeared (deleted by retention?) before the swap",
                         path=uri(store, key)) from None
    except PreconditionFailed:
        # Either someone replaced the .log (or the staged copy), or this write happened and only its answer
        # was lost (the retry then fails its own condition): our op id on the object tells.
        try:
            current, _ = store.describe(key)
        except ObjectNotFound:
            raise SourceGone("the .log disappeared (deleted by retention?) before the swap",
                             path=uri(store, key)) from None
        if current.metadata.get(META_OP) != journal.op:
            raise SourceChanged("the .log changed after planning: the new object is left untouched",
                                path=uri(store, key)) from None
        return current.etag


def _complete(ctx: Context, at: Standing, log_etag: str, indexes: Indexes | None) -> SegmentResult:
    """Step 4, with the new ``.log`` in place (maybe by a run that crashed): a ``.txnindex`` that goes after
    it, the new indexes where none is (another writer's index is never overwritten), a check that the
    ``.log`` is still ours, then the segment recorded in the partition's state and the journal forgotten.
    Another writer's objects found on the way leave the segment to them (:func:`_superseded`)."""
    journal, etag = at.journal, at.etag
    indexes_put: dict[FileRole, str] = {}
    superseded = ""
    if journal.txn_swapped and not journal.txn_first:
        try:
            _swap_txn_index(ctx, journal)
        except SourceChanged as e:
            superseded = e.message
    for name in INDEX_FILES:
        if journal.target(name) is not None and not superseded:
            put = _put_index_beside_ours(ctx, journal, name, indexes)
            if put is None and _log_is_ours(ctx, journal):  # still a foreign index beside our .log: the journal
                # stays, so the next run that covers the partition tries again
                return SegmentResult(journal.directory, journal.base_offset, Status.FAILED,
                                     f"another writer keeps putting a .{name} beside our .log: left in flight for "
                                     "the next run", run_id=journal.run_id, pending=Pending.TRANSIENT,
                                     cause=Cause.BUSY)
            if put is None:
                superseded = f"another writer put a .{name} beside our .log after the swap"
            else:
                indexes_put[name] = put
    if not superseded and not _log_is_ours(ctx, journal):
        superseded = "another writer replaced the .log after our swap"
    if superseded:
        return _superseded(ctx, journal, etag, indexes_put, superseded)

    def forgotten() -> None:
        with contextlib.suppress(TakenOver):  # done all the same: the run that took the entry over forgets it
            forget(ctx, journal, etag)

    compacted = journal.kind is OpKind.COMPACT
    etags = (log_etag, indexes_put.get(FileRole.INDEX), indexes_put.get(FileRole.TIMEINDEX))
    record_state(ctx, journal.directory, journal.base_offset,
                 journal.entry.done(*etags) if compacted else journal.entry.restored(journal.base_offset, *etags),
                 then=forgotten)
    return SegmentResult(journal.directory, journal.base_offset, Status.COMPACTED if compacted else
                         Status.ROLLED_BACK, "", journal.entry.bytes_before, journal.entry.bytes_after,
                         run_id=journal.run_id, encryption=kms(_attrs(journal, FileRole.LOG).headers))


def _put_index_beside_ours(ctx: Context, journal: Journal, name: FileRole, indexes: Indexes | None) -> str | None:
    """:func:`_put_index`, and while another writer's index sits beside our ``.log``, that one replaced by ours
    (:func:`_replace_foreign_index`, at most :data:`REPLACE_ATTEMPTS` times). The ETag put, or None."""
    put = _put_index(ctx, journal, name, indexes)
    for _ in range(REPLACE_ATTEMPTS):
        if put is not None or not _log_is_ours(ctx, journal):
            break
        put = _replace_foreign_index(ctx, journal, name, indexes)
    return put


def _log_is_ours(ctx: Context, journal: Journal) -> bool:
    try:
        return ctx.store.head(journal.final(FileRole.LOG)).metadata.get(META_OP) == journal.op
    except ObjectNotFound:
        return False


def _replace_foreign_index(ctx: Context, journal: Journal, name: FileRole, indexes: Indexes | None) -> str | None:
    """Another writer's index sits beside OUR ``.log`` (e.g. a mirror re-uploading a byte-identical original:
    its ``.log`` kept the planned ETag, so our swap went through, and its index arrived after our delete).
    It cannot be valid for our bytes, and a broker trusts a present index: delete it (``If-Match`` the ETag
    seen; the original is in the backup) and put ours. None if yet another index arrives meanwhile."""
    key = journal.final(name)
    try:
        there = ctx.store.head(key)
        ctx.store.delete(key, if_match=there.etag, missing_ok=True)
    except (ObjectNotFound, PreconditionFailed):
        pass  # gone already, or replaced again: the put below decides
    return _put_index(ctx, journal, name, indexes)


def _still_ours(ctx: Context, journal: Journal, etag: str) -> None:
    """:class:`TakenOver` unless the journal entry is still the one we last wrote."""
    key = journal_key(ctx.prefix, journal.directory, journal.base_offset)
    try:
        _, there = ctx.store.get_json(key)
    except ObjectNotFound:
        there = None
    if there != etag:
        raise TakenOver(TAKEN_OVER, path=uri(ctx.store, key))


def _superseded(ctx: Context, journal: Journal, etag: str, ours: dict[FileRole, str], why: str) -> SegmentResult:
    """Another writer replaced the segment after our ``.log`` swap: remove the indexes we put (``ours``: their
    ETags by file name; ``If-Match``: only ours; a broker rebuilds a missing index, but would trust ours
    beside a ``.log`` they do not belong to), leave every object of the other writer as it is, and forget the
    operation. The originals stay in the backup for the grace period."""
    for name, put in ours.items():
        with contextlib.suppress(PreconditionFailed):  # replaced by the other writer already: theirs
            ctx.store.delete(journal.final(name), if_match=put, missing_ok=True)
    with contextlib.suppress(TakenOver):
        forget(ctx, journal, etag)
    return SegmentResult(journal.directory, journal.base_offset, Status.SUPERSEDED,
                         f"{why}: its objects are left as they are", run_id=journal.run_id, pending=Pending.BUSY,
                         cause=Cause.REPLACED)


def _put_index(ctx: Context, journal: Journal, name: FileRole, indexes: Indexes | None = None) -> str | None:
    """Put one new index in place where no index is (``If-None-Match``: the old one was deleted before the
    swap) unless a crashed run of this operation already did; its ETag. None when another writer's index
    is there: it is left alone."""
    store, op, key = ctx.store, journal.op, journal.final(name)
    try:
        there = store.head(key)
        return there.etag if there.metadata.get(META_OP) == op else None
    except ObjectNotFound:
        pass
    target = journal.target(name)
    assert target is not None
    assert target.copy is not None
    staged = target.copy
    try:
        if indexes is not None:
            data = indexes.offset_index if name == FileRole.INDEX else indexes.time_index
        else:
            data = store.get(staged)
    except ObjectNotFound:  # only if the staging copy went first: rebuild from the .log in place
        with store.open(journal.final(FileRole.LOG)) as body:
            rebuilt = read_back(body, base_offset=journal.base_offset, path=uri(store, journal.final(FileRole.LOG)),
                                index_interval_bytes=ctx.index_interval_bytes,
                                decompression_limit=ctx.decompression_limit).indexes
        data = rebuilt.offset_index if name == FileRole.INDEX else rebuilt.time_index
    try:
        return store.put_object(key, data, _attrs(journal, name), if_none_match=True).etag
    except PreconditionFailed:
        # Another writer's index, or this very PUT whose answer was lost (the retry then fails its own
        # condition): our op id tells them apart.
        there = store.head(key)
        return there.etag if there.metadata.get(META_OP) == op else None


@dataclass(frozen=True, slots=True)
class _Txn:
    """The ``.txnindex`` an operation in place replaces: its final key, the ETag replaced (None: there was
    none), the object holding its replacement (None: it is removed), its backup, and the replacement's
    attributes."""

    final: str
    source: str | None
    new: str | None
    backup: str | None
    attrs: ObjectAttrs


def _txn(journal: Journal) -> _Txn:
    source, target = journal.source(FileRole.TXNINDEX), journal.target(FileRole.TXNINDEX)
    return _Txn(journal.final(FileRole.TXNINDEX), source.etag if source else None, target.copy if target else None,
                source.copy if source else None, _attrs(journal, FileRole.TXNINDEX))


def _swap_txn_index(ctx: Context, journal: Journal) -> None:
    """Put the journal's ``.txnindex`` in place (or remove it), unless a crashed run of this operation did;
    :class:`SourceChanged` when another writer's is there."""
    store, txn = ctx.store, _txn(journal)
    try:
        there: ObjectInfo | None = store.head(txn.final)
    except ObjectNotFound:
        there = None
    if there is not None and there.metadata.get(META_OP) == journal.op:
        return
    if there is None and txn.new is None:
        return  # removed (by us, or by a crashed run of this operation)
    if (there.etag if there is not None else None) != txn.source:
        raise SourceChanged("the .txnindex changed after planning", path=uri(store, txn.final),
                            expected=txn.source or "no object", found=there.etag if there else "no object")
    try:
        if txn.new is None:
            store.delete(txn.final, if_match=txn.source, missing_ok=True)
            return
        try:
            data = store.get(txn.new)
        except ObjectNotFound:
            raise SourceChanged("the staged .txnindex is gone (an interrupted cleanup of this operation)",
                                path=uri(store, txn.new)) from None
        if txn.source:
            store.put_object(txn.final, data, txn.attrs, if_match=txn.source)
        else:
            store.put_object(txn.final, data, txn.attrs, if_none_match=True)
    except PreconditionFailed:  # another writer's, or this very request whose answer was lost
        with contextlib.suppress(ObjectNotFound):
            if store.head(txn.final).metadata.get(META_OP) == journal.op:
                return
        raise SourceChanged("the .txnindex changed after planning", path=uri(store, txn.final)) from None


def _put_back_txn_index(ctx: Context, journal: Journal) -> None:
    """An abandoned operation that had put its ``.txnindex`` in before the ``.log``: while the original
    ``.log`` is in place, the original ``.txnindex`` goes back beside it (from its backup; or, if there was
    none, ours is removed). Beside a ``.log`` another writer put there, the ``.txnindex`` is that writer's
    business (either one could be wrong for its ``.log``): left as it is; with the ``.log`` gone, ours is
    removed."""
    store, txn = ctx.store, _txn(journal)
    try:
        there = store.head(txn.final)
    except ObjectNotFound:
        there = None
    ours = there is not None and there.metadata.get(META_OP) == journal.op
    removed = there is None and txn.new is None and txn.source is not None
    if not ours and not removed:
        return
    try:
        log_etag: str | None = store.head(journal.final(FileRole.LOG)).etag
    except ObjectNotFound:
        log_etag = None
    if log_etag is None:  # deleted by retention: no .txnindex of ours stays behind
        if ours and there is not None:
            with contextlib.suppress(PreconditionFailed):
                store.delete(txn.final, if_match=there.etag, missing_ok=True)
        return
    if log_etag != journal.source_etag(FileRole.LOG):
        return
    with contextlib.suppress(PreconditionFailed):
        if txn.backup is None:
            if there is not None:
                store.delete(txn.final, if_match=there.etag, missing_ok=True)
            return
        try:
            _, attrs = store.describe(txn.backup)
            data = store.get(txn.backup)
        except ObjectNotFound:  # not backed up: it was never replaced
            return
        if there is not None:
            store.put_object(txn.final, data, attrs, if_match=there.etag)
        else:
            store.put_object(txn.final, data, attrs, if_none_match=True)


def take_out(ctx: Context, journal: Journal) -> None:
    """What an operation given up before its swap had put in place, removed (only its own objects): indexes
    it put beside a ``.log`` that has since been replaced, and a ``.txnindex`` it swapped first (the
    original put back)."""
    store = ctx.store
    for name in INDEX_FILES:
        if (target := journal.target(name)) is None:
            continue
        try:
            there = store.head(target.final)
        except ObjectNotFound:
            continue
        if there.metadata.get(META_OP) == journal.op:
            with contextlib.suppress(PreconditionFailed):
                store.delete(target.final, if_match=there.etag, missing_ok=True)
    if journal.txn_first:
        _put_back_txn_index(ctx, journal)
