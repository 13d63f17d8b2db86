"""
### kafka_segment_tiering

Moves old Kafka log segments of an S3 `logdir` prefix to colder storage classes, as a policy file says
(`storage.tiers`: e.g. after 30 days `STANDARD_IA`, after 90 days `GLACIER_IR`).

**Tasks**: `tier` (a run of the engine's tiering kind: list the prefix; for each sealed segment read its
newest record's timestamp from the tail of its `.log` and pick the target class of its topic's policy; every
object that stays gets its reason: already there, under 128 KiB for an IA class, not yet past its class's
minimum duration, no saving; then each move, an in-place copy with the new storage class that keeps
metadata, tags and encryption, conditional on the planned ETag, a partition at a time under its lease like
a compaction, marked in the partition's state so that `tiering s3 rollback` can undo it) → `report`
(what moved, what it saves per month, its one-off cost and payback; a table in the log, JSON and Markdown
under `PREFIX/_tiering/reports/<run>/tiering.{json,md}`; publishes the asset `kafka_segment_tiering_report`).

Age is the records' age, not S3's `LastModified` (which a compaction resets). `GLACIER` and
`DEEP_ARCHIVE` are used only where the policy sets `storage.allow.archive: true`: such objects cannot be
read without a restore, and the compaction leaves them alone. Re-runs find moved objects already there.

**Params**

| param | meaning |
|---|---|
| `bucket` | the bucket holding the `logdir` tree |
| `prefix` | `PREFIX` in `s3://BUCKET/PREFIX/<topic>-<partition>/<base>.log` |
| `policy` | the policy YAML file on the workers (default `TIERING_POLICY_FILE`); a run without one fails in `plan` |
| `dry_run` | plan and report only; move nothing |
| `include_internal` | tier the internal topics (names starting `__`) too |
| `inventory` | `s3://BUCKET/.../manifest.json` of an S3 Inventory report (CSV) of the bucket: plan from it instead |
| | of listing (each object's ETag is still checked before it is moved); empty: list the prefix |

The schedule is `TIERING_TIERING_SCHEDULE` (default `@daily`) when `TIERING_POLICY_FILE` is set, else the
DAG runs only when triggered (with a `policy`); prices as for the compaction report
(`TIERING_PRICE_REGION`, `TIERING_PRICES_FILE`). S3 endpoint and credentials come from the worker's AWS
environment.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, Param, dag, get_current_context, task

from tiering.options import TIERING, option  # light: the options' declarations alone

POLICY_FILE = os.environ.get("TIERING_POLICY_FILE", "")
# Scheduled only when a policy is configured: without one, a run has nothing to follow (manual runs pass it).
SCHEDULE = os.environ.get("TIERING_TIERING_SCHEDULE", "@daily") if POLICY_FILE else None
REPORT_ASSET = Asset(name="kafka_segment_tiering_report", uri="tiering://kafka_segment_tiering/report")


def _run() -> tuple[Any, Any]:
    """The running task's params, typed (:class:`~tiering.steps.storage_classes.TieringParams`), and its store
    (a client from the worker's AWS environment)."""
    from tiering.steps.storage_classes import TieringParams  # noqa: PLC0415 - heavy imports stay inside tasks
    from tiering.storage.s3 import S3Store, make_client  # noqa: PLC0415

    ctx = get_current_context()
    run = TieringParams.from_params(ctx["params"], ctx["run_id"])
    return run, S3Store(make_client(), run.bucket)


@dag(
    dag_id="kafka_segment_tiering",
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True,
                  "max_retry_delay": timedelta(minutes=10)},
    doc_md=__doc__,
    tags=["kafka", "s3", "tiering"],
    params={
        "bucket": Param(os.environ.get("TIERING_BUCKET", "kafka-tiered"), type="string", minLength=3, maxLength=63,
                        pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$", description="the bucket"),
        "prefix": Param(os.environ.get("TIERING_PREFIX", "kafka/logs"), type="string",
                        description="PREFIX of the logdir tree"),
        "policy": Param(POLICY_FILE, type="string", description="policy YAML file on the workers"),
        "dry_run": Param(False, type="boolean", description="plan and report only"),
        "include_internal": Param(**option(TIERING, "include_internal").param()),
        "inventory": Param("", type="string", pattern=r"^(s3://[^/]+/.+/manifest\.json)?$",
                           description="an S3 Inventory manifest.json to plan from; empty: list the prefix"),
    },
)
def kafka_segment_tiering() -> None:
    @task
    def tier() -> dict[str, Any]:
        from tiering.steps import storage_classes  # noqa: PLC0415

        run, store = _run()
        return storage_classes.tier(store, run, print)[0].to_json()

    @task(outlets=[REPORT_ASSET])
    def report(tiered: dict[str, Any]) -> dict[str, Any]:
        from tiering.steps import storage_classes as steps  # noqa: PLC0415

        run, store = _run()
        step = steps.report(store, run, steps.TierStep.from_json(tiered), print)
        out = step.to_json()
        get_current_context()["outlet_events"][REPORT_ASSET].extra = {**out, "bucket": run.bucket, "prefix": run.prefix}
        if step.failure:
            raise RuntimeError(step.failure)
        return out

    report(tier())


tiering_dag = kafka_segment_tiering()
