"""One segment's operation in the commit protocol: what every step shares.

The protocol replaces one segment's objects on S3 without ever losing data (``docs/commit-protocol.md``
has the state diagram and the reasoning behind every step). Per segment, under the partition's lease
(:mod:`tiering.commit.lease`), the steps and their modules:

1. **stage** (:mod:`tiering.commit.stage`): the new ``.log`` streamed through the rewriter (or made
   elsewhere, by a key-compaction pass) into a multipart upload to ``_tiering/staging/``, its indexes
   beside it, accepted by their CRC-32C or by reading them back (:mod:`tiering.commit.verify`); then the
   segment's journal entry, state ``staged``;
2. **back up, swap, finish** (:mod:`tiering.commit.swap`): server-side copies of the originals to
   ``_tiering/backup/<run>/`` (state ``backed-up``), the old indexes deleted, the new ``.log`` put over the
   old one (``If-Match`` the planned ETag), the new indexes put, the segment recorded in the partition's
   state document (:func:`record_state`, the one place the commit protocol writes it), the staging objects
   and the journal entry deleted;
3. **recover, roll back, repair** (:mod:`tiering.commit.recover`): journal entries a crash left finished
   (or abandoned) by the same swap, another run's staged work taken over, a run's backups swapped back.

This module holds what those steps share: the run's :class:`Context`, the :class:`SegmentResult` every
step returns, the metadata marks on the objects we write, the errors that stop one segment, and the state
document's reads and writes.
"""

from __future__ import annotations

import secrets
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, BinaryIO, Final

from tiering.errors import ConfigError, ConflictError
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, Indexes
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.state import Replaced, SegmentState, StateBatch, load_state, record_segment
from tiering.lifecycle.vocabulary import Cause, Pending, Status, Swap, Verify
from tiering.plan.document import PlannedSegment
from tiering.storage.layout import normalize_prefix
from tiering.storage.objects import DEFAULT_PART_BYTES, ObjectStore

# User metadata on the objects we write to final keys (S3 shows them as x-amz-meta-*).
META_RUN: Final = "tiering-run"
META_OP: Final = "tiering-op"
META_CODEC: Final = "tiering-codec"
META_SOURCE_ETAG: Final = "tiering-source-etag"
META_RESTORED: Final = "tiering-restored-from-run"
META_MERGED: Final = "tiering-merged-segments"  # on a merged segment's objects: how many segments it holds
COPY_CHUNK: Final = 1 << 20
AUTO_SWAP: Final = "auto"  # the swap setting that learns the mode from the store (tiering.commit.swap.swap_mode)


class SourceChanged(ConflictError):
    """An object changed (or vanished) since it was planned: the segment is left as it is."""


class SourceGone(SourceChanged):
    """The planned ``.log`` no longer exists (deleted by retention): nothing is left to do for it."""


class CopyGone(SourceChanged):
    """The copy an operation puts in place (its staged copy, or a rollback's backup) is gone before anything
    final changed with it: the operation is given up."""


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
    options: RewriteOptions | None = None  # how a compaction rewrites segments (None: the run rewrites none)
    work_dir: str | None = None  # where spool files go (the system's temporary directory by default)
    part_bytes: int = DEFAULT_PART_BYTES
    min_savings_ratio: float = 0.0  # a rewrite saving less than this fraction is not swapped in
    state: StateBatch | None = None  # the partition's state changes, written together (else one at a time)
    verify: Verify = Verify.CHECKSUM  # how staged files are accepted (read-back where checksums are unsupported)
    swap: SwapChoice = field(default_factory=SwapChoice)  # how the new .log is put in place
    rebatch: RebatchOptions | None = None  # merge runs of small batches first (set per segment by the plan)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", normalize_prefix(self.prefix))

    @property
    def rewrite(self) -> RewriteOptions:
        """How this run rewrites a segment: only a compaction's context says (asking another's is a bug)."""
        if self.options is None:
            raise ConfigError("a run that rewrites no segment was asked how it rewrites one",
                              expected="a compaction's context, with its codec", found=f"run {self.run_id}")
        return self.options

    @property
    def index_interval_bytes(self) -> int:
        """The bytes between index entries of what the run writes (Kafka's default, unless a rewrite says)."""
        return self.options.index_interval_bytes if self.options is not None else DEFAULT_INDEX_INTERVAL_BYTES

    @property
    def decompression_limit(self) -> int:
        """The most bytes a batch of what the run reads may decompress to."""
        return self.options.decompression_limit if self.options is not None else DEFAULT_DECOMPRESSION_LIMIT

    def new_op(self) -> str:
        """A new operation id: this run's id and a random suffix (it marks every object the operation writes)."""
        return f"{self.run_id}.{secrets.token_hex(4)}"

    def for_segment(self, seg: PlannedSegment) -> Context:
        """This context with the segment's own codec, level and minimum savings (set by a policy) and its
        re-batching (set by the plan)."""
        ctx = self
        if seg.codec is not None:
            options = replace(self.rewrite, codec=Codec.parse(seg.codec), level=seg.level)
            ctx = replace(self, options=options, min_savings_ratio=seg.min_savings_ratio)
        o = ctx.rewrite
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


def operation_results(journal: Journal, status: Status, reason: str, *, error: dict[str, object] | None = None,
                      run_id: str | None = None, pending: Pending | None = None,
                      cause: Cause | None = None) -> list[SegmentResult]:
    """One result for every segment ``journal``'s operation touches (its sources' and targets' base offsets)."""
    bases = sorted({s.base_offset for s in (*journal.sources, *journal.targets)})
    return [SegmentResult(journal.directory, b, status, reason, error=error, run_id=run_id or journal.run_id,
                          pending=pending, cause=cause) for b in bases]


def uri(store: ObjectStore, key: str) -> str:
    return f"s3://{store.bucket}/{key}"


def spool_file(ctx: Context) -> BinaryIO:
    return tempfile.TemporaryFile(prefix="tiering-", dir=ctx.work_dir)


@dataclass(frozen=True, slots=True)
class Staged:
    """A journal entry in state ``staged``, with what the segment's result will say once it is swapped and the
    new indexes (verified with the staged files: the swap puts them without reading them back)."""

    journal: Journal
    etag: str
    result: SegmentResult = field(default_factory=lambda: SegmentResult("", 0, Status.STAGED))
    indexes: Indexes | None = None


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


def replaced(ctx: Context, directory: str, base: int, log_size: int, log_etag: str) -> Replaced:
    """A segment an operation is about to replace, with our entry for it where the ``.log`` in place is the
    one that entry records (the lineage the new entry keeps)."""
    entry = state_entry(ctx, directory, base)
    return Replaced(base, log_size, log_etag,
                    entry if entry is not None and entry.compacted and entry.log_etag == log_etag else None)


def kms(headers: dict[str, Any]) -> str | None:
    if headers.get("ServerSideEncryption") != "aws:kms":
        return None
    return "aws:kms+bucket-key" if headers.get("BucketKeyEnabled") else "aws:kms"
