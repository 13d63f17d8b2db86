"""Storage tiering against SIGKILL: the real ``tiering s3 tier`` (and then ``tiering s3 rollback`` of it) in its
own process, reaching S3 through the chaos proxy, killed right before or right after its N-th S3 request (N
spread over an uninterrupted run's requests, each slot jittered). The same command then runs again until it
exits 0 (the tiering run under its id; a rollback under a new one, once the killed one's lease expired), and
the rollback, whichever of the two was killed, must leave every object of the partition as it was: the same
bytes in the same storage class. One ``.log`` is a multipart upload, so a move changes its ETag and the mark
needs its write after the copy too."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import yaml

from tests.chaos.harness import LEASE_TTL, Proc, run_killed
from tests.s3.conftest import PREFIX, TOPIC, seed
from tiering.commit.recover import pending_journals
from tiering.errors import ExitCode
from tiering.lifecycle.state import load_state
from tiering.storage.layout import partition_prefix, segment_key
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.slow
TRIALS = 5  # per command: kill instants spread evenly over an uninterrupted run's requests, then jittered
ROOT = partition_prefix(PREFIX, f"{TOPIC}-0")
POLICY = {"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "GLACIER_IR"}]}}


def _objects(store: S3Store) -> dict[str, tuple[bytes, str]]:
    return {info.key: (store.get(info.key), info.storage_class) for info in store.list(ROOT)}


def _multipart(store: S3Store, key: str) -> None:
    body = store.get(key)
    upload = store.client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
    part = store.client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload, PartNumber=1, Body=body)["ETag"]
    store.client.complete_multipart_upload(Bucket=store.bucket, Key=key, UploadId=upload,
                                           MultipartUpload={"Parts": [{"ETag": part, "PartNumber": 1}]})


def _until_done(endpoint: str, argv: list[str], first: Proc) -> list[Proc]:
    procs = [first]
    while procs[-1].code != 0:
        assert len(procs) < 6, [p.summary() for p in procs]
        if procs[-1].code == ExitCode.BUSY:  # a partition still leased by the killed process
            time.sleep(LEASE_TTL + 1)
        procs.append(run_killed(endpoint, argv, "victim")[0])
    return procs


def _trial(store: S3Store, endpoint: str, policy: Path, undo: bool, kill: tuple[int, str] | None
           ) -> tuple[int, list[Proc]]:
    seed(store, segments=3, segment_bytes=300_000)  # records a year old; .log objects above Glacier IR's minimum
    _multipart(store, segment_key(PREFIX, TOPIC, 0, 0, ".log"))
    before = _objects(store)
    where = ["--bucket", store.bucket, "--prefix", PREFIX, "--lease-ttl-seconds", str(LEASE_TTL)]
    tier = ["s3", "tier", *where, "--policy", str(policy), "--run-id", "tiered", "--json"]
    undo_argv = ["s3", "rollback", *where, "--run-id", "tiered", "--json"]
    if undo:
        assert run_killed(endpoint, tier, "tier")[0].code == 0
    argv = undo_argv if undo else tier
    first, requests = run_killed(endpoint, argv, "victim", kill)
    procs = _until_done(endpoint, argv, first)
    if not undo:
        moved = {key: cls for key, (_, cls) in _objects(store).items() if cls != "STANDARD"}
        assert sorted(moved) == sorted(k for k in before if k.endswith(".log"))[:2], kill  # the sealed ones
        procs += _until_done(endpoint, undo_argv, run_killed(endpoint, undo_argv, "rollback")[0])
    problems = [problem for p in procs for problem in p.problems()]
    assert not problems, problems
    assert not list(pending_journals(store, PREFIX))
    assert _objects(store) == before, kill  # every byte, every class, as before the tiering run
    assert load_state(store, PREFIX, f"{TOPIC}-0").tiered == {}, kill
    return requests, procs


@pytest.mark.parametrize("undo", [False, True], ids=["tier", "rollback"])
def test_sigkilled_at_aimed_requests_a_rerun_converges_and_the_rollback_restores_every_class(
        undo: bool, moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    rng = random.Random(48 + undo)

    def bucket(name: str) -> S3Store:
        client = make_client(endpoint_url=moto_endpoint)
        client.create_bucket(Bucket=name)
        return S3Store(client, name)

    total, procs = _trial(bucket(f"tier-chaos-{int(undo)}"), moto_endpoint, policy, undo, None)  # uninterrupted
    assert procs[0].code == 0
    killed = []
    for i in range(TRIALS):
        kill = (int(total * (i + rng.random()) / TRIALS), "before" if i % 2 else "after")
        _, procs = _trial(bucket(f"tier-chaos-{int(undo)}-{i}"), moto_endpoint, policy, undo, kill)
        assert procs[0].killed, (kill, procs[0].summary())
        killed.append(f"{kill[1]} #{kill[0]}")
    print(f"\n{'rollback of a tiering run' if undo else 'tiering run'} ({total} requests): SIGKILLed "
          f"{', '.join(killed)}; every trial converged, every object back in its class")
