"""After runs: a run rolled back from its backups, and the cleanup of what the grace period no longer
keeps: journal entries crashed runs left are finished first, then the kept originals past the grace period,
abandoned staging objects and incomplete multipart uploads are deleted, and the leases of runs that finished
are released."""

from __future__ import annotations

import functools
import secrets
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, release_finished
from tiering.commit.operation import (
    Context,
    SegmentResult,
)
from tiering.commit.recover import pending_journals, recover_partition, stage_rollback
from tiering.commit.regroup import finish_regroup, stage_unmerge
from tiering.commit.swap import finish_one
from tiering.documents import check_document
from tiering.errors import ConfigError, ExitCode
from tiering.kafka.files import parse_segment_name
from tiering.lifecycle.state import PartitionState, forget_keys_run, load_state
from tiering.lifecycle.vocabulary import Cause, RunKind, Status
from tiering.run.documents import RunResult, RunTally, outcome
from tiering.run.segment import pending_bases, with_lease
from tiering.run.tier import rollback_tiering
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


def _backed_up(store: ObjectStore, prefix: str, target_run: str) -> dict[str, set[int]]:
    """The segments run ``target_run`` keeps originals of, by partition directory."""
    root = reserved_dir(prefix, BACKUP_DIR, target_run)
    segments: dict[str, set[int]] = {}
    for info in store.list(root):
        directory, _, name = info.key[len(root):].partition("/")
        parsed = parse_segment_name(name)
        if parsed is not None:
            segments.setdefault(directory, set()).add(parsed[0])
    return segments


def _later_runs(state: PartitionState, directory: str, target_run: str, bases: set[int]) -> list[SegmentResult]:
    """Why run ``target_run`` cannot be rolled back in this partition yet, per segment: a later run replaced
    what it put in place (its lineage says so), a tiering run moved it (its mark says so), or a later
    key-compaction pass ran here (an earlier pass's
    originals could bring back a value whose tombstone, or aborted data whose ``.txnindex`` entry, it let go).
    Empty when nothing stands in the way."""
    def later(runs: Sequence[str], what: str, did: str = "replaced segments here") -> str:
        return (f"not rolled back: {what} {', '.join(runs)} {did} after run {target_run}; "
                f"roll {'it' if len(runs) == 1 else 'those'} back first (newest first)")

    keys = state.keys_runs
    if target_run in keys and keys[-1] != target_run:
        reason = later(list(reversed(keys[keys.index(target_run) + 1:])), "key-compaction run(s)")
        return [SegmentResult(directory, b, Status.SKIPPED, reason, cause=Cause.LATER_RUN) for b in sorted(bases)]
    blocked: dict[int, SegmentResult] = {}
    for base, marks in sorted(state.tiered.items()):  # a tiering run moved the objects this run put in place
        if tiering := [m.run_id for m in reversed(marks) if m.generation == target_run]:
            reason = later(tiering, "tiering run(s)", "moved this segment's objects to another class")
            blocked[base] = SegmentResult(directory, base, Status.SKIPPED, reason, cause=Cause.LATER_RUN)
    for base, entry in sorted(state.segments.items()):
        found = entry.generation_of(target_run, base)
        if found is not None and found.above:
            reason = later(found.above, "run(s)")
            blocked |= {b: SegmentResult(directory, b, Status.SKIPPED, reason, cause=Cause.LATER_RUN)
                        for b in found.bases}
    return [blocked[b] for b in sorted(blocked)]


def rollback(store: ObjectStore, ctx: Context, target_run: str, lease_ttl: int = DEFAULT_TTL_SECONDS) -> RunResult:
    """Put back the originals that run ``target_run`` replaced, wherever what it put in place is still
    there, or, for a tiering run, the storage classes it changed (:func:`rollback_tiering`). Runs are rolled
    back newest first: where a later run replaced what this one made, or moved it to another class (the
    lineage and the marks in the partition's state say so), nothing is changed anywhere and every such
    segment names the run to roll back first."""
    started = datetime.now(UTC).isoformat()
    tally = RunTally()
    segments = _backed_up(store, ctx.prefix, target_run)
    if not segments:
        tiered = rollback_tiering(ctx, target_run, lease_ttl)
        if tiered is None:
            raise ConfigError("no backups of that run and no storage-class moves of it: nothing to roll back (or "
                              "its grace period is over)",
                              path=f"s3://{store.bucket}/{reserved_dir(ctx.prefix, BACKUP_DIR, target_run)}")
        return tiered
    refused = [r for directory, bases in sorted(segments.items())
               for r in _later_runs(load_state(store, ctx.prefix, directory), directory, target_run, bases)]
    for directory, bases in sorted(segments.items() if not refused else ()):
        def work(lease: Lease, out: list[SegmentResult], directory: str = directory, bases: set[int] = bases) -> None:
            out += recover_partition(ctx, directory, lease)
            state = load_state(store, ctx.prefix, directory)
            if later := _later_runs(state, directory, target_run, bases):  # a run since the check above
                out.extend(later)
                return
            restored: list[SegmentResult] = []
            # A segment that run merged is split back into the segments it holds, in one operation.
            merges = {b: e for b, e in state.segments.items()
                      if e.run_id == target_run and e.merged_from and e.compacted}
            merged = {b for e in merges.values() for b in e.merged_from}
            for base in sorted(merges):
                unmerge = stage_unmerge(ctx, directory, merges[base], target_run)
                restored += unmerge if isinstance(unmerge, list) else finish_regroup(ctx, *unmerge, lease)
            for base in sorted(bases - merged):
                staged = stage_rollback(ctx, directory, base, target_run)
                restored.append(staged if isinstance(staged, SegmentResult) else finish_one(ctx, *staged, lease))
            out.extend(restored)
            # Off the list once all of it is undone (a segment another run replaced since keeps this pass's
            # output), and the checkpoint cleared (records put back below it would be missed).
            if target_run in state.keys_runs and all(r.status is Status.ROLLED_BACK for r in restored):
                forget_keys_run(store, ctx.prefix, directory, target_run)

        for result in with_lease(ctx, directory, lease_ttl, work, [(directory, b) for b in sorted(bases)]):
            tally.add(result)
    for result in refused:
        tally.add(result)
    return tally.write(store, RunKind.ROLLBACK, ctx.run_id, ctx.prefix, started, {"restores_run": target_run})


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
