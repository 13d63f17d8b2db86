"""A chain of runs against SIGKILL: the real CLI merges a partition's small segments (run ``merged``), recompresses
the merged segment (run ``squeezed``), then rolls back the recompression and the merge, newest first, each
command in its own process reaching S3 through the chaos proxy. In each trial one command of the chain is
killed right before or right after its N-th S3 request (N spread over an uninterrupted chain's requests for
that command, jittered). At the instant of the kill the bucket must load into a broker with every offset once
(``tests/s3/broker_view.py``); the killed command then runs again until it finishes (the recompression under
its own run id, which takes its lease back; a rollback under a new id, once the killed one's lease expired),
the rest of the chain runs, and every original object must be back byte for byte, with no journal, swap file
or marker left and no traceback or leaked secret in any process's output."""

from __future__ import annotations

import io
import random
import time

import pytest

from tests.chaos.harness import LEASE_TTL, Proc, run_killed
from tests.s3.broker_view import check_loaded
from tests.s3.conftest import PREFIX, TOPIC, Original, seed
from tiering.commit.recover import pending_journals
from tiering.errors import ExitCode
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.reader import iter_batches
from tiering.storage.layout import partition_prefix, segment_key
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.slow
TRIALS = 2  # per killed command: kill instants spread evenly over its uninterrupted requests, then jittered
ROOT = partition_prefix(PREFIX, f"{TOPIC}-0")
FILES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
STEPS = ("merge", "compact", "rollback of compact", "rollback of merge")


def _chain(store: S3Store) -> list[list[str]]:
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(LEASE_TTL), "--json"]
    return [["s3", "merge", *where, "--segment-bytes", "1MiB", "--min-age-minutes", "0", "--run-id", "merged",
             "--no-report"],
            ["s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--run-id", "squeezed",
             "--no-report"],
            ["s3", "rollback", *where, "--run-id", "squeezed"],
            ["s3", "rollback", *where, "--run-id", "merged"]]


def _batches(originals: dict[int, Original]) -> list[tuple[int, int]]:
    return [(raw.header.offset, raw.header.last_offset) for base in sorted(originals)
            for raw in iter_batches(io.BytesIO(originals[base].log))]


def _to_the_end(endpoint: str, argv: list[str], first: Proc) -> list[Proc]:
    """``argv`` run again until it exits 0 (a rollback waits for the lease a killed one left to expire)."""
    procs = [first]
    while procs[-1].code != 0:
        assert len(procs) < 6, [p.summary() for p in procs]
        if procs[-1].code == ExitCode.BUSY:
            time.sleep(LEASE_TTL + 1)
        procs.append(run_killed(endpoint, argv, "victim")[0])
    return procs


def _trial(store: S3Store, endpoint: str, victim: int | None, kill: tuple[int, str] | None
           ) -> tuple[list[int], list[Proc]]:
    """The chain on a fresh partition, command ``victim`` killed at ``kill``; the requests each command made
    (the first attempt's) and every process that ran."""
    originals = seed(store, segments=5, segment_bytes=20_000)
    before = {(b, s): store.get(segment_key(PREFIX, TOPIC, 0, b, s)) for b in originals for s in FILES}
    keys = sorted(i.key for i in store.list(ROOT))
    expected = _batches(originals)
    requests: list[int] = []
    procs: list[Proc] = []
    for i, argv in enumerate(_chain(store)):
        first, made = run_killed(endpoint, argv, STEPS[i], kill if i == victim else None)
        requests.append(made)
        if i == victim:
            assert first.killed, (kill, first.summary())
            check_loaded(store, ROOT, expected)  # what a broker restoring the bucket now would load
        procs += _to_the_end(endpoint, argv, first)
        check_loaded(store, ROOT, expected)
    problems = [problem for p in procs for problem in p.problems()]
    assert not problems, problems
    assert not list(pending_journals(store, PREFIX))
    assert not [i.key for i in store.list(ROOT) if i.key.endswith((".swap", ".cleaned"))]
    assert {k: store.get(segment_key(PREFIX, TOPIC, 0, *k)) for k in before} == before, (victim, kill)
    assert sorted(i.key for i in store.list(ROOT)) == keys  # and no other object
    return requests, procs


def test_a_chain_of_runs_killed_anywhere_then_rolled_back_restores_every_object(
        moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    rng = random.Random(48)
    made = iter(range(1000))

    def bucket() -> S3Store:
        name = f"chain-chaos-{next(made)}"
        client = make_client(endpoint_url=moto_endpoint)
        client.create_bucket(Bucket=name)
        return S3Store(client, name)

    totals, procs = _trial(bucket(), moto_endpoint, None, None)  # uninterrupted: each command's requests
    assert [p.code for p in procs] == [0] * len(STEPS)
    killed = []
    for victim in (1, 2, 3):  # the merge alone is killed in test_merge_chaos.py
        for i in range(TRIALS):
            kill = (int(totals[victim] * (i + rng.random()) / TRIALS), "before" if i % 2 else "after")
            _trial(bucket(), moto_endpoint, victim, kill)
            killed.append(f"{STEPS[victim]} {kill[1]} #{kill[0]}")
    counts = ", ".join(f"{step} {n}" for step, n in zip(STEPS, totals, strict=True))
    print(f"\nchain merge -> compact -> both rollbacks ({counts} requests): SIGKILLed {'; '.join(killed)}; a "
          "broker's load of the bucket whole at each kill and after each command; every original object back "
          "byte for byte")
