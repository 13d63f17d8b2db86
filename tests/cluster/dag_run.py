"""One run of the compaction DAG with ``dag.test()`` (SQLite), from this process's host: the Airflow task
runs here and so does the Spark driver it submits. Prints the run's facts as one JSON line.

    python -m tests.cluster.dag_run WORK_DIR '{"bucket": ..., "prefix": ..., "spark_master": ...}'

The S3 endpoint and credentials, and ``TIERING_SPARK_CONF``, come from the environment, as in a
deployment.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.dags.compaction_check import tries
from tiering.demo.s3 import load_dag, run_dag, use_airflow_home


def main() -> None:
    work, conf = Path(sys.argv[1]), json.loads(sys.argv[2])
    use_airflow_home(work / "airflow")
    state, run_id = run_dag({"policy": "", "min_segment_age_minutes": 0, **conf}, load_dag())
    print(json.dumps({"state": state, "run_id": run_id, "tasks": tries(run_id)}))


if __name__ == "__main__":
    main()
