"""The compaction as the Spark job runs it: spark-submit --master local[2] against a moto server."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from tests.s3.conftest import PREFIX, check_consistent, seed
from tiering.plan.scan import ScanOptions
from tiering.run.cleanup import CleanupFigures, CleanupOptions
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.pipeline import RunSettings, compaction_kind, plan_run, scan_run
from tiering.spark.submit import SparkJobFailed, submit
from tiering.storage.layout import run_result_key
from tiering.storage.s3 import S3Store, make_client

JOB = Path(__file__).parents[2] / "spark_jobs" / "run_kind.py"


@pytest.fixture
def server_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = make_client()
    client.create_bucket(Bucket="spark")
    yield S3Store(client, "spark")
    server.stop()


@pytest.mark.slow
@pytest.mark.spark
def test_spark_compacts_and_swaps_in_every_planned_segment(server_store: S3Store) -> None:
    store = server_store
    originals = {0: seed(store, partition=0), 1: seed(store, partition=1, kind="logs", segments=2)}
    bad = sorted(originals[0])[0]
    data = bytearray(originals[0][bad].log)
    data[300] ^= 0x40
    store.put(f"{PREFIX}/orders.v1-0/{bad:020d}.log", bytes(data))
    settings = RunSettings("spark", PREFIX, "spark-run-1", "zstd", 3)
    scan_run(store, settings, ScanOptions("zstd", 3, min_age_minutes=0))
    planned = plan_run(store, settings, CompactOptions(), chunk_work=1)
    assert planned.segments == 3
    assert planned.chunks == 2
    kind = compaction_kind(settings, CompactOptions())
    lines: list[str] = []
    with pytest.raises(SparkJobFailed, match="exited with 1"):  # the run document's: a segment is invalid
        submit(JOB, ["--kind", "compact", "--settings", json.dumps(settings.to_json()),
                     "--options", json.dumps(kind.options_json())], master="local[2]", log=lines.append)
    assert any("compaction: 2 partitions in 2 tasks" in line for line in lines), lines[-20:]
    key = run_result_key(PREFIX, settings.run_id, "compact")
    run = RunResult.from_json(store.get_json(key)[0], key)
    status = {(r.directory, r.base_offset): r for r in run.segments}
    assert status[("orders.v1-0", bad)].status == "failed"
    assert status[("orders.v1-0", bad)].error is not None
    assert [r.status for k, r in status.items() if k != ("orders.v1-0", bad)] == ["compacted", "compacted"]
    assert all(r.stats for r in run.segments if r.status == "compacted")
    assert run.totals()["bytes_before"] == sum(r.bytes_before for r in run.segments if r.status == "compacted")
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))
    check_consistent(store, {b: o for b, o in originals[0].items() if b != bad}, partition=0)
    check_consistent(store, originals[1], partition=1)
    assert store.get(f"{PREFIX}/orders.v1-0/{bad:020d}.log") == bytes(data)
    # the cleanup, on Spark too: every original the run kept deleted (no grace left), a partition a task
    kept = list(store.list(f"{PREFIX}/_tiering/backup/{settings.run_id}/"))
    assert len(kept) == 2 * 3
    sweep = RunSettings("spark", PREFIX, "spark-cleanup")
    submit(JOB, ["--kind", "cleanup", "--settings", json.dumps(sweep.to_json()), "--options",
                 json.dumps(CleanupOptions(grace_days=0).to_json())], master="local[2]", log=lines.append)
    assert any("cleanup: 2 partitions in 2 tasks" in line for line in lines), lines[-20:]
    key = run_result_key(PREFIX, sweep.run_id, "cleanup")
    cleaned = RunResult.from_json(store.get_json(key)[0], key)
    assert CleanupFigures.of(cleaned).backups_deleted == len(kept)
    assert CleanupFigures.of(cleaned).backup_bytes_deleted == sum(i.size for i in kept)
    assert not list(store.list(f"{PREFIX}/_tiering/backup/"))
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))
