"""How a run ends, against SIGKILL: the real ``tiering s3 compact`` killed right before it releases a
partition's lease (the partition's journal entry already deleted, its state written: the work is done and
only the release is missing). A retry under the same run id finds nothing left to compact, and must still
release that lease: then a rollback of the run (a new id, a lease TTL far longer than the test) runs at once
and puts back every original byte for byte. And a run killed after committing, re-run under a new id: the
ledger still counts what the killed run saved, once."""

from __future__ import annotations

import json
from typing import Final

import pytest

from tests.chaos.harness import Proc, Running
from tests.chaos.proxy import Action, Proxy, Request, Rule
from tests.s3.conftest import PREFIX, TOPIC, seed
from tiering.commit.recover import pending_journals
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.storage.layout import leases_dir, ledger_key, segment_key
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.slow
TTL: Final = 600  # seconds: no lease can expire during the test, so only a release frees a partition
FILES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


def _releases_a_lease(request: Request) -> bool:
    return request.method == "DELETE" and request.key.startswith(leases_dir(PREFIX))


def _cli(endpoint: str, argv: list[str], *, kill_at_release: bool = False) -> tuple[Proc, list[str]]:
    """The CLI in its own process through the proxy (SIGKILLed before its first lease release); the lease
    keys that existed when it was killed."""
    victim: list[Running] = []
    seen: list[str] = []

    def die(_: Request) -> None:
        store = S3Store(make_client(endpoint_url=endpoint), argv[argv.index("--bucket") + 1])
        seen.extend(info.key for info in store.list(leases_dir(PREFIX)))
        assert not list(pending_journals(store, PREFIX)), "killed before its journal entry was deleted"
        victim[0].kill()

    # killed, and the request never reaches S3 (a proxy forwards what a client sent whole, killed or not)
    rules = [Rule(_releases_a_lease, Action("reset", before=die))] if kill_at_release else []
    with Proxy(endpoint, rules) as proxy:
        victim.append(Running("victim", argv, proxy.url))
        return victim[0].wait(), seen


def _bucket(endpoint: str, name: str) -> tuple[S3Store, dict[tuple[int, str], bytes]]:
    client = make_client(endpoint_url=endpoint)
    client.create_bucket(Bucket=name)
    store = S3Store(client, name)
    originals = seed(store, segments=4)
    return store, {(b, s): store.get(segment_key(PREFIX, TOPIC, 0, b, s)) for b in originals for s in FILES}


def test_killed_before_its_lease_release_a_same_id_retry_releases_it_and_a_rollback_runs_at_once(
        moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store, before = _bucket(moto_endpoint, "run-end")
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(TTL), "--json"]
    compact = ["s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--no-report", "--run-id", "R"]

    killed, held = _cli(moto_endpoint, compact, kill_at_release=True)
    assert killed.killed, killed.summary()
    assert held == [f"{leases_dir(PREFIX)}{TOPIC}-0.json"]
    blocked, _ = _cli(moto_endpoint, ["s3", "rollback", *where, "--run-id", "R"])
    assert blocked.code == 3, blocked.summary()
    assert "holds the partition's lease" in blocked.stdout, blocked.stdout

    retry, _ = _cli(moto_endpoint, compact)
    assert retry.code == 0, retry.summary()
    assert not retry.problems(), retry.problems()
    sealed = len(before) // len(FILES) - 1  # the last segment is the active one
    assert retry.doc is not None
    assert retry.doc["totals"]["compacted"] == sealed, retry.doc  # by the first attempt
    assert not list(store.list(leases_dir(PREFIX))), "the retry left the killed attempt's lease"

    undo, _ = _cli(moto_endpoint, ["s3", "rollback", *where, "--run-id", "R"])
    assert undo.code == 0, undo.summary()
    assert not undo.problems(), undo.problems()
    assert {k: store.get(segment_key(PREFIX, TOPIC, 0, *k)) for k in before} == before
    assert not list(store.list(leases_dir(PREFIX)))


def test_a_run_killed_after_committing_and_a_rerun_under_a_new_id_leave_a_ledger_of_what_the_bucket_saved(
        moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tiering s3 compact`` SIGKILLed at its first lease release, one partition committed and the other not
    begun (no run document, no report); the plain re-run under a new id compacts the other and publishes
    its report. The ledger holds both runs (the killed one counted from the partitions' state), and what it
    says they saved is what the bucket's ``.log`` objects lost, byte for byte."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store, _ = _bucket(moto_endpoint, "run-end-ledger")
    seed(store, partition=1, segments=4)

    def logs() -> int:
        return sum(o.size for o in store.list(PREFIX + "/") if o.key.endswith(LOG_SUFFIX) and "/_tiering/" not in o.key)

    originals = logs()
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(TTL), "--json"]
    compact = ["s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--workers", "1"]

    killed, _ = _cli(moto_endpoint, [*compact, "--run-id", "K"], kill_at_release=True)
    assert killed.killed, killed.summary()
    rerun, _ = _cli(moto_endpoint, [*compact, "--run-id", "N"])
    assert rerun.code == 0, rerun.summary()
    assert rerun.doc is not None
    assert rerun.doc["totals"]["compacted"] == 3, rerun.doc  # the other partition's sealed segments

    ledger = json.loads(store.get(ledger_key(PREFIX)))["runs"]
    assert sorted((r["run_id"], r["counted_from"]) for r in ledger) == [("K", "state"), ("N", "report")]
    assert next(r for r in ledger if r["run_id"] == "K")["segments_rewritten"] == 3
    assert sum(r["bytes_before"] - r["bytes_after"] for r in ledger) == originals - logs() > 0
