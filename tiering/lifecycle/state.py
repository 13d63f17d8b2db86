"""Our record of what each partition's segments became: ``PREFIX/_tiering/state/<topic>-<partition>.json``.

One small document per partition (:class:`PartitionState`), written only by the holder of the partition's
lease, with a compare-and-swap (``If-Match``) all the same. The scanner reads it to tell "already
compacted" without a HEAD per object, and to notice a ``.log`` that someone replaced after we compacted it
(its ETag is no longer the one we wrote). Entries (:class:`SegmentState`) are keyed by base offset.

The document stays as large as the partition's live segments: every write drops the entries of segments
the run's scan no longer saw (Kafka's retention deleted them; see :class:`Pruning`). A partition's
changes are written together (:class:`StateBatch`): one read and one write per batch, not per segment.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Final, Literal

import msgspec
from msgspec.structs import replace

from tiering.documents import Document, Part, read, to_builtins
from tiering.errors import TieringError
from tiering.lifecycle.vocabulary import FileRole
from tiering.storage.layout import state_key
from tiering.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed

CAS_ATTEMPTS: Final = 5
BATCH_ENTRIES: Final = 100  # a batch writes itself once this many changes wait (bounds the bytes rewritten)
PRUNE_MARGIN: Final = timedelta(hours=1)  # clocks of the hosts that record and scan may disagree this much


class Outcome(enum.StrEnum):
    """Why a segment we did not compact is remembered: it is not read again until its ``.log`` changes."""

    NO_SAVINGS = "no-savings"  # with this codec and level (another target is tried)
    INVALID = "invalid"
    UNREADABLE = "unreadable"  # S3 will not give us the bytes (SSE-C, an archived object)


class Replaced(Part, frozen=True):
    """One segment a generation replaced (its lineage, one step down): its base offset, its ``.log``'s size
    and ETag then, and our entry for that object (None: an object we did not write, such as the original as
    Kafka wrote it). Its files are in the replacing run's backup; rolling that run back puts them in place
    and this entry back in the partition's state."""

    base_offset: int
    log_size: int
    log_etag: str
    entry: SegmentState | None = None


class SegmentState(Part, frozen=True):
    """One segment's entry: compacted by ``run_id`` (``outcome`` None), or remembered with its outcome. A
    compacted entry is one generation: ``replaced`` names the segments its run replaced and, for each, the
    generation that was in place (the lineage a rollback walks back)."""

    log_etag: str
    run_id: str
    codec: str | None = None
    level: int | None = None
    outcome: Outcome | None = None
    reason: str | None = None
    index_etag: str | None = None
    timeindex_etag: str | None = None
    source_log_etag: str | None = None
    bytes_before: int = 0
    bytes_after: int = 0
    payload_xxh3: str | None = None
    recorded_at: str | None = None  # ISO 8601, the recording host's clock (entries before it was kept: None)
    rebatch_max_bytes: int | None = None  # the re-batching bound the rewrite used (None: none)
    merged_from: tuple[int, ...] = ()  # a merged segment: the base offsets of the segments it holds, in order
    replaced: tuple[Replaced, ...] = ()  # what this generation replaced (entries written before it: empty)

    @property
    def compacted(self) -> bool:
        return self.outcome is None

    def generation_of(self, run_id: str, base: int) -> Generation | None:
        """Where run ``run_id`` is in the lineage of this entry (the one of segment ``base``); None when it is
        not there."""
        todo: list[tuple[tuple[str, ...], int, SegmentState]] = [((), base, self)]
        while todo:
            above, at, entry = todo.pop(0)
            if entry.compacted and entry.run_id == run_id:
                return Generation(at, entry, above)
            below = above if entry.run_id in above else (*above, entry.run_id)
            todo += [(below, r.base_offset, r.entry) for r in entry.replaced if r.entry is not None]
        return None

    def lineage(self) -> Iterator[SegmentState]:
        """This entry and every generation below it (what its run replaced, what that replaced, and so on),
        each once; a remembered outcome is no generation and is left out."""
        todo: list[SegmentState] = [self]
        while todo:
            entry = todo.pop()
            if entry.compacted:
                yield entry
            todo += [r.entry for r in entry.replaced if r.entry is not None]


@dataclass(frozen=True, slots=True)
class Generation:
    """A run's generation found in a segment's lineage: the base offset it was made at, its entry, and the runs
    whose generations are above it (newest first: what must be rolled back before it)."""

    base_offset: int
    entry: SegmentState
    above: tuple[str, ...]

    @property
    def bases(self) -> tuple[int, ...]:
        """The segments its run replaced there (a merge's sources; otherwise the one)."""
        return self.entry.merged_from or (self.base_offset,)


class ClassMove(Part, frozen=True):
    """One object a tiering run moved to another storage class: its file (``log``, ``index``, ...), its size,
    the classes, and its ETag before the move and after it (None: noted before the copy, which a crash may or
    may not have made; a copy may change an ETag)."""

    file: FileRole
    size: int
    from_class: str = msgspec.field(name="from")
    to_class: str = msgspec.field(name="to")
    etag_before: str
    etag_after: str | None = None


class TierMark(Part, frozen=True):
    """What tiering run ``run_id`` moved of one segment's objects, and which generation of the segment they
    were (``generation``: the run of the segment's compacted entry then; None: the objects as Kafka wrote
    them). A segment's marks are kept oldest first: a tiering run is rolled back only where its mark is the
    newest and the generation it moved is still in place."""

    run_id: str
    generation: str | None
    moves: tuple[ClassMove, ...]


Marks = Mapping[int, tuple[TierMark, ...]]


def generation_in_place(entry: SegmentState | None) -> str | None:
    """The run whose generation a segment's entry says is in place (None: the objects as Kafka wrote them, or
    remembered as such)."""
    return entry.run_id if entry is not None and entry.compacted else None


def after_moves(entry: SegmentState | None, marks: Sequence[TierMark], in_place: Mapping[FileRole, ObjectInfo | None]
                ) -> SegmentState | None:
    """``entry`` naming the objects ``in_place`` (by file) that the newest tiering run of its generation moved
    where it still names them by their ETags before the move: a run killed between its copy (which may change
    an ETag) and its state write leaves it so. Otherwise ``entry`` as it is."""
    if entry is None or not entry.compacted or not marks or marks[-1].generation != entry.run_id:
        return entry
    named = {FileRole.LOG: entry.log_etag, FileRole.INDEX: entry.index_etag, FileRole.TIMEINDEX: entry.timeindex_etag}
    now: dict[FileRole, str] = {}
    for m in marks[-1].moves:
        info = in_place.get(m.file)
        if (info is not None and named.get(m.file) == m.etag_before != info.etag and info.storage_class == m.to_class
                and info.size == m.size and m.etag_after in (None, info.etag)):
            now[m.file] = info.etag
    if not now:
        return entry
    return replace(entry, log_etag=now.get(FileRole.LOG, entry.log_etag),
                   index_etag=now.get(FileRole.INDEX, entry.index_etag),
                   timeindex_etag=now.get(FileRole.TIMEINDEX, entry.timeindex_etag))


class PartitionState(Document, frozen=True, tag="tiering.partition-state"):
    """The document: every entry of one partition, by base offset."""

    segments: Mapping[int, SegmentState] = msgspec.field(default_factory=dict)
    # Where the next key-compaction pass's key map starts (the end of the last whole pass: Kafka's
    # cleaner-offset-checkpoint); None: from the first segment.
    keys_checkpoint: int | None = None
    # The key-compaction runs that replaced segments here, oldest first: only the last may be rolled back
    # (an earlier pass's originals could bring back what a later pass let go).
    keys_runs: tuple[str, ...] = ()
    # The storage-class moves of tiering runs, by segment, oldest first (what rolling them back undoes).
    tiered: Marks = msgspec.field(default_factory=dict)
    schema_version: Literal[1] = 1

    def get(self, base: int) -> SegmentState | None:
        return self.segments.get(base)

    def replacing_runs(self, base: int, generation: str | None) -> tuple[str, ...]:
        """The runs, newest first, whose generations replaced segment ``base`` as generation ``generation``
        had it (None: as Kafka wrote it); empty when no lineage here says so."""
        for top in self.segments.values():
            todo: list[tuple[tuple[str, ...], SegmentState]] = [((), top)]
            while todo:
                above, entry = todo.pop()
                if not entry.compacted:
                    continue
                chain = above if entry.run_id in above else (*above, entry.run_id)
                for r in entry.replaced:
                    if r.base_offset == base and generation_in_place(r.entry) == generation:
                        return chain
                    if r.entry is not None:
                        todo.append((chain, r.entry))
        return ()


@dataclass(frozen=True, slots=True)
class Pruning:
    """Which entries a write drops: those of segments the run's scan did not see in the partition (``live``,
    every base offset it found there). Below the lowest live base offset that is Kafka's retention at work,
    always dropped. Above it (a broker's own compaction merged segments away), only entries recorded
    before a listing made at ``listed_at``: an entry recorded after it (another run's, of a segment that
    appeared since) is kept; None (an S3 Inventory, whose snapshot is older than the scan) keeps them
    all. A dropped entry only costs a re-read: the segment, if it ever comes back, is judged like any
    other."""

    live: frozenset[int]
    listed_at: datetime | None = None
    lowest: int | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "lowest", min(self.live) if self.live else None)

    def drops(self, base: int, entry: SegmentState) -> bool:
        if base in self.live:
            return False
        if self.lowest is not None and base < self.lowest:
            return True
        if entry.recorded_at is None or self.listed_at is None:
            return False
        return datetime.fromisoformat(entry.recorded_at) < self.listed_at - PRUNE_MARGIN


def _read(store: ObjectStore, key: str) -> tuple[PartitionState, str | None]:
    try:
        doc, etag = store.get_json(key)
    except ObjectNotFound:
        return PartitionState(), None
    return read(doc, PartitionState, what="a partition state document", where=f"s3://{store.bucket}/{key}"), etag


def load_state(store: ObjectStore, prefix: str, directory: str) -> PartitionState:
    """The partition's entries; empty when we never touched it."""
    return _read(store, state_key(prefix, directory))[0]


MAX_KEYS_RUNS: Final = 100  # the key-compaction runs a partition's state lists (the latest)
_KEEP: Final = object()  # record_segments: the key-compaction checkpoint stays as it is


def record_segments(store: ObjectStore, prefix: str, directory: str,
                    changes: Mapping[int, SegmentState | None], pruning: Pruning | None = None, *,
                    keys_checkpoint: int | object | None = _KEEP,
                    keys_runs: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None,
                    tiered: Callable[[Marks], Marks] | None = None) -> None:
    """Set (or with None remove) entries in one compare-and-swap, dropping what ``pruning`` says; retried
    from a fresh read if the document moved. Nothing is written when nothing changes. ``keys_checkpoint``:
    set (or with None clear) the partition's key-compaction checkpoint too; ``keys_runs``: how its list of
    key-compaction runs changes; ``tiered``: how the tiering runs' marks change (marks of segments below the
    lowest live one are pruned with their entries: Kafka's retention deleted them)."""
    key = state_key(prefix, directory)
    for _ in range(CAS_ATTEMPTS):
        state, etag = _read(store, key)
        segments = {b: e for b, e in state.segments.items() if pruning is None or not pruning.drops(b, e)}
        for base, entry in changes.items():
            if entry is None:
                segments.pop(base, None)
            elif (there := segments.get(base)) is None or replace(there, recorded_at=entry.recorded_at) != entry:
                segments[base] = entry  # an entry equal but for its time stays as it was
        checkpoint = state.keys_checkpoint if keys_checkpoint is _KEEP else keys_checkpoint
        assert checkpoint is None or isinstance(checkpoint, int)
        runs = state.keys_runs if keys_runs is None else keys_runs(state.keys_runs)
        marks = {b: m for b, m in (state.tiered if tiered is None else tiered(state.tiered)).items()
                 if m and (pruning is None or pruning.lowest is None or b >= pruning.lowest)}
        if (segments == state.segments and checkpoint == state.keys_checkpoint and runs == state.keys_runs
                and marks == state.tiered):
            return
        doc = to_builtins(PartitionState(segments, checkpoint, runs, marks))
        try:
            if etag is None:
                store.put_json(key, doc, if_none_match=True)
            else:
                store.put_json(key, doc, if_match=etag)
            return
        except PreconditionFailed:
            continue
    raise TieringError("the partition state document kept changing under us", path=f"s3://{store.bucket}/{key}",
                       expected=f"a stable document within {CAS_ATTEMPTS} attempts", found="concurrent writers")


def record_keys_checkpoint(store: ObjectStore, prefix: str, directory: str, offset: int | None) -> None:
    """Set (or with None clear) where the partition's next key-compaction pass's key map starts."""
    record_segments(store, prefix, directory, {}, keys_checkpoint=offset)


def record_keys_run(store: ObjectStore, prefix: str, directory: str, run_id: str) -> None:
    """Note, before it replaces a segment here, that key-compaction run ``run_id`` does (once)."""
    record_segments(store, prefix, directory, {},
                    keys_runs=lambda runs: runs if run_id in runs else (*runs, run_id)[-MAX_KEYS_RUNS:])


def forget_keys_run(store: ObjectStore, prefix: str, directory: str, run_id: str) -> None:
    """A key-compaction run rolled back here: off the list, and the checkpoint cleared (records put back
    below it would be missed by the next pass's key map)."""
    record_segments(store, prefix, directory, {}, keys_checkpoint=None,
                    keys_runs=lambda runs: tuple(r for r in runs if r != run_id))


def record_segment(store: ObjectStore, prefix: str, directory: str, base_offset: int,
                   entry: SegmentState | None) -> None:
    """Set (or with None remove) one segment's entry."""
    record_segments(store, prefix, directory, {base_offset: entry})


def stamped(entry: SegmentState) -> SegmentState:
    """``entry`` with the time it is recorded (what pruning compares with a later scan's time)."""
    return replace(entry, recorded_at=datetime.now(UTC).isoformat(timespec="seconds"))


class StateBatch:
    """One partition's state changes, written together by its lease holder: :meth:`put` queues an entry and
    what to do once it is written (the protocol deletes the operation's journal then, never before, so a
    crash before the write leaves the journal, and the recovery records the entry again); :meth:`flush`
    writes them in one compare-and-swap and then runs those steps. Pending changes are visible to
    :meth:`get`. Not thread-safe: one per partition's work. Work that stops before the flush leaves its
    journals behind, which the next run covering the partition finishes; :meth:`unfinished` names those
    segments (their results must not claim them done)."""

    def __init__(self, store: ObjectStore, prefix: str, directory: str, pruning: Pruning | None = None,
                 max_entries: int = BATCH_ENTRIES) -> None:
        self.store, self.prefix, self.directory = store, prefix, directory
        self.pruning = pruning
        self.max_entries = max_entries
        self._changes: dict[int, SegmentState | None] = {}
        self._then: list[tuple[int, Callable[[], None]]] = []
        self._loaded: PartitionState | None = None

    def get(self, base: int) -> SegmentState | None:
        if base in self._changes:
            return self._changes[base]
        if self._loaded is None:
            self._loaded = load_state(self.store, self.prefix, self.directory)
        return self._loaded.get(base)

    def put(self, base: int, entry: SegmentState | None, then: Callable[[], None] | None = None) -> None:
        self._changes[base] = entry
        if then is not None:
            self._then.append((base, then))

    @property
    def full(self) -> bool:
        """Time to :meth:`flush` (the caller does, between segments: a failed write is then nobody's result)."""
        return len(self._changes) >= self.max_entries

    def unfinished(self) -> set[int]:
        """Segments whose entry is not written yet, or whose step after it has not run."""
        return set(self._changes) | {base for base, _ in self._then}

    def flush(self, check: Callable[[], None] | None = None) -> None:
        """Write the queued changes (and prune), then run what waited for them, one at a time (a failure
        leaves the rest queued). ``check`` runs first: the holder's lease check, so that a holder whose
        lease expired writes nothing and deletes nothing (its journals stay for the new holder)."""
        if check is not None and (self._changes or self._then):
            check()
        if self._changes:  # pruning rides along with a write, never costs one of its own
            record_segments(self.store, self.prefix, self.directory, self._changes, self.pruning)
            self._changes, self._loaded = {}, None
        while self._then:
            self._then[0][1]()
            self._then.pop(0)
