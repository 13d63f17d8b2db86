"""After runs: the cleanup of what the grace period no longer keeps (a run is undone by the rollback kind,
:mod:`tiering.run.rollback`). Journal entries crashed runs left are finished first, then the kept originals
past the grace period, abandoned staging objects and incomplete multipart uploads are deleted, and the leases
of runs that finished are released."""

from __future__ import annotations

import functools
import secrets
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, release_finished
from tiering.commit.operation import (
    Context,
    SegmentResult,
)
from tiering.commit.recover import pending_journals, recover_partition
from tiering.documents import check_document
from tiering.errors import ExitCode
from tiering.lifecycle.vocabulary import RunKind
from tiering.run.documents import outcome
from tiering.run.segment import pending_bases, with_lease
from tiering.storage.layout import (
    BACKUP_DIR,
    STAGING_DIR,
    clock_key,
    normalize_prefix,
    probe_key,
    reserved_dir,
    run_result_key,
)
from tiering.storage.objects import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    delete_honours_etag,
)

DEFAULT_GRACE_DAYS: Final = 7
DEFAULT_STALE_HOURS: Final = 24  # staging objects and multipart uploads older than this are abandoned


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """What a cleanup did: kept originals, staging objects and uploads removed, referenced ones kept, and the
    operations of crashed runs it finished first (or left pending)."""

    KIND: ClassVar[str] = "tiering.cleanup"
    SCHEMA_VERSION: ClassVar[int] = 1

    backups_deleted: int = 0
    backup_bytes_deleted: int = 0
    staging_deleted: int = 0
    uploads_aborted: int = 0
    kept_referenced: int = 0
    recovered: tuple[SegmentResult, ...] = ()
    leases_released: int = 0  # of runs that finished (killed before their release, then re-run under a new id)

    @property
    def left_pending(self) -> tuple[SegmentResult, ...]:
        return tuple(r for r in self.recovered if r.pending is not None)

    def exit_code(self) -> ExitCode:
        return outcome(self.recovered)

    def summary(self) -> str:
        """One line for people."""
        left = len(self.left_pending)
        return (f"{self.backups_deleted:,} kept originals deleted ({self.backup_bytes_deleted:,} bytes), "
                f"{self.staging_deleted:,} staging objects deleted, {self.uploads_aborted:,} uploads aborted, "
                f"{self.kept_referenced:,} kept (still referenced), {len(self.recovered):,} interrupted operations "
                f"finished" + (f", {left:,} left to a later run" if left else "") +
                (f", {self.leases_released:,} leases of finished runs released" if self.leases_released else ""))

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND, "backups_deleted": self.backups_deleted,
                "backup_bytes_deleted": self.backup_bytes_deleted, "staging_deleted": self.staging_deleted,
                "uploads_aborted": self.uploads_aborted, "kept_referenced": self.kept_referenced,
                "recovered": [r.to_json() for r in self.recovered],
                "left_pending": [r.to_json() for r in self.left_pending], "leases_released": self.leases_released}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> CleanupResult:
        check_document(doc, kind=cls.KIND, version=cls.SCHEMA_VERSION, what="a cleanup result", where=where)
        return cls(int(doc["backups_deleted"]), int(doc["backup_bytes_deleted"]), int(doc["staging_deleted"]),
                   int(doc["uploads_aborted"]), int(doc["kept_referenced"]),
                   tuple(SegmentResult.from_json(r) for r in doc["recovered"]), int(doc.get("leases_released", 0)))


def cleanup(store: ObjectStore, ctx: Context, *, grace_days: float = DEFAULT_GRACE_DAYS,
            stale_hours: float = DEFAULT_STALE_HOURS, lease_ttl: int = DEFAULT_TTL_SECONDS) -> CleanupResult:
    """Converge journal entries left by crashed runs, then delete kept originals past the grace period,
    abandoned staging objects, and incomplete multipart uploads; ages by S3's clock (LastModified)."""
    prefix = normalize_prefix(ctx.prefix)
    recovered: list[SegmentResult] = []
    counts: Counter[str] = Counter()
    for directory, bases in sorted(pending_bases(store, prefix).items()):
        def work(lease: Lease, done: list[SegmentResult], directory: str = directory) -> None:
            done += recover_partition(ctx, directory, lease)

        recovered += with_lease(ctx, directory, lease_ttl, work, [(directory, b) for b in bases])
    referenced: set[str] = set()
    for journal, _ in pending_journals(store, prefix):  # those still pending (their partition was busy)
        referenced |= journal.referenced()
    now = store.now(clock_key(prefix))
    checked: bool | None = None  # whether the store's DeleteObjects checks each ETag (probed once, if needed)
    for sub, age in ((BACKUP_DIR, timedelta(days=grace_days)), (STAGING_DIR, timedelta(hours=stale_hours))):
        expired: dict[str, ObjectInfo] = {}
        for info in store.list(reserved_dir(prefix, sub)):
            if now - info.last_modified < age:
                continue
            if info.key in referenced:
                counts["kept_referenced"] += 1
                continue
            expired[info.key] = info
        if expired and checked is None:
            checked = delete_honours_etag(store, probe_key(prefix, ctx.run_id, secrets.token_hex(4), "delete-etag"))
        if expired and not checked:  # the store would delete a key rewritten since the listing: look again first
            expired = {key: info for key, info in expired.items() if _still(store, info)}
        deleted = store.delete_many([(info.key, info.etag) for info in expired.values()])
        if sub == BACKUP_DIR:
            counts["backups_deleted"] += len(deleted)
            counts["backup_bytes_deleted"] += sum(expired[key].size for key in deleted)
        else:
            counts["staging_deleted"] += len(deleted)
    for key, upload_id, initiated in store.list_uploads(reserved_dir(prefix)):
        if now - initiated > timedelta(hours=stale_hours):
            store.abort_upload(key, upload_id)
            counts["uploads_aborted"] += 1
    released = release_finished(store, prefix, functools.cache(lambda run_id: _finished_at(store, prefix, run_id)))
    return CleanupResult(counts["backups_deleted"], counts["backup_bytes_deleted"], counts["staging_deleted"],
                         counts["uploads_aborted"], counts["kept_referenced"], tuple(recovered), released)


def _finished_at(store: ObjectStore, prefix: str, run_id: str) -> datetime | None:
    """When run ``run_id``'s document was written (S3's clock), or None while it has none."""
    for kind in RunKind:
        try:
            return store.head(run_result_key(prefix, run_id, kind)).last_modified
        except ObjectNotFound:
            continue
    return None


def _still(store: ObjectStore, info: ObjectInfo) -> bool:
    """Whether ``info``'s object is still the version listed (a HEAD)."""
    try:
        return store.head(info.key).etag == info.etag
    except ObjectNotFound:
        return False
