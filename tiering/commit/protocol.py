"""The commit protocol: replace one segment's objects on S3 without ever losing data.

See ``docs/commit-protocol.md`` for the state diagram and the reasoning behind every step. In short, per
segment, under the partition's lease (:mod:`tiering.commit.lease`):

1. **stage**: stream the ``.log`` (``GET If-Match`` the planned ETag) through the rewriter, every batch
   proved as it is written, straight into a multipart upload to ``_tiering/staging/`` (no local copy);
   put the new ``.index`` and ``.timeindex`` beside it, all with their CRC-32C, and accept them when S3
   reports that checksum for what it stored (or, where it reports none, read them back and check them:
   CRCs, every record, the records digest equals the source's, the indexes equal a rebuild); then create
   the segment's journal (``If-None-Match: *``) in state ``staged``, with the staged ``.log``'s ETag;
2. **back up**: server-side copy of the originals to ``_tiering/backup/<run>/`` (metadata, tags, storage
   class and encryption kept); journal state ``backed-up``;
3. **swap**: delete the old ``.index``/``.timeindex`` (``If-Match``), put the new ``.log`` over the old one
   (``If-Match`` the planned ETag: a changed source is never overwritten) by a server-side copy of the
   staged version verified (:class:`Swap`; a store that ignores a copy's ``If-Match`` gets a PUT of it),
   put the new indexes;
4. **finish**: record the segment in the partition's state document, delete the staging objects, then the
   journal.

:func:`finish` is also the recovery: given a journal left by a crash it looks at the final ``.log`` (the
planned original, ours, or someone else's) and rolls forward from wherever the crash happened, or
abandons a segment whose source changed. Rollback of a run is the same swap with the backups as the
new objects.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, BinaryIO, Final, cast

import crc32c

from tiering.commit.lease import LeaseGuard, LeaseLost
from tiering.errors import ConflictError, InvalidDataError, ProofError, StorageError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import TXN_INDEX_SUFFIX
from tiering.kafka.index import Indexes
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.rewrite import RewriteOptions, read_back, rewrite_segment
from tiering.lifecycle.journal import FILES, INDEX_FILES, Journal, NewFiles, TxnIndexSwap
from tiering.lifecycle.vocabulary import Cause, JournalState, OpKind, Pending, Status, Swap, Verify
from tiering.plan.scan import PlannedSegment
from tiering.plan.state import SegmentState, StateBatch, load_state, record_segment, stamped
from tiering.storage.layout import (
    backup_key,
    dir_segment_key,
    journal_dir,
    journal_key,
    normalize_prefix,
    probe_key,
    sibling_key,
    staging_key,
)
from tiering.storage.objects import (
    DEFAULT_PART_BYTES,
    ChecksumUnsupported,
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StreamUpload,
    copy_honours_if_match,
    crc32c_b64,
)

# User metadata on the objects we write to final keys (S3 shows them as x-amz-meta-*).
META_RUN: Final = "tiering-run"
META_OP: Final = "tiering-op"
META_CODEC: Final = "tiering-codec"
META_SOURCE_ETAG: Final = "tiering-source-etag"
META_RESTORED: Final = "tiering-restored-from-run"

COPY_CHUNK: Final = 1 << 20
AUTO_SWAP: Final = "auto"  # the swap setting that learns the mode from the store (:func:`swap_mode`)
REPLACE_ATTEMPTS: Final = 3  # another writer's index beside our .log: deleted and ours put, at most this often

# Segment outcomes (the names other modules use).
COMPACTED: Final = Status.COMPACTED
ROLLED_BACK: Final = Status.ROLLED_BACK
REPAIRED: Final = Status.REPAIRED
SKIPPED: Final = Status.SKIPPED
FAILED: Final = Status.FAILED
ABORTED: Final = Status.ABORTED
SUPERSEDED: Final = Status.SUPERSEDED


class SourceChanged(ConflictError):
    """An object changed (or vanished) since it was planned: the segment is left as it is."""


class SourceGone(SourceChanged):
    """The planned ``.log`` no longer exists (deleted by retention): nothing is left to do for it."""


class TakenOver(ConflictError):
    """Another run took this very operation over (our lease had expired while we were stalled) and changed
    its journal entry: we stop and touch nothing more; the other run finishes or abandons it."""


@dataclass(slots=True)
class SwapChoice:
    """The run's swap mode: given, or learnt from the store the first time a swap needs it (one object shared
    by the contexts of a run's partitions, whose threads ask it at once)."""

    mode: Swap | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


@dataclass(frozen=True, slots=True)
class Context:
    store: ObjectStore
    prefix: str
    run_id: str
    options: RewriteOptions
    work_dir: str | None = None  # where spool files go (the system's temporary directory by default)
    part_bytes: int = DEFAULT_PART_BYTES
    min_savings_ratio: float = 0.0  # a rewrite saving less than this fraction is not swapped in
    state: StateBatch | None = None  # the partition's state changes, written together (else one at a time)
    verify: Verify = Verify.CHECKSUM  # how staged files are accepted (read-back where checksums are unsupported)
    swap: SwapChoice = field(default_factory=SwapChoice)  # how the new .log is put in place
    rebatch: RebatchOptions | None = None  # merge runs of small batches first (set per segment by the plan)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))

    def for_segment(self, seg: PlannedSegment) -> Context:
        """This context with the segment's own codec, level and minimum savings (set by a policy) and its
        re-batching (set by the plan)."""
        ctx = self
        if seg.codec is not None:
            options = replace(self.options, codec=Codec.parse(seg.codec), level=seg.level)
            ctx = replace(self, options=options, min_savings_ratio=seg.min_savings_ratio)
        o = ctx.options
        rebatch = None if seg.rebatch_max_bytes is None else RebatchOptions(
            o.codec, o.level, seg.rebatch_max_bytes, o.decompression_limit)
        return ctx if rebatch == ctx.rebatch else replace(ctx, rebatch=rebatch)


@dataclass(frozen=True, slots=True)
class SegmentResult:
    directory: str
    base_offset: int
    status: Status
    reason: str = ""
    bytes_before: int = 0
    bytes_after: int = 0
    recovered: bool = False
    stats: dict[str, object] | None = None
    error: dict[str, object] | None = None
    run_id: str | None = None  # the run whose operation this is (differs from ours for a recovery)
    encryption: str | None = None  # "aws:kms" or "aws:kms+bucket-key" when the objects use SSE-KMS (costs KMS calls)
    pending: Pending | None = None  # set when the segment is still to do and a later run can do it
    cause: Cause | None = None  # why a skipped segment was left as it is
    seconds: float | None = None  # the segment's time on one core, start to result (the report's compute)

    def to_json(self) -> dict[str, object]:
        doc = {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}
        if self.pending is not None:
            doc["pending"] = self.pending.value
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SegmentResult:
        return cls(str(doc["directory"]), int(doc["base_offset"]), Status(doc["status"]), str(doc.get("reason", "")),
                   int(doc.get("bytes_before", 0)), int(doc.get("bytes_after", 0)), bool(doc.get("recovered", False)),
                   doc.get("stats"), doc.get("error"), doc.get("run_id"), doc.get("encryption"),
                   Pending(doc["pending"]) if doc.get("pending") else None,
                   Cause(doc["cause"]) if doc.get("cause") else None,
                   float(doc["seconds"]) if doc.get("seconds") is not None else None)


def _uri(store: ObjectStore, key: str) -> str:
    return f"s3://{store.bucket}/{key}"


def _spool(ctx: Context) -> BinaryIO:
    return tempfile.TemporaryFile(prefix="tiering-", dir=ctx.work_dir)


@dataclass(frozen=True, slots=True)
class Staged:
    """A journal entry in state ``staged``, with what the segment's result will say once it is swapped and the
    new indexes (verified with the staged files: the swap puts them without reading them back)."""

    journal: Journal
    etag: str
    result: SegmentResult = field(default_factory=lambda: SegmentResult("", 0, Status.STAGED))
    indexes: Indexes | None = None


def stage_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard) -> Staged | SegmentResult:
    """Step 1: rewrite, upload to staging, verify (the CRC-32C S3 reports for what it stored, or by reading
    back, :class:`Verify`), journal. Raises :class:`SourceChanged`
    when the planned objects changed, an InvalidDataError for a corrupt source; returns a skipped
    :class:`SegmentResult` when the rewrite would not save anything. Nothing outside ``_tiering/`` changes."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    src = _sources(ctx, seg)
    log_uri = _uri(store, seg.log.key)
    new = {name: staging_key(ctx.prefix, ctx.run_id, d, base, suffix) for name, suffix in FILES}
    verified = ctx.verify
    # The new .log goes to staging while it is written (a multipart upload, aborted on leaving the block
    # unfinished: an error, or a rewrite not worth keeping).
    with store.writer(new["log"], part_bytes=ctx.part_bytes, checksum=verified is Verify.CHECKSUM) as out:
        try:
            with store.open(seg.log.key, if_match=seg.log.etag) as body:
                result = rewrite_segment(body, cast(BinaryIO, out), base_offset=base, options=ctx.options,
                                         path=log_uri, size=seg.log.size, progress=lambda _: lease.keep_alive(),
                                         rebatch=ctx.rebatch)
        except (PreconditionFailed, ObjectNotFound):
            raise SourceChanged("the .log changed or disappeared after planning", path=log_uri,
                                expected=seg.log.etag) from None
        stats = result.stats
        stats_doc = result.to_json()
        if stats.bytes_out >= stats.bytes_in:
            return SegmentResult(d, base, SKIPPED, f"no savings: {ctx.options.codec.label} would not shrink it "
                                 f"({stats.bytes_in} -> {stats.bytes_out} bytes)", stats.bytes_in, stats.bytes_in,
                                 stats=stats_doc, cause=Cause.NO_SAVINGS)
        if 1 - stats.bytes_out / stats.bytes_in < ctx.min_savings_ratio:
            return SegmentResult(d, base, SKIPPED, f"below min.savings.ratio: {ctx.options.codec.label} saves "
                                 f"{1 - stats.bytes_out / stats.bytes_in:.1%}, the policy asks for "
                                 f"{ctx.min_savings_ratio:.1%}", stats.bytes_in, stats.bytes_in, stats=stats_doc,
                                 cause=Cause.BELOW_MIN_SAVINGS)
        lease.check()
        upload = _finish_upload(ctx, out, base, new, result.indexes, stats.bytes_out, stats.payload_xxh3)
    journal, etag = _journal(
        ctx, seg, src, new, upload, stats.bytes_in, stats.bytes_out, stats.payload_xxh3, ctx.options.codec.label,
        {"codec": ctx.options.codec.label, "level": ctx.options.level,
         # what the original holds (the state keeps it: a rollback checks the backup against it)
         "payload_xxh3": stats.source_payload_xxh3 or stats.payload_xxh3,
         "rebatch_max_bytes": ctx.rebatch.max_bytes if ctx.rebatch is not None else None})
    return Staged(journal, etag, SegmentResult(d, base, COMPACTED, "", stats.bytes_in, stats.bytes_out,
                                               stats={**stats_doc, "verified": str(upload.verified)},
                                               run_id=ctx.run_id), result.indexes)


def stage_cleaned(ctx: Context, seg: PlannedSegment, log: BinaryIO, size: int, indexes: Indexes,
                  entry: Mapping[str, object], lease: LeaseGuard, txn_index: bytes | None = None) -> Staged:
    """Step 1 for a ``.log`` made elsewhere (a key-compaction pass): ``log`` holds its ``size`` bytes and
    ``indexes`` are the ones made with it. It is read back here (CRCs, every record, offsets) and its indexes
    must equal a rebuild; the source is read once more for its records digest (a rollback checks the backup
    against it); then staged, verified and journalled as :func:`stage_segment` does. ``entry``: what the
    journal entry (and then the state) records beside the sizes and digests. ``txn_index``: the segment's new
    ``.txnindex`` (empty: removed), when it loses entries (:class:`TxnIndexSwap`); None: left as it is."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    src = _sources(ctx, seg)
    log_uri = _uri(store, seg.log.key)
    limits = {"index_interval_bytes": ctx.options.index_interval_bytes,
              "decompression_limit": ctx.options.decompression_limit}
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
    with store.writer(new["log"], part_bytes=ctx.part_bytes, checksum=ctx.verify is Verify.CHECKSUM) as out:
        while chunk := log.read(COPY_CHUNK):
            out.write(chunk)
            lease.keep_alive()
        lease.check()
        upload = _finish_upload(ctx, out, base, new, indexes, size, made.payload_xxh3)
    txn = None if txn_index is None else _stage_txn_index(ctx, seg, txn_index)
    journal, etag = _journal(ctx, seg, src, new, upload, original.size, size, made.payload_xxh3, "keys",
                             {**entry, "payload_xxh3": original.payload_xxh3}, txn)
    return Staged(journal, etag, SegmentResult(d, base, COMPACTED, "", original.size, size, run_id=ctx.run_id),
                  indexes)


def _stage_txn_index(ctx: Context, seg: PlannedSegment, data: bytes) -> TxnIndexSwap:
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
        raise SourceChanged("the .txnindex changed after planning", path=_uri(store, final), expected=planned,
                            found=etag)
    new = staging_key(ctx.prefix, ctx.run_id, d, base, TXN_INDEX_SUFFIX) if data else None
    if new is not None:
        store.put(new, data)
    return TxnIndexSwap(final, etag, new, backup_key(ctx.prefix, ctx.run_id, d, base, TXN_INDEX_SUFFIX) if etag
                        else None, True, attrs)


@dataclass(frozen=True, slots=True)
class _Sources:
    """The segment's final keys, the ETags and sizes they had when checked, and their attributes."""

    final: dict[str, str]
    etags: dict[str, str | None]
    sizes: dict[str, int]
    attrs: dict[str, ObjectAttrs]


def _sources(ctx: Context, seg: PlannedSegment) -> _Sources:
    """The segment's files as they are now, each checked against the plan (:class:`SourceChanged` else)."""
    store = ctx.store
    assert seg.log is not None
    attrs: dict[str, ObjectAttrs] = {}
    source: dict[str, str | None] = {}
    sizes: dict[str, int] = {}
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
            gone = SourceGone if name == "log" else SourceChanged
            raise gone(f"the {name} file disappeared after planning", path=_uri(store, ref.key)) from None
        if ref is None:
            raise SourceChanged(f"the {name} file appeared after planning", path=_uri(store, final[name]),
                                expected="no object", found=info.etag)
        if info.etag != ref.etag:
            raise SourceChanged(f"the {name} file changed after planning", path=_uri(store, ref.key),
                                expected=ref.etag, found=info.etag)
        source[name], sizes[name] = info.etag, info.size
    return _Sources(final, source, sizes, attrs)


@dataclass(frozen=True, slots=True)
class _Upload:
    log_etag: str | None
    log_crc32c: int | None
    verified: Verify


def _finish_upload(ctx: Context, out: StreamUpload, base: int, new: dict[str, str], indexes: Indexes, size: int,
                   digest: str) -> _Upload:
    """Complete the staged ``.log``'s upload, put the staged indexes, and accept them: by the checksum S3
    reports, or (where it reports none) by reading the ``.log`` back against its ``size`` and records
    ``digest`` and its indexes against a rebuild."""
    store, verified = ctx.store, ctx.verify
    log_etag: str | None = None
    try:
        log_etag = out.finish().etag
        store.put(new["index"], indexes.offset_index, checksum=verified is Verify.CHECKSUM)
        store.put(new["timeindex"], indexes.time_index, checksum=verified is Verify.CHECKSUM)
    except ChecksumUnsupported:  # this store does not say what it holds: read it back
        verified = Verify.READ_BACK
        store.put(new["index"], indexes.offset_index)
        store.put(new["timeindex"], indexes.time_index)
    if out.size != size:
        raise ProofError("the staged .log was sent with another size than the rewrite wrote",
                         path=_uri(store, new["log"]), expected=size, found=out.size)
    if verified is Verify.READ_BACK:  # what S3 now holds, checked against what the source held
        log_etag = log_etag or store.head(new["log"]).etag
        with store.open(new["log"], if_match=log_etag) as body:
            back = read_back(body, base_offset=base, path=_uri(store, new["log"]), size=size,
                             index_interval_bytes=ctx.options.index_interval_bytes,
                             decompression_limit=ctx.options.decompression_limit)
        _check_read_back(store, new, back.size, back.payload_xxh3, back.indexes.offset_index,
                         back.indexes.time_index, size, digest)
        if back.indexes != indexes:
            raise ProofError("the staged indexes differ from a rebuild of the staged .log",
                             path=_uri(store, new["log"]))
    return _Upload(log_etag, out.crc if verified is Verify.CHECKSUM else None, verified)


def _journal(ctx: Context, seg: PlannedSegment, src: _Sources, new: dict[str, str], upload: _Upload,
             bytes_in: int, bytes_out: int, new_digest: str, codec_mark: str,
             entry: Mapping[str, object], txn: TxnIndexSwap | None = None) -> tuple[Journal, str]:
    """Create the segment's journal entry in state ``staged`` (``If-None-Match``: one operation at a time)."""
    store, base, d = ctx.store, seg.base_offset, seg.directory
    assert seg.log is not None
    op = f"{ctx.run_id}.{secrets.token_hex(4)}"
    marks = {META_RUN: ctx.run_id, META_OP: op, META_CODEC: codec_mark, META_SOURCE_ETAG: seg.log.etag.strip('"')}
    source = src.etags
    journal = Journal(
        OpKind.COMPACT, op, ctx.run_id, JournalState.STAGED, d, base, src.final, source,
        NewFiles(new["log"], bytes_out, new["index"], new["timeindex"], upload.log_etag),
        {name: src.attrs.get(name, src.attrs["log"]).with_metadata(marks) for name, _ in FILES}, src.sizes,
        {name: backup_key(ctx.prefix, ctx.run_id, d, base, sfx) if source[name] else None for name, sfx in FILES},
        new_digest,
        {"run_id": ctx.run_id, "source_log_etag": seg.log.etag, "bytes_before": bytes_in, "bytes_after": bytes_out,
         **entry},
        log_crc32c=upload.log_crc32c, txn=None if txn is None else replace(txn, attrs=txn.attrs.with_metadata(marks)))
    try:
        etag = store.put_json(journal_key(ctx.prefix, d, base), journal.to_json(), if_none_match=True)
    except PreconditionFailed:
        raise SourceChanged("a journal entry of another operation exists for this segment (recover first)",
                            path=_uri(store, journal_key(ctx.prefix, d, base))) from None
    return journal, etag


def recheck_source(ctx: Context, seg: PlannedSegment) -> None:
    """Before a source that failed validation is called invalid: download it again, checked against its
    length and (where it is a plain MD5) its ETag, and validate it again the same way. Raises the
    :class:`~tiering.errors.InvalidDataError` if the object itself is invalid, a ``TransportError`` if the
    bytes do not match the ETag; returns when the fresh copy is valid (the first read was damaged)."""
    assert seg.log is not None
    with _spool(ctx) as copy, _spool(ctx) as sink:
        ctx.store.download(seg.log.key, copy, etag=seg.log.etag)
        copy.seek(0)
        rewrite_segment(copy, sink, base_offset=seg.base_offset, options=ctx.options,
                        path=_uri(ctx.store, seg.log.key), size=seg.log.size)


def _check_read_back(store: ObjectStore, new: dict[str, str], size: int, digest: str, offset_index: bytes,
                     time_index: bytes, expected_size: int, expected_digest: str) -> None:
    where = _uri(store, new["log"])
    if size != expected_size:
        raise ProofError("the staged .log read back has another size", path=where, expected=expected_size,
                         found=size)
    if digest != expected_digest:
        raise ProofError("the staged .log does not hold the source's records", path=where,
                         expected=f"records xxh3 {expected_digest}", found=digest)
    for name, want in (("index", offset_index), ("timeindex", time_index)):
        got = store.get(new[name])
        if got != want:
            raise ProofError(f"the staged .{name} is not the rebuild of the staged .log", path=_uri(store, new[name]),
                             expected=f"{len(want)} bytes", found=f"{len(got)} bytes")


def _download_verified(ctx: Context, journal: Journal) -> BinaryIO:
    """The new ``.log`` of a journal entry (staged, or a backup), copied to a spool file and checked again:
    against the CRC-32C it was staged with when S3 reported it (its records were proved as it was written,
    and S3 holds those very bytes), else by decoding it (every CRC and record, the records digest)."""
    store, key = ctx.store, journal.new.log
    spool = _spool(ctx)
    try:
        if journal.log_crc32c is not None and ctx.verify is Verify.CHECKSUM:
            crc = 0
            with store.open(key, if_match=journal.new.log_etag) as body:
                while chunk := body.read(COPY_CHUNK):
                    spool.write(chunk)
                    crc = crc32c.crc32c(chunk, crc)
            if crc != journal.log_crc32c:
                raise ProofError("the staged .log downloaded is not the one staged", path=_uri(store, key),
                                 expected=f"CRC-32C {crc32c_b64(journal.log_crc32c)}", found=crc32c_b64(crc))
            spool.seek(0)
            return spool
        with store.open(key, if_match=journal.new.log_etag) as body:
            shutil.copyfileobj(body, spool, COPY_CHUNK)
        spool.seek(0)
        back = read_back(spool, base_offset=journal.base_offset, path=_uri(store, key),
                         decompression_limit=ctx.options.decompression_limit)
        expected = journal.payload_xxh3
        if expected and back.payload_xxh3 != expected:
            raise ProofError("the object to put in place does not hold the expected records", path=_uri(store, key),
                             expected=f"records xxh3 {expected}", found=back.payload_xxh3)
        spool.seek(0)
        return spool
    except PreconditionFailed:  # the GET is pinned to the ETag verified at staging: another object is there
        spool.close()
        raise ProofError("the staged .log is not the one verified", path=_uri(store, key),
                         expected=f"ETag {journal.new.log_etag}") from None
    except BaseException:
        spool.close()
        raise


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


def _copy_source(ctx: Context, journal: Journal) -> str:
    """The ETag of the new ``.log`` to copy into place, checked first: a staged copy must be the very version
    verified when it was staged (its ETag and size); a backup (a rollback) is decoded here, every CRC and
    record, and must hold the records the state entry names. The copy is then held to that ETag."""
    store, key = ctx.store, journal.new.log
    info = store.head(key)
    if journal.new.log_etag is not None:
        if info.etag.strip('"') != journal.new.log_etag.strip('"') or info.size != journal.new.log_size:
            raise ProofError("the staged .log is not the one verified", path=_uri(store, key),
                             expected=f"ETag {journal.new.log_etag}, {journal.new.log_size} bytes",
                             found=f"ETag {info.etag}, {info.size} bytes")
        return info.etag
    with store.open(key, if_match=info.etag) as body:
        back = read_back(body, base_offset=journal.base_offset, path=_uri(store, key), size=info.size,
                         decompression_limit=ctx.options.decompression_limit)
    if journal.payload_xxh3 and back.payload_xxh3 != journal.payload_xxh3:
        raise ProofError("the object to put in place does not hold the expected records", path=_uri(store, key),
                         expected=f"records xxh3 {journal.payload_xxh3}", found=back.payload_xxh3)
    return info.etag


def finish(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard, indexes: Indexes | None = None
           ) -> SegmentResult:
    """Steps 2-4 (or the rest of them, after a crash): idempotent, and safe to call with any journal entry.
    ``indexes``: the staged indexes' bytes, when the caller staged them (else they are read from staging)."""
    store = ctx.store
    d, base, kind = journal.directory, journal.base_offset, journal.kind
    final, source, entry = journal.final, journal.source, journal.entry
    done = SegmentResult(d, base, COMPACTED if kind is OpKind.COMPACT else ROLLED_BACK, "",
                         int(entry.get("bytes_before", 0)), int(entry.get("bytes_after", 0)),
                         run_id=journal.run_id, encryption=_kms(journal.attrs["log"].headers))
    try:
        current, _ = store.describe(final["log"])
    except ObjectNotFound:
        return _abandon(ctx, journal, etag, "the .log disappeared (deleted by retention?): nothing to replace",
                        pending=None)
    swapped = current.metadata.get(META_OP) == journal.op
    if not swapped and current.etag != source["log"]:
        return _abandon(ctx, journal, etag, "the .log changed after planning: the new object is left untouched")
    if not swapped:
        mode = swap_mode(ctx)
        spool: BinaryIO | None = None
        try:
            try:
                staged = _copy_source(ctx, journal) if mode is Swap.COPY else None
                spool = _download_verified(ctx, journal) if mode is Swap.PUT else None
            except ObjectNotFound:
                raise SourceChanged("the staged copy is gone (an interrupted cleanup of this operation)",
                                    path=_uri(store, journal.new.log)) from None
            if journal.state is JournalState.STAGED and journal.backup:
                _back_up(ctx, journal)
                journal = journal.advanced(JournalState.BACKED_UP)
                try:
                    etag = store.put_json(journal_key(ctx.prefix, d, base), journal.to_json(), if_match=etag)
                except (PreconditionFailed, ObjectNotFound):
                    raise TakenOver("another run took this operation over while it was stalled (its lease had "
                                    "expired): left to that run", path=_uri(store, final["log"])) from None
            lease.check()
            if journal.txn is not None and journal.txn.before_log:
                _swap_txn_index(ctx, journal)
            for name in INDEX_FILES:
                if source[name]:
                    try:
                        store.delete(final[name], if_match=source[name], missing_ok=True)
                    except PreconditionFailed:
                        _still_ours(ctx, journal, etag)
                        raise SourceChanged(f"the .{name} changed after planning", path=_uri(store, final[name]),
                                            expected=source[name]) from None
            lease.check()
            try:
                if staged is not None:
                    current = store.copy_over(journal.new.log, final["log"], source_etag=staged,
                                              if_match=str(source["log"]), attrs=journal.attrs["log"],
                                              size=journal.new.log_size)
                else:
                    assert spool is not None
                    spool.seek(0)
                    current = store.put_object(final["log"], spool, journal.attrs["log"], if_match=source["log"])
            except ObjectNotFound:
                if staged is not None and _exists(ctx, final["log"]):
                    raise SourceChanged("the staged copy is gone (an interrupted cleanup of this operation)",
                                        path=_uri(store, journal.new.log)) from None
                raise SourceGone("the .log disappeared (deleted by retention?) before the swap",
                                 path=_uri(store, final["log"])) from None
            except PreconditionFailed:
                # Either someone replaced the .log (or the staged copy), or this write happened and only its
                # answer was lost (the retry then fails its own condition): our op id on the object tells.
                try:
                    current, _ = store.describe(final["log"])
                except ObjectNotFound:
                    raise SourceGone("the .log disappeared (deleted by retention?) before the swap",
                                     path=_uri(store, final["log"])) from None
                if current.metadata.get(META_OP) != journal.op:
                    return _abandon(ctx, journal, etag, "the .log changed after planning: the new object is "
                                    "left untouched")
        except TakenOver as e:
            return SegmentResult(d, base, ABORTED, e.message, run_id=journal.run_id, pending=Pending.BUSY,
                                 cause=Cause.BUSY)
        except SourceChanged as e:
            return _abandon(ctx, journal, etag, e.message,
                            pending=None if isinstance(e, SourceGone) else Pending.BUSY)
        finally:
            if spool is not None:
                spool.close()
    # The new .log is in place (maybe by a run that crashed): put its indexes where none is (another
    # writer's index is never overwritten), check that the .log is still ours, then forget the journal.
    etags = {"log_etag": current.etag}
    superseded = ""
    if journal.txn is not None and not journal.txn.before_log:
        try:
            _swap_txn_index(ctx, journal)
        except SourceChanged as e:
            superseded = e.message
    for name in INDEX_FILES:
        if journal.new.key(name) and not superseded:
            put = _put_index(ctx, journal, name, indexes)
            for _ in range(REPLACE_ATTEMPTS):
                if put is not None or not _log_is_ours(ctx, journal):
                    break
                put = _replace_foreign_index(ctx, journal, name, indexes)
            if put is None and _log_is_ours(ctx, journal):  # still a foreign index beside our .log: the journal
                # stays, so the next run that covers the partition tries again
                return SegmentResult(d, base, FAILED, f"another writer keeps putting a .{name} beside our .log: "
                                     "left in flight for the next run", run_id=journal.run_id,
                                     pending=Pending.TRANSIENT, cause=Cause.BUSY)
            if put is None:
                superseded = f"another writer put a .{name} beside our .log after the swap"
            else:
                etags[f"{name}_etag"] = put
    if not superseded and not _log_is_ours(ctx, journal):
        superseded = "another writer replaced the .log after our swap"
    if superseded:
        return _superseded(ctx, journal, etag, etags, superseded)

    def forget() -> None:
        with contextlib.suppress(TakenOver):  # done all the same: the run that took the entry over forgets it
            _forget(ctx, journal, etag)

    record_state(ctx, d, base, stamped(SegmentState.from_json({**entry, **etags})) if kind is OpKind.COMPACT
                 else None, then=forget)
    return done


def record_state(ctx: Context, directory: str, base: int, entry: SegmentState | None,
                 then: Callable[[], None] | None = None) -> None:
    """Set (None: remove) a segment's state entry, then run ``then``: now, or with the partition's batch."""
    if ctx.state is not None and ctx.state.directory == directory:
        ctx.state.put(base, entry, then)
        return
    record_segment(ctx.store, ctx.prefix, directory, base, entry)
    if then is not None:
        then()


def state_entry(ctx: Context, directory: str, base: int) -> SegmentState | None:
    """A segment's state entry, the partition's batch's pending change included."""
    if ctx.state is not None and ctx.state.directory == directory:
        return ctx.state.get(base)
    return load_state(ctx.store, ctx.prefix, directory).get(base)


def _log_is_ours(ctx: Context, journal: Journal) -> bool:
    try:
        return ctx.store.head(journal.final["log"]).metadata.get(META_OP) == journal.op
    except ObjectNotFound:
        return False


def _replace_foreign_index(ctx: Context, journal: Journal, name: str, indexes: Indexes | None) -> str | None:
    """Another writer's index sits beside OUR ``.log`` (e.g. a mirror re-uploading a byte-identical original:
    its ``.log`` kept the planned ETag, so our swap went through, and its index arrived after our delete).
    It cannot be valid for our bytes, and a broker trusts a present index: delete it (``If-Match`` the ETag
    seen; the original is in the backup) and put ours. None if yet another index arrives meanwhile."""
    key = journal.final[name]
    try:
        there = ctx.store.head(key)
        ctx.store.delete(key, if_match=there.etag, missing_ok=True)
    except (ObjectNotFound, PreconditionFailed):
        pass  # gone already, or replaced again: the put below decides
    return _put_index(ctx, journal, name, indexes)


def finish_one(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard, *,
               taken_from: str | None = None, indexes: Indexes | None = None) -> SegmentResult:
    """:func:`finish` with every per-segment problem as a result (the partition's other entries go on); a lost
    lease still stops the partition. ``taken_from``: the run whose staged operation this run took over."""
    try:
        return finish(ctx, journal, etag, lease, indexes)
    except LeaseLost:
        raise
    except (ProofError, InvalidDataError) as e:  # a staged or backup copy that does not verify: nothing swapped
        failed = SegmentResult(journal.directory, journal.base_offset, FAILED, f"proof failed, left in flight: {e}",
                               error=e.to_dict(), run_id=journal.run_id, cause=Cause.PROOF_FAILED)
        if journal.kind is not OpKind.COMPACT or journal.state is not JournalState.STAGED:
            return failed
        # Nothing final changed: drop the staged copy and its journal, so that the segment is staged anew
        # instead of every later run meeting the same bad copy.
        dropped = _abandon(ctx, journal, etag, "", pending=None)
        if dropped.pending is not None:  # another run took the entry over in between: left to it
            return dropped
        if taken_from is not None:  # another run's copy: this run compacts the segment anew
            return SegmentResult(journal.directory, journal.base_offset, ABORTED, f"the copy run {taken_from} "
                                 f"staged does not verify, dropped; the segment is compacted anew: {e}",
                                 error=e.to_dict(), run_id=taken_from, cause=Cause.ABANDONED)
        return replace(failed, reason=f"proof failed, the staged copy dropped (nothing final changed): {e}")
    except StorageError as e:
        return SegmentResult(journal.directory, journal.base_offset, FAILED, f"S3 error, left in flight: {e}",
                             error=e.to_dict(), run_id=journal.run_id,
                             pending=Pending.TRANSIENT if e.retryable else None,
                             cause=Cause.TRANSIENT if e.retryable else Cause.REFUSED)


def _still_ours(ctx: Context, journal: Journal, etag: str) -> None:
    """:class:`TakenOver` unless the journal entry is still the one we last wrote."""
    key = journal_key(ctx.prefix, journal.directory, journal.base_offset)
    try:
        _, there = ctx.store.get_json(key)
    except ObjectNotFound:
        there = None
    if there != etag:
        raise TakenOver("another run took this operation over while it was stalled (its lease had expired): left "
                        "to that run", path=_uri(ctx.store, key))


def _forget(ctx: Context, journal: Journal, etag: str) -> None:
    """Delete a finished (or given up) operation's journal entry, then its staging objects: a crash in between
    leaves only staging objects that no journal names (cleanup removes them), never a journal whose staged
    copy is gone. :class:`TakenOver` if the entry is no longer the one we wrote (nothing is deleted then)."""
    try:
        ctx.store.delete(journal_key(ctx.prefix, journal.directory, journal.base_offset), if_match=etag,
                         missing_ok=True)
    except PreconditionFailed:
        raise TakenOver("another run took this operation over while it was stalled (its lease had expired): left "
                        "to that run", path=_uri(ctx.store, journal.final["log"])) from None
    if journal.kind is OpKind.COMPACT:
        for key in journal.new.present():
            ctx.store.delete(key, missing_ok=True)
        if journal.txn is not None and journal.txn.new is not None:
            ctx.store.delete(journal.txn.new, missing_ok=True)


def _superseded(ctx: Context, journal: Journal, etag: str, ours: dict[str, str], why: str) -> SegmentResult:
    """Another writer replaced the segment after our ``.log`` swap: remove the indexes we put (``If-Match``:
    only ours; a broker rebuilds a missing index, but would trust ours beside a ``.log`` they do not belong
    to), leave every object of the other writer as it is, and forget the operation. The originals stay
    in the backup for the grace period."""
    for name in INDEX_FILES:
        if f"{name}_etag" in ours:
            with contextlib.suppress(PreconditionFailed):  # replaced by the other writer already: theirs
                ctx.store.delete(journal.final[name], if_match=ours[f"{name}_etag"], missing_ok=True)
    with contextlib.suppress(TakenOver):
        _forget(ctx, journal, etag)
    return SegmentResult(journal.directory, journal.base_offset, SUPERSEDED,
                         f"{why}: its objects are left as they are", run_id=journal.run_id, pending=Pending.BUSY,
                         cause=Cause.REPLACED)


def _kms(headers: dict[str, Any]) -> str | None:
    if headers.get("ServerSideEncryption") != "aws:kms":
        return None
    return "aws:kms+bucket-key" if headers.get("BucketKeyEnabled") else "aws:kms"


def _put_index(ctx: Context, journal: Journal, name: str, indexes: Indexes | None = None) -> str | None:
    """Put one new index in place where no index is (``If-None-Match``: the old one was deleted before the
    swap) unless a crashed run of this operation already did; its ETag. None when another writer's index
    is there: it is left alone."""
    store, final, op = ctx.store, journal.final, journal.op
    try:
        there = store.head(final[name])
        return there.etag if there.metadata.get(META_OP) == op else None
    except ObjectNotFound:
        pass
    staged = journal.new.key(name)
    assert staged is not None
    try:
        if indexes is not None:
            data = indexes.offset_index if name == "index" else indexes.time_index
        else:
            data = store.get(staged)
    except ObjectNotFound:  # only if the staging copy went first: rebuild from the .log in place
        with store.open(final["log"]) as body:
            rebuilt = read_back(body, base_offset=journal.base_offset, path=_uri(store, final["log"]),
                                index_interval_bytes=ctx.options.index_interval_bytes,
                                decompression_limit=ctx.options.decompression_limit).indexes
        data = rebuilt.offset_index if name == "index" else rebuilt.time_index
    try:
        return store.put_object(final[name], data, journal.attrs[name], if_none_match=True).etag
    except PreconditionFailed:
        # Another writer's index, or this very PUT whose answer was lost (the retry then fails its own
        # condition): our op id tells them apart.
        there = store.head(final[name])
        return there.etag if there.metadata.get(META_OP) == op else None


def _back_up(ctx: Context, journal: Journal) -> None:
    """Server-side copies of the originals. moto ignores CopySourceIfMatch, so the source ETag is checked
    again after the copy: a source that changed meanwhile stops the swap before anything is replaced."""
    store, final, source, backup = ctx.store, journal.final, journal.source, journal.backup or {}
    for name, _ in FILES:
        etag, target = source[name], backup.get(name)
        if not etag or not target:
            continue
        try:
            store.copy(final[name], target, source_etag=etag, attrs=journal.attrs[name])
            copied, after = store.head(target), store.head(final[name])
        except (PreconditionFailed, ObjectNotFound):
            raise SourceChanged(f"the {name} file changed while it was backed up",
                                path=_uri(store, final[name])) from None
        if after.etag != etag or copied.size != journal.source_sizes[name]:
            raise SourceChanged(f"the {name} file changed while it was backed up", path=_uri(store, final[name]),
                                expected=etag, found=after.etag)
    txn = journal.txn
    if txn is not None and txn.source and txn.backup:
        try:
            _, attrs = store.describe(txn.final)
            store.copy(txn.final, txn.backup, source_etag=txn.source, attrs=attrs)
            after = store.head(txn.final)
        except (PreconditionFailed, ObjectNotFound):
            raise SourceChanged("the .txnindex changed while it was backed up", path=_uri(store, txn.final)) from None
        if after.etag != txn.source:
            raise SourceChanged("the .txnindex changed while it was backed up", path=_uri(store, txn.final),
                                expected=txn.source, found=after.etag)


def _swap_txn_index(ctx: Context, journal: Journal) -> None:
    """Put the journal's ``.txnindex`` in place (or remove it), unless a crashed run of this operation did;
    :class:`SourceChanged` when another writer's is there."""
    store, txn = ctx.store, journal.txn
    assert txn is not None
    try:
        there: ObjectInfo | None = store.head(txn.final)
    except ObjectNotFound:
        there = None
    if there is not None and there.metadata.get(META_OP) == journal.op:
        return
    if there is None and txn.new is None:
        return  # removed (by us, or by a crashed run of this operation)
    if (there.etag if there is not None else None) != txn.source:
        raise SourceChanged("the .txnindex changed after planning", path=_uri(store, txn.final),
                            expected=txn.source or "no object", found=there.etag if there else "no object")
    try:
        if txn.new is None:
            store.delete(txn.final, if_match=txn.source, missing_ok=True)
            return
        try:
            data = store.get(txn.new)
        except ObjectNotFound:
            raise SourceChanged("the staged .txnindex is gone (an interrupted cleanup of this operation)",
                                path=_uri(store, txn.new)) from None
        if txn.source:
            store.put_object(txn.final, data, txn.attrs, if_match=txn.source)
        else:
            store.put_object(txn.final, data, txn.attrs, if_none_match=True)
    except PreconditionFailed:  # another writer's, or this very request whose answer was lost
        with contextlib.suppress(ObjectNotFound):
            if store.head(txn.final).metadata.get(META_OP) == journal.op:
                return
        raise SourceChanged("the .txnindex changed after planning", path=_uri(store, txn.final)) from None


def _put_back_txn_index(ctx: Context, journal: Journal) -> None:
    """An abandoned operation that had put its ``.txnindex`` in before the ``.log``: while the original
    ``.log`` is in place, the original ``.txnindex`` goes back beside it (from its backup; or, if there was
    none, ours is removed). Beside a ``.log`` another writer put there, the ``.txnindex`` is that writer's
    business (either one could be wrong for its ``.log``): left as it is; with the ``.log`` gone, ours is
    removed."""
    store, txn = ctx.store, journal.txn
    assert txn is not None
    try:
        there = store.head(txn.final)
    except ObjectNotFound:
        there = None
    ours = there is not None and there.metadata.get(META_OP) == journal.op
    removed = there is None and txn.new is None and txn.source is not None
    if not ours and not removed:
        return
    try:
        log_etag: str | None = store.head(journal.final["log"]).etag
    except ObjectNotFound:
        log_etag = None
    if log_etag is None:  # deleted by retention: no .txnindex of ours stays behind
        if ours and there is not None:
            with contextlib.suppress(PreconditionFailed):
                store.delete(txn.final, if_match=there.etag, missing_ok=True)
        return
    if log_etag != journal.source["log"]:
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


def _abandon(ctx: Context, journal: Journal, etag: str, reason: str,
             pending: Pending | None = Pending.BUSY) -> SegmentResult:
    """Give up a segment whose ``.log`` is not (or no longer) ours: drop staging and the journal; backups stay.
    Indexes this operation had put beside a ``.log`` that has since been replaced are removed (only ours)."""
    store = ctx.store
    for name in INDEX_FILES:
        try:
            there = store.head(journal.final[name])
        except ObjectNotFound:
            continue
        if there.metadata.get(META_OP) == journal.op:
            with contextlib.suppress(PreconditionFailed):
                store.delete(journal.final[name], if_match=there.etag, missing_ok=True)
    if journal.txn is not None and journal.txn.before_log:
        _put_back_txn_index(ctx, journal)
    try:
        _forget(ctx, journal, etag)
    except TakenOver as e:
        return SegmentResult(journal.directory, journal.base_offset, ABORTED, e.message, run_id=journal.run_id,
                             pending=Pending.BUSY, cause=Cause.BUSY)
    return SegmentResult(journal.directory, journal.base_offset, ABORTED, reason, run_id=journal.run_id,
                         pending=pending, cause=Cause.BUSY if pending is Pending.BUSY else Cause.ABANDONED)


def pending_journals(store: ObjectStore, prefix: str, directory: str | None = None) -> Iterator[tuple[Journal, str]]:
    """Journal entries left in flight (by a crash, or by a stage step waiting for its commit)."""
    under = journal_dir(prefix, directory)
    for info in store.list(under):
        try:
            doc, etag = store.get_json(info.key)
        except ObjectNotFound:
            continue  # finished in between
        yield Journal.from_json(doc, where=_uri(store, info.key)), etag


def recover_partition(ctx: Context, directory: str, lease: LeaseGuard) -> list[SegmentResult]:
    """Finish (or abandon) every journal entry of the partition; the caller holds its lease.

    A compaction of ANOTHER run still ``staged`` (nothing final changed, no backup made yet) is never rolled
    forward into that run's backup keys: that run may only be stalled, with a backup copy in flight to the
    keys its journal names, and a copy landing after our swap would put the new ``.log`` where the original
    must be kept (S3 refuses such a copy by its ``x-amz-copy-source-if-match``; moto does not). Here it is
    abandoned and its segment planned again like any other (:func:`iter_recover` can take it over instead).
    Entries of this run (a retry, or the pipeline's commit step) and entries past their backup are
    finished."""
    return list(iter_recover(ctx, directory, lease))


def iter_recover(ctx: Context, directory: str, lease: LeaseGuard, *, commit: bool = True,
                 adoptable: Callable[[Journal], bool] | None = None) -> Iterator[SegmentResult]:
    """:func:`recover_partition`, one result at a time (the partition's state batch is written between two
    operations when it is full, so that a failed write stops the work after the results already given).

    A compaction another run left ``staged`` is taken over (:func:`adopt`) when ``adoptable`` says this run
    would stage the same (same source, codec and level): its staged files are used instead of being made
    again; with ``commit`` it is finished at once, else left staged for this run's commit step. Otherwise it
    is abandoned and the segment compacted anew."""
    for journal, etag in list(pending_journals(ctx.store, ctx.prefix, directory)):
        if ctx.state is not None and ctx.state.full:
            ctx.state.flush(lease.check)
        theirs = journal.run_id != ctx.run_id
        if journal.kind is OpKind.COMPACT and journal.state is JournalState.STAGED and theirs:
            if adoptable is not None and adoptable(journal):
                result = _adopted(ctx, journal, etag, lease, commit=commit)
            else:
                result = _abandon(ctx, journal, etag, f"interrupted before its backup (run {journal.run_id}): "
                                  "abandoned; the segment is compacted anew", pending=None)
        else:
            result = finish_one(ctx, journal, etag, lease)
        # A recovery: another run's operation finished or dropped here. Not one: this run's own (a retry, the
        # commit step) or one it took over (its results are this run's, like those of what it stages).
        yield replace(result, recovered=(result.run_id or journal.run_id) != ctx.run_id)


def adopt(ctx: Context, journal: Journal, etag: str) -> tuple[Journal, str]:
    """Take over a compaction another run staged and left (nothing final changed, no backup made yet): the
    same staged files, with this run's operation id, backup keys and state entry, written over that run's
    journal entry if it is still the one read (``If-Match``). A stalled owner then finds its entry changed
    and stops, and whatever it still copies goes to its own backup keys, which no journal names any more.
    :class:`TakenOver` if the entry changed in between."""
    d, base = journal.directory, journal.base_offset
    op = f"{ctx.run_id}.{secrets.token_hex(4)}"
    marks = {META_RUN: ctx.run_id, META_OP: op}
    taken = replace(journal, op=op, run_id=ctx.run_id,
                    attrs={name: a.with_metadata(marks) for name, a in journal.attrs.items()},
                    backup={name: backup_key(ctx.prefix, ctx.run_id, d, base, sfx) if journal.source[name] else None
                            for name, sfx in FILES},
                    entry={**journal.entry, "run_id": ctx.run_id})
    try:
        return taken, ctx.store.put_json(journal_key(ctx.prefix, d, base), taken.to_json(), if_match=etag)
    except (PreconditionFailed, ObjectNotFound):
        raise TakenOver("another run took this operation over first: left to that run",
                        path=_uri(ctx.store, journal_key(ctx.prefix, d, base))) from None


def _adopted(ctx: Context, journal: Journal, etag: str, lease: LeaseGuard, *, commit: bool) -> SegmentResult:
    lease.check()
    try:
        staged = ctx.store.head(journal.new.log)
    except ObjectNotFound:
        staged = None
    if staged is None or staged.size != journal.new.log_size:
        return _abandon(ctx, journal, etag, f"interrupted before its backup (run {journal.run_id}), its staged "
                        ".log gone or other: abandoned; the segment is compacted anew", pending=None)
    try:
        taken, etag = adopt(ctx, journal, etag)
    except TakenOver as e:
        return SegmentResult(journal.directory, journal.base_offset, ABORTED, e.message, run_id=journal.run_id,
                             pending=Pending.BUSY, cause=Cause.BUSY)
    why = f"staged by run {journal.run_id}, which did not finish it: taken over"
    if commit:
        result = finish_one(ctx, taken, etag, lease, taken_from=journal.run_id)
        return replace(result, reason=why) if result.status is COMPACTED else result
    return SegmentResult(taken.directory, taken.base_offset, Status.STAGED, why,
                         int(taken.entry.get("bytes_before", 0)), int(taken.entry.get("bytes_after", 0)),
                         run_id=ctx.run_id, encryption=_kms(taken.attrs["log"].headers))


def repair_segment(ctx: Context, seg: PlannedSegment, lease: LeaseGuard) -> SegmentResult:
    """Remove the indexes we rebuilt for a ``.log`` that has since been replaced (``If-Match``: only ours)."""
    lease.check()
    for ref in (seg.index, seg.timeindex):
        if ref is not None:
            try:
                ctx.store.delete(ref.key, if_match=ref.etag, missing_ok=True)
            except PreconditionFailed:
                raise SourceChanged("an index changed after planning", path=_uri(ctx.store, ref.key)) from None
    record_state(ctx, seg.directory, seg.base_offset, None)
    return SegmentResult(seg.directory, seg.base_offset, REPAIRED, seg.reason)


def _txn_index_restore(ctx: Context, directory: str, base: int, target_run: str, op: str) -> TxnIndexSwap | None:
    """The ``.txnindex`` a rollback puts back after the ``.log``: the one ``target_run`` backed up, if any."""
    store = ctx.store
    kept = backup_key(ctx.prefix, target_run, directory, base, TXN_INDEX_SUFFIX)
    try:
        _, attrs = store.describe(kept)
    except ObjectNotFound:
        return None  # that run did not replace it
    final = dir_segment_key(ctx.prefix, directory, base, TXN_INDEX_SUFFIX)
    try:
        source: str | None = store.head(final).etag
    except ObjectNotFound:
        source = None
    return TxnIndexSwap(final, source, kept, None, False, attrs.with_metadata({META_RESTORED: target_run, META_OP: op}))


def stage_rollback(ctx: Context, directory: str, base: int, target_run: str) -> tuple[Journal, str] | SegmentResult:
    """Journal the restore of one segment from ``target_run``'s backups, if that run's ``.log`` is still the
    one in place; otherwise a skipped result saying what is there instead."""
    store = ctx.store
    final = {name: dir_segment_key(ctx.prefix, directory, base, sfx) for name, sfx in FILES}
    backups = {name: backup_key(ctx.prefix, target_run, directory, base, sfx) for name, sfx in FILES}
    try:
        current, _ = store.describe(final["log"])
    except ObjectNotFound:
        return SegmentResult(directory, base, SKIPPED, "the .log is gone: nothing to restore over",
                             cause=Cause.NOT_RESTORABLE)
    owner = current.metadata.get(META_RUN)
    if owner != target_run:
        what = f"run {owner}" if owner else "an object we did not write (the original, or a replacement)"
        return SegmentResult(directory, base, SKIPPED, f"the .log in place is from {what}, not from run {target_run}",
                             cause=Cause.NOT_RESTORABLE)
    source: dict[str, str | None] = {"log": current.etag}
    attrs: dict[str, ObjectAttrs] = {}
    new: dict[str, str | None] = {}
    log_size = 0
    op = f"{ctx.run_id}.{secrets.token_hex(4)}"
    for name, _ in FILES:
        if name != "log":
            try:
                source[name] = store.head(final[name]).etag
            except ObjectNotFound:
                source[name] = None
        try:
            info, original = store.describe(backups[name])
        except ObjectNotFound:
            if name == "log":
                return SegmentResult(directory, base, FAILED, "the backup of the .log is missing",
                                     error={"path": _uri(store, backups[name])}, cause=Cause.BACKUP_MISSING)
            new[name] = None
            continue
        new[name] = backups[name]
        attrs[name] = original.with_metadata({META_RESTORED: target_run, META_OP: op})
        if name == "log":
            log_size = info.size
    entry = state_entry(ctx, directory, base)
    journal = Journal(OpKind.ROLLBACK, op, ctx.run_id, JournalState.BACKED_UP, directory, base, final, source,
                      NewFiles(backups["log"], log_size, new["index"], new["timeindex"]), attrs,
                      payload_xxh3=entry.payload_xxh3 if entry else None, restores_run=target_run,
                      entry={"bytes_before": current.size, "bytes_after": log_size},
                      txn=_txn_index_restore(ctx, directory, base, target_run, op))
    try:
        etag = store.put_json(journal_key(ctx.prefix, directory, base), journal.to_json(), if_none_match=True)
    except PreconditionFailed:
        return SegmentResult(directory, base, SKIPPED, "another operation's journal entry is pending for it",
                             pending=Pending.BUSY, cause=Cause.BUSY)
    return journal, etag
