"""One DAG run that key-compacts, merges and recompresses a real broker's partitions on S3, then a storage
tiering run, undone run by run.

The source broker's partitions (conftest.py: Java, librdkafka and kafka-python producers; plain, idempotent,
transactional, compacted and log-append-time topics) are uploaded to a moto server; the Airflow DAG runs
once under a policy that key-compacts two topics and merges and re-batches every topic (runs
``<run>-keys``, ``<run>-merge`` and ``<run>``, each working on what the one before it wrote); then
``tiering s3 tier`` moves what they wrote to STANDARD_IA. Rolling back an earlier run first is refused
(exit 3, a later run named) and changes nothing; rolling back the four newest first puts every object of
every partition back byte for byte and in its storage class, and no other object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.kafka_broker.conftest import Source, note
from tests.kafka_broker.test_restore import PREFIX, upload
from tiering.demo.s3 import moto_server
from tiering.errors import ExitCode
from tiering.lifecycle.vocabulary import RunKind, Status
from tiering.storage.layout import run_result_key

pytestmark = [pytest.mark.kafka, pytest.mark.airflow, pytest.mark.spark]  # the compaction DAG, dag.test()

BUCKET = "rollback-chain"
ROOT = Path(__file__).resolve().parents[2]
# Every topic merged up to 1 MiB and recompressed with re-batching; two topics key-compacted first: the
# compacted topic (how much the broker's cleaner left dirty depends on when it last ran) and kp.none, which
# the broker never cleaned (its topic deletes): its 500 keys repeat and some records have none, so the
# -keys run always has records to remove.
POLICY = """\
version: 1
cluster:
  compression.type: zstd
  min.segment.age.hours: 0
  rebatch.enable: true
  merge.enable: true
  merge.target.bytes: 1048576
  compact.enable: true
topics:
  - topic: kp.compacted
    cleanup.policy: compact
  - topic: kp.none
    cleanup.policy: compact
"""

# Everything sealed, whatever its age, to STANDARD_IA (the objects above its 128 KiB minimum).
TIER_POLICY = """\
version: 1
cluster:
  storage.tiers:
    - {after.days: 0, storage.class: STANDARD_IA}
"""


def _env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _objects(client: Any) -> dict[str, tuple[bytes, str]]:
    """Every object of the partitions (the tool's own keys left out): its bytes and storage class."""
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + "/"):
        for obj in page.get("Contents", []):
            if "/_tiering/" not in obj["Key"]:
                body = client.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read()
                out[obj["Key"]] = (body, obj.get("StorageClass", "STANDARD"))
    return out


def _rollback(endpoint: str, run_id: str) -> tuple[int, dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-m", "tiering", "s3", "rollback", "--bucket", BUCKET, "--prefix", PREFIX,
                           "--run-id", run_id, "--json"], capture_output=True, text=True, env=_env(endpoint),
                          timeout=600, check=False, cwd=ROOT)
    assert done.returncode in (ExitCode.OK, ExitCode.BUSY), done.stderr[-4000:]
    return done.returncode, json.loads(done.stdout), done.stderr


def test_rollbacks_newest_first_undo_key_compaction_merge_compaction_and_tiering(
        source: Source, tmp_path: Path) -> None:
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET)
        upload(client, BUCKET, source.broker.data_dir)
        originals = _objects(client)
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY)
        params = {"policy": str(policy), "compact_keys": True}
        done = subprocess.run([sys.executable, str(Path(__file__).with_name("dag_run.py")), str(tmp_path), endpoint,
                               BUCKET, PREFIX, json.dumps(params)], capture_output=True, text=True,
                              env=_env(endpoint), timeout=1200, check=False, cwd=ROOT)
        (tmp_path / "dag.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, f"{tmp_path / 'dag.log'}: " + done.stderr[-4000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["state"] == "success", done.stderr[-4000:]
        run = out["run_id"]
        runs = [f"{run}-keys", f"{run}-merge", run]  # in the order the DAG ran them
        for r, kind in zip(runs, (RunKind.COMPACT_KEYS, RunKind.MERGE, RunKind.COMPACT), strict=True):
            totals = json.loads(client.get_object(Bucket=BUCKET, Key=run_result_key(PREFIX, r, kind))["Body"].read())[
                "totals"]
            note(f"{r}: {totals}")
            # each run replaced segments (a key-compaction pass cleans neighbours into one: merged), so each has
            # a rollback to test
            assert totals.get(Status.COMPACTED, 0) + totals.get(Status.MERGED, 0) > 0, (r, totals)
        tier_policy = tmp_path / "tier-policy.yaml"
        tier_policy.write_text(TIER_POLICY)
        tiered = subprocess.run([sys.executable, "-m", "tiering", "s3", "tier", "--bucket", BUCKET, "--prefix", PREFIX,
                                 "--policy", str(tier_policy), "--run-id", f"{run}-tier", "--json"],
                                capture_output=True, text=True, env=_env(endpoint), timeout=600, check=False, cwd=ROOT)
        assert tiered.returncode == ExitCode.OK, tiered.stderr[-4000:]
        segments = json.loads(tiered.stdout)["run"]["segments"]
        moved = [m for r in segments for m in (r.get("stats") or {}).get("moved", [])]
        note(f"{run}-tier: {len(moved)} objects moved")
        assert moved
        runs.append(f"{run}-tier")
        worked = _objects(client)
        assert worked != originals
        assert any(cls == "STANDARD_IA" for _, cls in worked.values())

        for early in (runs[2], runs[1], runs[0]):  # each while a later run's output is in place
            later = runs[runs.index(early) + 1:]
            code, doc, stderr = _rollback(endpoint, early)
            assert code == ExitCode.BUSY, stderr
            refused = [s for s in doc["segments"] if s["cause"] == "later run"]
            assert refused, doc["outcomes"]
            assert all(any(r in s["reason"] for r in later) for s in refused), refused[:3]
            assert any(r in stderr for r in later), stderr
            assert _objects(client) == worked  # nothing changed

        for r in reversed(runs):
            code, doc, stderr = _rollback(endpoint, r)
            assert code == ExitCode.OK, (r, stderr, doc["outcomes"])
            note(f"rolled back {r}: {doc['totals']}")
        restored = _objects(client)
        assert sorted(restored) == sorted(originals)
        assert [k for k in originals if restored[k] != originals[k]] == []
