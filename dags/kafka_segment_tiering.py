"""
### kafka_segment_tiering

Moves old Kafka log segments of an S3 `logdir` prefix to colder storage classes, as a policy file says
(`storage.tiers`: e.g. after 30 days `STANDARD_IA`, after 90 days `GLACIER_IR`).

**Tasks**: `plan` (list the prefix; for each sealed segment read its newest record's timestamp from the
tail of its `.log` and pick the target class of its topic's policy; every object that stays gets its
reason: already there, under 128 KiB for an IA class, not yet past its class's minimum duration, no
saving) → `apply` (each move is an in-place copy with the new storage class that keeps metadata, tags and
encryption, conditional on the planned ETag, under the partition's lease like a compaction) → `report`
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

POLICY_FILE = os.environ.get("TIERING_POLICY_FILE", "")
# Scheduled only when a policy is configured: without one, a run has nothing to follow (manual runs pass it).
SCHEDULE = os.environ.get("TIERING_TIERING_SCHEDULE", "@daily") if POLICY_FILE else None
REPORT_ASSET = Asset(name="kafka_segment_tiering_report", uri="tiering://kafka_segment_tiering/report")


def _where(ctx: Any) -> tuple[Any, str, str]:
    from tiering.run.pipeline import safe_run_id  # noqa: PLC0415 - heavy imports stay inside tasks
    from tiering.storage.store import S3Store, make_client  # noqa: PLC0415

    params = ctx["params"]
    return S3Store(make_client(), params["bucket"]), params["prefix"].strip("/"), safe_run_id(ctx["run_id"])


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
    },
)
def kafka_segment_tiering() -> None:
    @task
    def plan() -> dict[str, Any]:
        from tiering.plan.policy import load_policy  # noqa: PLC0415
        from tiering.report.publish import cost_config  # noqa: PLC0415
        from tiering.run.tier import plan_tiering  # noqa: PLC0415
        from tiering.storage.layout import run_key  # noqa: PLC0415

        ctx = get_current_context()
        path = ctx["params"]["policy"].strip()
        if not path:
            raise ValueError("kafka_segment_tiering needs a policy: pass the policy param or set TIERING_POLICY_FILE")
        policy = load_policy(path)  # a bad policy fails here, before any request
        store, prefix, run_id = _where(ctx)
        planned = plan_tiering(store, prefix, policy, cost_config()[0])
        key = run_key(prefix, run_id, "tier-plan.json")
        store.put_json(key, planned.to_json())
        totals = planned.totals()
        print(f"plan: {totals.objects_to_move} objects to move ({totals.bytes_to_move:,} bytes); "
              f"staying: {dict(totals.staying)}")
        return {"plan_key": key, "objects_to_move": totals.objects_to_move}

    @task
    def apply(planned: dict[str, Any]) -> dict[str, Any]:
        from tiering.run.tier import TierPlan, apply_tiering  # noqa: PLC0415
        from tiering.storage.layout import run_result_key  # noqa: PLC0415

        ctx = get_current_context()
        store, _, run_id = _where(ctx)
        if ctx["params"]["dry_run"] or not planned["objects_to_move"]:
            print("nothing to move" + (" (dry run)" if ctx["params"]["dry_run"] else ""))
            return {"segments": 0}
        run = apply_tiering(store, TierPlan.from_json(store.get_json(planned["plan_key"])[0]), run_id,
                            progress=lambda r: print(f"  {r.directory}/{r.base_offset}: {r.status} {r.reason}"))
        return {"run_key": run_result_key(run.plan.prefix, run_id, "tier"), "segments": len(run.results)}

    @task(outlets=[REPORT_ASSET])
    def report(planned: dict[str, Any], applied: dict[str, Any]) -> dict[str, Any]:
        from tiering.run.tier import TierPlan, TierRun, tier_report, tier_table  # noqa: PLC0415
        from tiering.storage.layout import tier_report_key  # noqa: PLC0415

        ctx = get_current_context()
        store, prefix, run_id = _where(ctx)
        plan = TierPlan.from_json(store.get_json(planned["plan_key"])[0])
        results = TierRun.from_json(store.get_json(applied["run_key"])[0]).results if "run_key" in applied else ()
        doc = tier_report(plan, results, run_id, dry_run=ctx["params"]["dry_run"])
        text = tier_table(doc)
        print(text)
        key = tier_report_key(prefix, run_id, "json")
        store.put_json(key, doc.to_json())
        store.put(tier_report_key(prefix, run_id, "md"), ("```\n" + text + "\n```\n").encode())
        monthly, one_off = doc.money()  # a run reports what it did
        out: dict[str, Any] = {"run_id": run_id, "dry_run": doc.dry_run, "objects_moved": doc.objects_moved,
                               "bytes_moved": doc.bytes_moved, "monthly_savings_usd": round(monthly, 6),
                               "one_off_usd": round(one_off, 6), "report": f"s3://{store.bucket}/{key}"}
        ctx["outlet_events"][REPORT_ASSET].extra = {**out, "bucket": store.bucket, "prefix": prefix}
        if doc.segments_failed:
            raise RuntimeError(f"{len(doc.segments_failed)} segments failed to move (see the report)")
        return out

    planned = plan()
    report(planned, apply(planned))


tiering_dag = kafka_segment_tiering()
