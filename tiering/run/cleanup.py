"""Cleanup as a kind of run: what the grace period no longer keeps, deleted a partition at a time under the
partition's lease (so never beside a rollback or another run working there).

For the run as a whole (:meth:`Cleanup.prepare`), before anything else: the leases of runs that finished
are released (a run killed before its release, then re-run under another id), incomplete multipart uploads
older than the stale period aborted, and probes' scratch objects deleted. Then, as for every kind, the
operations crashed runs left in flight are finished. The partitions are those holding kept objects past
their age: originals in ``backup/<run>/`` past the grace period, staging objects in ``staging/<run>/`` past
the stale period, every run's listing read at once, in key order, so that a partition's objects come
together (what is held: one partition's objects, and a listing page of each run that kept any); or an S3
Inventory report's rows under ``backup/`` and ``staging/``, spilled to local files by partition. In each
partition, under its lease: a journal left in flight there finished first, the objects an operation still
in flight names kept, the rest deleted (DeleteObjects, each only if its ETag is still the one listed; the
lease checked just before). Ages are S3's (``LastModified`` against S3's clock read at the start).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, release_finished
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.recover import pending_journals, recover_partition
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import Cause, RunKind, Status
from tiering.options import CLEANUP, Options, option
from tiering.plan.inventory import spill_grouped
from tiering.run import engine
from tiering.run.documents import RunResult, finished_at
from tiering.storage.layout import (
    BACKUP_DIR,
    STAGING_DIR,
    StepDir,
    clock_key,
    kept_segment,
    normalize_prefix,
    probe_dir,
    probe_key,
    reserved_dir,
)
from tiering.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore, delete_honours_etag

DEFAULT_GRACE_DAYS: Final[float] = option(CLEANUP, "grace_days").default
DEFAULT_STALE_HOURS: Final[float] = option(CLEANUP, "stale_hours").default
DELETE_BATCH: Final = 1_000  # the keys of one DeleteObjects (S3's most)
FIGURES: Final = ("backups_deleted", "backup_bytes_deleted", "staging_deleted", "kept_referenced", "kept_changed",
                  "uploads_aborted", "probes_deleted", "leases_released")


@dataclass(frozen=True, slots=True)
class CleanupOptions(Options):
    """How long kept originals and staging objects stay, the partitions' lease time; and, once the run has
    started, S3's clock then (ISO 8601) and whether the store's DeleteObjects honours an ETag (else each
    object is looked at again before it is deleted). Declared in :data:`tiering.options.CLEANUP`."""

    DECLARED: ClassVar = CLEANUP
    WHAT: ClassVar = "cleanup options"

    grace_days: float = DEFAULT_GRACE_DAYS
    stale_hours: float = DEFAULT_STALE_HOURS
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    now: str | None = None
    deletes_checked: bool | None = None


@dataclass(frozen=True, slots=True)
class Expired:
    """One kept object past its age: its key and ETag as listed, its size, and the segment it belongs to."""

    key: str
    etag: str
    size: int
    base_offset: int

    def to_json(self) -> list[Any]:
        return [self.key, self.etag, self.size, self.base_offset]

    @classmethod
    def from_json(cls, doc: list[Any]) -> Expired:
        return cls(str(doc[0]), str(doc[1]), int(doc[2]), int(doc[3]))


@dataclass(frozen=True, slots=True)
class CleanupPartition:
    """One partition's objects past their age: kept originals and staging objects."""

    directory: str
    backups: tuple[Expired, ...]
    staging: tuple[Expired, ...]
    refused: ClassVar[tuple[SegmentResult, ...]] = ()
    noted: ClassVar[tuple[SegmentResult, ...]] = ()

    @property
    def todo(self) -> tuple[int, ...]:
        return tuple(sorted({e.base_offset for e in (*self.backups, *self.staging)}))

    @property
    def bytes(self) -> int:
        return sum(e.size for e in (*self.backups, *self.staging))

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "backups": [e.to_json() for e in self.backups],
                "staging": [e.to_json() for e in self.staging]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CleanupPartition:
        return cls(str(doc["directory"]), tuple(Expired.from_json(e) for e in doc["backups"]),
                   tuple(Expired.from_json(e) for e in doc["staging"]))


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Cleanup as a kind of run (see the module)."""

    options: CleanupOptions = CleanupOptions()

    run_kind: ClassVar[RunKind] = RunKind.CLEANUP
    label: ClassVar[str] = "cleanup"
    step: ClassVar[StepDir] = StepDir.CLEANUP
    plans_ahead: ClassVar[bool] = False

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def started(self, store: ObjectStore, prefix: str) -> Cleanup:
        """The cleanup with S3's clock read and whether the store's DeleteObjects honours an ETag learnt (a
        scratch object written and deleted), unless the options say."""
        prefix = normalize_prefix(prefix)
        now = self.options.now or store.now(clock_key(prefix)).isoformat()
        checked = self.options.deletes_checked
        if checked is None:
            checked = delete_honours_etag(store, probe_key(prefix, "cleanup", secrets.token_hex(4), "delete-etag"))
        return Cleanup(replace(self.options, now=now, deletes_checked=checked))

    @property
    def now(self) -> datetime:
        if self.options.now is None:
            raise ConfigError("a cleanup has no clock before it starts", expected="now", found=None)
        return datetime.fromisoformat(self.options.now)

    def prepare(self, ctx: Context) -> dict[str, Counter[str]]:
        """The leases of finished runs released, stale multipart uploads aborted, stale probe objects deleted."""
        store, prefix, now = ctx.store, ctx.prefix, self.now
        stale = timedelta(hours=self.options.stale_hours)
        done = Counter(leases_released=release_finished(
            store, prefix, functools.cache(lambda run_id: finished_at(store, prefix, run_id))))
        for key, upload_id, initiated in store.list_uploads(reserved_dir(prefix)):
            if now - initiated > stale:
                store.abort_upload(key, upload_id)
                done["uploads_aborted"] += 1
        for run_dir in store.list_dirs(reserved_dir(prefix, STAGING_DIR)):
            run_id = run_dir.rstrip("/").rpartition("/")[2]
            probes = [(i.key, i.etag) for i in store.list(probe_dir(prefix, run_id)) if now - i.last_modified >= stale]
            done["probes_deleted"] += len(store.delete_many(probes)) if probes else 0
        return {"cleanup": done}

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[CleanupPartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        """Each partition with kept objects past their age: from every run's backup and staging listings read
        together in key order (a partition's objects come one after the other), or from an S3 Inventory's
        objects (``source``, which hold no promised order: spilled by partition). An inventory is stale: an
        object kept since it was taken waits for a later cleanup, and one rewritten since is not deleted
        (its ETag no longer the one listed)."""
        prefix = normalize_prefix(prefix)
        ages = {BACKUP_DIR: timedelta(days=self.options.grace_days),
                STAGING_DIR: timedelta(hours=self.options.stale_hours)}
        now = self.now
        if source is None:
            def runs(sub: str) -> list[Iterator[tuple[str, str, Expired]]]:
                return [_kept(store.list(run), run, sub, ages[sub], now)
                        for run in store.list_dirs(reserved_dir(prefix, sub))]

            merged = heapq.merge(*runs(BACKUP_DIR), *runs(STAGING_DIR), key=lambda e: e[0])
            groups: Iterable[tuple[str, Iterable[tuple[str, str, Expired]]]] = itertools.groupby(
                merged, key=lambda e: e[0].partition("/")[0])
        else:
            groups = _inventoried(source, prefix, ages, now)
        for directory, found in groups:
            objects = list(found)
            emit(CleanupPartition(directory, tuple(e for _, sub, e in objects if sub == BACKUP_DIR),
                                  tuple(e for _, sub, e in objects if sub == STAGING_DIR)))

    def partition_from_json(self, doc: Mapping[str, Any]) -> CleanupPartition:
        return CleanupPartition.from_json(doc)

    def work(self, ctx: Context, part: CleanupPartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        """The partition's journals finished, then its expired objects deleted but those an operation still in
        flight names; one result a segment."""
        store = ctx.store
        pending = list(pending_journals(store, ctx.prefix, part.directory))
        if pending:  # one a crashed run left since the planner finished the others: finished first too
            out += recover_partition(ctx, part.directory, lease)
            pending = list(pending_journals(store, ctx.prefix, part.directory))
        referenced: set[str] = set()
        for journal, _ in pending:
            referenced |= journal.referenced()
        wanted = [e for e in (*part.backups, *part.staging) if e.key not in referenced]
        if not self.options.deletes_checked:  # the store would delete a key rewritten since the listing
            looked: list[Expired] = []
            for e in wanted:
                lease.keep_alive()  # a HEAD an object: renewed when due
                if _still(store, e):
                    looked.append(e)
            wanted = looked
        deleted: set[str] = set()
        for at in range(0, len(wanted), DELETE_BATCH):
            lease.check()  # still ours, just before the deletes (a stall the local clock did not see)
            deleted |= store.delete_many([(e.key, e.etag) for e in wanted[at:at + DELETE_BATCH]])
        backups = {e.key for e in part.backups}
        by_base: dict[int, Counter[str]] = {}
        for e in (*part.backups, *part.staging):
            counts = by_base.setdefault(e.base_offset, Counter())
            if e.key in referenced:
                counts["kept_referenced"] += 1
            elif e.key in deleted and e.key in backups:
                counts["backups_deleted"] += 1
                counts["backup_bytes_deleted"] += e.size
            elif e.key in deleted:
                counts["staging_deleted"] += 1
            else:
                counts["kept_changed"] += 1
        for base, counts in sorted(by_base.items()):
            result = _result(part.directory, base, counts)
            out.append(result)
            if progress is not None:
                progress(result)

    def settings_json(self) -> dict[str, Any]:
        return {"grace_days": self.options.grace_days, "stale_hours": self.options.stale_hours,
                "lease_ttl_seconds": self.options.lease_ttl_seconds, "now": self.options.now}

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        """What was deleted and kept, from each segment's result; with :meth:`prepare`'s, under ``cleanup``."""
        counts = Counter(dict.fromkeys(FIGURES, 0))
        for r in results:
            found = (r.stats or {}).get("cleanup")
            if isinstance(found, Mapping):
                counts.update({k: int(v) for k, v in found.items() if k in FIGURES})
        return {"cleanup": counts}


def _kept(objects: Iterable[ObjectInfo], run_dir: str, sub: str, age: timedelta, now: datetime
          ) -> Iterator[tuple[str, str, Expired]]:
    """A run's kept objects (``objects``, under ``run_dir``) past ``age``, each with the key below the run's
    directory (``<partition>/<file>``: the order in which the runs' listings are merged)."""
    for info in objects:
        where = kept_segment(run_dir, info.key)
        if where is not None and now - info.last_modified >= age:
            yield info.key[len(run_dir):], sub, Expired(info.key, info.etag, info.size, where[1])


def _inventoried(objects: Iterator[ObjectInfo], prefix: str, ages: Mapping[str, timedelta], now: datetime
                 ) -> Iterator[tuple[str, list[tuple[str, str, Expired]]]]:
    """The kept objects of an inventory past their age, by partition (:func:`spill_grouped`: only those are
    spilled), each as :func:`_kept` gives it."""
    roots = {sub: reserved_dir(prefix, sub) for sub in ages}

    def expired(info: ObjectInfo) -> tuple[str, str, Expired] | None:
        for sub, root in roots.items():
            if info.key.startswith(root) and not any(c in info.key for c in "\t\n\r"):
                run, slash, _ = info.key[len(root):].partition("/")
                return next(_kept((info,), root + run + "/", sub, ages[sub], now), None) if slash else None
        return None

    def partition(info: ObjectInfo) -> str | None:
        found = expired(info)
        return found[0].partition("/")[0] if found is not None else None

    for directory, infos in spill_grouped(objects, partition):
        yield directory, [found for info in infos if (found := expired(info)) is not None]


def _result(directory: str, base: int, counts: Counter[str]) -> SegmentResult:
    """What became of one segment's kept objects."""
    gone = counts["backups_deleted"] + counts["staging_deleted"]
    kept = counts["kept_referenced"] + counts["kept_changed"]
    parts = [f"{counts['backups_deleted']} kept originals" if counts["backups_deleted"] else "",
             f"{counts['staging_deleted']} staging objects" if counts["staging_deleted"] else ""]
    said = " and ".join(p for p in parts if p)
    why = ("an operation in flight still needs them" if counts["kept_referenced"] else
           "rewritten since they were listed")
    reason = (f"{said} deleted" if gone else "") + ("; " if gone and kept else "") + \
             (f"{kept} kept: {why}" if kept else "")
    stats: dict[str, object] = {"cleanup": {k: v for k, v in counts.items() if k in FIGURES and v}}
    return SegmentResult(directory, base, Status.EXPIRED if gone else Status.SKIPPED, reason, stats=stats,
                         cause=None if gone else Cause.BUSY)


def _still(store: ObjectStore, e: Expired) -> bool:
    """Whether ``e``'s object is still the version listed, or gone already (a HEAD): either way no other
    version is deleted with it."""
    try:
        return store.head(e.key).etag == e.etag
    except ObjectNotFound:
        return True


def cleanup(store: ObjectStore, ctx: Context, options: CleanupOptions = CleanupOptions(),
            progress: Callable[[SegmentResult], None] | None = None, *, workers: int = 1,
            source: Iterator[ObjectInfo] | None = None) -> RunResult:
    """A cleanup in this process, as run ``ctx.run_id`` (:class:`Cleanup`, through the engine); ``source``: an
    S3 Inventory's objects to find the kept ones in, instead of listing them."""
    return engine.run(store, ctx, Cleanup(options), progress, workers=workers, source=source)


@dataclass(frozen=True, slots=True)
class CleanupFigures:
    """A cleanup run's figures, read from its run document."""

    backups_deleted: int
    backup_bytes_deleted: int
    staging_deleted: int
    kept_referenced: int
    kept_changed: int
    uploads_aborted: int
    probes_deleted: int
    leases_released: int

    @classmethod
    def of(cls, run: RunResult) -> CleanupFigures:
        found = (run.usage or {}).get("cleanup")
        if not isinstance(found, Mapping):
            raise ConfigError("not a cleanup's run document", path=run.run_id, expected="usage.cleanup",
                              found=sorted(run.usage or {}))
        return cls(*(int(found.get(name, 0)) for name in FIGURES))

    def counts(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIGURES}

    def summary(self, size: Callable[[int], str] = lambda n: f"{n:,} bytes") -> str:
        """One line for people (``size``: how a number of bytes reads)."""
        return (f"{self.backups_deleted:,} kept originals deleted ({size(self.backup_bytes_deleted)}), "
                f"{self.staging_deleted:,} staging objects deleted, {self.uploads_aborted:,} incomplete uploads "
                f"aborted" + (f", {self.kept_referenced:,} kept (an operation in flight needs them)"
                              if self.kept_referenced else "")
                + (f", {self.leases_released:,} leases of finished runs released" if self.leases_released else ""))
