"""Merging against SIGKILL: the real ``tiering s3 merge`` (and then ``tiering s3 rollback`` of it) in its own
process, reaching S3 through the chaos proxy, killed right before or right after its N-th S3 request (N
spread over an uninterrupted run's requests, each slot jittered). At the instant of the kill the bucket
must load into a broker with every offset once (``tests/s3/broker_view.py``); then the same command runs
again until it finishes (a merge under the same run id, which takes its lease back; a rollback under a new
one, once the killed one's lease expired), and the partition must be the merged one (or, after the
rollback, the original objects byte for byte), with no journal, swap file or marker left and no traceback
or leaked secret in any process's output."""

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
TRIALS = 5  # per command: kill instants spread evenly over an uninterrupted run's requests, then jittered
ROOT = partition_prefix(PREFIX, f"{TOPIC}-0")
FILES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)


def _batches(originals: dict[int, Original]) -> list[tuple[int, int]]:
    return [(raw.header.offset, raw.header.last_offset) for base in sorted(originals)
            for raw in iter_batches(io.BytesIO(originals[base].log))]


def _names(store: S3Store) -> list[str]:
    return [info.key for info in store.list(ROOT)]


def _trial(store: S3Store, endpoint: str, undo: bool, kill: tuple[int, str] | None) -> tuple[int, list[Proc]]:
    originals = seed(store, segments=5, segment_bytes=20_000)
    before = {(b, s): store.get(segment_key(PREFIX, TOPIC, 0, b, s)) for b in originals for s in FILES}
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(LEASE_TTL)]
    merge = ["s3", "merge", *where, "--segment-bytes", "1MiB", "--min-age-minutes", "0", "--run-id", "merged",
             "--no-report", "--json"]
    argv = ["s3", "rollback", *where, "--run-id", "merged", "--json"] if undo else merge
    if undo:
        assert run_killed(endpoint, merge, "merge")[0].code == 0
    first, requests = run_killed(endpoint, argv, "victim", kill)
    check_loaded(store, ROOT, _batches(originals))  # what a broker restoring the bucket now would load
    procs = [first]
    while procs[-1].code != 0:
        assert len(procs) < 6, [p.summary() for p in procs]
        if procs[-1].code == ExitCode.BUSY:  # a rollback runs under a new id each time: the killed one's lease
            time.sleep(LEASE_TTL + 1)  # expires after its TTL
        procs.append(run_killed(endpoint, argv, "victim")[0])
    problems = [problem for p in procs for problem in p.problems()]
    assert not problems, problems
    assert not list(pending_journals(store, PREFIX))
    assert not [k for k in _names(store) if k.endswith((".swap", ".cleaned"))]
    check_loaded(store, ROOT, _batches(originals))
    bases = sorted(originals)
    if undo:
        assert {k: store.get(segment_key(PREFIX, TOPIC, 0, *k)) for k in before} == before, kill
    else:
        assert store.get(segment_key(PREFIX, TOPIC, 0, bases[0], LOG_SUFFIX)) == b"".join(
            originals[b].log for b in bases[:-1]), kill
    return requests, procs


@pytest.mark.parametrize("undo", [False, True], ids=["merge", "rollback"])
def test_sigkilled_at_aimed_requests_a_rerun_converges(undo: bool, moto_endpoint: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    rng = random.Random(35 + undo)

    def bucket(name: str) -> S3Store:
        client = make_client(endpoint_url=moto_endpoint)
        client.create_bucket(Bucket=name)
        return S3Store(client, name)

    total, procs = _trial(bucket(f"merge-chaos-{int(undo)}"), moto_endpoint, undo, None)  # uninterrupted
    assert procs[0].code == 0
    killed = []
    for i in range(TRIALS):
        kill = (int(total * (i + rng.random()) / TRIALS), "before" if i % 2 else "after")
        _, procs = _trial(bucket(f"merge-chaos-{int(undo)}-{i}"), moto_endpoint, undo, kill)
        assert procs[0].killed, (kill, procs[0].summary())
        killed.append(f"{kill[1]} #{kill[0]}")
    print(f"\n{'rollback of a merge' if undo else 'merge'} ({total} requests): SIGKILLed {', '.join(killed)}; "
          "a broker's load of the bucket whole at each kill; every trial converged")
