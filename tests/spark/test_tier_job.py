"""The tiering Spark job end to end: spark-submit --master local[2] of the engine's tiering kind against a moto
server, two partitions in two tasks, the old .log objects moved, the rest left; then the engine's rollback kind,
on Spark too, puts every object back in its class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.s3.conftest import PREFIX, TOPIC, seed
from tests.spark.test_compact_job import server_store  # noqa: F401 - the fixture
from tiering.cost.prices import load_prices
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.policy import load_policy
from tiering.run.documents import RunResult
from tiering.run.pipeline import RunSettings
from tiering.run.rollback import RollbackOptions
from tiering.run.tier import TierOptions
from tiering.spark.submit import submit
from tiering.storage.layout import run_result_key
from tiering.storage.s3 import S3Store

JOB = Path(__file__).parents[2] / "spark_jobs" / "run_kind.py"


@pytest.mark.slow
@pytest.mark.spark
def test_spark_tiers_each_partition_in_a_task_and_the_run_rolls_back(server_store: S3Store,  # noqa: F811
                                                                    tmp_path: Path) -> None:
    server_store.client.create_bucket(Bucket="tier-job")
    store = S3Store(server_store.client, "tier-job")
    for p in (0, 1):
        seed(store, partition=p, segments=3, segment_bytes=300_000)  # records a year old
    def objects() -> dict[str, str]:
        """Every segment object (our own documents left out) and its storage class."""
        return {i.key: i.storage_class for i in store.list(PREFIX + "/") if "/_tiering/" not in i.key}

    classes = objects()
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"cluster": {"storage.tiers": [{"after.days": 30,
                                                                     "storage.class": "GLACIER_IR"}]}}))
    lines: list[str] = []
    settings = RunSettings(store.bucket, PREFIX, "spark-tier")
    options = TierOptions(load_policy(str(policy)), load_prices("us-east-1"))
    submit(JOB, ["--kind", "tier", "--settings", json.dumps(settings.to_json()), "--options",
                 json.dumps(options.to_json())], master="local[2]", log=lines.append)
    assert any("2 partitions in 2 tasks" in line for line in lines), lines[-20:]
    key = run_result_key(PREFIX, "spark-tier", RunKind.TIER)
    run = RunResult.from_json(store.get_json(key)[0], key)
    assert run.counts == {"moved": 4}  # two sealed segments a partition; indexes too small, active ones stay
    assert run.usage["objects_moved"] == {"STANDARD -> GLACIER_IR": 4}
    moved = sorted(k for k, c in objects().items() if c == "GLACIER_IR")
    sealed = [key for p in (0, 1) for key in sorted(k for k in classes if k.startswith(f"{PREFIX}/{TOPIC}-{p}/")
                                                    and k.endswith(".log"))[:2]]
    assert moved == sealed
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))
    undo = RunSettings(store.bucket, PREFIX, "spark-undo")
    submit(JOB, ["--kind", "rollback", "--settings", json.dumps(undo.to_json()), "--options",
                 json.dumps(RollbackOptions("spark-tier").to_json())], master="local[2]", log=lines.append)
    key = run_result_key(PREFIX, "spark-undo", RunKind.ROLLBACK)
    undone = RunResult.from_json(store.get_json(key)[0], key)
    assert undone.counts == {"rolled-back": 4}
    assert undone.settings["restores_run"] == "spark-tier"
    assert objects() == classes
