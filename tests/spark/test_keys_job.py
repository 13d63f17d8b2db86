"""The key-compaction Spark job end to end: spark-submit --master local[2] against a moto server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kafka.test_keycompact import NOW
from tests.s3 import test_keycompact_s3 as K
from tests.spark.test_compact_job import server_store  # noqa: F401 - the fixture
from tiering.kafka.files import LOG_SUFFIX, TXN_INDEX_SUFFIX
from tiering.kafka.merge import DEFAULT_INDEX_BYTES, DEFAULT_SEGMENT_BYTES, Limits
from tiering.run.documents import RunResult
from tiering.run.keycompact import KeyCompactOptions
from tiering.run.pipeline import RunSettings
from tiering.spark.submit import submit
from tiering.storage.layout import run_result_key, segment_key
from tiering.storage.s3 import S3Store

JOB = Path(__file__).parents[2] / "spark_jobs" / "run_kind.py"


@pytest.mark.slow
@pytest.mark.spark
def test_spark_cleans_each_partition_in_a_task_as_the_in_process_run_does(server_store: S3Store) -> None:  # noqa: F811
    store = server_store
    parts = K.partition(aborts=True)
    K.upload(store, parts)
    for base, (log, txn) in parts.items():  # a second partition of the same topic, and a topic not chosen
        store.put(segment_key(K.PREFIX, K.TOPIC, 1, base, LOG_SUFFIX), log)
        if txn:
            store.put(segment_key(K.PREFIX, K.TOPIC, 1, base, TXN_INDEX_SUFFIX), txn)
        store.put(segment_key(K.PREFIX, "orders.delete", 0, base, LOG_SUFFIX), log)
    lines: list[str] = []
    settings = RunSettings(store.bucket, K.PREFIX, "spark-keys")
    options = KeyCompactOptions(NOW, topics=r"profiles\..*", min_age_minutes=0)  # merged: the cleaner's bounds
    submit(JOB, ["--kind", "compact-keys", "--settings", json.dumps(settings.to_json()), "--options",
                 json.dumps(options.to_json())], master="local[2]", log=lines.append)
    assert any("key compaction: 2 partitions in 2 tasks" in line for line in lines), lines[-20:]
    key = run_result_key(K.PREFIX, "spark-keys", "compact-keys")
    run = RunResult.from_json(store.get_json(key)[0], key)
    # each partition's four sealed segments cleaned into one, as the broker's cleaner groups them by default
    assert run.counts == {"merged": 8, "skipped": 2}
    assert set(run.usage["requests"]) == {"_run", f"{K.TOPIC}-0", f"{K.TOPIC}-1"}
    want = K.expected(parts, NOW, Limits(DEFAULT_SEGMENT_BYTES, DEFAULT_INDEX_BYTES))
    assert [c.sources for c in want.values()] == [(0, 20, 40, 60)]
    for partition in (0, 1):
        assert store.get(segment_key(K.PREFIX, K.TOPIC, partition, 0, LOG_SUFFIX)) == want[0].log
        assert store.get(segment_key(K.PREFIX, K.TOPIC, partition, 80, LOG_SUFFIX)) == parts[80][0]  # active
        assert not K.exists(store, segment_key(K.PREFIX, K.TOPIC, partition, 20, LOG_SUFFIX))
    assert all(store.get(segment_key(K.PREFIX, "orders.delete", 0, b, LOG_SUFFIX)) == log
               for b, (log, _) in parts.items())
    assert not list(store.list(f"{K.PREFIX}/_tiering/leases/"))
