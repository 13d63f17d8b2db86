"""Journal entries left in flight, rollback and repair: the commit protocol run again over what is there.

A crash leaves journal entries; the next run that holds the partition's lease finishes each of them (or
abandons one whose source changed) with :func:`tiering.commit.finish.finish`, or takes over a compaction
another run staged and left when this run would stage the same. A rollback journals the restore of a
segment from a run's backups and swaps them in the same way; a repair removes the indexes we rebuilt
beside a ``.log`` that has since been replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import replace

from tiering.commit.finish import abandon, finish
from tiering.commit.lease import LeaseGuard
from tiering.commit.operation import (
    META_CODEC,
    META_MERGED,
    META_OP,
    META_RESTORED,
    META_RUN,
    Context,
    SegmentResult,
    SourceChanged,
    TakenOver,
    record_state,
    state_entry,
    uri,
)
from tiering.kafka.files import TXN_INDEX_SUFFIX
from tiering.lifecycle.journal import (
    FILES,
    GROUP_FILES,
    INDEX_FILES,
    Journal,
    OpFile,
    OpSegment,
    Recorded,
    read_journal,
)
from tiering.lifecycle.vocabulary import Cause, FileRole, JournalState, OpKind, Pending, Status
from tiering.plan.document import PlannedSegment
from tiering.storage.layout import (
    backup_key,
    dir_segment_key,
    journal_dir,
    journal_key,
)
from tiering.storage.objects import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
)


def pending_journals(store: ObjectStore, prefix: str, directory: str | None = None, *,
                     kinds: Collection[str] | None = None) -> Iterator[tuple[Journal, str]]:
    """Journal entries left in flight (by a crash); with ``kinds``,
    only the entries of those operation kinds (the others are not read as journals at all)."""
    under = journal_dir(prefix, directory)
    for info in store.list(under):
        try:
            doc, etag = store.get_json(info.key)
        except ObjectNotFound:
            continue  # finished in between
        if kinds is not None and not (isinstance(doc, dict) and doc.get("kind") in kinds):
            continue
        yield read_journal(doc, where=uri(store, info.key)), etag


def recover_partition(ctx: Context, directory: str, lease: LeaseGuard) -> list[SegmentResult]:
    """Finish (or abandon) every journal entry of the partition; the caller holds its lease.

    A compaction of ANOTHER run still ``staged`` (nothing final changed, no backup made yet) is never rolled
    forward into that run's backup keys: that run may only be stalled, with a backup copy in flight to the
    keys its journal names, and a copy landing after our swap would put the new ``.log`` where the original
    must be kept (S3 refuses such a copy by its ``x-amz-copy-source-if-match``; moto does not). Here it is
    abandoned and its segment planned again like any other (:func:`iter_recover` can take it over instead).
    Entries of this run (a retry) and entries past their backup are finished."""
    return list(iter_recover(ctx, directory, lease))


def iter_recover(ctx: Context, directory: str, lease: LeaseGuard, *,
                 adoptable: Callable[[Journal], bool] | None = None) -> Iterator[SegmentResult]:
    """:func:`recover_partition`, one result at a time (the partition's state batch is written between two
    operations when it is full, so that a failed write stops the work after the results already given).

    A compaction another run left ``staged`` is taken over (:func:`adopt`) when ``adoptable`` says this run
    would stage the same (same source, codec and level): its staged files are used instead of being made
    again, and it is finished at once. Otherwise it is abandoned and the segment compacted anew."""
    for journal, etag in list(pending_journals(ctx.store, ctx.prefix, directory)):
        if ctx.state is not None and ctx.state.full:
            ctx.state.flush(lease.check)
        if journal.state is not JournalState.STAGED or journal.run_id == ctx.run_id:
            results = finish(ctx, journal, etag, lease)
        elif journal.kind is OpKind.COMPACT and adoptable is not None and adoptable(journal):
            results = [_adopted(ctx, journal, etag, lease)]
        else:
            anew = "the segment is compacted anew" if journal.in_place else "the segments are merged anew"
            results = abandon(ctx, journal, etag, f"interrupted before its backup (run {journal.run_id}): "
                              f"abandoned; {anew}", pending=None)
        # A recovery: another run's operation finished or dropped here. Not one: this run's own (a retry) or one
        # it took over (its results are this run's, like those of what it stages).
        for result in results:
            yield replace(result, recovered=(result.run_id or journal.run_id) != ctx.run_id)


def adopt(ctx: Context, journal: Journal, etag: str) -> tuple[Journal, str]:
    """Take over a compaction another run staged and left (nothing final changed, no backup made yet): the
    same staged files, with this run's operation id, backup keys and state entry, written over that run's
    journal entry if it is still the one read (``If-Match``). A stalled owner then finds its entry changed
    and stops, and whatever it still copies goes to its own backup keys, which no journal names any more.
    :class:`TakenOver` if the entry changed in between."""
    d, base = journal.directory, journal.base_offset
    op = ctx.new_op()
    marks = {META_RUN: ctx.run_id, META_OP: op}
    suffix = dict(GROUP_FILES)

    def marked(f: OpFile) -> OpFile:
        return replace(f, attrs=f.attrs.with_metadata(marks)) if f.attrs is not None else f

    sources = tuple(OpSegment(s.base_offset, {name: replace(marked(f), copy=backup_key(ctx.prefix, ctx.run_id, d,
                                                                                      s.base_offset, suffix[name]))
                                              for name, f in s.files.items()}) for s in journal.sources)
    targets = tuple(OpSegment(t.base_offset, {name: marked(f) for name, f in t.files.items()}) for t in journal.targets)
    taken = replace(journal, op=op, run_id=ctx.run_id, sources=sources, targets=targets,
                    entry=replace(journal.entry, run_id=ctx.run_id))
    try:
        return taken, ctx.store.put_json(journal_key(ctx.prefix, d, base), taken.to_json(), if_match=etag)
    except (PreconditionFailed, ObjectNotFound):
        raise TakenOver("another run took this operation over first: left to that run",
                        path=uri(ctx.store, journal_key(ctx.prefix, d, base))) from None


def _adopted(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard) -> SegmentResult:
    lease.check()
    new = journal.targets[0].log
    try:
        staged = ctx.store.head(str(new.copy))
    except ObjectNotFound:
        staged = None
    if staged is None or staged.size != new.size:
        return abandon(ctx, journal, etag, f"interrupted before its backup (run {journal.run_id}), its staged "
                       ".log gone or other: abandoned; the segment is compacted anew", pending=None)[0]
    try:
        taken, etag = adopt(ctx, journal, etag)
    except TakenOver as e:
        return SegmentResult(journal.directory, journal.base_offset, Status.ABORTED, e.message, run_id=journal.run_id,
                             pending=Pending.BUSY, cause=Cause.BUSY)
    why = f"staged by run {journal.run_id}, which did not finish it: taken over"
    [result] = finish(ctx, taken, etag, lease, taken_from=journal.run_id)
    return replace(result, reason=why) if result.status is Status.COMPACTED else result


def repair_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard) -> SegmentResult:
    """Remove the indexes we rebuilt for a ``.log`` that has since been replaced (``If-Match``: only ours)."""
    lease.check()
    for ref in (seg.index, seg.timeindex):
        if ref is not None:
            try:
                ctx.store.delete(ref.key, if_match=ref.etag, missing_ok=True)
            except PreconditionFailed:
                raise SourceChanged("an index changed after planning", path=uri(ctx.store, ref.key)) from None
    record_state(ctx, seg.directory, seg.base_offset, None)
    return SegmentResult(seg.directory, seg.base_offset, Status.REPAIRED, seg.reason)


def _txn_index_restore(ctx: Context, directory: str, base: int, target_run: str, op: str
                       ) -> tuple[OpFile | None, OpFile] | None:
    """The ``.txnindex`` a rollback puts back after the ``.log``: the one in place (None: there is none) and
    the one ``target_run`` backed up; None where that run did not replace it."""
    store = ctx.store
    kept = backup_key(ctx.prefix, target_run, directory, base, TXN_INDEX_SUFFIX)
    try:
        info, attrs = store.describe(kept)
    except ObjectNotFound:
        return None
    final = dir_segment_key(ctx.prefix, directory, base, TXN_INDEX_SUFFIX)
    try:
        there = store.head(final)
    except ObjectNotFound:
        there = None
    return (None if there is None else OpFile(final, there.etag, there.size),
            OpFile(final, size=info.size, copy=kept,
                   attrs=attrs.with_metadata({META_RESTORED: target_run, META_OP: op})))


def _not_to_restore(ctx: Context, directory: str, base: int, final: dict[FileRole, str], backup: str,
                    current: ObjectInfo, target_run: str) -> SegmentResult | None:
    """Where the ``.log`` in place is not the rolled-back run's, what to report instead of restoring, judged
    by content against that run's backup of the original; None where it is the original's bytes beside an
    index the run wrote (the segment is restored whole)."""
    def skipped(reason: str, cause: Cause) -> SegmentResult:
        return SegmentResult(directory, base, Status.SKIPPED, reason, cause=cause)

    try:
        original = ctx.store.head(backup)
    except ObjectNotFound:
        original = None
    if original is not None and (original.etag, original.size) == (current.etag, current.size):
        for name in INDEX_FILES:
            with contextlib.suppress(ObjectNotFound):
                if ctx.store.head(final[name]).metadata.get(META_RUN) == target_run:
                    return None
        return skipped("the original is in place already (the same bytes as the backup): nothing to restore",
                       Cause.RESTORED)
    entry = state_entry(ctx, directory, base)
    if original is not None and entry is not None and entry.compacted and entry.log_etag == current.etag:
        for g in entry.lineage():
            if any(r.base_offset == base and r.log_etag == original.etag for r in g.replaced):
                return skipped(f"restored already: run {g.run_id} has replaced the original since (rolling run "
                               f"{g.run_id} back puts it in place)", Cause.RESTORED)
    owner = current.metadata.get(META_RUN)
    what = f"run {owner}" if owner else "an object we did not write, with other bytes than the original"
    return skipped(f"the .log in place is from {what}, not from run {target_run}: not restored over it",
                   Cause.NOT_RESTORABLE)


def stage_rollback(ctx: Context, directory: str, base: int, target_run: str) -> tuple[Journal, str] | SegmentResult:
    """Journal the restore of one segment from ``target_run``'s backups, if that run's ``.log`` is still the
    one in place; otherwise a skipped result saying what is there instead."""
    store = ctx.store
    final = {name: dir_segment_key(ctx.prefix, directory, base, sfx) for name, sfx in FILES}
    backups = {name: backup_key(ctx.prefix, target_run, directory, base, sfx) for name, sfx in FILES}
    try:
        current, _ = store.describe(final[FileRole.LOG])
    except ObjectNotFound:
        return SegmentResult(directory, base, Status.SKIPPED, "the .log is gone: nothing to restore over",
                             cause=Cause.NOT_RESTORABLE)
    owner = current.metadata.get(META_RUN)
    if owner != target_run and current.metadata.get(META_RESTORED) == target_run:
        return SegmentResult(directory, base, Status.SKIPPED, f"already restored from run {target_run}'s backup",
                             cause=Cause.RESTORED)
    merged_by_it = owner == target_run and current.metadata.get(META_MERGED) and not current.metadata.get(META_CODEC)
    if merged_by_it:  # a merge of that run (a rewrite sets its codec mark); the sources' list was in the partition's
        # state, which no longer has it
        return SegmentResult(directory, base, Status.SKIPPED, f"the .log in place merged "
                             f"{current.metadata[META_MERGED]} segments and the partition's state no longer says "
                             "which: not restored one for one",
                             cause=Cause.NOT_RESTORABLE)
    if owner != target_run and (instead := _not_to_restore(ctx, directory, base, final, backups[FileRole.LOG], current,
                                                           target_run)) is not None:
        return instead
    # the run's .log in place, or the original's bytes (put back by a mirror, say) beside the run's indexes
    op = ctx.new_op()
    sources = {FileRole.LOG: OpFile(final[FileRole.LOG], current.etag, current.size)}
    targets: dict[FileRole, OpFile] = {}
    for name, _ in FILES:
        if name != FileRole.LOG:
            with contextlib.suppress(ObjectNotFound):
                there = store.head(final[name])
                sources[name] = OpFile(final[name], there.etag, there.size)
        try:
            info, original = store.describe(backups[name])
        except ObjectNotFound:
            if name == FileRole.LOG:
                return SegmentResult(directory, base, Status.FAILED, "the backup of the .log is missing",
                                     error={"path": uri(store, backups[name])}, cause=Cause.BACKUP_MISSING)
            continue
        # The backup is decoded before it goes in (no ETag to hold it to): it must hold the records the
        # state entry names.
        targets[name] = OpFile(final[name], size=info.size, copy=backups[name],
                               attrs=original.with_metadata({META_RESTORED: target_run, META_OP: op}))
    if (txn := _txn_index_restore(ctx, directory, base, target_run, op)) is not None:
        if txn[0] is not None:
            sources[FileRole.TXNINDEX] = txn[0]
        targets[FileRole.TXNINDEX] = txn[1]
    entry = state_entry(ctx, directory, base)
    # What goes back in the partition's state: the generation that run replaced (its entry's lineage).
    restores = (entry.replaced if entry is not None and entry.run_id == target_run
                and entry.log_etag == current.etag else ())
    recorded = Recorded(current.size, targets[FileRole.LOG].bytes, replaced=restores)
    journal = Journal(OpKind.ROLLBACK, op, ctx.run_id, JournalState.BACKED_UP, directory, (OpSegment(base, sources),),
                      (OpSegment(base, targets),), recorded,
                      restores_run=target_run, payload_xxh3=entry.payload_xxh3 if entry else None)
    try:
        etag = store.put_json(journal_key(ctx.prefix, directory, base), journal.to_json(), if_none_match=True)
    except PreconditionFailed:
        return SegmentResult(directory, base, Status.SKIPPED, "another operation's journal entry is pending for it",
                             pending=Pending.BUSY, cause=Cause.BUSY)
    return journal, etag
