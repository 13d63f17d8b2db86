"""Neighbouring segments replaced by others holding the same batches: a merge (several segments into one)
and its rollback (one merged segment back into the segments it was made of).

Nothing a broker restoring the bucket could read may show an offset twice or miss one, at any instant. The
order relies on what Kafka's ``LogLoader`` does with a log directory on load (``docs/commit-protocol.md``,
"Merging segments", goes through it crash by crash):

- a ``.log.swap`` file is a new segment: every file of another segment whose base offset lies within the
  range the ``.log.swap`` files cover (the smallest base to the largest next offset) is deleted, then every
  ``.swap`` file is renamed to its final name;
- while a ``<N>.log.cleaned`` file exists, every ``.swap`` file at ``N`` or above is void (deleted instead).

The steps, each idempotent, the journal's state saying where a crash left the operation:

1. **stage** (:func:`stage_merge`): the merged ``.log`` streamed from the sources (``GET If-Match``) to
   staging, proved to be their bytes one after the other (the CRC-32C S3 reports for what it stored equals
   the one of the sources as read), its indexes and ``.txnindex`` beside it; the journal entry (state
   ``staged``). A rollback journals the segments the merge kept in its backup (:func:`stage_unmerge`).
2. **back up**: every source file copied to the run's backup (state ``backed-up``).
3. **swap**: the sources checked unchanged, then each target put at ``<final>.swap``: its ``.log.swap``
   first (an index swap file alone would replace the index of the segment in place), then its
   ``.txnindex``, ``.index`` and ``.timeindex`` swap files. With several targets a ``.cleaned`` marker at the
   first base voids them until all are there (state ``swapped``). From here the operation only rolls
   forward: a broker restoring the bucket already sees the targets.
4. **roll forward**: the sources' files deleted (``If-Match``), the targets put at their final keys (``.log``
   first), the swap files deleted (the ``.log.swap`` last), the partition's state recorded, the journal and
   staging forgotten.

A source that changed or vanished before step 3 ends the operation (abandoned by :mod:`tiering.commit.finish`:
the swap files removed by :func:`take_out`, the backups kept); after it, the object of another writer found in
the way leaves the operation in flight and says so (nothing of that writer's is deleted or overwritten).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, BinaryIO, Final, cast

import crc32c

from tiering.commit.entry import Standing, advance, backed_up, forget, rewrite
from tiering.commit.lease import LeaseGuard
from tiering.commit.operation import (
    COPY_CHUNK,
    META_MERGED,
    META_OP,
    META_RESTORED,
    META_RUN,
    Context,
    CopyGone,
    SegmentResult,
    SourceChanged,
    SourceGone,
    TakenOver,
    operation_results,
    record_state,
    replaced,
    uri,
)
from tiering.errors import InvalidDataError, ProofError
from tiering.kafka.files import CLEANED_SUFFIX, SWAP_SUFFIX
from tiering.kafka.index import Indexes, parse_txn_index
from tiering.kafka.merge import Source as MergeSource
from tiering.kafka.merge import merge
from tiering.kafka.rewrite import read_back
from tiering.lifecycle.journal import GROUP_FILES, Journal, OpFile, OpSegment, Recorded
from tiering.lifecycle.state import SegmentState
from tiering.lifecycle.vocabulary import Cause, FileRole, JournalState, OpKind, Pending, Status, StorageClass, Verify
from tiering.plan.document import PlannedSegment
from tiering.storage.layout import (
    backup_key,
    cleaned_key,
    dir_segment_key,
    journal_key,
    partition_prefix,
    sibling_key,
    staging_key,
    swap_key,
)
from tiering.storage.objects import (
    ChecksumUnsupported,
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
)

# The order a segment's files go in place (and out of the way): the .log first, so that no index of a target
# is ever read beside a .log it was not made for.
PUT_ORDER: Final = (FileRole.LOG, FileRole.TXNINDEX, FileRole.INDEX, FileRole.TIMEINDEX)
# Swap files come out in the reverse order: while an .index.swap is there (which spares a broker the recovery
# that would rebuild the .txnindex), so is the .txnindex.swap.
REMOVE_ORDER: Final = tuple(reversed(PUT_ORDER))
# A source's files: its indexes before its .log (a broker never finds an index without the .log it fits).
SOURCE_ORDER: Final = (FileRole.TXNINDEX, FileRole.INDEX, FileRole.TIMEINDEX, FileRole.LOG)


class _Reading(io.RawIOBase):
    """A source ``.log`` as read: the CRC-32C and the count of every byte that went through, in order."""

    def __init__(self, body: BinaryIO, seen: _Seen) -> None:
        self.body, self.seen = body, seen

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.body.read(len(buffer))
        buffer[: len(data)] = data
        self.seen.crc = crc32c.crc32c(data, self.seen.crc)
        self.seen.size += len(data)
        return len(data)

    def close(self) -> None:
        self.body.close()
        super().close()


@dataclass(slots=True)
class _Seen:
    crc: int = 0
    size: int = 0


def _source_files(ctx: Context, seg: PlannedSegment, run_id: str) -> OpSegment:
    """A planned segment's files as they are now, checked against the plan (:class:`SourceChanged`
    otherwise), with their attributes and backup keys."""
    store, d, base = ctx.store, seg.directory, seg.base_offset
    assert seg.log is not None
    files: dict[FileRole, OpFile] = {}
    for name, suffix in GROUP_FILES:
        ref = getattr(seg, name)
        key = ref.key if ref is not None else sibling_key(seg.log.key, suffix)
        try:
            info, attrs = store.describe(key)
        except ObjectNotFound:
            if ref is None:
                continue
            gone = SourceGone if name == FileRole.LOG else SourceChanged
            raise gone(f"the {name} file disappeared after planning", path=uri(store, key)) from None
        if ref is None or info.etag != ref.etag:
            raise SourceChanged(f"the {name} file changed after planning", path=uri(store, key),
                                expected=ref.etag if ref else "no object", found=info.etag)
        files[name] = OpFile(key, info.etag, info.size, backup_key(ctx.prefix, run_id, d, base, suffix), attrs,
                             info.last_modified.isoformat())
    return OpSegment(base, files)


def stage_merge(ctx: Context, segments: Sequence[PlannedSegment], lease: LeaseGuard
                ) -> tuple[Journal, str] | int:
    """Step 1 of a merge of ``segments`` (neighbours, in offset order, two or more): the journal entry and its
    ETag. When the second segment does not start where the first ends (a gap in offsets), nothing is staged
    and 1 comes back; a later gap makes the merge end before it (the journal names the sources merged)."""
    store, first = ctx.store, segments[0]
    d, base = first.directory, first.base_offset
    op = ctx.new_op()
    sources = [_source_files(ctx, seg, ctx.run_id) for seg in segments]
    seen = _Seen()

    def opener(group: OpSegment) -> Callable[[], BinaryIO]:
        def open_log() -> BinaryIO:
            lease.keep_alive()
            try:
                body = store.open(group.log.final, if_match=group.log.etag)
            except (PreconditionFailed, ObjectNotFound):
                raise SourceChanged("the .log changed or disappeared after planning", path=uri(store, group.log.final),
                                    expected=group.log.etag) from None
            return io.BufferedReader(_Reading(body, seen), COPY_CHUNK)
        return open_log

    merge_sources = [MergeSource(g.base_offset, opener(g), _aborted(ctx, g), uri(store, g.log.final)) for g in sources]
    new = {name: staging_key(ctx.prefix, ctx.run_id, d, base, suffix) for name, suffix in GROUP_FILES}
    marks = {META_RUN: ctx.run_id, META_OP: op}
    checksum = ctx.verify is Verify.CHECKSUM
    with store.writer(new[FileRole.LOG], part_bytes=ctx.part_bytes, checksum=checksum, metadata=marks) as out:
        merged = merge(merge_sources, cast(BinaryIO, out), index_interval_bytes=ctx.index_interval_bytes,
                       contiguous=True)
        if merged.sources < 2:  # leaving the block unfinished aborts the upload
            return merged.sources
        sources = sources[: merged.sources]
        expected = sum(g.log.bytes for g in sources)
        if seen.size != expected or merged.log_bytes != expected:
            raise ProofError("the merged .log is not the sources' bytes one after the other",
                             path=uri(store, first.log.key if first.log else new[FileRole.LOG]),
                             expected=f"{expected} bytes read and written",
                             found=f"{seen.size} read, {merged.log_bytes} written")
        lease.check()
        staged = _finish_staging(ctx, out, new, merged.indexes, merged.txn_index, merged.log_bytes, seen.crc, marks)
    recorded = Recorded(expected, merged.log_bytes, ctx.run_id, sources[0].log.etag,
                        merged_from=tuple(g.base_offset for g in sources))
    return _journal_group(ctx, op, d, sources, staged, new, marks, recorded, seen.crc)


def stage_cleaned_group(ctx: Context, segments: Sequence[PlannedSegment], log: BinaryIO, size: int,
                        indexes: Indexes, txn_index: bytes, lease: LeaseGuard) -> tuple[Journal, str]:
    """Step 1 for neighbours a key-compaction pass cleaned into one segment (the broker's cleaner merges the
    groups it cleans): ``log`` holds its ``size`` bytes, ``indexes`` and ``txn_index`` were made with it. It
    is read back (CRCs, every record, offsets) and its indexes must equal a rebuild; then staged (its
    CRC-32C, as S3 stored it, must be the one of the bytes read back) and journalled like a merge."""
    store, first = ctx.store, segments[0]
    op = ctx.new_op()
    sources = [_source_files(ctx, seg, ctx.run_id) for seg in segments]
    where = uri(store, sources[0].log.final)
    log.seek(0)
    try:
        made = read_back(log, base_offset=first.base_offset, path=f"{where} (cleaned)", size=size,
                         index_interval_bytes=ctx.index_interval_bytes,
                         decompression_limit=ctx.decompression_limit)
    except InvalidDataError as e:  # what the cleaner made, not a source: a proof failure
        raise ProofError(f"the cleaned .log does not read back: {e}", path=where) from None
    if made.size != size or made.indexes != indexes:
        raise ProofError("the cleaned .log does not match the indexes made with it", path=where,
                         expected=f"{size} bytes and their indexes", found=f"{made.size} bytes")
    new = {name: staging_key(ctx.prefix, ctx.run_id, first.directory, first.base_offset, suffix)
           for name, suffix in GROUP_FILES}
    marks = {META_RUN: ctx.run_id, META_OP: op}
    log.seek(0)
    crc = 0
    with store.writer(new[FileRole.LOG], part_bytes=ctx.part_bytes, checksum=ctx.verify is Verify.CHECKSUM,
                      metadata=marks) as out:
        while chunk := log.read(COPY_CHUNK):
            crc = crc32c.crc32c(chunk, crc)
            out.write(chunk)
            lease.keep_alive()
        lease.check()
        staged = _finish_staging(ctx, out, new, indexes, txn_index, size, crc, marks)
    recorded = Recorded(sum(g.log.bytes for g in sources), size, ctx.run_id, sources[0].log.etag,
                        payload_xxh3=made.payload_xxh3, merged_from=tuple(g.base_offset for g in sources))
    return _journal_group(ctx, op, first.directory, sources, staged, new, marks, recorded, crc)


def _journal_group(ctx: Context, op: str, d: str, sources: list[OpSegment],
                   staged: dict[FileRole, tuple[str, int]], new: dict[FileRole, str], marks: dict[str, str],
                   recorded: Recorded, crc: int) -> tuple[Journal, str]:
    """The journal entry (state ``staged``) of one segment made from ``sources`` at the first one's base
    offset (its ``.log``'s CRC-32C ``crc``): its files take the first source's attributes (its ``.log``'s
    where it lacks the file), with our marks and the number of segments it holds."""
    base = sources[0].base_offset
    marks = {**marks, META_MERGED: str(len(sources))}
    target_files = {}
    for name, suffix in GROUP_FILES:
        if name in staged:
            etag, size = staged[name]
            attrs = sources[0].files.get(name, sources[0].log).attrs or ObjectAttrs()
            target_files[name] = OpFile(dir_segment_key(ctx.prefix, d, base, suffix), etag, size, new[name],
                                        attrs.with_metadata(marks), crc32c=crc if name == FileRole.LOG else None)
    lineage = tuple(replaced(ctx, d, s.base_offset, s.log.bytes, str(s.log.etag)) for s in sources)
    journal = Journal(OpKind.MERGE, op, ctx.run_id, JournalState.STAGED, d, tuple(sources),
                      (OpSegment(base, target_files),), replace(recorded, replaced=lineage))
    return journal, _create(ctx, journal)


def _aborted(ctx: Context, group: OpSegment) -> tuple[Any, ...]:
    txn = group.files.get(FileRole.TXNINDEX)
    if txn is None:
        return ()
    try:
        with ctx.store.open(txn.final, if_match=txn.etag) as body:
            data = body.read()
    except (PreconditionFailed, ObjectNotFound):
        raise SourceChanged("the .txnindex changed or disappeared after planning", path=uri(ctx.store, txn.final),
                            expected=txn.etag) from None
    return tuple(parse_txn_index(data, path=uri(ctx.store, txn.final)))


def _finish_staging(ctx: Context, out: Any, new: dict[FileRole, str], indexes: Indexes, txn_index: bytes,
                    log_bytes: int, crc: int, marks: dict[str, str]) -> dict[FileRole, tuple[str, int]]:
    """Complete the staged ``.log`` (its bytes must have the CRC-32C ``crc`` of what it was made from, and so
    must what S3 stored), put its indexes and ``.txnindex`` beside it: their ETags and sizes by file name. A
    store that reports no checksums (or ``--verify read-back``) has each object read back instead."""
    store = ctx.store
    files = {FileRole.INDEX: indexes.offset_index, FileRole.TIMEINDEX: indexes.time_index, FileRole.TXNINDEX: txn_index}
    files = {name: data for name, data in files.items() if data or name != FileRole.TXNINDEX}
    staged: dict[FileRole, tuple[str, int]] = {}
    read_back = ctx.verify is Verify.READ_BACK
    try:
        staged[FileRole.LOG] = (out.finish(expect_crc=crc).etag, log_bytes)
    except ChecksumUnsupported:  # completed, and the store does not say what it holds
        read_back = True
        staged[FileRole.LOG] = (store.head(new[FileRole.LOG]).etag, log_bytes)
    for name, data in files.items():
        staged[name] = (store.put(new[name], data, metadata=marks, checksum=not read_back), len(data))
    if read_back:
        _check_read_back(ctx, new, staged, files, crc)
    return staged


def _check_read_back(ctx: Context, new: dict[FileRole, str], staged: dict[FileRole, tuple[str, int]],
                     files: dict[FileRole, bytes], crc: int) -> None:
    store = ctx.store
    got, size = 0, 0
    with store.open(new[FileRole.LOG], if_match=staged[FileRole.LOG][0]) as body:
        while chunk := body.read(COPY_CHUNK):
            got = crc32c.crc32c(chunk, got)
            size += len(chunk)
    if got != crc or size != (want := staged[FileRole.LOG][1]):
        raise ProofError("the staged merged .log read back is not the sources' bytes",
                         path=uri(store, new[FileRole.LOG]), expected=f"{want} bytes, CRC-32C {crc:#010x}",
                         found=f"{size} bytes, {got:#010x}")
    for name, data in files.items():
        if store.get(new[name]) != data:
            raise ProofError(f"the staged .{name} read back differs from the one written", path=uri(store, new[name]))


def _create(ctx: Context, journal: Journal) -> str:
    key = journal_key(ctx.prefix, journal.directory, journal.base_offset)
    try:
        return ctx.store.put_json(key, journal.to_json(), if_none_match=True)
    except PreconditionFailed:
        raise SourceChanged("a journal entry of another operation exists for this segment (recover first)",
                            path=uri(ctx.store, key)) from None


def stage_unmerge(ctx: Context, directory: str, entry: SegmentState, target_run: str
                  ) -> tuple[Journal, str] | list[SegmentResult]:
    """Journal the rollback of the merge ``entry`` records (run ``target_run``): the merged segment in place
    replaced by the segments it was made of, from that run's backup. Nothing to back up: the merged segment
    holds their bytes. Results instead when it cannot be done (said per segment)."""
    store, bases = ctx.store, entry.merged_from
    base = bases[0]

    def refused(status: Status, reason: str, cause: Cause) -> list[SegmentResult]:
        return [SegmentResult(directory, b, status, reason, cause=cause) for b in bases]

    log_key = dir_segment_key(ctx.prefix, directory, base, GROUP_FILES[0][1])
    try:
        current = store.head(log_key)
    except ObjectNotFound:
        return refused(Status.SKIPPED, "the merged .log is gone: nothing to restore over", Cause.NOT_RESTORABLE)
    if current.metadata.get(META_RUN) != target_run or current.etag != entry.log_etag:
        return refused(Status.SKIPPED, f"the .log in place is not the one run {target_run} merged",
                       Cause.NOT_RESTORABLE)
    in_place: dict[FileRole, OpFile] = {}
    for name, suffix in GROUP_FILES:
        key = dir_segment_key(ctx.prefix, directory, base, suffix)
        with contextlib.suppress(ObjectNotFound):
            info = store.head(key)
            in_place[name] = OpFile(key, info.etag, info.size)
    op = ctx.new_op()
    marks = {META_RESTORED: target_run, META_OP: op}
    targets: list[OpSegment] = []
    for b in bases:
        files: dict[FileRole, OpFile] = {}
        for name, suffix in GROUP_FILES:
            kept = backup_key(ctx.prefix, target_run, directory, b, suffix)
            try:
                info, attrs = store.describe(kept)
            except ObjectNotFound:
                if name == FileRole.LOG:
                    return refused(Status.FAILED, f"the backup of segment {b}'s .log is missing",
                                   Cause.BACKUP_MISSING)
                continue
            files[name] = OpFile(dir_segment_key(ctx.prefix, directory, b, suffix), info.etag, info.size, kept,
                                 attrs.with_metadata(marks))
        targets.append(OpSegment(b, files))
    if sum(t.log.bytes for t in targets) != entry.bytes_before:  # a key-compaction merge made less of them
        return refused(Status.FAILED, "the backups do not add up to what the merge replaced", Cause.BACKUP_MISSING)
    journal = Journal(OpKind.UNMERGE, op, ctx.run_id, JournalState.BACKED_UP, directory,
                      (OpSegment(base, in_place),), tuple(targets),
                      Recorded(current.size, current.size, replaced=entry.replaced), restores_run=target_run)
    try:
        return journal, _create(ctx, journal)
    except SourceChanged:
        return refused(Status.SKIPPED, "another operation's journal entry is pending for it", Cause.BUSY)


def roll_forward(ctx: Context, at: Standing, lease: LeaseGuard) -> list[SegmentResult]:
    """Steps 2-4 (or the rest of them, after a crash), from the state of the entry ``at`` stands at; results
    for every segment the operation touches. Before the swap a changed source or a copy gone is raised for
    :func:`tiering.commit.finish.finish`, which abandons the operation; after it, another writer's object in
    the way leaves the operation in flight with its journal, and a later run that holds the partition goes
    on from there."""
    if at.journal.state is not JournalState.SWAPPED:
        if at.journal.state is JournalState.STAGED:
            _check_sources(ctx, at.journal)
            at.journal, at.etag = backed_up(ctx, at.journal, at.etag)
        _check_sources(ctx, at.journal)
        _no_other_swaps(ctx, at.journal)
        lease.check()
        at.etag = rewrite(ctx, at.journal, at.etag)  # another run that took it over stops us here
        _put_swaps(ctx, at.journal)
        at.journal, at.etag = advance(ctx, at.journal, at.etag, JournalState.SWAPPED)
    return _roll_forward(ctx, at.journal, at.etag, lease)


def _no_other_swaps(ctx: Context, journal: Journal) -> None:
    """:class:`SourceChanged` when the partition holds ``.swap`` or ``.cleaned`` objects of another operation: a
    broker restoring the bucket would take their range and ours as one."""
    root = partition_prefix(ctx.prefix, journal.directory)
    for info in ctx.store.list(root):
        if not info.key.endswith((SWAP_SUFFIX, CLEANED_SUFFIX)) or "/" in info.key[len(root):]:
            continue
        there = _head(ctx, info.key)
        if there is not None and not _ours(journal, there):
            raise SourceChanged("another operation's swap files are in the partition", path=uri(ctx.store, info.key))


def _ours(journal: Journal, info: ObjectInfo) -> bool:
    return info.metadata.get(META_OP) == journal.op


def _head(ctx: Context, key: str) -> ObjectInfo | None:
    try:
        return ctx.store.head(key)
    except ObjectNotFound:
        return None


def _check_sources(ctx: Context, journal: Journal) -> None:
    """Every source file still the planned object, and no other file of theirs appeared."""
    store = ctx.store
    for source in journal.sources:
        log_key = source.log.final
        for name, suffix in GROUP_FILES:
            planned = source.files.get(name)
            there = _head(ctx, planned.final if planned else sibling_key(log_key, suffix))
            if planned is None and there is None:
                continue
            if planned is not None and there is None:
                gone = SourceGone if name == FileRole.LOG else SourceChanged
                raise gone(f"segment {source.base_offset}'s {name} file disappeared", path=uri(store, planned.final))
            assert there is not None
            if planned is None or there.etag != planned.etag:
                raise SourceChanged(f"segment {source.base_offset}'s {name} file changed", path=uri(store, there.key),
                                    expected=planned.etag if planned else "no object", found=there.etag)


def _place(ctx: Context, journal: Journal, f: OpFile, key: str, fallback: str | None = None) -> str:
    """A server-side copy of the target file ``f`` at ``key``, unless this operation's copy is there already:
    its ETag. :class:`SourceChanged` when an object that is not ours is in the way. When the copy ``f`` names
    is gone (staging cleaned up under a long stall), ``fallback``: this operation's swap object of it; with
    neither, :class:`CopyGone`, or :class:`ProofError` when the copy is there but not the one verified."""
    store = ctx.store
    there = _head(ctx, key)
    if there is not None:
        if _ours(journal, there):
            return there.etag
        raise SourceChanged("an object of another writer is where the operation puts its own",
                            path=uri(store, key), expected="no object", found=there.etag)
    assert f.copy is not None
    assert f.attrs is not None
    assert f.etag is not None
    try:
        return store.copy_over(f.copy, key, source_etag=f.etag, if_match=None, attrs=f.attrs, size=f.bytes).etag
    except (PreconditionFailed, ObjectNotFound):
        spare = _head(ctx, fallback) if fallback is not None else None
        if fallback is None or spare is None or not _ours(journal, spare) or spare.size != f.size:
            if _head(ctx, f.copy) is None:
                raise CopyGone("the copy to put in place is gone", path=uri(store, f.copy)) from None
            raise ProofError("the copy to put in place changed since it was verified", path=uri(store, f.copy),
                             expected=f.etag) from None
    return store.copy_over(fallback, key, source_etag=spare.etag, if_match=None, attrs=f.attrs, size=f.bytes).etag


def _swap_files(journal: Journal) -> Iterator[tuple[OpFile, str]]:
    """Every target file with its ``.swap`` key, in the order they go in."""
    for target in journal.targets:
        for name in PUT_ORDER:
            if (f := target.files.get(name)) is not None:
                yield f, swap_key(f.final)


def _put_swaps(ctx: Context, journal: Journal) -> None:
    """Step 3: each target at its ``.swap`` key; several targets behind a ``.cleaned`` marker that voids them
    until all are there."""
    marker = _marker(ctx, journal)
    if marker is not None:
        _put_marker(ctx, journal, marker)
    for f, key in _swap_files(journal):
        _place(ctx, journal, f, key)
    if marker is not None:
        _delete_ours(ctx, journal, marker)


def _marker(ctx: Context, journal: Journal) -> str | None:
    return cleaned_key(ctx.prefix, journal.directory, journal.base_offset) if len(journal.targets) > 1 else None


def _put_marker(ctx: Context, journal: Journal, key: str) -> None:
    try:
        ctx.store.put(key, b"", if_none_match=True, metadata={META_RUN: journal.run_id, META_OP: journal.op})
    except PreconditionFailed:
        there = _head(ctx, key)
        if there is None or not _ours(journal, there):
            raise SourceChanged("another writer's .cleaned file is in the partition",
                                path=uri(ctx.store, key)) from None


def _delete_ours(ctx: Context, journal: Journal, key: str) -> None:
    """Delete ``key`` if it is this operation's object (``If-Match`` the ETag seen)."""
    there = _head(ctx, key)
    if there is not None and _ours(journal, there):
        with contextlib.suppress(PreconditionFailed):
            ctx.store.delete(key, if_match=there.etag, missing_ok=True)


def take_out(ctx: Context, journal: Journal) -> None:
    """What an operation given up before its swap had put in place, removed: its swap files (only its own),
    in an order in which none is read without its ``.log.swap``: behind the ``.cleaned`` marker when there
    are several targets, else the index swap files first."""
    marker = _marker(ctx, journal)
    if marker is not None:
        _put_marker(ctx, journal, marker)
    for target in journal.targets:
        for name in REMOVE_ORDER:
            if (f := target.files.get(name)) is not None:
                _delete_ours(ctx, journal, swap_key(f.final))
    if marker is not None:
        _delete_ours(ctx, journal, marker)


def _roll_forward(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard) -> list[SegmentResult]:
    """Step 4, the targets in place as swap files: the sources' files deleted, the targets put at their
    final keys, the swap files deleted, the state recorded, the operation forgotten. Another writer's object
    in the way stops it with the journal kept (a later run goes on from there)."""
    try:
        for source in journal.sources:
            lease.check()
            for name in SOURCE_ORDER:
                if (f := source.files.get(name)) is not None:
                    _delete_source(ctx, journal, f)
        put: dict[int, dict[str, str]] = {}
        for target in journal.targets:
            lease.check()
            put[target.base_offset] = {name: _place(ctx, journal, f, f.final, fallback=swap_key(f.final))
                                       for name in PUT_ORDER if (f := target.files.get(name)) is not None}
        for target in journal.targets:
            for name in REMOVE_ORDER:
                if (f := target.files.get(name)) is not None:
                    _delete_ours(ctx, journal, swap_key(f.final))
    except SourceChanged as e:
        return operation_results(journal, Status.FAILED, f"stopped after its swap, left in flight: {e}",
                                 pending=Pending.BUSY, cause=Cause.BUSY)

    def forgotten() -> None:
        with contextlib.suppress(TakenOver):
            forget(ctx, journal, etag)

    merged = journal.kind is OpKind.MERGE
    if merged:  # the sources after the first are gone (the merged entry keeps theirs, in its lineage)
        for source in journal.sources[1:]:
            record_state(ctx, journal.directory, source.base_offset, None)
    for i, target in enumerate(journal.targets):
        etags = put[target.base_offset]
        made = (etags[FileRole.LOG], etags.get(FileRole.INDEX), etags.get(FileRole.TIMEINDEX))
        record_state(ctx, journal.directory, target.base_offset,
                     journal.entry.done(*made) if merged else journal.entry.restored(target.base_offset, *made),
                     then=forgotten if i == len(journal.targets) - 1 else None)
    if merged:
        target = journal.targets[0]
        n = len(journal.sources)
        return [SegmentResult(journal.directory, s.base_offset, Status.MERGED,
                              f"{n} segments merged into one" if i == 0 else
                              f"merged into segment {target.base_offset}",
                              s.log.bytes, target.log.bytes if i == 0 else 0, run_id=journal.run_id,
                              stats={**({"merge": merge_stats(journal)} if i == 0 else {}),
                                     FileRole.LOG: _facts(s.log)})
                for i, s in enumerate(journal.sources)]
    merged_size = journal.sources[0].log.bytes
    return [SegmentResult(journal.directory, t.base_offset, Status.ROLLED_BACK,
                          f"restored from run {journal.restores_run}'s backup (the merged segment split again)",
                          merged_size if i == 0 else 0, t.log.bytes, run_id=journal.run_id)
            for i, t in enumerate(journal.targets)]


def _facts(f: OpFile) -> dict[str, Any]:
    """A source ``.log``'s storage class and age as the report prices its replacement (a plan entry's)."""
    return {"storage_class": f.attrs.storage_class if f.attrs is not None else StorageClass.STANDARD, "size": f.bytes,
            **({"last_modified": f.last_modified} if f.last_modified else {})}


def merge_stats(journal: Journal) -> dict[str, Any]:
    """What a merge changed, for the report: the segments and the size of every object before and after,
    and their storage class (the merged segment takes the first one's)."""
    attrs = journal.targets[0].log.attrs
    return {"segments_before": len(journal.sources), "segments_after": len(journal.targets),
            "storage_class": attrs.storage_class if attrs is not None else StorageClass.STANDARD,
            "objects_before": [f.bytes for s in journal.sources for f in s.files.values()],
            "objects_after": [f.bytes for t in journal.targets for f in t.files.values()]}


def _delete_source(ctx: Context, journal: Journal, f: OpFile) -> None:
    """Delete a source file (``If-Match`` the planned ETag) unless it is gone or already this operation's
    target at the same key."""
    there = _head(ctx, f.final)
    if there is None or _ours(journal, there):
        return
    if there.etag != f.etag:
        raise SourceChanged("a source file changed after the swap files went in", path=uri(ctx.store, f.final),
                            expected=f.etag, found=there.etag)
    try:
        ctx.store.delete(f.final, if_match=f.etag, missing_ok=True)
    except PreconditionFailed:
        raise SourceChanged("a source file changed after the swap files went in", path=uri(ctx.store, f.final),
                            expected=f.etag) from None

