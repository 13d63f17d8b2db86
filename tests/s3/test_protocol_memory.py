"""The commit protocol's state machine on MemoryStore, without moto: compaction with its journal and state
document, rollback, cleanup, leases expired by moving the store's clock, and a crash at every protocol step
(before the store does the request, and after it did and before the caller hears of it) followed by a re-run,
with every invariant and every original byte checked.

The product code is annotated with S3Store; it is handed a MemoryStore here (tests are not type-checked)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.s3.conftest import BUCKET, PREFIX, TOPIC, Original, check_consistent, context, no_pending, plan_for, seed
from tiering.commit.lease import Lease
from tiering.commit.operation import META_OP, META_RUN, META_SOURCE_ETAG
from tiering.commit.recover import pending_journals
from tiering.errors import ExitCode
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Action, Cause, JournalState, Pending
from tiering.run.cleanup import CleanupFigures, CleanupOptions, cleanup
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import lease_key, segment_key
from tiering.storage.memory import ManualClock, MemoryStore
from tiering.storage.objects import PreconditionFailed, StreamUpload

DIR = f"{TOPIC}-0"
SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
TTL = 60  # seconds: a dead run's lease expires when the test moves the clock past it
Match = Callable[[tuple[Any, ...], dict[str, Any]], bool]


class Crash(Exception):
    """The process dies here (nothing in the package catches it)."""


def key(base: int, suffix: str = LOG_SUFFIX) -> str:
    return segment_key(PREFIX, TOPIC, 0, base, suffix)


class Aimed:
    """A client of the bucket that runs ``action`` at the first call of ``method`` whose arguments
    satisfy ``match``: before the call reaches the store, or (``after``) once the store did it and before the
    caller hears of it. Once ``action`` raised :class:`Crash`, every later call raises it too: the process is
    dead (its lease is not released)."""

    def __init__(self, store: MemoryStore, method: str, match: Match, action: Callable[[], object], *,
                 after: bool = False) -> None:
        self._inner, self._method, self._match, self._action, self._after = (
            store, method, match, action, after)
        self.fired = self.dead = False

    def _fire(self) -> None:
        self.fired = True
        try:
            self._action()
        except Crash:
            self.dead = True
            raise

    def __getattr__(self, name: str) -> Any:
        if name == "writer":  # an upload's calls go through this client too
            return lambda key, **kw: StreamUpload(self, key, **kw)  # type: ignore[arg-type]
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise Crash
            aimed = not self.fired and name == self._method and self._match(args, kwargs)
            if aimed and not self._after:
                self._fire()
            result = attr(*args, **kwargs)
            if aimed and self._after:
                self._fire()
            return result

        return call


def die() -> None:
    raise Crash


def _final(suffix: str, condition: str, arg: int = 0) -> Match:
    return lambda a, k: a[arg].endswith(suffix) and "/_tiering/" not in a[arg] and bool(k.get(condition))


def _ours(where: str, suffix: str = "", condition: str | None = None, arg: int = 0) -> Match:
    return lambda a, k: (f"/_tiering/{where}/" in a[arg] and a[arg].endswith(suffix)
                         and (condition is None or bool(k.get(condition))))


# Every request of the protocol that changes something, in the order a compaction makes them (MemoryStore
# refuses a copy whose target If-Match fails, as S3 does: the run swaps by server-side copy).
STEPS: dict[str, tuple[str, Match]] = {
    "swap-probe": ("put", lambda a, k: "/_tiering/staging/" in a[0] and "/probe/" in a[0]),
    "staging-upload": ("_single", _ours("staging", LOG_SUFFIX)),
    "staging-index": ("put", _ours("staging", INDEX_SUFFIX)),
    "journal-create": ("put_json", _ours("journal", condition="if_none_match")),
    "backup-log": ("copy", _ours("backup", LOG_SUFFIX, arg=1)),
    "backup-timeindex": ("copy", _ours("backup", TIME_INDEX_SUFFIX, arg=1)),
    "journal-backed-up": ("put_json", _ours("journal", condition="if_match")),
    "index-delete": ("delete", _final(INDEX_SUFFIX, "if_match")),
    "timeindex-delete": ("delete", _final(TIME_INDEX_SUFFIX, "if_match")),
    "log-swap": ("copy_over", _final(LOG_SUFFIX, "if_match", arg=1)),
    "index-put": ("put_object", _final(INDEX_SUFFIX, "if_none_match")),
    "timeindex-put": ("put_object", _final(TIME_INDEX_SUFFIX, "if_none_match")),
    "state-write": ("put_json", _ours("state")),
    "journal-delete": ("delete", _ours("journal")),
    "staging-delete": ("delete", _ours("staging")),
}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def mem(clock: ManualClock) -> MemoryStore:
    return MemoryStore(BUCKET, clock=clock)


@pytest.fixture
def originals(mem: MemoryStore) -> dict[int, Original]:
    return seed(mem)


@pytest.fixture
def seeded(mem: MemoryStore, originals: dict[int, Original]) -> dict[str, bytes]:
    """Every object outside ``_tiering/`` as seeded, by key."""
    return {o.key: mem.get(o.key) for o in mem.list(PREFIX + "/") if "/_tiering/" not in o.key}


def outside(store: MemoryStore) -> set[str]:
    return {o.key for o in store.list(PREFIX + "/") if "/_tiering/" not in o.key}


def under(store: MemoryStore, where: str) -> list[str]:
    return [o.key for o in store.list(f"{PREFIX}/_tiering/{where}/")]


def roll_everything_back(store: MemoryStore, seeded: dict[str, bytes]) -> None:
    """Roll back every run that kept backups, newest first: the bucket holds the seeded bytes again."""
    runs = sorted({d.rsplit("/", 2)[-2] for d in store.list_dirs(f"{PREFIX}/_tiering/backup/")}, reverse=True)
    for i, run_id in enumerate(runs):
        rollback(store, context(store, f"undo-{i}"), run_id, lease_ttl=TTL)
    assert no_pending(store)
    assert {k: store.get(k) for k in outside(store)} == seeded


# --- The whole life of a run ---------------------------------------------------------------------------------


def test_compaction_journals_records_state_and_leaves_only_backups(mem: MemoryStore,
                                                                   originals: dict[int, Original]) -> None:
    sealed, active = sorted(originals)[:-1], sorted(originals)[-1]
    etags = {(b, sfx): mem.head(key(b, sfx)).etag for b in originals for sfx in SUFFIXES}
    journals: list[tuple[str, str]] = []  # (journal state, run that wrote the final .log) as the swap is sent

    def watch() -> None:
        for journal, _ in pending_journals(mem, PREFIX):
            journals.append((journal.state.value, mem.head(journal.final("log")).metadata.get(META_RUN, "")))

    worker = Aimed(mem, "copy_over", _final(LOG_SUFFIX, "if_match", arg=1), watch)
    run = compact(worker, plan_for(mem), context(worker), CompactOptions())
    assert [(r.base_offset, r.status) for r in run.segments] == [(b, "compacted") for b in sealed]
    assert run.exit_code() == ExitCode.OK
    assert journals == [(JournalState.BACKED_UP.value, "")]  # backed up before the swap; the original in place
    codecs = check_consistent(mem, originals)
    assert [codecs[b] for b in sealed] == ["zstd"] * len(sealed)
    assert codecs[active] == "snappy"
    state = load_state(mem, PREFIX, DIR)
    assert sorted(state.segments) == sealed
    for b in sealed:
        entry, info = state.segments[b], mem.head(key(b))
        assert (entry.codec, entry.run_id, entry.source_log_etag) == ("zstd", "run-1", etags[b, LOG_SUFFIX])
        assert [entry.log_etag, entry.index_etag, entry.timeindex_etag] == [
            mem.head(key(b, sfx)).etag for sfx in SUFFIXES]
        assert (entry.bytes_before, entry.bytes_after) == (len(originals[b].log), info.size)
        assert info.metadata[META_SOURCE_ETAG] == etags[b, LOG_SUFFIX].strip('"')
        assert info.metadata[META_OP].startswith("run-1.")
        for sfx in SUFFIXES:  # the backups are the originals, ETag for ETag (plain MD5s: byte for byte)
            assert mem.head(f"{PREFIX}/_tiering/backup/run-1/{DIR}/{b:020d}{sfx}").etag == etags[b, sfx]
    assert no_pending(mem)
    assert under(mem, "staging") == under(mem, "leases") == []
    assert len(under(mem, "backup")) == 3 * len(sealed)
    doc = mem.get_json(f"{PREFIX}/_tiering/runs/run-1/compact.json")[0]
    assert doc["totals"]["compacted"] == len(sealed)
    copies = doc["usage"]["requests"][DIR]["CopyObject"]  # by partition, counted as S3 would bill them
    assert copies == 4 * len(sealed) + 2  # three backups and the swap a segment; the two copies of the run's probe
    plan = plan_for(mem)
    assert [s.action for s in plan.segments] == [Action.SKIP] * len(plan.segments)


def test_rollback_then_cleanup_by_the_store_s_clock(mem: MemoryStore, clock: ManualClock,
                                                    originals: dict[int, Original], seeded: dict[str, bytes]) -> None:
    sealed = sorted(originals)[:-1]
    compact(mem, plan_for(mem), context(mem), CompactOptions())
    run = rollback(mem, context(mem, "undo-1"), "run-1")
    assert [(r.base_offset, r.status) for r in run.segments] == [(b, "rolled-back") for b in sealed]
    assert {k: mem.get(k) for k in outside(mem)} == seeded  # every original byte, indexes included
    assert all(META_RUN not in mem.head(key(b)).metadata for b in sealed)
    assert load_state(mem, PREFIX, DIR).segments == {}
    assert no_pending(mem)
    assert {r.status for r in rollback(mem, context(mem, "undo-2"), "run-1").segments} == {"skipped"}
    # Leftovers of a crash: an orphan staging object and an incomplete multipart upload.
    mem.put(f"{PREFIX}/_tiering/staging/dead-run/{DIR}/{0:020d}.log", b"x")
    mem.create_upload(f"{PREFIX}/_tiering/staging/dead-run/big.log")
    kept = CleanupFigures.of(cleanup(mem, context(mem, "clean-1")))
    assert (kept.backups_deleted, kept.staging_deleted, kept.uploads_aborted) == (0, 0, 0)
    clock.advance(hours=25)  # past the staging age, within the backups' grace period
    stale = CleanupFigures.of(cleanup(mem, context(mem, "clean-2")))
    assert (stale.backups_deleted, stale.staging_deleted, stale.uploads_aborted) == (0, 1, 1)
    clock.advance(days=7)
    backups = list(mem.list(f"{PREFIX}/_tiering/backup/"))
    deleted_before, batches_before = mem.requests["DeleteObject"], mem.requests["DeleteObjects"]
    done = CleanupFigures.of(cleanup(mem, context(mem, "clean-3")))
    assert (done.backups_deleted, done.backup_bytes_deleted) == (3 * len(sealed), sum(o.size for o in backups))
    assert mem.requests["DeleteObject"] - deleted_before == 1  # the partition's lease, released
    assert mem.requests["DeleteObjects"] - batches_before == 1 + 2  # one for them all, two for the probe
    assert under(mem, "backup") == under(mem, "staging") == []
    assert not list(mem.list_uploads(PREFIX + "/"))


def test_a_live_lease_keeps_a_partition_until_it_expires_by_the_store_s_clock(
        mem: MemoryStore, clock: ManualClock, originals: dict[int, Original]) -> None:
    other = Lease(mem, lease_key(PREFIX, DIR), owner="run-other", ttl_seconds=TTL)
    other.acquire(PREFIX)
    busy = compact(mem, plan_for(mem), context(mem), CompactOptions(lease_ttl_seconds=TTL))
    assert {(r.status, r.pending) for r in busy.segments} == {("skipped", Pending.BUSY)}
    assert all("run run-other holds the partition's lease" in r.reason for r in busy.segments)
    clock.advance(seconds=TTL)  # at the TTL exactly, still held
    assert compact(mem, plan_for(mem), context(mem), CompactOptions()).exit_code() == ExitCode.BUSY
    clock.advance(seconds=1)
    run = compact(mem, plan_for(mem), context(mem, "run-2"), CompactOptions())
    assert {r.status for r in run.segments} == {"compacted"}
    check_consistent(mem, originals)


def test_a_source_replaced_right_before_the_swap_is_never_overwritten(mem: MemoryStore,
                                                                      originals: dict[int, Original]) -> None:
    first = sorted(originals)[0]
    worker = Aimed(mem, "copy_over", lambda a, k: a[1] == key(first),
                   lambda: mem.put(key(first), b"a mirror's upload"))
    run = compact(worker, plan_for(mem), context(worker), CompactOptions())
    got = {r.base_offset: (r.status, r.reason) for r in run.segments}
    assert got[first] == ("aborted", "the .log changed after planning: the new object is left untouched")
    assert mem.get(key(first)) == b"a mirror's upload"
    assert mem.get(f"{PREFIX}/_tiering/backup/run-1/{DIR}/{first:020d}.log") == originals[first].log
    assert no_pending(mem)


def test_a_source_replaced_during_its_backup_copy_is_refused_by_the_copy_condition(
        mem: MemoryStore, originals: dict[int, Original]) -> None:
    """On S3 (and MemoryStore) the copy itself is refused; on moto only the HEAD after it notices."""
    first = sorted(originals)[0]
    worker = Aimed(mem, "copy", lambda a, k: a[0] == key(first), lambda: mem.put(key(first), b"rewritten"))
    run = compact(worker, plan_for(mem), context(worker), CompactOptions())
    got = {r.base_offset: r for r in run.segments}[first]
    assert (got.status, got.pending) == ("aborted", Pending.BUSY)
    assert "changed while it was backed up" in got.reason
    assert f"{PREFIX}/_tiering/backup/run-1/{DIR}/{first:020d}.log" not in under(mem, "backup")
    assert mem.get(key(first)) == b"rewritten"
    assert no_pending(mem)


@pytest.mark.parametrize("step", ["log-swap", "index-put"])
def test_a_conditional_write_whose_answer_was_lost_is_recognised_as_ours(
        step: str, mem: MemoryStore, originals: dict[int, Original]) -> None:
    """The store did the write, then the caller heard 412 (what a botocore retry of it gets): the protocol
    tells its own write from another writer's by its op id on the object."""
    method, match = STEPS[step]

    def lost() -> None:
        raise PreconditionFailed("put_object failed with S3 error PreconditionFailed (HTTP 412)")

    worker = Aimed(mem, method, match, lost, after=True)
    run = compact(worker, plan_for(mem), context(worker), CompactOptions())
    assert worker.fired
    assert {r.status for r in run.segments} == {"compacted"}, [r.reason for r in run.segments]
    assert no_pending(mem)
    check_consistent(mem, originals)


# --- A crash at every step -----------------------------------------------------------------------------------


def crash_cases() -> Iterator[Any]:
    for step in STEPS:
        for after in (False, True):
            for rerun in ("same-run", "next-run"):
                yield pytest.param(step, after, rerun, id=f"{step}-{'after' if after else 'before'}-{rerun}")


@pytest.mark.parametrize(("step", "after", "rerun"), list(crash_cases()))
def test_a_crash_at_any_step_is_recoverable_and_loses_nothing(
        step: str, after: bool, rerun: str, mem: MemoryStore, clock: ManualClock,
        originals: dict[int, Original], seeded: dict[str, bytes]) -> None:
    """The run dies at the step (its lease stays); the bucket is consistent at once; a re-run (the same run id
    takes its lease back at once; another waits for it to expire) converges: nothing pending, every sealed
    segment compacted, nothing outside ``_tiering/`` gained or lost; cleanup leaves no orphan; rolling every
    run back gives the seeded bytes back."""
    sealed = sorted(originals)[:-1]
    method, match = STEPS[step]
    dying = Aimed(mem, method, match, die, after=after)
    with pytest.raises(Crash):
        compact(dying, plan_for(mem), context(dying), CompactOptions(lease_ttl_seconds=TTL))
    assert dying.fired
    check_consistent(mem, originals, indexes=False)  # an index may be missing for now: a broker rebuilds it
    assert outside(mem) <= set(seeded)
    assert under(mem, "leases")  # the dead run still holds its partition

    if rerun == "next-run":
        clock.advance(seconds=TTL + 1)
    run = compact(mem, plan_for(mem), context(mem, "run-1" if rerun == "same-run" else "run-2"),
                  CompactOptions(lease_ttl_seconds=TTL))
    assert run.exit_code() == ExitCode.OK, [(r.status, r.reason) for r in run.segments]
    assert no_pending(mem)
    codecs = check_consistent(mem, originals)
    assert [codecs[b] for b in sealed] == ["zstd"] * len(sealed)
    assert outside(mem) == set(seeded)
    assert sorted(load_state(mem, PREFIX, DIR).segments) == sealed

    clock.advance(hours=25)
    cleanup(mem, context(mem, "clean"), CleanupOptions(lease_ttl_seconds=TTL))
    assert under(mem, "staging") == []
    assert not list(mem.list_uploads(PREFIX + "/"))
    roll_everything_back(mem, seeded)
    check_consistent(mem, originals)


@pytest.mark.parametrize("step", ["index-delete", "log-swap", "index-put", "journal-delete"])
def test_a_crash_during_a_rollback_is_finished_by_the_next_one(step: str, mem: MemoryStore, clock: ManualClock,
                                                               seeded: dict[str, bytes]) -> None:
    compact(mem, plan_for(mem), context(mem), CompactOptions())
    method, match = STEPS[step]
    dying = Aimed(mem, method, match, die, after=True)
    with pytest.raises(Crash):
        rollback(dying, context(dying, "undo-1"), "run-1", lease_ttl=TTL)
    clock.advance(seconds=TTL + 1)
    again = rollback(mem, context(mem, "undo-2"), "run-1", lease_ttl=TTL)
    assert again.exit_code() == ExitCode.OK
    assert no_pending(mem)
    assert {k: mem.get(k) for k in outside(mem)} == seeded


def test_a_rollback_whose_backup_goes_after_it_was_staged_restores_nothing_and_exits_1(
        mem: MemoryStore, originals: dict[int, Original]) -> None:
    """The backup a rollback would put back vanishes between its journal entry and its swap (its grace period
    ran out): the compacted segment stays in place, the entry is dropped, and the run says the backup is
    missing (exit 1, never 0)."""
    first = sorted(originals)[0]
    compact(mem, plan_for(mem), context(mem), CompactOptions())
    compacted = mem.get(key(first))
    backup = f"{PREFIX}/_tiering/backup/run-1/{DIR}/{first:020d}.log"
    worker = Aimed(mem, "put_json", lambda a, k: a[0].endswith(f"/journal/{DIR}/{first:020d}.json"),
                   lambda: mem.delete(backup), after=True)
    run = rollback(worker, context(worker, "undo-1"), "run-1")
    assert worker.fired
    got = {r.base_offset: r for r in run.segments}[first]
    assert (got.status, got.cause) == ("failed", Cause.BACKUP_MISSING), got.reason
    assert run.exit_code() == ExitCode.INVALID
    assert mem.get(key(first)) == compacted
    assert no_pending(mem)


# --- An operation left in flight by the previous version -------------------------------------------------------


def as_version_1(doc: dict[str, Any]) -> dict[str, Any]:
    """The one-for-one entry schema version 1 wrote for the same operation (final keys, the ETags replaced and
    their sizes, the new files, the attributes and backups by file name)."""
    [source], [target] = doc["sources"], doc["targets"]
    src, tgt = source["files"], target["files"]
    names = ("log", "index", "timeindex")
    return {"schema_version": 1, **{k: doc[k] for k in ("kind", "op", "run_id", "state", "directory", "base_offset",
                                                      "entry")},
            "final": {n: tgt[n]["final"] for n in names},
            "source": {n: src[n]["etag"] if n in src else None for n in names},
            "source_sizes": {n: src[n]["size"] for n in names if n in src},
            "new": {"log": tgt["log"]["copy"], "index": tgt["index"]["copy"], "timeindex": tgt["timeindex"]["copy"],
                    "log_size": tgt["log"]["size"], "log_etag": tgt["log"]["etag"]},
            "attrs": {n: tgt[n]["attrs"] for n in names},
            "backup": {n: src[n]["copy"] if n in src else None for n in names},
            "payload_xxh3": doc["payload_xxh3"], "log_crc32c": tgt["log"].get("crc32c")}


@pytest.mark.parametrize("step", ["journal-create", "journal-backed-up", "index-delete", "log-swap", "index-put"])
def test_an_entry_version_1_left_in_flight_is_finished_by_this_version(
        step: str, mem: MemoryStore, clock: ManualClock, originals: dict[int, Original],
        seeded: dict[str, bytes]) -> None:
    """A run of the previous version died at the step; its journal entries are in that version's shape. This
    version reads them, finishes them (or takes a staged one's segment anew) and loses nothing."""
    method, match = STEPS[step]
    dying = Aimed(mem, method, match, die, after=True)
    with pytest.raises(Crash):
        compact(dying, plan_for(mem), context(dying), CompactOptions(lease_ttl_seconds=TTL))
    [(journal, etag)] = list(pending_journals(mem, PREFIX))
    written = as_version_1(journal.to_json())
    key = f"{PREFIX}/_tiering/journal/{DIR}/{journal.base_offset:020d}.json"
    mem.put_json(key, written, if_match=etag)
    [(read, _)] = list(pending_journals(mem, PREFIX))
    assert read == journal  # nothing of the operation lost in the older shape
    clock.advance(seconds=TTL + 1)
    run = compact(mem, plan_for(mem), context(mem, "run-2"), CompactOptions(lease_ttl_seconds=TTL))
    assert run.exit_code() == ExitCode.OK, [(r.status, r.reason) for r in run.segments]
    assert no_pending(mem)
    codecs = check_consistent(mem, originals)
    assert [codecs[b] for b in sorted(originals)[:-1]] == ["zstd"] * (len(originals) - 1)
    roll_everything_back(mem, seeded)
    check_consistent(mem, originals)


# --- The staged copy the swap takes ----------------------------------------------------------------------------


def _staged(base: int, run_id: str = "run-1") -> str:
    return f"{PREFIX}/_tiering/staging/{run_id}/{DIR}/{base:020d}.log"


def test_a_staged_log_written_again_after_it_was_verified_is_never_copied_into_place(
        mem: MemoryStore, originals: dict[int, Original]) -> None:
    """Its ETag is no longer the one the journal recorded: the proof fails before anything final changes, the
    staged copy is dropped, and the next run compacts the segment anew."""
    first = sorted(originals)[0]
    worker = Aimed(mem, "put_json", lambda a, k: a[0].endswith(f"/journal/{DIR}/{first:020d}.json"),
                   lambda: mem.put(_staged(first), b"not what was verified"), after=True)
    run = compact(worker, plan_for(mem), context(worker), CompactOptions())
    got = {r.base_offset: r for r in run.segments}[first]
    assert (got.status, got.cause) == ("failed", Cause.PROOF_FAILED), got.reason
    assert "not the one verified" in got.reason
    assert mem.get(key(first)) == originals[first].log  # untouched
    assert no_pending(mem)
    again = compact(mem, plan_for(mem), context(mem, "run-2"), CompactOptions())
    assert {r.base_offset: r.status for r in again.segments}[first] == "compacted"
    check_consistent(mem, originals)


def test_a_journal_without_the_staged_etag_is_swapped_after_decoding_the_staged_log(
        mem: MemoryStore, clock: ManualClock, originals: dict[int, Original]) -> None:
    """An entry an earlier version wrote (no ``log_etag``): the staged .log is decoded (every record, the
    records digest) before the copy, held to the version decoded."""
    first = sorted(originals)[0]
    dying = Aimed(mem, "put_json", lambda a, k: a[0].endswith(f"/journal/{DIR}/{first:020d}.json"), die,
                  after=True)
    with pytest.raises(Crash):
        compact(dying, plan_for(mem), context(dying), CompactOptions(lease_ttl_seconds=TTL))
    [(journal, etag)] = list(pending_journals(mem, PREFIX))
    doc = journal.to_json()
    assert doc["targets"][0]["files"]["log"].pop("etag")
    mem.put_json(f"{PREFIX}/_tiering/journal/{DIR}/{first:020d}.json", doc, if_match=etag)
    gets = mem.requests["GetObject"]
    run = compact(mem, plan_for(mem), context(mem), CompactOptions(lease_ttl_seconds=TTL))
    assert run.exit_code() == ExitCode.OK, [(r.status, r.reason) for r in run.segments]
    assert mem.requests["GetObject"] > gets
    assert no_pending(mem)
    check_consistent(mem, originals)


# --- A staged .log larger than one part ------------------------------------------------------------------------

MULTIPART_STEPS = {"upload-start": "_start", "upload-part": "_part", "upload-complete": "_finish"}


@pytest.mark.parametrize(("step", "after"), [(s, a) for s in MULTIPART_STEPS for a in (False, True)],
                         ids=lambda v: v if isinstance(v, str) else ("after" if v else "before"))
def test_a_crash_during_a_multipart_staging_upload_loses_nothing_and_leaves_nothing_billed(
        step: str, after: bool, clock: ManualClock) -> None:
    """A segment whose new .log spans several parts: the run dies at the upload's start, at a part or at its
    completion; a re-run compacts the segment, and cleanup aborts what the dead run left uploading."""
    from dataclasses import replace

    from tiering.storage.objects import MIN_PART_BYTES

    mem = MemoryStore(BUCKET, clock=clock)
    originals = seed(mem, segments=2, segment_bytes=14 * MIN_PART_BYTES // 5)
    first = sorted(originals)[0]
    method = MULTIPART_STEPS[step]
    dying = Aimed(mem, method, lambda a, k: str(a[0]).endswith(LOG_SUFFIX), die, after=after)
    with pytest.raises(Crash):
        compact(dying, plan_for(mem), replace(context(dying), part_bytes=MIN_PART_BYTES),
                CompactOptions(lease_ttl_seconds=TTL))
    assert dying.fired
    check_consistent(mem, originals)
    assert mem.get(key(first)) == originals[first].log
    clock.advance(seconds=TTL + 1)
    run = compact(mem, plan_for(mem), replace(context(mem, "run-2"), part_bytes=MIN_PART_BYTES),
                  CompactOptions(lease_ttl_seconds=TTL))
    assert run.exit_code() == ExitCode.OK, [(r.status, r.reason) for r in run.segments]
    assert {r.base_offset: r.status for r in run.segments}[first] == "compacted"
    assert mem.requests["UploadPart"] >= 2  # the new .log did go in parts
    assert no_pending(mem)
    check_consistent(mem, originals)
    clock.advance(hours=25)
    cleanup(mem, context(mem, "clean"), CleanupOptions(lease_ttl_seconds=TTL))
    assert not list(mem.list_uploads(PREFIX + "/"))
    assert under(mem, "staging") == []
