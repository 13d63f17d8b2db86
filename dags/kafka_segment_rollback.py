"""
### kafka_segment_rollback

Undoes what one run of `kafka_segment_compaction` or `kafka_segment_tiering` did, from the Airflow UI:
trigger it with the run id of the DAG run to undo (as the UI shows it, e.g. `scheduled__2026-12-01T00:00:00+00:00`)
and the DAG that made it (the two DAGs' scheduled runs share their ids).

**Task**: `rollback`. A compaction DAG run `R` makes up to three runs, one after the other: `R-keys` (key
compaction), `R-merge` (merging) and `R` (recompression); a tiering DAG run makes `R-tier`. Each that left
something to undo is rolled back, newest first, a partition at a time under its lease: the originals its
backups keep are put back where what it wrote is still in place (a merged segment split back into its
sources), and the objects a tiering run moved go back to the classes it found them in. Where a later run
(of another DAG run) replaced or moved what it wrote, that rollback is refused, changes nothing and names the
run to undo first; the task then fails with that sentence, at once (another attempt would be refused too),
and the runs before it stay as they are. S3 failing or a partition busy (another run's lease) fails the
attempt, and Airflow retries it.

**Params**

| param | meaning |
|---|---|
| `bucket` | the bucket holding the `logdir` tree |
| `prefix` | `PREFIX` in `s3://BUCKET/PREFIX/<topic>-<partition>/<base>.log` |
| `undo` | the run id of the DAG run to undo, as the Airflow UI shows it |
| `dag` | the DAG that made it: `kafka_segment_compaction` (its runs `R-keys`, `R-merge`, `R`), |
| | `kafka_segment_tiering` (`R-tier`), or `one run` (`undo` is then one run's id as the command line names it) |

Only triggered by hand; the originals are kept for the grace period (`cleanup_grace_days` of the compaction
DAG), after which there is nothing left to roll back. S3 endpoint and credentials come from the worker's AWS
environment. The same from a shell: `tiering s3 rollback --run-id RUN` for each run, newest first.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Param, dag, get_current_context, task


@dag(
    dag_id="kafka_segment_rollback",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    doc_md=__doc__,
    tags=["kafka", "s3", "rollback"],
    params={
        "bucket": Param(os.environ.get("TIERING_BUCKET", "kafka-tiered"), type="string", minLength=3, maxLength=63,
                        pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$", description="the bucket"),
        "prefix": Param(os.environ.get("TIERING_PREFIX", "kafka/logs"), type="string",
                        description="PREFIX of the logdir tree"),
        "undo": Param("", type="string", minLength=1, description="the run id of the DAG run to undo"),
        "dag": Param("kafka_segment_compaction", type="string",
                     enum=["kafka_segment_compaction", "kafka_segment_tiering", "one run"],
                     description="the DAG that made it (or one run: undo is a run's own id)"),
    },
)
def kafka_segment_rollback() -> None:
    @task
    def rollback() -> dict[str, Any]:
        from tiering.steps import rollback as steps  # noqa: PLC0415 - heavy imports stay inside tasks
        from tiering.storage.s3 import S3Store, make_client  # noqa: PLC0415

        ctx = get_current_context()
        run = steps.RollbackParams.from_params(ctx["params"], ctx["run_id"])
        step = steps.rollback_dag_run(S3Store(make_client(), run.bucket), run, print)
        if step.failure:  # a refusal (or an object that cannot be restored) would meet the same again
            from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415

            raise (RuntimeError if step.retryable else AirflowFailException)(step.failure)
        return step.to_json()

    rollback()


rollback_dag = kafka_segment_rollback()
