"""Runs the compaction DAG with dag.test() against a moto server in its own process, in the ways a run can
fail, and prints the facts tests/dags/test_compaction_dag.py asserts: a policy that does not exist fails
the first task at once (no retries), a run whose every partition is busy fails its report task with the
reason (not "success"), and once the partitions are free the same DAG compacts everything; then key
compaction, and merging of small segments, before the recompression."""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from tiering.commit.lease import Lease
from tiering.demo.s3 import load_dag, moto_server, run_dag, use_airflow_home
from tiering.demo.seed import seed_partition
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.files import LOG_SUFFIX
from tiering.kafka.records import Record
from tiering.kafka.segment import iter_decoded
from tiering.run.pipeline import safe_run_id
from tiering.storage.layout import lease_key, run_result_key, segment_key
from tiering.storage.s3 import S3Store, make_client

BUCKET, PREFIX, TOPIC = "compaction-dag", "kafka/logs", "clicks"
COMPACTED = "profiles"
SMALL = "metrics"


def tries(run_id: str) -> dict[str, list[Any]]:
    """Each task's final state and try number in the DAG run."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: [str(ti.state), ti.try_number]
                for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == "kafka_segment_compaction")
                if safe_run_id(ti.run_id) == run_id}


def main() -> None:
    work = Path(sys.argv[1])
    os.environ.update(AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo", AWS_DEFAULT_REGION="us-east-1")
    use_airflow_home(work / "airflow")
    with moto_server(lambda line: print(line, file=sys.stderr)) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        store = S3Store(make_client(), BUCKET)
        store.client.create_bucket(Bucket=BUCKET)
        for partition in (0, 1):
            seed_partition(store, PREFIX, TOPIC, partition, segments=3, kind="json", codec=Codec.SNAPPY,
                           segment_bytes=40_000, seed=partition)
        dag = load_dag()
        conf = {"bucket": BUCKET, "prefix": PREFIX, "min_segment_age_minutes": 0, "spark_master": "local[1]",
                "policy": ""}  # dag.test() keeps a param of an earlier run that is not given again
        facts: dict[str, Any] = {}

        state, run_id = run_dag({**conf, "policy": str(work / "missing.yaml")}, dag)
        facts["missing_policy"] = {"state": state, "tasks": tries(run_id)}

        leases = [Lease(store, lease_key(PREFIX, f"{TOPIC}-{p}"), "another-run", 600) for p in (0, 1)]
        for lease in leases:
            lease.acquire(PREFIX)
        state, run_id = run_dag(conf, dag)
        doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
        facts["busy"] = {"state": state, "tasks": tries(run_id), "totals": doc["totals"], "pending": doc["pending"]}

        for lease in leases:
            lease.release()
        conf["lease_ttl_seconds"] = 120  # the DAG's lease time reaches its cleanup too
        state, run_id = run_dag(conf, dag)
        doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
        cleaned = store.get_json(run_result_key(PREFIX, f"{run_id}-cleanup", "cleanup"))[0]
        facts["free"] = {"state": state, "totals": doc["totals"], "cleanup": {
            "exit_code": cleaned["exit_code"], "lease_ttl_seconds": cleaned["settings"].get("lease_ttl_seconds"),
            "backups": sorted(i.key for i in store.list(f"{PREFIX}/_tiering/backup/{run_id}/"))}}

        seed_compacted(store)
        state, run_id = run_dag({**conf, "compact_keys": True, "topics": COMPACTED}, dag)
        keys = store.get_json(run_result_key(PREFIX, f"{run_id}-keys", "compact-keys"))[0]
        doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
        logs = sorted(i.key for i in store.list(f"{PREFIX}/{COMPACTED}-0/") if i.key.endswith(LOG_SUFFIX))
        records = sum(len(b.records) for key in logs for b in iter_decoded(io.BytesIO(store.get(key))))
        facts["keys"] = {"state": state, "keys_totals": keys["totals"], "totals": doc["totals"], "records": records,
                         "report": keys["run_id"], "logs": [key.rsplit("/", 1)[1] for key in logs]}

        for partition in (0, 1):  # small segments: five sealed ones and the active one in each partition
            seed_partition(store, PREFIX, SMALL, partition, segments=6, kind="json", codec=Codec.NONE,
                           segment_bytes=20_000, seed=partition)
        state, run_id = run_dag({**conf, "compact_keys": False, "merge": True, "merge_target_bytes": 1 << 20,
                                 "topics": SMALL}, dag)
        merged = store.get_json(run_result_key(PREFIX, f"{run_id}-merge", "merge"))[0]
        doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
        logs = sorted(i.key.rsplit("/", 1)[1] for i in store.list(f"{PREFIX}/{SMALL}-0/") if i.key.endswith(".log"))
        report = store.get_json(f"{PREFIX}/_tiering/reports/{run_id}-merge/report.json")[0]
        facts["merge"] = {"state": state, "tasks": tries(run_id), "merge_totals": merged["totals"],
                          "objects": merged["usage"]["objects"], "totals": doc["totals"], "logs": logs,
                          "report_merging": report["merging"]}
        print(json.dumps(facts))


def seed_compacted(store: S3Store) -> None:
    """A compacted topic: three segments (the last one active) of 100 updates each over 10 keys, snappy."""
    for base in (0, 100, 200):
        batches = [build_batch(BatchSpec(o, Codec.SNAPPY), [
            Record(o + j, 1_790_000_000_000 + o + j, b"k%d" % ((o + j) % 10), b"value %d" % (o + j), ())
            for j in range(10)]) for o in range(base, base + 100, 10)]
        store.put(segment_key(PREFIX, COMPACTED, 0, base, LOG_SUFFIX), b"".join(batches))


if __name__ == "__main__":
    main()
