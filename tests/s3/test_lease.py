"""Partition leases against moto: conditional create, expiry by S3's clock, takeover, renewal, release."""

from __future__ import annotations

import time

import pytest

from tests.s3.conftest import PREFIX, fresh_store
from tiering.commit.lease import Lease, LeaseHeld, LeaseLost, release_finished, release_leases_of
from tiering.storage.layout import clock_key, lease_key
from tiering.storage.s3 import S3Store

KEY = lease_key(PREFIX, "orders-0")


def test_one_holder_at_a_time_and_the_same_owner_takes_its_own_back(store: S3Store) -> None:
    a = Lease(store, KEY, "run-a")
    a.acquire(PREFIX)
    with pytest.raises(LeaseHeld, match=r"run run-a holds the partition's lease \(renewed \d+ s ago by S3's clock"):
        Lease(fresh_store(), KEY, "run-b").acquire(PREFIX)
    again = Lease(fresh_store(), KEY, "run-a")  # a retry of the same run
    again.acquire(PREFIX)
    with pytest.raises(LeaseLost):
        a.check()  # the first handle's ETag is stale now
    again.release()
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))


def test_an_expired_lease_is_taken_over_and_its_old_holder_stops(store: S3Store) -> None:
    old = Lease(store, KEY, "run-old", ttl_seconds=1)
    old.acquire(PREFIX)
    time.sleep(2.2)  # expiry is judged by S3's clock (LastModified), with one-second resolution
    new = Lease(fresh_store(), KEY, "run-new", ttl_seconds=600)
    new.acquire(PREFIX)
    with pytest.raises(LeaseLost, match="taken over"):
        old.check()
    old.release()  # must not delete the successor's lease
    assert store.get_json(KEY)[0]["owner"] == "run-new"
    with pytest.raises(LeaseHeld):
        Lease(fresh_store(), KEY, "run-third").acquire(PREFIX)


def test_keep_alive_renews_after_a_third_of_the_ttl(store: S3Store) -> None:
    lease = Lease(store, KEY, "run-a", ttl_seconds=3)
    lease.acquire(PREFIX)
    first = lease.etag
    lease.keep_alive()
    assert lease.etag == first  # too early: nothing sent
    time.sleep(1.1)
    lease.keep_alive()
    assert lease.etag != first
    assert store.get_json(KEY)[0]["renewals"] == 1


def test_release_of_a_lease_never_held_is_a_no_op(store: S3Store) -> None:
    Lease(store, KEY, "run-a").release()
    with pytest.raises(LeaseLost, match="not held"):
        Lease(store, KEY, "run-a").check()


def _held(store: S3Store) -> dict[str, str]:
    return {info.key.rsplit("/", 1)[1]: store.get_json(info.key)[0]["owner"]
            for info in store.list(f"{PREFIX}/_tiering/leases/")}


def test_a_run_at_its_end_releases_every_lease_it_holds_and_no_other(store: S3Store) -> None:
    for directory, owner in (("orders-0", "run-a"), ("orders-1", "run-a"), ("orders-2", "run-b")):
        Lease(store, lease_key(PREFIX, directory), owner).acquire(PREFIX)
    assert release_leases_of(store, PREFIX, "run-a") == 2
    assert _held(store) == {"orders-2.json": "run-b"}
    assert release_leases_of(store, PREFIX, "run-a") == 0


def test_cleanup_releases_the_leases_of_finished_runs_not_renewed_since(store: S3Store) -> None:
    finished = Lease(store, lease_key(PREFIX, "orders-0"), "done")  # killed after its last write, then re-run
    finished.acquire(PREFIX)
    renewed = Lease(store, lease_key(PREFIX, "orders-1"), "retried")  # finished, then retried under its id
    renewed.acquire(PREFIX)
    Lease(store, lease_key(PREFIX, "orders-2"), "running").acquire(PREFIX)  # no run document yet
    time.sleep(1.1)  # LastModified has one-second resolution
    ended = store.now(clock_key(PREFIX))
    time.sleep(1.1)
    renewed.check()
    when = {"done": ended, "retried": ended}
    assert release_finished(store, PREFIX, when.get) == 1
    assert _held(store) == {"orders-1.json": "retried", "orders-2.json": "running"}


def test_what_is_not_a_lease_under_the_leases_is_left_and_a_run_still_releases_its_own(store: S3Store) -> None:
    Lease(store, lease_key(PREFIX, "orders-0"), "run-a").acquire(PREFIX)
    store.put(f"{PREFIX}/_tiering/leases/", b"")  # a console's folder marker
    assert release_leases_of(store, PREFIX, "run-a") == 1
    assert [info.key for info in store.list(f"{PREFIX}/_tiering/leases/")] == [f"{PREFIX}/_tiering/leases/"]
