"""Runs the tiering DAG with dag.test() against a moto server in its own process (Airflow's configuration
stays out of pytest's) and prints the facts tests/dags/test_tiering_dag.py asserts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import yaml

from tiering.demo.s3 import load_dag, moto_server, run_dag, use_airflow_home
from tiering.demo.seed import seed_partition
from tiering.kafka.codecs import Codec
from tiering.storage.s3 import S3Store, make_client

BUCKET, PREFIX = "tier-dag", "kafka/logs"


def main() -> None:
    work = Path(sys.argv[1])
    os.environ.update(AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo", AWS_DEFAULT_REGION="us-east-1")
    use_airflow_home(work / "airflow")
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump({"cluster": {"storage.tiers": [
        {"after.days": 30, "storage.class": "STANDARD_IA"}, {"after.days": 90, "storage.class": "GLACIER_IR"}]}}))
    with moto_server(lambda line: print(line, file=sys.stderr)) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        store = S3Store(make_client(), BUCKET)
        store.client.create_bucket(Bucket=BUCKET)
        seeded = seed_partition(store, PREFIX, "clicks", 0, segments=3, kind="json", codec=Codec.SNAPPY,
                                segment_bytes=300_000)  # records from 2025-11-22: a year old

        def classes() -> dict[str, str]:
            return {o.key: o.storage_class for o in store.list(PREFIX + "/") if "/_tiering/" not in o.key}

        dag = load_dag("kafka_segment_tiering", "tiering_dag")
        runs = []
        for dry in (True, False, False):
            state, run_id = run_dag({"bucket": BUCKET, "prefix": PREFIX, "policy": str(policy), "dry_run": dry}, dag)
            report = store.get_json(f"{PREFIX}/_tiering/reports/{run_id}-tier/tiering.json")[0]
            runs.append({"state": state, "dry_run": dry, "report": report, "classes": classes()})
        for t in dag.tasks:
            t.retries = 0  # the failure is the point: no backoff waits
        state, _ = run_dag({"bucket": BUCKET, "prefix": PREFIX, "policy": str(work / "missing.yaml")}, dag)
        print(json.dumps({"runs": runs, "missing_policy_state": state,
                          "logs": [s.log_key for s in seeded]}))


if __name__ == "__main__":
    main()
