"""The journal entry of one in-flight operation (``PREFIX/_tiering/journal/<dir>/<base>.json``).

An operation replaces segments (its ``sources``) by others (its ``targets``): one by one at the same base
offset (a compaction, a key-compaction pass, their rollback: swapped in place), or neighbours by others
holding the same batches (a merge, a key-compaction pass that cleans a group into one segment, a merge's
rollback: swapped through ``.swap`` files). Every kind has this one shape: each file named by its final key,
with the ETag, size and checksum it is held to and the object holding its copy (a source's backup, a
target's staged or backed-up bytes). The entry is written before the first final key changes and deleted
once the operation is finished (see ``docs/commit-protocol.md``); it says where the segments' one complete
generation is. A transition makes a new entry (:meth:`Journal.advanced`).

:func:`read_journal` reads this version and the two shapes schema version 1 wrote (one for one, and a
regroup), so that an operation left in flight by an earlier version is finished by this one. The words it
uses (operation kinds, states) are in :mod:`tiering.lifecycle.vocabulary`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Final

from msgspec import structs

from tiering.documents import check_document, read_part, to_builtins
from tiering.errors import ConfigError
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from tiering.lifecycle.state import Replaced, SegmentState, stamped
from tiering.lifecycle.vocabulary import FileRole, JournalState, OpKind
from tiering.storage.objects import ObjectAttrs

# The three files every operation replaces, by name, with their suffixes.
FILES: Final = ((FileRole.LOG, LOG_SUFFIX), (FileRole.INDEX, INDEX_SUFFIX), (FileRole.TIMEINDEX, TIME_INDEX_SUFFIX))
INDEX_FILES: Final = (FileRole.INDEX, FileRole.TIMEINDEX)
# A segment's files with its .txnindex (a merge always replaces it: its entries are offsets; a one-for-one
# operation only where its entries change).
GROUP_FILES: Final = (*FILES, (FileRole.TXNINDEX, TXN_INDEX_SUFFIX))


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
        return stamped(structs.replace(entry, log_etag=log_etag, index_etag=index_etag, timeindex_etag=timeindex_etag))

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None
               and f.name not in ("merged_from", "replaced")}
        if self.merged_from:
            doc["merged_from"] = list(self.merged_from)
        if self.replaced:
            doc["replaced"] = [to_builtins(r) for r in self.replaced]
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
                   tuple(read_part(r, Replaced, what="a replaced segment's entry") for r in doc.get("replaced") or ()))




@dataclass(frozen=True, slots=True)
class OpFile:
    """One file of a segment an operation removes (a source) or puts in place (a target).

    A source: ``etag`` and ``size`` are the planned object's; ``copy`` is where it is backed up (None: not
    backed up) and ``attrs`` what its backup gets (None: the original's own, read at the copy). A target:
    ``copy`` is the object holding its bytes (staging, or a backup for a rollback), ``etag``, ``size`` and
    ``crc32c`` what that copy was verified as (an ETag of None: not verified yet, so it is decoded before it
    goes in), and ``attrs`` go with it in place."""

    final: str
    etag: str | None = None
    size: int | None = None
    copy: str | None = None
    attrs: ObjectAttrs | None = None
    last_modified: str | None = None  # a source's, ISO 8601 by S3's clock (prices its early deletion)
    crc32c: int | None = None  # a target's: the CRC-32C S3 reported for the staged copy

    @property
    def bytes(self) -> int:
        """Its size (0 where none was recorded)."""
        return self.size or 0

    def to_json(self) -> dict[str, Any]:
        return {"final": self.final, "etag": self.etag, "size": self.size, "copy": self.copy,
                **({"attrs": self.attrs.to_json()} if self.attrs is not None else {}),
                **({"last_modified": self.last_modified} if self.last_modified is not None else {}),
                **({"crc32c": self.crc32c} if self.crc32c is not None else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OpFile:
        return cls(str(doc["final"]), _text(doc.get("etag")), _number(doc.get("size")), _text(doc.get("copy")),
                   ObjectAttrs.from_json(doc["attrs"]) if doc.get("attrs") else None, _text(doc.get("last_modified")),
                   _number(doc.get("crc32c")))


@dataclass(frozen=True, slots=True)
class OpSegment:
    """A segment of an operation: its base offset and its files by name (:data:`GROUP_FILES`; absent: none)."""

    base_offset: int
    files: Mapping[FileRole, OpFile]

    @property
    def log(self) -> OpFile:
        return self.files[FileRole.LOG]

    def to_json(self) -> dict[str, Any]:
        return {"base_offset": self.base_offset, "files": {n: f.to_json() for n, f in self.files.items()}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> OpSegment:
        return cls(int(doc["base_offset"]), {FileRole(n): OpFile.from_json(f) for n, f in doc["files"].items()})


# The kinds that regroup segments (through .swap files); the others replace one segment in place.
REGROUPS: Final = frozenset({OpKind.MERGE, OpKind.UNMERGE})


@dataclass(frozen=True, slots=True)
class Journal:
    """One in-flight operation: ``sources`` replaced by ``targets`` (see the module's docstring). Kept at the
    journal key of the first base offset, which sources and targets share; the partition's lease keeps every
    other operation off the segments in between."""

    SCHEMA_VERSION: ClassVar[int] = 2

    kind: OpKind
    op: str  # unique per operation: the tiering-op metadata of every object it puts in place
    run_id: str
    state: JournalState
    directory: str
    sources: tuple[OpSegment, ...]
    targets: tuple[OpSegment, ...]
    entry: Recorded = field(default_factory=Recorded)  # what the partition's state records when done
    restores_run: str | None = None  # a rollback: the run whose work it undoes
    payload_xxh3: str | None = None  # the records digest the target .log must decode to (in place)
    txn_first: bool = False  # in place: the target's .txnindex (or its removal) goes in before the .log

    @property
    def base_offset(self) -> int:
        return self.sources[0].base_offset

    @property
    def in_place(self) -> bool:
        """One segment replaced by one at the same keys (an overwrite), rather than through ``.swap`` files."""
        return self.kind not in REGROUPS

    def source(self, name: FileRole) -> OpFile | None:
        """The first source's file ``name`` (the one segment of an operation in place)."""
        return self.sources[0].files.get(name)

    def target(self, name: FileRole) -> OpFile | None:
        """The first target's file ``name``."""
        return self.targets[0].files.get(name)

    def source_etag(self, name: FileRole) -> str | None:
        """The planned ETag of the first source's file ``name`` (None: there is no such file)."""
        f = self.source(name)
        return f.etag if f is not None else None

    def final(self, name: FileRole) -> str:
        """The final key of file ``name`` of the first segment."""
        f = self.target(name) or self.source(name)
        if f is None:
            raise KeyError(name)
        return f.final

    @property
    def txn_swapped(self) -> bool:
        """Whether an operation in place replaces (or removes) the ``.txnindex`` too."""
        return self.source(FileRole.TXNINDEX) is not None or self.target(FileRole.TXNINDEX) is not None

    def advanced(self, state: JournalState) -> Journal:
        return replace(self, state=state)

    def backups(self) -> tuple[BackupCopy, ...]:
        """Every source file copied to its backup before anything final changes (none for a rollback: the
        objects in place hold what the rolled-back run wrote, and its backups are what goes back)."""
        def what(base: int, name: FileRole) -> str:
            return f"the {name} file" if len(self.sources) == 1 else f"segment {base}'s {name} file"

        return tuple(BackupCopy(f.final, f.etag, f.copy, what(s.base_offset, name), f.size, f.attrs)
                     for s in self.sources for name, f in s.files.items() if f.copy is not None and f.etag)

    def staging(self) -> tuple[str, ...]:
        """The staged targets, dropped once the operation is forgotten (a rollback's are backups, kept)."""
        if self.kind not in (OpKind.COMPACT, OpKind.MERGE):
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
                **({"restores_run": self.restores_run} if self.restores_run else {}),
                **({"payload_xxh3": self.payload_xxh3} if self.payload_xxh3 else {}),
                **({"txn_first": True} if self.txn_first else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, where: str) -> Journal:
        try:
            return cls(OpKind(doc["kind"]), str(doc["op"]), str(doc["run_id"]), JournalState(doc["state"]),
                       str(doc["directory"]), tuple(OpSegment.from_json(s) for s in doc["sources"]),
                       tuple(OpSegment.from_json(t) for t in doc["targets"]),
                       Recorded.from_json(doc.get("entry") or {}), _text(doc.get("restores_run")),
                       _text(doc.get("payload_xxh3")), bool(doc.get("txn_first", False)))
        except (AttributeError, ConfigError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"journal entry is malformed ({type(e).__name__}: {e})", path=where) from None


def read_journal(doc: object, *, where: str) -> Journal:
    """A journal entry of this version, or of either shape schema version 1 wrote (read as this version's);
    a document of another version or shape is a :class:`ConfigError` naming it."""
    if isinstance(doc, Mapping) and doc.get("schema_version") == 1:
        checked = check_document(doc, kind=None, version=1, what="a journal entry", where=where)
        try:
            journal = _v1_regroup(checked) if checked.get("kind") in REGROUPS else _v1_in_place(checked)
        except (AttributeError, ConfigError, KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"journal entry is malformed ({type(e).__name__}: {e})", path=where) from None
    else:
        checked = check_document(doc, kind=None, version=Journal.SCHEMA_VERSION, what="a journal entry",
                                 where=where)
        journal = Journal.from_json(checked, where=where)
    _check_shape(journal, where)
    return journal


def _check_shape(journal: Journal, where: str) -> None:
    """An entry names a ``.log`` for every segment it replaces and puts in place; in place, one segment by one
    at the same base offset; else all at the first source's base offset and no other."""
    segments = (*journal.sources, *journal.targets)
    bases = {s.base_offset for s in segments}
    if journal.in_place:
        fits = len(journal.sources) == len(journal.targets) == 1 and len(bases) == 1
    else:
        fits = bool(journal.sources) and bool(journal.targets) and journal.targets[0].base_offset == min(bases)
    if not fits or any(FileRole.LOG not in s.files for s in segments):
        raise ConfigError(f"journal entry is malformed: a {journal.kind} of {len(journal.sources)} segment(s) into "
                          f"{len(journal.targets)}", path=where,
                          expected="each segment with its .log; in place, one by one at the same base offset",
                          found=sorted(bases))


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _number(value: object) -> int | None:
    return None if value is None else int(str(value))


def _v1_regroup(doc: Mapping[str, Any]) -> Journal:
    """Version 1's regroup entry: its sources and targets were this version's, without checksums."""
    return Journal(OpKind(doc["kind"]), str(doc["op"]), str(doc["run_id"]), JournalState(doc["state"]),
                   str(doc["directory"]), tuple(OpSegment.from_json(s) for s in doc["sources"]),
                   tuple(OpSegment.from_json(t) for t in doc["targets"]), Recorded.from_json(doc.get("entry") or {}),
                   _text(doc.get("restores_run")))


def _v1_in_place(doc: Mapping[str, Any]) -> Journal:
    """Version 1's one-for-one entry: the final keys, the ETags replaced, their sizes and backups, and the new
    files by name (plus a ``.txnindex`` swap), read as one source and one target."""
    final, source, new = doc["final"], doc["source"], doc["new"]
    backup, sizes = doc.get("backup") or {}, doc.get("source_sizes") or {}
    attrs = {name: ObjectAttrs.from_json(a) for name, a in doc["attrs"].items()}
    src = {name: OpFile(str(final[name]), str(source[name]), _number(sizes.get(name)), _text(backup.get(name)),
                        attrs.get(name)) for name, _ in FILES if source.get(name)}
    new_log = OpFile(str(final[FileRole.LOG]), _text(new.get("log_etag")), int(new.get("log_size", 0)),
                     str(new[FileRole.LOG]), attrs.get(FileRole.LOG), crc32c=_number(doc.get("log_crc32c")))
    tgt = {FileRole.LOG: new_log, **{name: OpFile(str(final[name]), copy=str(new[name]), attrs=attrs.get(name))
                              for name in INDEX_FILES if new.get(name)}}
    txn = doc.get("txn")
    if txn:
        if txn.get("source"):
            src[FileRole.TXNINDEX] = OpFile(str(txn["final"]), str(txn["source"]), copy=_text(txn.get("backup")))
        if txn.get("new"):
            tgt[FileRole.TXNINDEX] = OpFile(str(txn["final"]), copy=str(txn["new"]),
                                     attrs=ObjectAttrs.from_json(txn["attrs"]))
    base = int(doc["base_offset"])
    return Journal(OpKind(doc["kind"]), str(doc["op"]), str(doc["run_id"]), JournalState(doc["state"]),
                   str(doc["directory"]), (OpSegment(base, src),), (OpSegment(base, tgt),),
                   Recorded.from_json(doc.get("entry") or {}), _text(doc.get("restores_run")),
                   _text(doc.get("payload_xxh3")),
                   bool(txn and txn.get("before_log") and FileRole.TXNINDEX in {**src, **tgt}))
