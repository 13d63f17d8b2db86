"""Step 1 of the commit protocol: stage a segment's new objects and journal the operation.

Nothing outside ``_tiering/`` changes here. The planned objects are checked against the plan (their ETags;
an index that appeared since stops the segment too); the new ``.log`` is written to a multipart upload
under ``_tiering/staging/`` while it is made (``GET If-Match`` the planned ETag, every batch proved as it is
written, no local copy), its indexes are put beside it, all accepted by the CRC-32C S3 reports for what it
stored, or by reading them back (:mod:`tiering.commit.verify`). Then the journal entry is created
(``If-None-Match``: one operation per segment at a time) in state ``staged``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import BinaryIO, cast

from tiering.commit.lease import LeaseGuard
from tiering.commit.operation import (
    COPY_CHUNK,
    META_CODEC,
    META_OP,
    META_RUN,
    META_SOURCE_ETAG,
    Context,
    SegmentResult,
    SourceChanged,
    SourceGone,
    Staged,
    replaced,
    spool_file,
    uri,
)
from tiering.commit.verify import check_read_back
from tiering.errors import InvalidDataError, ProofError
from tiering.kafka.files import TXN_INDEX_SUFFIX
from tiering.kafka.index import Indexes
from tiering.kafka.rewrite import read_back, rewrite_segment
from tiering.kafka.segment import verify_segment
from tiering.lifecycle.journal import FILES, INDEX_FILES, Journal, OpFile, OpSegment, Recorded
from tiering.lifecycle.vocabulary import Cause, FileRole, JournalState, OpKind, Status, Verify
from tiering.plan.document import PlannedSegment
from tiering.storage.layout import (
    backup_key,
    journal_key,
    sibling_key,
    staging_key,
)
from tiering.storage.objects import (
    ChecksumUnsupported,
    ObjectAttrs,
    ObjectNotFound,
    PreconditionFailed,
    StreamUpload,
)


def stage_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard) -> Staged | SegmentResult:
    """Step 1: rewrite, upload to staging, verify (the CRC-32C S3 reports for what it stored, or by reading
    back, :class:`Verify`), journal. Raises :class:`SourceChanged`
    when the planned objects changed, an InvalidDataError for a corrupt source; returns a skipped
    :class:`SegmentResult` when the rewrite would not save anything. Nothing outside ``_tiering/`` changes."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    src = _sources(ctx, seg)
    log_uri = uri(store, seg.log.key)
    new = {name: staging_key(ctx.prefix, ctx.run_id, d, base, suffix) for name, suffix in FILES}
    verified = ctx.verify
    # The new .log goes to staging while it is written (a multipart upload, aborted on leaving the block
    # unfinished: an error, or a rewrite not worth keeping).
    with store.writer(new[FileRole.LOG], part_bytes=ctx.part_bytes, checksum=verified is Verify.CHECKSUM) as out:
        try:
            with store.open(seg.log.key, if_match=seg.log.etag) as body:
                result = rewrite_segment(body, cast(BinaryIO, out), base_offset=base, options=ctx.rewrite,
                                         path=log_uri, size=seg.log.size, progress=lambda _: lease.keep_alive(),
                                         rebatch=ctx.rebatch)
        except (PreconditionFailed, ObjectNotFound):
            raise SourceChanged("the .log changed or disappeared after planning", path=log_uri,
                                expected=seg.log.etag) from None
        stats = result.stats
        stats_doc = result.to_json()
        if stats.bytes_out >= stats.bytes_in:
            return SegmentResult(d, base, Status.SKIPPED, f"no savings: {ctx.rewrite.codec.label} would not shrink it "
                                 f"({stats.bytes_in} -> {stats.bytes_out} bytes)", stats.bytes_in, stats.bytes_in,
                                 stats=stats_doc, cause=Cause.NO_SAVINGS)
        if 1 - stats.bytes_out / stats.bytes_in < ctx.min_savings_ratio:
            return SegmentResult(d, base, Status.SKIPPED, f"below min.savings.ratio: {ctx.rewrite.codec.label} saves "
                                 f"{1 - stats.bytes_out / stats.bytes_in:.1%}, the policy asks for "
                                 f"{ctx.min_savings_ratio:.1%}", stats.bytes_in, stats.bytes_in, stats=stats_doc,
                                 cause=Cause.BELOW_MIN_SAVINGS)
        lease.check()
        upload = _finish_upload(ctx, out, base, new, result.indexes, stats.bytes_out, stats.payload_xxh3)
    recorded = Recorded(stats.bytes_in, stats.bytes_out, ctx.run_id, seg.log.etag, ctx.rewrite.codec.label,
                        ctx.rewrite.level, stats.source_payload_xxh3 or stats.payload_xxh3,
                        ctx.rebatch.max_bytes if ctx.rebatch is not None else None)
    journal, etag = _journal(ctx, seg, src, new, upload, recorded, stats.payload_xxh3, ctx.rewrite.codec.label)
    return Staged(journal, etag, SegmentResult(d, base, Status.COMPACTED, "", stats.bytes_in, stats.bytes_out,
                                               stats={**stats_doc, "verified": str(upload.verified)},
                                               run_id=ctx.run_id), result.indexes)


def stage_cleaned(ctx: Context, seg: PlannedSegment, log: BinaryIO, size: int, indexes: Indexes,
                  lease: LeaseGuard, txn_index: bytes | None = None) -> Staged:
    """Step 1 for a ``.log`` made elsewhere (a key-compaction pass): ``log`` holds its ``size`` bytes and
    ``indexes`` are the ones made with it. It is read back here (CRCs, every record, offsets) and its indexes
    must equal a rebuild; the source is read once more for its records digest (a rollback checks the backup
    against it); then staged, verified and journalled as :func:`stage_segment` does (no codec or level
    recorded: the batches keep theirs). ``txn_index``: the segment's new ``.txnindex`` (empty: removed),
    when it loses entries (it goes in before the ``.log``: :attr:`Journal.txn_first` says why); None: left
    as it is."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    src = _sources(ctx, seg)
    log_uri = uri(store, seg.log.key)
    limits = {"index_interval_bytes": ctx.index_interval_bytes,
              "decompression_limit": ctx.decompression_limit}
    log.seek(0)
    try:
        made = read_back(log, base_offset=base, path=f"{log_uri} (cleaned)", size=size, **limits)
    except InvalidDataError as e:  # what the cleaner made, not the source: a proof failure, never retried
        raise ProofError(f"the cleaned .log does not read back: {e}", path=log_uri) from None
    if made.size != size or made.indexes != indexes:
        raise ProofError("the cleaned .log does not match the indexes made with it", path=log_uri,
                         expected=f"{size} bytes and their indexes", found=f"{made.size} bytes, indexes "
                         f"{'equal' if made.indexes == indexes else 'different'}")
    try:
        with store.open(seg.log.key, if_match=seg.log.etag) as body:
            original = read_back(body, base_offset=base, path=log_uri, size=seg.log.size, **limits)
    except (PreconditionFailed, ObjectNotFound):
        raise SourceChanged("the .log changed or disappeared after planning", path=log_uri,
                            expected=seg.log.etag) from None
    new = {name: staging_key(ctx.prefix, ctx.run_id, d, base, suffix) for name, suffix in FILES}
    log.seek(0)
    with store.writer(new[FileRole.LOG], part_bytes=ctx.part_bytes, checksum=ctx.verify is Verify.CHECKSUM) as out:
        while chunk := log.read(COPY_CHUNK):
            out.write(chunk)
            lease.keep_alive()
        lease.check()
        upload = _finish_upload(ctx, out, base, new, indexes, size, made.payload_xxh3)
    txn = None if txn_index is None else _stage_txn_index(ctx, seg, txn_index)
    recorded = Recorded(original.size, size, ctx.run_id, seg.log.etag, payload_xxh3=original.payload_xxh3)
    journal, etag = _journal(ctx, seg, src, new, upload, recorded, made.payload_xxh3, "keys", txn)
    return Staged(journal, etag, SegmentResult(d, base, Status.COMPACTED, "", original.size, size, run_id=ctx.run_id),
                  indexes)


@dataclass(frozen=True, slots=True)
class _TxnFiles:
    """A ``.txnindex`` replaced: the one in place (None: there is none) and its replacement (None: removed)."""

    source: OpFile | None
    target: OpFile | None


def _stage_txn_index(ctx: Context, seg: PlannedSegment, data: bytes) -> _TxnFiles:
    """Check the ``.txnindex`` is still the planned one and stage its replacement (none when empty)."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    final = seg.txnindex.key if seg.txnindex else sibling_key(seg.log.key, TXN_INDEX_SUFFIX)
    try:
        info, attrs = store.describe(final)
        etag: str | None = info.etag
    except ObjectNotFound:
        etag, attrs = None, ObjectAttrs()
    planned = seg.txnindex.etag if seg.txnindex else None
    if etag != planned:
        raise SourceChanged("the .txnindex changed after planning", path=uri(store, final), expected=planned,
                            found=etag)
    new = staging_key(ctx.prefix, ctx.run_id, d, base, TXN_INDEX_SUFFIX) if data else None
    if new is not None:
        store.put(new, data)
    source = None if etag is None else OpFile(final, etag, info.size,
                                              backup_key(ctx.prefix, ctx.run_id, d, base, TXN_INDEX_SUFFIX))
    return _TxnFiles(source, None if new is None else OpFile(final, size=len(data), copy=new, attrs=attrs))


@dataclass(frozen=True, slots=True)
class _Sources:
    """The segment's final keys, the ETags and sizes they had when checked, and their attributes."""

    final: dict[FileRole, str]
    etags: dict[FileRole, str | None]
    sizes: dict[FileRole, int]
    attrs: dict[FileRole, ObjectAttrs]


def _sources(ctx: Context, seg: PlannedSegment) -> _Sources:
    """The segment's files as they are now, each checked against the plan (:class:`SourceChanged` else)."""
    store = ctx.store
    assert seg.log is not None
    attrs: dict[FileRole, ObjectAttrs] = {}
    source: dict[FileRole, str | None] = {}
    sizes: dict[FileRole, int] = {}
    # The keys as listed (never rebuilt from a parsed topic and number); an index the plan did not see is
    # looked for too: one that appeared since (a restore or a mirror in progress) would be overwritten
    # without a backup, so it stops the segment like any other change.
    final = {name: getattr(seg, name).key if getattr(seg, name) else sibling_key(seg.log.key, sfx)
             for name, sfx in FILES}
    for name, _ in FILES:
        ref = getattr(seg, name)
        try:
            info, attrs[name] = store.describe(final[name])
        except ObjectNotFound:
            if ref is None:
                source[name] = None
                continue
            gone = SourceGone if name == FileRole.LOG else SourceChanged
            raise gone(f"the {name} file disappeared after planning", path=uri(store, ref.key)) from None
        if ref is None:
            raise SourceChanged(f"the {name} file appeared after planning", path=uri(store, final[name]),
                                expected="no object", found=info.etag)
        if info.etag != ref.etag:
            raise SourceChanged(f"the {name} file changed after planning", path=uri(store, ref.key),
                                expected=ref.etag, found=info.etag)
        source[name], sizes[name] = info.etag, info.size
    return _Sources(final, source, sizes, attrs)


@dataclass(frozen=True, slots=True)
class _Upload:
    log_etag: str | None
    log_crc32c: int | None
    verified: Verify


def _finish_upload(ctx: Context, out: StreamUpload, base: int, new: dict[FileRole, str], indexes: Indexes, size: int,
                   digest: str) -> _Upload:
    """Complete the staged ``.log``'s upload, put the staged indexes, and accept them: by the checksum S3
    reports, or (where it reports none) by reading the ``.log`` back against its ``size`` and records
    ``digest`` and its indexes against a rebuild."""
    store, verified = ctx.store, ctx.verify
    log_etag: str | None = None
    try:
        log_etag = out.finish().etag
        store.put(new[FileRole.INDEX], indexes.offset_index, checksum=verified is Verify.CHECKSUM)
        store.put(new[FileRole.TIMEINDEX], indexes.time_index, checksum=verified is Verify.CHECKSUM)
    except ChecksumUnsupported:  # this store does not say what it holds: read it back
        verified = Verify.READ_BACK
        store.put(new[FileRole.INDEX], indexes.offset_index)
        store.put(new[FileRole.TIMEINDEX], indexes.time_index)
    if out.size != size:
        raise ProofError("the staged .log was sent with another size than the rewrite wrote",
                         path=uri(store, new[FileRole.LOG]), expected=size, found=out.size)
    if verified is Verify.READ_BACK:  # what S3 now holds, checked against what the source held
        log_etag = log_etag or store.head(new[FileRole.LOG]).etag
        with store.open(new[FileRole.LOG], if_match=log_etag) as body:
            back = read_back(body, base_offset=base, path=uri(store, new[FileRole.LOG]), size=size,
                             index_interval_bytes=ctx.index_interval_bytes,
                             decompression_limit=ctx.decompression_limit)
        check_read_back(store, new, back.size, back.payload_xxh3, back.indexes.offset_index,
                         back.indexes.time_index, size, digest)
        if back.indexes != indexes:
            raise ProofError("the staged indexes differ from a rebuild of the staged .log",
                             path=uri(store, new[FileRole.LOG]))
    return _Upload(log_etag, out.crc if verified is Verify.CHECKSUM else None, verified)


def _journal(ctx: Context, seg: PlannedSegment, src: _Sources, new: dict[FileRole, str], upload: _Upload,
             recorded: Recorded, new_digest: str, codec_mark: str, txn: _TxnFiles | None = None
             ) -> tuple[Journal, str]:
    """Create the segment's journal entry in state ``staged`` (``If-None-Match``: one operation at a time):
    its files, each backed up, replaced by the staged ones, which take the originals' attributes with our
    marks (the backups get those too)."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    op = ctx.new_op()
    marks = {META_RUN: ctx.run_id, META_OP: op, META_CODEC: codec_mark, META_SOURCE_ETAG: seg.log.etag.strip('"')}
    attrs = {name: src.attrs.get(name, src.attrs[FileRole.LOG]).with_metadata(marks) for name, _ in FILES}
    sources = {name: OpFile(src.final[name], etag, src.sizes.get(name),
                            backup_key(ctx.prefix, ctx.run_id, d, base, sfx), attrs[name])
               for name, sfx in FILES if (etag := src.etags[name])}
    targets = {FileRole.LOG: OpFile(src.final[FileRole.LOG], upload.log_etag, recorded.bytes_after, new[FileRole.LOG],
                                    attrs[FileRole.LOG], crc32c=upload.log_crc32c),
               **{name: OpFile(src.final[name], copy=new[name], attrs=attrs[name]) for name in INDEX_FILES}}
    if txn is not None and txn.source is not None:
        sources[FileRole.TXNINDEX] = txn.source
    if txn is not None and txn.target is not None:
        targets[FileRole.TXNINDEX] = replace(txn.target, attrs=(txn.target.attrs or ObjectAttrs()).with_metadata(marks))
    journal = Journal(OpKind.COMPACT, op, ctx.run_id, JournalState.STAGED, d, (OpSegment(base, sources),),
                      (OpSegment(base, targets),),
                      replace(recorded, replaced=(replaced(ctx, d, base, seg.log.size, seg.log.etag),)),
                      payload_xxh3=new_digest, txn_first=FileRole.TXNINDEX in sources or FileRole.TXNINDEX in targets)
    try:
        etag = store.put_json(journal_key(ctx.prefix, d, base), journal.to_json(), if_none_match=True)
    except PreconditionFailed:
        raise SourceChanged("a journal entry of another operation exists for this segment (recover first)",
                            path=uri(store, journal_key(ctx.prefix, d, base))) from None
    return journal, etag


def recheck_source(ctx: Context, seg: PlannedSegment) -> None:
    """Before a source that failed validation is called invalid: download it again, checked against its
    length and (where it is a plain MD5) its ETag, and validate it again the same way. Raises the
    :class:`~tiering.errors.InvalidDataError` if the object itself is invalid, a ``TransportError`` if the
    bytes do not match the ETag; returns when the fresh copy is valid (the first read was damaged). A run that
    rewrites nothing (a merge, a key-compaction pass) validates every batch as it reads: CRC, decompression,
    each record, offsets in order."""
    assert seg.log is not None
    where = uri(ctx.store, seg.log.key)
    with spool_file(ctx) as copy:
        ctx.store.download(seg.log.key, copy, etag=seg.log.etag)
        copy.seek(0)
        if ctx.options is None:
            verify_segment(copy, path=where, segment_base=seg.base_offset, digests=False,
                           limit=ctx.decompression_limit, keep_batches=False)
            return
        with spool_file(ctx) as sink:
            rewrite_segment(copy, sink, base_offset=seg.base_offset, options=ctx.options, path=where,
                            size=seg.log.size)
