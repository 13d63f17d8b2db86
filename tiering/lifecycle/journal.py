"""The journal entry of one in-flight operation on one segment (``PREFIX/_tiering/journal/<dir>/<base>.json``).

A journal entry is written before the first final key changes and deleted once the operation is
finished (see ``docs/commit-protocol.md``); it says where the segment's one complete generation is. It is
a frozen dataclass with a schema version; a transition makes a new entry (:meth:`Journal.advanced`).
The JSON form is stable: an entry written by an earlier version of this module reads back the same.
The words it uses (operation kinds, states) are in :mod:`tiering.lifecycle.vocabulary`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Final

from tiering.documents import check_document
from tiering.errors import ConfigError
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from tiering.lifecycle.state import Replaced, SegmentState, stamped
from tiering.lifecycle.vocabulary import JournalState, OpKind
from tiering.storage.objects import ObjectAttrs

# The three files an operation replaces, by name, with their suffixes.
FILES: Final = (("log", LOG_SUFFIX), ("index", INDEX_SUFFIX), ("timeindex", TIME_INDEX_SUFFIX))
INDEX_FILES: Final = ("index", "timeindex")


@dataclass(frozen=True, slots=True)
class BackupCopy:
    """One original an operation copies to its backup before anything final changes: its key and the ETag
    planned, where it goes, what to call it in an error, the size the copy must have (None: not checked)
    and the attributes the copy gets (None: the original's own, read first)."""

    final: str
    etag: str
    target: str
    what: str
    size: int | None
    attrs: ObjectAttrs | None


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
class Recorded:
    """What the partition's state document records for the segment once the operation is done, and what the
    operation's result reports: the sizes before and after and, for a compaction, the run, the source
    ``.log`` it replaced, the codec and level, the records digest of the original (a rollback checks the
    backup against it) and the re-batching bound; for a merge, the segments merged. ``replaced``: for a
    rewrite or a merge, the segments it replaces with our entries for them (the new entry's lineage); for a
    rollback, the entries it puts back, one per segment restored."""

    bytes_before: int = 0
    bytes_after: int = 0
    run_id: str | None = None
    source_log_etag: str | None = None
    codec: str | None = None  # None: a key-compaction pass (the batches keep their codecs)
    level: int | None = None
    payload_xxh3: str | None = None
    rebatch_max_bytes: int | None = None
    merged_from: tuple[int, ...] = ()  # a merge: the base offsets of the segments it merged, in order
    replaced: tuple[Replaced, ...] = ()

    def done(self, log_etag: str, index_etag: str | None, timeindex_etag: str | None) -> SegmentState:
        """The entry of the segment a compaction, key-compaction pass or merge just put in place, stamped now."""
        if self.run_id is None:
            raise ConfigError("a compaction's journal entry names no run", expected="its run_id", found="none")
        return stamped(SegmentState(log_etag, self.run_id, self.codec, self.level, None, None, index_etag,
                                    timeindex_etag, self.source_log_etag, self.bytes_before, self.bytes_after,
                                    self.payload_xxh3, None, self.rebatch_max_bytes, self.merged_from,
                                    self.replaced))

    def restored(self, base: int, log_etag: str, index_etag: str | None, timeindex_etag: str | None
                 ) -> SegmentState | None:
        """The entry a rollback puts back for segment ``base``, now that the objects restored from the backup
        are in place (their ETags: a copy may give another); None where an original went back."""
        entry = next((r.entry for r in self.replaced if r.base_offset == base), None)
        if entry is None:
            return None
        return stamped(replace(entry, log_etag=log_etag, index_etag=index_etag, timeindex_etag=timeindex_etag))

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None
               and f.name not in ("merged_from", "replaced")}
        if self.merged_from:
            doc["merged_from"] = list(self.merged_from)
        if self.replaced:
            doc["replaced"] = [r.to_json() for r in self.replaced]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Recorded:
        def text(name: str) -> str | None:
            return None if doc.get(name) is None else str(doc[name])

        def number(name: str) -> int | None:
            return None if doc.get(name) is None else int(doc[name])

        return cls(int(doc.get("bytes_before") or 0), int(doc.get("bytes_after") or 0), text("run_id"),
                   text("source_log_etag"), text("codec"), number("level"), text("payload_xxh3"),
                   number("rebatch_max_bytes"), tuple(int(b) for b in doc.get("merged_from") or ()),
                   tuple(Replaced.from_json(r) for r in doc.get("replaced") or ()))


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
    entry: Recorded = field(default_factory=Recorded)  # what the partition state records when done
    restores_run: str | None = None
    log_crc32c: int | None = None  # the new .log's CRC-32C, when S3 reported it for the staged object
    txn: TxnIndexSwap | None = None  # the .txnindex replaced too (None: left as it is)

    def advanced(self, state: JournalState) -> Journal:
        return replace(self, state=state)

    def backups(self) -> tuple[BackupCopy, ...]:
        """The originals copied to the backup before the swap (none for a rollback: they are its backup)."""
        backup = self.backup or {}
        copies = [BackupCopy(self.final[name], etag, target, f"the {name} file", self.source_sizes.get(name),
                             self.attrs[name])
                  for name, _ in FILES if (etag := self.source[name]) and (target := backup.get(name))]
        if self.txn is not None and self.txn.source and self.txn.backup:
            copies.append(BackupCopy(self.txn.final, self.txn.source, self.txn.backup, "the .txnindex", None, None))
        return tuple(copies)

    def staging(self) -> tuple[str, ...]:
        """The staging objects dropped once the operation is forgotten (a rollback's new files are backups)."""
        if self.kind is not OpKind.COMPACT:
            return ()
        return (*self.new.present(), *([self.txn.new] if self.txn is not None and self.txn.new else []))

    def referenced(self) -> set[str]:
        """The keys outside the partition this operation still needs (cleanup keeps them)."""
        keys = set(self.new.present()) | {v for v in (self.backup or {}).values() if v}
        if self.txn is not None:
            keys |= {k for k in (self.txn.new, self.txn.backup) if k}
        return keys

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
                "payload_xxh3": self.payload_xxh3, "entry": self.entry.to_json(),
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
                       Recorded.from_json(doc.get("entry") or {}), doc.get("restores_run"),
                       None if doc.get("log_crc32c") is None else int(doc["log_crc32c"]),
                       TxnIndexSwap.from_json(doc["txn"]) if doc.get("txn") else None)
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"journal entry is malformed ({type(e).__name__}: {e})", path=where) from None


# The four files a merge replaces, by name (a segment's .txnindex goes with it: its entries are offsets).
GROUP_FILES: Final = (*FILES, ("txnindex", TXN_INDEX_SUFFIX))


@dataclass(frozen=True, slots=True)
class GroupFile:
    """One file of a segment a regroup removes or puts in place. A source's ``etag`` and ``size`` are the
    planned object's, ``copy`` where it is backed up (None: not backed up); a target's ``etag`` and ``size``
    are those of ``copy``, the object holding it (staging or a backup), and ``attrs`` go with it in place."""

    final: str
    etag: str
    size: int
    copy: str | None = None
    attrs: ObjectAttrs | None = None
    last_modified: str | None = None  # a source's, ISO 8601 by S3's clock (prices its early deletion)

    def to_json(self) -> dict[str, Any]:
        return {"final": self.final, "etag": self.etag, "size": self.size, "copy": self.copy,
                **({"attrs": self.attrs.to_json()} if self.attrs is not None else {}),
                **({"last_modified": self.last_modified} if self.last_modified is not None else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GroupFile:
        return cls(str(doc["final"]), str(doc["etag"]), int(doc["size"]), doc.get("copy"),
                   ObjectAttrs.from_json(doc["attrs"]) if doc.get("attrs") else None, doc.get("last_modified"))


@dataclass(frozen=True, slots=True)
class GroupSegment:
    """A segment of a regroup: its base offset and its files by name (:data:`GROUP_FILES`; absent: none)."""

    base_offset: int
    files: Mapping[str, GroupFile]

    @property
    def log(self) -> GroupFile:
        return self.files["log"]

    def to_json(self) -> dict[str, Any]:
        return {"base_offset": self.base_offset, "files": {n: f.to_json() for n, f in self.files.items()}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GroupSegment:
        return cls(int(doc["base_offset"]), {str(n): GroupFile.from_json(f) for n, f in doc["files"].items()})


@dataclass(frozen=True, slots=True)
class RegroupJournal:
    """One in-flight operation that replaces neighbouring segments (``sources``) by others holding the same
    batches (``targets``): a merge (several into one) or its rollback (one into the several it was made
    of). Kept at the journal key of the first base offset, which sources and targets share; the partition's
    lease keeps every other operation off the segments in between."""

    SCHEMA_VERSION: ClassVar[int] = 1

    kind: OpKind
    op: str
    run_id: str
    state: JournalState
    directory: str
    sources: tuple[GroupSegment, ...]
    targets: tuple[GroupSegment, ...]
    entry: Recorded = field(default_factory=Recorded)  # what the partition state records for a merged segment
    restores_run: str | None = None  # an unmerge: the run whose merge it undoes

    @property
    def base_offset(self) -> int:
        return self.sources[0].base_offset

    def advanced(self, state: JournalState) -> RegroupJournal:
        return replace(self, state=state)

    def backups(self) -> tuple[BackupCopy, ...]:
        """Every source file copied to the backup before the swap files go in (none for an unmerge)."""
        return tuple(BackupCopy(f.final, f.etag, f.copy, f"segment {s.base_offset}'s {name} file", f.size,
                                f.attrs or ObjectAttrs())
                     for s in self.sources for name, f in s.files.items() if f.copy is not None)

    def staging(self) -> tuple[str, ...]:
        """A merge's staged targets, dropped once the operation is forgotten (an unmerge's are backups)."""
        if self.kind is not OpKind.MERGE:
            return ()
        return tuple(f.copy for t in self.targets for f in t.files.values() if f.copy is not None)

    def referenced(self) -> set[str]:
        """The keys outside the partition this operation still needs (cleanup keeps them)."""
        return {f.copy for s in (*self.sources, *self.targets) for f in s.files.values() if f.copy}

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.kind.value, "op": self.op,
                "run_id": self.run_id, "state": self.state.value, "directory": self.directory,
                "base_offset": self.base_offset, "sources": [s.to_json() for s in self.sources],
                "targets": [t.to_json() for t in self.targets], "entry": self.entry.to_json(),
                **({"restores_run": self.restores_run} if self.restores_run else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str) -> RegroupJournal:
        try:
            return cls(OpKind(doc["kind"]), str(doc["op"]), str(doc["run_id"]), JournalState(doc["state"]),
                       str(doc["directory"]), tuple(GroupSegment.from_json(s) for s in doc["sources"]),
                       tuple(GroupSegment.from_json(t) for t in doc["targets"]),
                       Recorded.from_json(doc.get("entry") or {}), doc.get("restores_run"))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"journal entry is malformed ({type(e).__name__}: {e})", path=where) from None


REGROUPS: Final = frozenset({OpKind.MERGE, OpKind.UNMERGE})


def read_journal(doc: object, *, where: str) -> Journal | RegroupJournal:
    """A journal entry of either shape, by its kind."""
    if isinstance(doc, Mapping) and doc.get("kind") in REGROUPS:
        checked = check_document(doc, kind=None, version=RegroupJournal.SCHEMA_VERSION, what="a journal entry",
                                 where=where)
        return RegroupJournal.from_json(checked, where=where)
    return Journal.from_json(doc, where=where)
