"""The merge Spark job end to end: spark-submit --master local[2] against a moto server, two partitions in
two tasks, the merged segments the sources' bytes one after the other, then a rollback in this process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.s3.conftest import PREFIX, TOPIC, context, seed
from tests.spark.test_compact_job import server_store  # noqa: F401 - the fixture
from tiering.demo.inventory import write_inventory
from tiering.kafka.merge import Limits
from tiering.lifecycle.vocabulary import RunKind, Status
from tiering.run.documents import RunResult
from tiering.run.merge import MergeOptions
from tiering.run.pipeline import RunSettings
from tiering.run.rollback import rollback
from tiering.spark.submit import submit
from tiering.storage.layout import run_result_key, segment_key
from tiering.storage.s3 import S3Store

JOB = Path(__file__).parents[2] / "spark_jobs" / "run_kind.py"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("source", ["listing", "inventory"])
def test_spark_merges_each_partition_in_a_task_as_the_in_process_run_does(server_store: S3Store,  # noqa: F811
                                                                          source: str) -> None:
    # A bucket of its own: moto's server keeps its buckets in this process, and other tests' "spark" bucket
    # holds partitions of the same topic.
    server_store.client.create_bucket(Bucket=f"merge-job-{source}")
    store = S3Store(server_store.client, f"merge-job-{source}")
    originals = {p: seed(store, partition=p, segments=5, segment_bytes=20_000) for p in (0, 1)}
    seed(store, segments=3, segment_bytes=20_000, topic="logs.kept")  # a topic not chosen
    kept = {i.key: i.etag for i in store.list(f"{PREFIX}/logs.kept-0/")}
    planned_from = ["--inventory", write_inventory(store, store.bucket, "inventory/daily",
                                                   list(store.list(PREFIX + "/")))] if source == "inventory" else []
    lines: list[str] = []
    settings = RunSettings(store.bucket, PREFIX, "spark-merge")
    options = MergeOptions(Limits(1 << 20), TOPIC.replace(".", r"\."), min_age_minutes=0)
    submit(JOB, ["--kind", "merge", "--settings", json.dumps(settings.to_json()), "--options",
                 json.dumps(options.to_json()), *planned_from], master="local[2]", log=lines.append)
    assert any("merge: 2 partitions in 2 tasks" in line for line in lines), lines[-20:]
    assert any("planned from the S3 Inventory report" in line for line in lines) is (source == "inventory")
    key = run_result_key(PREFIX, "spark-merge", RunKind.MERGE)
    run = RunResult.from_json(store.get_json(key)[0], key)
    assert run.counts == {"merged": 8, "skipped": 2}  # four sealed segments each; the active ones stay
    assert run.usage["objects"] == {"before": 24, "after": 6}
    assert set(run.usage["requests"]) == {"_run", f"{TOPIC}-0", f"{TOPIC}-1"}
    for p, segs in originals.items():
        bases = sorted(segs)
        merged = store.get(segment_key(PREFIX, TOPIC, p, bases[0], ".log"))
        assert merged == b"".join(segs[b].log for b in bases[:-1])
        assert not [i for i in store.list(f"{PREFIX}/{TOPIC}-{p}/") if i.key.endswith(f"{bases[1]:020d}.log")]
    assert {i.key: i.etag for i in store.list(f"{PREFIX}/logs.kept-0/")} == kept
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))
    undone = rollback(store, context(store, "undo"), "spark-merge")
    assert {r.status for r in undone.segments} == {Status.ROLLED_BACK}
    for p, segs in originals.items():
        for base, original in segs.items():
            assert store.get(segment_key(PREFIX, TOPIC, p, base, ".log")) == original.log
