"""The typed vocabulary of a segment's lifecycle on S3: operation kinds, journal states, segment statuses,
why work is left pending, and the journal entry itself (``PREFIX/_tiering/journal/<dir>/<base>.json``).

A journal entry is written before the first final key changes and deleted once the operation is
finished (see ``docs/commit-protocol.md``); it says where the segment's one complete generation is. It is
a frozen dataclass with a schema version; a transition makes a new entry (:meth:`Journal.advanced`).
The JSON form is stable: an entry written by an earlier version of this module reads back the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum
from typing import Any, ClassVar, Final

from tiering.documents import check_document
from tiering.errors import ConfigError
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.storage.objects import ObjectAttrs

# The three files an operation replaces, by name, with their suffixes.
FILES: Final = (("log", LOG_SUFFIX), ("index", INDEX_SUFFIX), ("timeindex", TIME_INDEX_SUFFIX))
INDEX_FILES: Final = ("index", "timeindex")


class Action(StrEnum):
    """What a plan does with a segment."""

    COMPACT = "compact"  # rewrite it with the run's codec (and re-batch, or clean its keys) and swap it in
    REPAIR = "repair"  # rebuild indexes the bucket lacks or holds wrong; the .log stays as it is
    SKIP = "skip"  # leave it as it is (its cause and reason say why)


class RunKind(StrEnum):
    """What a run does (its run document is ``runs/<run>/<kind>.json``)."""

    COMPACT = "compact"  # recompress (and re-batch) sealed segments
    COMPACT_KEYS = "compact-keys"  # one pass of Kafka's log cleaner over compacted topics
    ROLLBACK = "rollback"  # restore the originals a run replaced
    TIER = "tier"  # move objects to other storage classes


class OpKind(StrEnum):
    COMPACT = "compact"  # the originals replaced by a rewrite
    ROLLBACK = "rollback"  # a rewrite replaced by the originals kept in a backup


class JournalState(StrEnum):
    STAGED = "staged"  # the new generation is in staging and verified; nothing final changed
    BACKED_UP = "backed-up"  # the originals are in the backup too; the swap may start


class Status(StrEnum):
    """What became of one segment in a run."""

    COMPACTED = "compacted"
    ROLLED_BACK = "rolled-back"
    REPAIRED = "repaired"  # our indexes removed from beside a .log someone else put back
    STAGED = "staged"  # staged by a worker, waiting for the commit step
    SKIPPED = "skipped"
    FAILED = "failed"
    ABORTED = "aborted"  # given up before the .log was replaced (it changed or vanished)
    SUPERSEDED = "superseded"  # swapped, then another writer replaced the segment: its objects are kept
    MOVED = "moved"  # storage tiering: objects moved to another storage class


class Cause(StrEnum):
    """Why a segment is left as it is: what decisions read (the human reason beside it is the detail)."""

    ACTIVE = "active"  # the highest base offset of its partition
    TOO_YOUNG = "too young"  # uploaded (or, by a policy, written) too recently
    ALREADY_COMPACTED = "already compacted"
    ARCHIVED = "archived"
    INCOMPLETE = "incomplete"  # index files without a .log
    EMPTY = "empty"
    INVALID = "invalid"
    REMEMBERED = "remembered"  # a rewrite of this very object gave nothing, or it was invalid or unreadable
    POLICY = "policy"  # compression.type producer
    AUTO_DECLINED = "auto declined"  # no candidate codec pays off
    BUDGET = "budget"  # over --max-segments / --max-bytes
    NO_SAVINGS = "no savings"  # the rewrite would not shrink it
    BELOW_MIN_SAVINGS = "below min savings"  # it would shrink less than the policy's min.savings.ratio
    UNREADABLE = "unreadable"  # S3 will not give us the bytes (SSE-C without its key, an archived object)
    PROOF_FAILED = "proof failed"  # what we wrote, or what storage holds, is not the source's records
    NOTHING_TO_CLEAN = "nothing to clean"  # a key-compaction pass keeps every batch of it as it is
    UNCLEANABLE = "uncleanable"  # past a key-compaction pass's first uncleanable offset
    PASS_STOPPED = "pass stopped"  # noqa: S105 (a cause, not a password): a key-compaction pass stopped at an earlier segment of the partition
    UNSUPPORTED = "unsupported"  # work this version cannot do on that data (the reason says what)
    BUSY = "busy"  # another run holds the partition or an operation on the segment, or a writer changed it
    TRANSIENT = "transient"  # S3 or the network failed (throttling, 5xx, a connection cut): a later run retries
    ABANDONED = "abandoned"  # an operation given up before its swap: the segment is planned anew (or is gone)
    REPLACED = "replaced"  # swapped in, then another writer replaced the segment: its objects are kept
    NOT_RESTORABLE = "not restorable"  # a rollback finds the .log gone, or not the one the run put in place
    BACKUP_MISSING = "backup missing"  # a rollback's kept original is not there
    LATER_RUN = "later run"  # a later key-compaction run replaced what a rollback would restore
    REFUSED = "refused"  # the settings, the store or its permissions refuse the work (a configuration problem)
    LOCAL_ERROR = "local error"  # this machine's side: a full disk, an unwritable work directory
    NOTHING_TO_MOVE = "nothing to move"  # storage tiering: every object is in its class already


# The causes a finished rewrite is not swapped in for: remembered, so the object is not read again.
NOTHING_TO_GAIN: Final = frozenset({Cause.NO_SAVINGS, Cause.BELOW_MIN_SAVINGS})


class Verify(StrEnum):
    """How a staged generation is accepted before anything final changes."""

    CHECKSUM = "checksum"  # S3 reports, for what it stored, the CRC-32C of the bytes the rewrite produced
    READ_BACK = "read-back"  # downloaded again and decoded: for stores without S3's additional checksums


class Swap(StrEnum):
    """How the new ``.log`` is put over the original, both conditional on the original's ETag."""

    COPY = "copy"  # a server-side CopyObject from staging with If-Match: no byte crosses the wire again
    PUT = "put"  # downloaded, checked and PUT with If-Match: for stores that ignore a copy's If-Match


class Pending(Enum):
    """Why work the run was asked to do is still to do, and what makes a later run succeed."""

    BUSY = "busy"  # another run held the partition, or a writer changed the segment: plan again, retry
    TRANSIENT = "transient"  # S3 or the network failed (throttling, 5xx, a connection cut): retry


@dataclass(frozen=True, slots=True)
class NewFiles:
    """Where the generation to put in place is (staging for a compaction, a backup for a rollback)."""

    log: str
    log_size: int
    index: str | None
    timeindex: str | None
    log_etag: str | None = None  # the staged .log's ETag once verified: the only version the swap copies

    def key(self, name: str) -> str | None:
        key: str | None = getattr(self, name)
        return key

    def present(self) -> list[str]:
        """The keys of the files this generation has."""
        return [k for k in (self.log, self.index, self.timeindex) if k]


@dataclass(frozen=True, slots=True)
class TxnIndexSwap:
    """The segment's ``.txnindex`` replaced too (a key-compaction pass that drops aborted transactions' entries,
    or its rollback). A consumer reading ``read_committed`` skips a producer's batches from an entry's first
    offset until it meets that transaction's ABORT marker: an entry beside a ``.log`` without its marker
    would hide later data, an entry missing for data already gone hides nothing. So a ``.txnindex`` that
    loses entries goes in before the ``.log`` (``before_log``), one that regains them after it."""

    final: str
    source: str | None  # the ETag replaced (None: there was no .txnindex)
    new: str | None  # the object holding the replacement (staging, a backup); None: the .txnindex is removed
    backup: str | None  # where the original is copied (None: nothing to keep)
    before_log: bool
    attrs: ObjectAttrs  # given to the replacement

    def to_json(self) -> dict[str, Any]:
        return {"final": self.final, "source": self.source, "new": self.new, "backup": self.backup,
                "before_log": self.before_log, "attrs": self.attrs.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TxnIndexSwap:
        return cls(str(doc["final"]), doc.get("source"), doc.get("new"), doc.get("backup"), bool(doc["before_log"]),
                   ObjectAttrs.from_json(doc["attrs"]))


@dataclass(frozen=True, slots=True)
class Journal:
    """One in-flight operation on one segment. ``final``, ``source`` and ``backup`` map the file names of
    :data:`FILES` to the final keys, the ETags being replaced (None: no such file) and the backup keys."""

    SCHEMA_VERSION: ClassVar[int] = 1

    kind: OpKind
    op: str  # unique per operation: the tiering-op metadata of every object it puts in place
    run_id: str
    state: JournalState
    directory: str
    base_offset: int
    final: Mapping[str, str]
    source: Mapping[str, str | None]
    new: NewFiles
    attrs: Mapping[str, ObjectAttrs]  # given to each file's replacement
    source_sizes: Mapping[str, int] = field(default_factory=dict)
    backup: Mapping[str, str | None] | None = None  # None: nothing to back up (a rollback)
    payload_xxh3: str | None = None  # the records digest the new .log must decode to
    entry: Mapping[str, Any] = field(default_factory=dict)  # what the partition state records when done
    restores_run: str | None = None
    log_crc32c: int | None = None  # the new .log's CRC-32C, when S3 reported it for the staged object
    txn: TxnIndexSwap | None = None  # the .txnindex replaced too (None: left as it is)

    def advanced(self, state: JournalState) -> Journal:
        return replace(self, state=state)

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.kind.value, "op": self.op,
                "run_id": self.run_id, "state": self.state.value, "directory": self.directory,
                "base_offset": self.base_offset, "final": dict(self.final), "source": dict(self.source),
                "source_sizes": dict(self.source_sizes),
                "new": {"log": self.new.log, "index": self.new.index, "timeindex": self.new.timeindex,
                        "log_size": self.new.log_size,
                        **({"log_etag": self.new.log_etag} if self.new.log_etag else {})},
                "attrs": {name: a.to_json() for name, a in self.attrs.items()},
                "backup": dict(self.backup) if self.backup is not None else None,
                "payload_xxh3": self.payload_xxh3, "entry": dict(self.entry),
                **({"restores_run": self.restores_run} if self.restores_run else {}),
                **({"log_crc32c": self.log_crc32c} if self.log_crc32c is not None else {}),
                **({"txn": self.txn.to_json()} if self.txn is not None else {})}

    @classmethod
    def from_json(cls, doc: object, *, where: str) -> Journal:
        """Read an entry; a document of another version or shape is a :class:`ConfigError` naming it."""
        doc = check_document(doc, kind=None, version=cls.SCHEMA_VERSION, what="a journal entry", where=where)
        try:
            new = doc["new"]
            return cls(OpKind(doc["kind"]), str(doc["op"]), str(doc["run_id"]), JournalState(doc["state"]),
                       str(doc["directory"]), int(doc["base_offset"]), dict(doc["final"]), dict(doc["source"]),
                       NewFiles(str(new["log"]), int(new.get("log_size", 0)), new.get("index"), new.get("timeindex"),
                                new.get("log_etag")),
                       {name: ObjectAttrs.from_json(a) for name, a in doc["attrs"].items()},
                       dict(doc.get("source_sizes") or {}), doc.get("backup"), doc.get("payload_xxh3"),
                       dict(doc.get("entry") or {}), doc.get("restores_run"),
                       None if doc.get("log_crc32c") is None else int(doc["log_crc32c"]),
                       TxnIndexSwap.from_json(doc["txn"]) if doc.get("txn") else None)
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"journal entry is malformed ({type(e).__name__}: {e})", path=where) from None
