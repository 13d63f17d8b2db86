"""Storage-class moves in place, as a tiering run and its rollback both make them under a partition's lease:
the operations in flight a move must not cross, and the partition's state following the ETags a copy
changed (a copy of a multipart object gets a new ETag, and a stale one would read as "replaced by someone
else")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgspec import structs

from tiering.commit.operation import SegmentResult
from tiering.commit.recover import pending_journals
from tiering.lifecycle.journal import REGROUPS
from tiering.lifecycle.state import Marks, SegmentState, record_segments
from tiering.lifecycle.vocabulary import FileRole
from tiering.storage.layout import journal_key
from tiering.storage.objects import ObjectNotFound, ObjectStore


def in_flight_groups(store: ObjectStore, prefix: str, directory: str) -> dict[int, str]:
    """The segments of the partition's merges (and their rollbacks) in flight, each with the group's range: a
    move would change a source the merge deletes by its ETag, or put a class on a file it is replacing. (A
    one-segment operation is found at its journal entry's key: :func:`operation_pending`.)"""
    out: dict[int, str] = {}
    for journal, _ in pending_journals(store, prefix, directory, kinds=REGROUPS):
        bases = sorted({g.base_offset for g in (*journal.sources, *journal.targets)})
        for base in bases:
            out[base] = f"{bases[0]}..{bases[-1]}"
    return out


def operation_pending(store: ObjectStore, prefix: str, directory: str, base: int) -> bool:
    """Whether a one-segment operation (a compaction, its rollback) has its journal entry on the segment."""
    try:
        store.head(journal_key(prefix, directory, base))
    except ObjectNotFound:
        return False
    return True


def follow_etags(store: ObjectStore, prefix: str, directory: str, base: int, entry: SegmentState | None,
                  etags: Mapping[FileRole, tuple[str, str]], marks: Callable[[Marks], Marks]) -> None:
    """After copies in place (``etags``: each copied file's ETag before and after), keep our state naming the
    objects, in one write: the compacted entry of the segment (a copy of a multipart object gets a new ETag,
    and a stale one would read as "replaced by someone else") and the tiering marks, changed by ``marks``.
    ``entry``: the segment's entry as the caller, holding the partition's lease, read it."""

    def follow(file: FileRole, etag: str | None) -> str | None:
        old, new = etags.get(file, (None, None))
        return new if etag is not None and etag == old else etag

    changes: dict[int, SegmentState | None] = {}
    if entry is not None:
        updated = structs.replace(entry, log_etag=follow(FileRole.LOG, entry.log_etag) or entry.log_etag,
                          index_etag=follow(FileRole.INDEX, entry.index_etag),
                          timeindex_etag=follow(FileRole.TIMEINDEX, entry.timeindex_etag))
        if updated != entry:
            changes[base] = updated
    record_segments(store, prefix, directory, changes, tiered=marks)


def moved_objects(results: Sequence[SegmentResult]) -> list[dict[str, Any]]:
    """The objects these results moved (not those found already moved), as their stats list them."""
    out: list[dict[str, Any]] = []
    for r in results:
        items = (r.stats or {}).get("moved")
        if isinstance(items, list):
            out += [m for m in items if isinstance(m, dict) and not m.get("already")]
    return out
