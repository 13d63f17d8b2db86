"""Run the Airflow DAG ``kafka_segment_compaction`` (dag.test(), SQLite, Spark local[2]) once on a logdir tree
already on an S3 endpoint, in its own process (Airflow's configuration stays out of pytest's), and print the
run's state and compact document as one JSON line.

    python tests/kafka_broker/dag_run.py WORKDIR ENDPOINT BUCKET PREFIX [PARAMS_JSON]

PARAMS_JSON: more DAG params, e.g. '{"rebatch": true}'.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tiering.demo.s3 import run_dag, use_airflow_home
from tiering.storage.s3 import S3Store, make_client


def main() -> None:
    work, endpoint, bucket, prefix = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1")
    use_airflow_home(work / "airflow")
    extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    state, run_id = run_dag({"bucket": bucket, "prefix": prefix, "codec": "zstd", "min_segment_age_minutes": 0,
                             "spark_master": "local[2]", **extra})
    store = S3Store(make_client(), bucket)
    doc = store.get_json(f"{prefix}/_tiering/runs/{run_id}/compact.json")[0]
    print(json.dumps({"state": state, "run_id": run_id, "document": doc}))


if __name__ == "__main__":
    main()
