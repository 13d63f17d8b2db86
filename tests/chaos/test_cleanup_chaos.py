"""Cleanup against SIGKILL: the real ``tiering s3 cleanup`` in its own process, reaching S3 through the chaos
proxy, killed right before or right after its N-th S3 request (N spread over an uninterrupted cleanup's
requests, each slot jittered), then run again until it exits 0 (a partition the killed one still leases is
left to a later run, exit 3, until its lease expires).

The bucket holds what cleanup is for: a compaction's and a merge's kept originals (past a grace period of
zero days), a stale staging object and an incomplete multipart upload, and one partition with an operation in
flight (a compaction killed after its backup, its journal pending). However the cleanup was killed, once it
converges every segment in place holds its original records beside indexes that fit it, nothing outside
``_tiering/`` changed but what finishing the pending operation swapped, and nothing is left: no backup, no
staging object, no upload, no journal, no lease.

The same trials run a cleanup that plans from an S3 Inventory of the bucket taken before it (``--inventory``,
every re-run with the same stale report), with the same outcome: the report lists every kept object (the
pending operation, staged by another run, is abandoned, which keeps the one backup it made and makes none)."""

from __future__ import annotations

import io
import random
import time

import pytest

from tests.chaos.harness import LEASE_TTL, STEPS, Proc, records, run_killed
from tests.s3.conftest import PREFIX, TOPIC, seed
from tiering.demo.inventory import write_inventory
from tiering.errors import ExitCode
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.records import Record
from tiering.kafka.segment import iter_decoded
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.slow
TRIALS = 4  # kill instants spread evenly over an uninterrupted cleanup's requests, then jittered
RESERVED = f"{PREFIX}/_tiering/"
OTHER = "payments"  # the topic whose compaction is killed mid-way


def _outside(store: S3Store) -> dict[str, bytes]:
    return {info.key: store.get(info.key) for info in store.list(f"{PREFIX}/") if not info.key.startswith(RESERVED)}


def _left(store: S3Store) -> list[str]:
    """What a converged cleanup must have removed: backups, staging objects, journals, leases, uploads."""
    keys = [info.key for sub in ("backup/", "staging/", "journal/", "leases/") for info in store.list(RESERVED + sub)]
    uploads = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    return keys + [f"upload {u['Key']}" for u in uploads]


def _records(objects: dict[str, bytes]) -> dict[str, list[Record]]:
    """Every partition's records in offset order, read from its ``.log`` objects (a merge changes which
    segment holds a record, never the record)."""
    logs = sorted(key for key in objects if key.endswith(LOG_SUFFIX))
    out: dict[str, list[Record]] = {}
    for key in logs:
        batches = iter_decoded(io.BytesIO(objects[key]), path=key)
        out.setdefault(key.rsplit("/", 2)[1], []).extend(r for b in batches for r in b.records)
    return out


def _check_segments(store: S3Store, originals: dict[str, bytes]) -> list[str]:
    """Every partition holds the records it held before anything ran, and every index in place fits its .log."""
    now = _outside(store)
    want, got = _records(originals), _records(now)
    problems = [f"{d}: its records differ from the original's" for d in sorted(want) if got.get(d) != want[d]]
    for key, log in sorted(now.items()):
        if key.endswith(LOG_SUFFIX):
            rebuilt = records(log, int(key.rsplit("/", 1)[1].removesuffix(LOG_SUFFIX)))[1:]
            for suffix, index in zip((INDEX_SUFFIX, TIME_INDEX_SUFFIX), rebuilt, strict=True):
                there = now.get(key.removesuffix(LOG_SUFFIX) + suffix)
                if there is not None and there != index:
                    problems.append(f"{key.removesuffix(LOG_SUFFIX) + suffix}: does not fit its .log")
    return problems


def _until_done(endpoint: str, argv: list[str], first: Proc) -> list[Proc]:
    procs = [first]
    while procs[-1].code != 0:
        assert len(procs) < 6, [p.summary() for p in procs]
        assert procs[-1].killed or procs[-1].code == ExitCode.BUSY, procs[-1].summary()
        if procs[-1].code == ExitCode.BUSY:  # a partition still leased by the killed process
            time.sleep(LEASE_TTL + 1)
        procs.append(run_killed(endpoint, argv, "cleanup")[0])
    return procs


def _prepare(store: S3Store, endpoint: str) -> dict[str, bytes]:
    """Two partitions compacted and then merged (their originals kept); a partition of another topic with a
    compaction killed right after its first backup copy (its journal pending, its staging objects there); a
    stale staging object and an open upload. The segments as they were before any run."""
    for partition in range(2):
        seed(store, partition=partition, segments=4, segment_bytes=40_000)
    seed(store, topic=OTHER, segments=3, segment_bytes=40_000)
    originals = _outside(store)
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(LEASE_TTL), "--json"]
    compact = ["s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0"]
    assert run_killed(endpoint, [*compact, "--topics", TOPIC, "--run-id", "c1"], "compact")[0].code == 0
    merge = ["s3", "merge", *where, "--topics", TOPIC, "--min-age-minutes", "0", "--segment-bytes", "1MiB",
             "--run-id", "m1"]
    assert run_killed(endpoint, merge, "merge")[0].code == 0
    killed, _ = run_killed(endpoint, [*compact, "--topics", OTHER, "--run-id", "c2"], "compact-killed", (0, "after"),
                           at=STEPS["backup-copy"])
    assert killed.killed, killed.summary()
    assert list(store.list(f"{RESERVED}journal/{OTHER}-0/")), "the killed compaction left its journal"
    store.put(f"{RESERVED}staging/abandoned/{TOPIC}-0/00000000000000000000.log", b"left by a run long gone")
    store.client.create_multipart_upload(Bucket=store.bucket, Key=f"{RESERVED}staging/abandoned/part.log")
    time.sleep(LEASE_TTL + 1)  # the killed compaction's lease expires: cleanup may finish its operation
    return originals


@pytest.mark.parametrize("planned_from", ["listing", "inventory"])
def test_a_cleanup_killed_anywhere_converges_deletes_everything_past_its_age_and_loses_nothing(
        planned_from: str, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    rng = random.Random(50)

    def trial(name: str, kill: tuple[int, str] | None) -> tuple[int, list[Proc]]:
        client = make_client(endpoint_url=moto_endpoint)
        client.create_bucket(Bucket=name)
        store = S3Store(client, name)
        originals = _prepare(store, moto_endpoint)
        argv = ["s3", "cleanup", "--bucket", name, "--prefix", PREFIX, "--grace-days", "0", "--stale-hours", "0",
                "--lease-ttl-seconds", str(LEASE_TTL), "--json"]
        if planned_from == "inventory":
            argv += ["--inventory", write_inventory(store, name, "inventory", list(store.list(f"{PREFIX}/")))]
        first, requests = run_killed(moto_endpoint, argv, "cleanup", kill)
        procs = _until_done(moto_endpoint, argv, first)
        problems = [problem for p in procs for problem in p.problems()]
        assert not problems, (kill, problems)
        assert _check_segments(store, originals) == [], kill
        assert _left(store) == [], kill
        return requests, procs

    total, procs = trial(f"cleanup-chaos-{planned_from}", None)
    assert procs[0].code == 0
    killed = []
    for i in range(TRIALS):
        kill = (int(total * (i + rng.random()) / TRIALS), "before" if i % 2 else "after")
        _, procs = trial(f"cleanup-chaos-{planned_from}-{i}", kill)
        assert procs[0].killed, (kill, procs[0].summary())
        killed.append(f"{kill[1]} #{kill[0]}")
    print(f"\ncleanup from a {planned_from} ({total} requests): SIGKILLed {', '.join(killed)}; every trial converged, "
          "nothing lost, nothing left")
