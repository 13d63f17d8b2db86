"""Buckets of a million segments in this process, for planning a rollback and a tiering run at scale
(``bench/bench_plan_scale.py --kinds rollback,tier``).

:class:`IndexedMemoryStore` is :class:`tiering.storage.memory.MemoryStore` (the project's in-process store,
contract-tested against moto) with one change: its listings. MemoryStore builds a listing's every entry when
the listing starts (every key of the bucket walked and the prefix's keys sorted, each with its
``ObjectInfo``): a rollback's listing of one run's backups (three million objects at a million segments)
would hold them all at once in the store, and each of a tiering plan's ten thousand partition listings would
walk every key. Here the keys are also kept sorted (the fill's in one list, sorted once; those put later in
another, so that a plan chunk put does not grow a list of millions) and each page (1,000 entries, keys and
common prefixes, as MemoryStore and S3 answer) is cut from them when it is read, after the last key of the
page before (S3's continuation); pages are counted as MemoryStore counts them. Everything else is
MemoryStore's.

The buckets, filled without a request each (objects share one value per file type; not measured):

- :func:`fill_rollback`: what run ``R`` left after compacting every segment of every partition, copied from
  a real compaction (``tiering.run.pipeline.compact``) of a small partition of generated segments: per
  segment the compacted ``.log``, ``.index`` and ``.timeindex`` in place and the originals under
  ``_tiering/backup/R/<dir>/``; per partition its state document (written by
  :func:`tiering.lifecycle.state.record_segments`) with the run's entry for each segment, and the broker's
  partition files; the run's own documents (``_tiering/runs/R/``) as the compaction wrote them.
- :func:`fill_tier`: a Kafka ``logdir``: per segment a generated ``.log`` (about 200 KB of JSON records,
  snappy, timestamps from 2025-11-22: a year old), its ``.index`` and ``.timeindex`` as Kafka writes them;
  the broker's partition files.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import gc
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Final

from msgspec.structs import replace

from tiering.commit.operation import Context
from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.state import SegmentState, load_state, record_segments
from tiering.plan.scan import ScanOptions, scan
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.layout import BACKUP_DIR, partition_key, reserved_dir, reserved_key, segment_key
from tiering.storage.memory import PAGE, ManualClock, MemoryStore
from tiering.storage.objects import ObjectInfo

SUFFIXES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
PARTITION_FILES: Final = ("leader-epoch-checkpoint", "partition.metadata")
TOPICS: Final = 10
OFFSETS_A_SEGMENT: Final = 1000  # the base offsets' stride (the records' own offsets are the template's)


class _SortedKeys(dict[str, Any]):
    """The store's objects by key, the keys also kept in order: those of the fill in one list (sorted once,
    when first needed), those put since in another (so a put never grows the fill's list of millions)."""

    def __init__(self) -> None:
        super().__init__()
        self._filled: list[str] | None = None
        self._added: list[str] = []

    def lists(self) -> tuple[list[str], list[str]]:
        """The keys in order: the fill's and those put since (no key in both)."""
        if self._filled is None:
            self._filled, self._added = sorted(self), []
        return self._filled, self._added

    def __setitem__(self, key: str, value: Any) -> None:
        if self._filled is not None and key not in self:
            bisect.insort(self._added, key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        if self._filled is not None:
            for keys in (self._added, self._filled):
                at = bisect.bisect_left(keys, key)
                if at < len(keys) and keys[at] == key:
                    del keys[at]
                    return

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            value = super().__getitem__(key)
            del self[key]
            return value
        return super().pop(key, *default)

    def fill(self, items: Iterable[tuple[str, Any]]) -> None:
        """Many objects at once (the order is made once, when next listed)."""
        self._filled = None
        self.update(items)


class IndexedMemoryStore(MemoryStore):
    """MemoryStore whose listings are cut a page at a time from its keys in order (see the module docstring)."""

    def __init__(self, bucket: str, **kwargs: Any) -> None:
        super().__init__(bucket, **kwargs)
        self._objects = self._keys = _SortedKeys()

    def object_of(self, key: str) -> Any:
        """The stored object (its bytes, ETag, time, metadata...), to be shared by :meth:`fill`."""
        return self._objects[key]

    def fill(self, items: Iterable[tuple[str, Any]]) -> None:
        """Objects put in place without a request each (what :meth:`object_of` gave, shared)."""
        with self._lock:
            self._keys.fill(items)

    def ready(self) -> None:
        """The keys put in order now (else the first listing does it, in whatever is measured then)."""
        with self._lock:
            self._keys.lists()

    def __len__(self) -> int:
        return len(self._objects)

    def _listing(self, prefix: str, delimiter: str | None) -> Iterator[list[tuple[str, ObjectInfo | None]]]:
        resume = prefix  # the first key a page may hold (S3's continuation: after the last one listed)
        while True:
            page: list[tuple[str, ObjectInfo | None]] = []
            with self._lock:
                self._count("ListObjectsV2")
                filled, added = self._keys.lists()
                i, j = bisect.bisect_left(filled, resume), bisect.bisect_left(added, resume)
                while len(page) < PAGE:
                    if i < len(filled) and (j >= len(added) or filled[i] < added[j]):
                        key, i = filled[i], i + 1
                    elif j < len(added):
                        key, j = added[j], j + 1
                    else:
                        break
                    if not key.startswith(prefix):
                        break
                    cut = key.find(delimiter, len(prefix)) if delimiter else -1
                    if cut < 0:
                        page.append((key, self._objects[key].info(key, listed=True)))
                        resume = key + "\0"
                    else:
                        common = key[:cut + len(delimiter or "")]
                        page.append((common, None))
                        resume = common[:-1] + chr(ord(common[-1]) + 1)  # past every key under it
                        i, j = bisect.bisect_left(filled, resume), bisect.bisect_left(added, resume)
                i, j = bisect.bisect_left(filled, resume), bisect.bisect_left(added, resume)
                following = min([*filled[i:i + 1], *added[j:j + 1]], default=None)
                done = following is None or not following.startswith(prefix)
            yield page
            if done:
                return


def directory_of(number: int) -> tuple[str, int]:
    """Partition ``number``'s topic and partition (as ``bench/synth_inventory.py`` names them)."""
    return f"events-{number % TOPICS:03d}", number // TOPICS


def release_free_memory() -> None:
    """What filling left garbage or free returned to the system where it can be, before the baseline."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def fill_rollback(store: IndexedMemoryStore, prefix: str, run_id: str, partitions: int, per_partition: int
                  ) -> int:
    """Run ``run_id``'s compaction of every segment, ``per_partition`` segments in each of ``partitions``
    partitions, as it leaves the bucket (module docstring); the objects in the bucket."""
    template = IndexedMemoryStore(store.bucket)
    topic, number = "events-000", 0
    generated = generate_partition(segments=2, kind="json", codec=Codec.SNAPPY, segment_bytes=20_000)
    upload_partition(template, prefix, topic, number, generated)
    run = compact(template, scan(template, prefix, ScanOptions("zstd", min_age_minutes=0)),
                  Context(template, prefix, run_id, RewriteOptions(Codec.ZSTD)), CompactOptions())
    assert [r.status for r in run.segments] == ["compacted"], run.segments  # the first: the second is active
    directory = f"{topic}-{number}"
    entry = load_state(template, prefix, directory).segments[0]
    backup = reserved_dir(prefix, BACKUP_DIR, run_id)
    in_place = {s: template.object_of(segment_key(prefix, topic, number, 0, s)) for s in SUFFIXES}
    kept = {s: template.object_of(f"{backup}{directory}/{0:020d}{s}") for s in SUFFIXES}
    files = {f: template.object_of(partition_key(prefix, topic, number) + f) for f in PARTITION_FILES}
    runs = reserved_key(prefix, "runs", run_id) + "/"
    store.fill((o.key, template.object_of(o.key)) for o in template.list(runs))

    def objects() -> Iterator[tuple[str, Any]]:
        for p in range(partitions):
            t, n = directory_of(p)
            for i in range(per_partition):
                base = i * OFFSETS_A_SEGMENT
                for s in SUFFIXES:
                    yield segment_key(prefix, t, n, base, s), in_place[s]
                    yield f"{backup}{t}-{n}/{base:020d}{s}", kept[s]
            for f, obj in files.items():
                yield partition_key(prefix, t, n) + f, obj

    store.fill(objects())
    for p in range(partitions):
        t, n = directory_of(p)
        record_segments(store, prefix, f"{t}-{n}", {base: _entry_at(entry, base) for base in
                                                    range(0, per_partition * OFFSETS_A_SEGMENT, OFFSETS_A_SEGMENT)})
    store.ready()
    return len(store)


def _entry_at(entry: SegmentState, base: int) -> SegmentState:
    """The template's state entry as the run's entry of segment ``base``."""
    return replace(entry, replaced=tuple(replace(r, base_offset=base) for r in entry.replaced))


def fill_tier(store: IndexedMemoryStore, prefix: str, partitions: int, per_partition: int) -> int:
    """A ``logdir`` of ``partitions`` partitions of ``per_partition`` segments (module docstring), its objects
    last modified the day after their records; the objects in the bucket."""
    template = IndexedMemoryStore(store.bucket, clock=ManualClock(datetime(2025, 11, 23, tzinfo=UTC)))
    topic, number = "events-000", 0
    upload_partition(template, prefix, topic, number, generate_partition(
        segments=1, kind="json", codec=Codec.SNAPPY, segment_bytes=200_000))
    segment = {s: template.object_of(segment_key(prefix, topic, number, 0, s)) for s in SUFFIXES}
    files = {f: template.object_of(partition_key(prefix, topic, number) + f) for f in PARTITION_FILES}

    def objects() -> Iterator[tuple[str, Any]]:
        for p in range(partitions):
            t, n = directory_of(p)
            for i in range(per_partition):
                for s in SUFFIXES:
                    yield segment_key(prefix, t, n, i * OFFSETS_A_SEGMENT, s), segment[s]
            for f, obj in files.items():
                yield partition_key(prefix, t, n) + f, obj

    store.fill(objects())
    store.ready()
    return len(store)
