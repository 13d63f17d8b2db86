"""Cleanup as a kind of the run engine, on the in-memory store (whose DeleteObjects honours ETags, or not):
every run's kept objects read together a partition at a time, each partition under its lease, the leases of
finished runs released first."""

from __future__ import annotations

import pytest

from tiering.commit.lease import Lease
from tiering.commit.operation import Context
from tiering.errors import ConfigError, ExitCode
from tiering.lifecycle.vocabulary import Cause, RunKind, Status
from tiering.run.cleanup import Cleanup, CleanupFigures, CleanupOptions, cleanup
from tiering.run.kinds import kind_from_json
from tiering.storage.layout import backup_key, lease_key, probe_key, run_result_key, staging_key
from tiering.storage.memory import MemoryStore

PREFIX = "logs"
NOW = CleanupOptions(grace_days=0, stale_hours=0)
# "t-1.x-0" sorts before "t-1" as a key ("." < "/"), after it as a name: the runs' listings are merged by key
PARTITIONS = ("t-1", "t-1.x-0")


def _under(store: MemoryStore, *parts: str) -> set[str]:
    return {i.key for i in store.list(f"{PREFIX}/_tiering/") if any(f"/_tiering/{p}/" in i.key for p in parts)}


def _kept(store: MemoryStore) -> dict[str, bytes]:
    """Backups of two runs and a staging object of a third, in both partitions; a probe's scratch object."""
    objects = {}
    for run in ("r1", "r2"):
        for d in PARTITIONS:
            for base, suffix in ((0, ".log"), (0, ".index"), (100, ".log")):
                objects[backup_key(PREFIX, run, d, base, suffix)] = f"{run} {d} {base}{suffix}".encode()
    for d in PARTITIONS:
        objects[staging_key(PREFIX, "r3", d, 200, ".log")] = b"abandoned"
    objects[probe_key(PREFIX, "r3", "abcd")] = b"probe"
    for key, data in objects.items():
        store.put(key, data)
    return objects


@pytest.mark.parametrize("delete_etags", [True, False])
def test_every_runs_kept_objects_go_a_partition_at_a_time(delete_etags: bool) -> None:
    store = MemoryStore("b", delete_etags=delete_etags)
    objects = _kept(store)
    run = cleanup(store, Context(store, PREFIX, "sweep"), NOW)
    assert run.exit_code() is ExitCode.OK
    assert run.kind is RunKind.CLEANUP
    assert _under(store, "backup", "staging") == set()
    figures = CleanupFigures.of(run)
    backups = {k: v for k, v in objects.items() if "/backup/" in k}
    assert (figures.backups_deleted, figures.backup_bytes_deleted) == (len(backups), sum(map(len, backups.values())))
    assert (figures.staging_deleted, figures.probes_deleted) == (2, 1)
    # one result a segment, each partition once
    assert sorted((r.directory, r.base_offset, r.status) for r in run.segments) == sorted(
        (d, b, Status.EXPIRED) for d in PARTITIONS for b in (0, 100, 200))
    first = next(r for r in run.segments if (r.directory, r.base_offset) == ("t-1", 0))
    assert first.reason == "4 kept originals deleted"


def test_a_busy_partition_keeps_its_objects_and_the_run_says_so() -> None:
    store = MemoryStore("b")
    objects = _kept(store)
    Lease(store, lease_key(PREFIX, "t-1"), "running").acquire(PREFIX)
    run = cleanup(store, Context(store, PREFIX, "sweep"), NOW)
    assert run.exit_code() is ExitCode.BUSY
    busy = [r for r in run.segments if r.directory == "t-1"]
    assert {(r.status, r.cause) for r in busy} == {(Status.SKIPPED, Cause.BUSY)}
    assert all("partition busy: run running holds" in r.reason for r in busy)
    assert _under(store, "backup", "staging") == {k for k in objects if "/t-1/" in k}


def test_a_finished_runs_lease_is_released_first_and_its_partition_cleaned() -> None:
    store = MemoryStore("b")
    _kept(store)
    Lease(store, lease_key(PREFIX, "t-1"), "killed").acquire(PREFIX)  # killed before its release ...
    store.put_json(run_result_key(PREFIX, "killed", RunKind.COMPACT), {"kind": "compact"})  # ... then finished
    run = cleanup(store, Context(store, PREFIX, "sweep"), NOW)
    assert run.exit_code() is ExitCode.OK
    assert CleanupFigures.of(run).leases_released == 1
    assert _under(store, "leases", "backup") == set()


def test_nothing_young_is_touched_and_the_options_travel_as_json() -> None:
    store = MemoryStore("b")
    objects = _kept(store)
    run = cleanup(store, Context(store, PREFIX, "sweep"))  # a week's grace, a day's staleness
    assert run.exit_code() is ExitCode.OK
    assert run.segments == ()
    assert all(store.get(k) == v for k, v in objects.items())
    started = Cleanup(NOW).started(store, PREFIX)
    assert kind_from_json("cleanup", started.options_json()) == started
    with pytest.raises(ConfigError, match="option grace_days is out of its range or of the wrong type"):
        kind_from_json("cleanup", {"grace_days": "soon"})


@pytest.mark.parametrize("delete_etags", [True, False])
def test_an_inventory_finds_what_it_lists_and_a_kept_object_rewritten_since_stays(delete_etags: bool) -> None:
    from tiering.demo.inventory import write_inventory
    from tiering.plan.inventory import inventory_objects

    store = MemoryStore("b", delete_etags=delete_etags)
    objects = _kept(store)
    uri = write_inventory(store, "b", "inventory", list(store.list(f"{PREFIX}/")))
    since = backup_key(PREFIX, "r4", "t-1", 300, ".log")  # kept after the inventory was taken
    rewritten = backup_key(PREFIX, "r1", "t-1", 0, ".log")
    store.put(since, b"kept later")
    store.put(rewritten, b"written again")
    run = cleanup(store, Context(store, PREFIX, "sweep"), NOW, source=inventory_objects(store, uri, PREFIX)[1])
    assert _under(store, "backup", "staging") == {since, rewritten}  # the rest of what the inventory lists: gone
    figures = CleanupFigures.of(run)
    assert (figures.backups_deleted, figures.staging_deleted, figures.kept_changed) == (
        sum("/backup/" in k for k in objects) - 1, 2, 1)
    kept = next(r for r in run.segments if (r.directory, r.base_offset) == ("t-1", 0))
    assert kept.reason == "3 kept originals deleted; 1 kept: rewritten since they were listed"
    assert run.exit_code() is ExitCode.OK  # a rewritten object is another one, of its own age
    # the listing finds the rest
    assert cleanup(store, Context(store, PREFIX, "sweep-2"), NOW).exit_code() is ExitCode.OK
    assert _under(store, "backup", "staging") == set()


def test_an_inventory_plans_the_partitions_a_listing_plans_and_none_with_nothing_past_its_age() -> None:
    from tiering.demo.inventory import write_inventory
    from tiering.plan.inventory import inventory_objects
    from tiering.run import engine

    store = MemoryStore("b")
    _kept(store)
    store.put(backup_key(PREFIX, "r1", "t-2", 0, ".log"), b"kept today")  # within the grace period
    uri = write_inventory(store, "b", "inventory", list(store.list(f"{PREFIX}/")))
    kind = Cleanup(CleanupOptions(grace_days=1, stale_hours=0, deletes_checked=True))

    def planned(from_inventory: bool) -> list[tuple[str, int, int]]:
        found: list[tuple[str, int, int]] = []
        engine.preview(store, PREFIX, kind, lambda p: found.append((p.directory, len(p.backups), len(p.staging))),
                       source=inventory_objects(store, uri, PREFIX)[1] if from_inventory else None)
        return sorted(found)

    assert planned(False) == [("t-1", 0, 1), ("t-1.x-0", 0, 1)]  # only the stale staging objects
    assert planned(True) == planned(False)
