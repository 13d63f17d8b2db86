"""
### kafka_segment_compaction

Recompresses the sealed Kafka log segments of an S3 `logdir` prefix with a stronger codec, swaps them
in with a crash-safe commit protocol (see `docs/commit-protocol.md`), and reports what was saved.

**Tasks**: `key_compaction` (with `compact_keys` only: one pass of Kafka's log cleaner over each compacted
topic's partitions) → `scan` (list the prefix, classify every segment) → `plan` (apply the budget, largest segments
first; the plan is written as chunks of whole partitions) → `spark_compaction` (Spark tasks of up to 64
segments: rewrite, stage and verify) → `commit` (mapped over the plan's chunks, each task named
after the partitions it holds: swap the staged segments in under the partition leases) → `report` (the run
document and the cost savings report: JSON, Markdown, CSV and an HTML page with charts under
`PREFIX/_tiering/reports/<run>/` and `.../reports/latest/`, the ledger of all runs; a summary table in the
log; publishes the report asset)
→ `cleanup` (kept originals past their grace period, abandoned staging objects, incomplete multipart
uploads).

Every task can be retried (with exponential backoff) and a whole run can be re-run: finished segments
are found compacted, staged ones are committed, interrupted swaps are finished.

**Params** (manual triggers are validated against them):

| param | meaning |
|---|---|
| `bucket` | the bucket holding the `logdir` tree |
| `prefix` | `PREFIX` in `s3://BUCKET/PREFIX/<topic>-<partition>/<base>.log` |
| `topics` | a regular expression the whole topic name must match; empty: every topic |
| `codec` | target codec: `zstd`, `lz4`, `gzip`, `snappy` or `none` |
| `level` | codec level (Kafka's `compression.<codec>.level`); empty: Kafka's default |
| `min_segment_age_minutes` | leave segments uploaded less than this long ago (S3's `LastModified`; a guard |
| | against racing the uploader, not the records' age) |
| `max_segments` | compact at most this many segments this run (largest first); empty: no limit |
| `max_bytes` | compact at most this many `.log` bytes this run; empty: no limit |
| `dry_run` | only scan, plan and estimate the savings from sampled batches; change nothing |
| `spark_master` | where the Spark job runs: `local[*]` (embedded), `spark://host:7077` (standalone, |
| | client mode), `yarn`, `k8s://...`, or `conn:<conn_id>`: the host and port of that Airflow connection |
| `cleanup_grace_days` | keep replaced originals this many days before `cleanup` deletes them |
| `inventory` | `s3://BUCKET/.../manifest.json` of an S3 Inventory report (CSV) of the bucket: plan from it |
| | instead of listing (for buckets too large to list; each segment's ETag is still checked before it is |
| | touched, so a stale inventory only costs skips); empty: list the prefix |
| `policy` | a policy YAML file on the workers (default `TIERING_POLICY_FILE`): per-topic codec, `producer` |
| | (left alone) or `auto` (chosen by net dollars, shown in the report), level, minimum savings ratio and |
| | minimum record age; with a policy, `codec` and `level` are not used |
| `lease_ttl_seconds` | how long a partition stays locked once its holder stops renewing the lease (a crashed |
| | run's partitions are free again after it); default 600. A partition staged by a Spark task waits, its |
| | lease not renewed, until its commit task: longer than this, and another run may take the partition |
| | over, and with it the staged work (nothing is lost or staged again) |
| `verify` | how staged files are accepted before anything final changes: `checksum` (the CRC-32C S3 reports |
| | for what it stored equals the one of the bytes the rewrite produced and proved; nothing downloaded) or |
| | `read-back` (downloaded and decoded again); a store that reports no checksum is read back either way |
| `swap` | how a commit puts the new `.log` over the original, conditional on its ETag: `copy` (server-side |
| | CopyObject from staging with If-Match: no byte crosses the wire again), `put` (downloaded and PUT: for |
| | stores that ignore a copy's If-Match) or `auto` (default: `copy` where a probe shows the store refuses a |
| | copy whose If-Match fails) |
| `rebatch` | also merge runs of small batches into larger ones, every record unchanged (docs/rebatching.md), |
| | in every topic; with a policy, `rebatch.enable` decides per topic and this must stay off |
| `rebatch_max_bytes` | with `rebatch`: a merged batch's bound (default 1 MiB, Kafka's default |
| | `max.message.bytes`) |
| `compact_keys` | first key-compact the compacted topics (docs/key-compaction.md): those of the policy with |
| | `cleanup.policy: compact` and `compact.enable: true`, else those matching `topics` (required then); |
| | one pass of Kafka's log cleaner per partition (a Spark job, one task per unit of whole partitions), |
| | as run `<run>-keys` with its own report |

The schedule is `TIERING_COMPACTION_SCHEDULE` (default `@daily`); scheduled runs use the defaults of
`bucket` and `prefix`, set by `TIERING_BUCKET` and `TIERING_PREFIX`; the default Spark master is
`TIERING_SPARK_MASTER` (default `local[*]`); extra `spark-submit --conf` pairs come from
`TIERING_SPARK_CONF` (JSON object); a commit task finishes `TIERING_COMMIT_WORKERS` partitions at once
(default 4). S3 endpoint and credentials come from the worker's AWS environment.
The report's prices: `TIERING_PRICE_REGION` (default the AWS region), `TIERING_PRICES_FILE` (a JSON file
merged over the built-in list prices), `TIERING_ACCOUNT_STANDARD_TB` (the account's S3 Standard volume,
which decides the volume tier); the grace period is `cleanup_grace_days`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from airflow.sdk import Asset, Param, dag, get_current_context, task

SCHEDULE = os.environ.get("TIERING_COMPACTION_SCHEDULE", "@daily")
SPARK_MASTER = os.environ.get("TIERING_SPARK_MASTER", "local[*]")
SPARK_JOB = Path(os.environ.get("TIERING_SPARK_JOB", Path(__file__).resolve().parents[1] / "spark_jobs"
                                / "compact_segments.py"))
SPARK_KEYS_JOB = SPARK_JOB.with_name("compact_keys.py")
# Published after every run (its extra names the bucket, prefix, run and the report's S3 URI), so that
# other DAGs can be scheduled on it. Static: bucket and prefix are runtime params, the asset is not.
REPORT_ASSET = Asset(name="kafka_segment_compaction_report", uri="tiering://kafka_segment_compaction/report")
CODECS = ["zstd", "lz4", "gzip", "snappy", "none"]
COMMIT_WORKERS = int(os.environ.get("TIERING_COMMIT_WORKERS", "4"))  # partitions a commit task finishes at once

P = ParamSpec("P")
R = TypeVar("R")
DEFAULT_ARGS: dict[str, Any] = {
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=10),
}


def fail_fast(task_function: Callable[P, R]) -> Callable[P, R]:
    """A task whose ``TieringError`` that another attempt would meet again (configuration, invalid input, a
    failed proof: not ``retryable``) fails at once instead of using its retries; a retryable one (S3 or the
    network failing, a busy partition) is raised as it is, and retried."""

    @functools.wraps(task_function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return task_function(*args, **kwargs)
        except Exception as e:
            from tiering.errors import TieringError  # noqa: PLC0415 - tiering loads inside tasks only

            if not isinstance(e, TieringError) or e.retryable:
                raise
            from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415

            raise AirflowFailException(f"{type(e).__name__}: {e} (not retried: another attempt would fail the "
                                       "same way)") from e

    return run


def spark_master(value: str) -> str:
    """The Spark master URL; ``conn:<conn_id>`` names an Airflow connection whose host (with or without the
    ``spark://`` scheme) and port give it, so that a deployment keeps the cluster's address in a connection."""
    if not value.startswith("conn:"):
        return value
    from airflow.sdk import Connection  # noqa: PLC0415

    conn = Connection.get(value.removeprefix("conn:"))
    host = str(conn.host or "")
    url = host if "://" in host else f"spark://{host}"
    return f"{url}:{conn.port}" if conn.port else url


def _policy(params: dict[str, Any]) -> Any:
    """The run's policy (validated: a bad file fails the first task with the key and the problem), or None."""
    from tiering.plan.policy import load_policy  # noqa: PLC0415

    path = (params.get("policy") or "").strip()
    return load_policy(path) if path else None


def _store(settings: Any) -> Any:
    """The run's bucket, through a client from the worker's AWS environment (never in params or XCom)."""
    from tiering.storage.store import S3Store, make_client  # noqa: PLC0415

    return S3Store(make_client(), settings.bucket)


def _settings(params: dict[str, Any], run_id: str) -> Any:
    from tiering.run.pipeline import RunSettings, safe_run_id  # noqa: PLC0415 - heavy imports stay inside tasks

    verify, swap = RunSettings.modes(params["verify"], params["swap"])
    return RunSettings(params["bucket"], params["prefix"].strip("/"), safe_run_id(run_id),
                       params["codec"], params["level"], params["lease_ttl_seconds"], verify, swap)


@dag(
    dag_id="kafka_segment_compaction",
    schedule=SCHEDULE,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    doc_md=__doc__,
    tags=["kafka", "s3", "compaction"],
    params={
        "bucket": Param(os.environ.get("TIERING_BUCKET", "kafka-tiered"), type="string", minLength=3, maxLength=63,
                        pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$", description="the bucket"),
        "prefix": Param(os.environ.get("TIERING_PREFIX", "kafka/logs"), type="string",
                        description="PREFIX of the logdir tree"),
        "topics": Param(None, type=["null", "string"], description="regex on the whole topic name"),
        "codec": Param("zstd", type="string", enum=CODECS, description="target codec"),
        "level": Param(None, type=["null", "integer"], minimum=-131072, maximum=22, description="codec level"),
        "min_segment_age_minutes": Param(15, type="integer", minimum=0, description="upload grace period"),
        "max_segments": Param(None, type=["null", "integer"], minimum=1, description="segment budget"),
        "max_bytes": Param(None, type=["null", "integer"], minimum=1, description="byte budget"),
        "dry_run": Param(False, type="boolean", description="plan and estimate only"),
        "spark_master": Param(SPARK_MASTER, type="string", minLength=1, description="Spark master"),
        "cleanup_grace_days": Param(7, type="number", minimum=0, description="days originals are kept"),
        "lease_ttl_seconds": Param(600, type="integer", minimum=30, maximum=86400,
                                   description="how long a partition stays locked after its holder stopped renewing "
                                   "(a crashed run's partitions are free again after it)"),
        "verify": Param("checksum", type="string", enum=["checksum", "read-back"],
                        description="staged files accepted by S3's CRC-32C of what it stored, or read back"),
        "swap": Param("auto", type="string", enum=["auto", "copy", "put"],
                      description="the .log put in place by a server-side copy, by a PUT, or as a probe of the store "
                      "finds"),
        "inventory": Param("", type="string", pattern=r"^(s3://[^/]+/.+/manifest\.json)?$",
                           description="an S3 Inventory manifest.json to plan from; empty: list the prefix"),
        "policy": Param(os.environ.get("TIERING_POLICY_FILE", ""), type="string",
                        description="policy YAML file on the workers; empty: codec and level for every topic"),
        "rebatch": Param(False, type="boolean",
                         description="also merge runs of small batches (docs/rebatching.md) in every topic; with a "
                         "policy, its rebatch.enable decides per topic instead"),
        "rebatch_max_bytes": Param(1 << 20, type="integer", minimum=62, maximum=(1 << 31) - 1,
                                   description="with rebatch: a merged batch's bound (Kafka's default "
                                   "max.message.bytes)"),
        "compact_keys": Param(False, type="boolean",
                              description="first key-compact the compacted topics (the policy's with "
                              "cleanup.policy compact and compact.enable, else those matching topics)"),
    },
)
def kafka_segment_compaction() -> None:
    @task
    @fail_fast
    def key_compaction() -> dict[str, Any]:
        """With ``compact_keys``: one key-compaction pass (run ``<run>-keys``, its report published)."""
        ctx = get_current_context()
        params = ctx["params"]
        if not params["compact_keys"] or params["dry_run"]:
            return {"skipped": True}
        import json  # noqa: PLC0415

        from tiering.report.publish import cost_config, publish_report  # noqa: PLC0415
        from tiering.report.render import to_table  # noqa: PLC0415
        from tiering.run.compact import RunResult  # noqa: PLC0415
        from tiering.spark.submit import submit  # noqa: PLC0415
        from tiering.storage.layout import run_result_key  # noqa: PLC0415

        settings = _settings(params, ctx["run_id"])
        store = _store(settings)
        run_id = f"{settings.run_id}-keys"  # its own backups: the recompression that follows keeps its own
        policy = (params.get("policy") or "").strip()
        if policy:
            _policy(params)  # a bad file fails here, with the key and the problem
        elif not params["topics"]:
            from tiering.errors import ConfigError  # noqa: PLC0415

            raise ConfigError("compact_keys needs the compacted topics: a policy, or the topics param")
        chosen = ["--policy", policy] if policy else []
        chosen += ["--topics", params["topics"]] if params["topics"] else []
        conf = {"spark.log.level": "WARN", **json.loads(os.environ.get("TIERING_SPARK_CONF", "{}"))}
        submit(SPARK_KEYS_JOB, ["--bucket", settings.bucket, "--prefix", settings.prefix, "--run-id", run_id, *chosen,
                                "--min-age-minutes", str(params["min_segment_age_minutes"]),
                                "--lease-ttl-seconds", str(settings.lease_ttl_seconds), "--verify",
                                settings.verify.value, "--swap", settings.swap_text],
               master=spark_master(params["spark_master"]), conf=conf)
        key = run_result_key(settings.prefix, run_id, "compact-keys")
        run = RunResult.from_json(store.get_json(key)[0], f"s3://{settings.bucket}/{key}")
        prices, cost = cost_config(grace_days=params["cleanup_grace_days"])
        doc, keys = publish_report(store, settings.prefix, run_id, prices, cost, kind=run.kind)
        print(to_table(doc))
        if run.failed:
            from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415

            raise AirflowFailException(f"key compaction run {run_id}: {run.hard_failures} segments failed "
                                       f"(see s3://{settings.bucket}/{keys['json']})")
        return {"run_id": run_id, **run.totals(), "pending": run.pending,
                "report": f"s3://{settings.bucket}/{keys['json']}"}

    @task
    @fail_fast
    def scan() -> dict[str, Any]:
        from tiering.plan.scan import ScanOptions  # noqa: PLC0415
        from tiering.run.pipeline import scan_run  # noqa: PLC0415

        ctx = get_current_context()
        params, settings = ctx["params"], _settings(ctx["params"], ctx["run_id"])
        options = ScanOptions(params["codec"], params["level"], params["topics"] or None,
                              params["min_segment_age_minutes"], policy=_policy(params),
                              rebatch_max_bytes=params["rebatch_max_bytes"] if params["rebatch"] else None)
        result = scan_run(_store(settings), settings, options, inventory=(params["inventory"] or "").strip() or None)
        totals = result.totals
        print(f"scanned s3://{settings.bucket}/{settings.prefix}: {result.objects:,} objects, "
              f"{totals.segments:,} segments: {totals.to_compact:,} to compact, {totals.skipped:,} skipped "
              + "(" + ", ".join(f"{n:,} {why}" for why, n in totals.skipped_by_reason.items()) + ")")
        return result.to_json()

    @task
    @fail_fast
    def plan(scanned: dict[str, Any]) -> dict[str, Any]:
        from tiering.report.publish import cost_config  # noqa: PLC0415
        from tiering.run.compact import CompactOptions  # noqa: PLC0415
        from tiering.run.pipeline import plan_run  # noqa: PLC0415

        ctx = get_current_context()
        params, settings = ctx["params"], _settings(ctx["params"], ctx["run_id"])
        planned = plan_run(_store(settings), settings, CompactOptions(params["max_segments"], params["max_bytes"]),
                           estimate_savings=params["dry_run"], policy=_policy(params), prices=cost_config()[0])
        saved = planned.forecast
        print(f"plan: {planned.segments:,} segments to compact ({planned.bytes:,} bytes) in {len(planned.chunks)} "
              "chunks" + (f"; forecast: saves {saved.saved_bytes:,} bytes ({saved.saved_low:,} to "
                          f"{saved.saved_high:,}), by topic in the plan's manifest" if saved else ""))
        return (planned.dry() if params["dry_run"] else planned).to_json()

    @task
    @fail_fast
    def spark_compaction(planned: dict[str, Any]) -> list[dict[str, Any]]:
        """Stage every planned segment with Spark; returns the plan's chunks (names) for the commit."""
        import json  # noqa: PLC0415

        from tiering.run.pipeline import PlanStep  # noqa: PLC0415
        from tiering.spark.submit import submit  # noqa: PLC0415

        ctx = get_current_context()
        params, settings = ctx["params"], _settings(ctx["params"], ctx["run_id"])
        step = PlanStep.from_json(planned)
        chunks = [c.to_json() for c in step.chunks]
        if step.dry_run or not step.segments:
            print("nothing to stage" + (" (dry run)" if step.dry_run else "")
                  + (f"; {len(chunks)} chunks with operations in flight to finish" if chunks else ""))
            return chunks
        conf = {"spark.log.level": "WARN", **json.loads(os.environ.get("TIERING_SPARK_CONF", "{}"))}
        submit(SPARK_JOB, ["--plan", f"s3://{settings.bucket}/{step.plan_key}", "--run-id", settings.run_id,
                           "--lease-ttl-seconds", str(settings.lease_ttl_seconds), "--verify", settings.verify.value],
               master=spark_master(params["spark_master"]), conf=conf)
        return chunks

    @task(map_index_template="{{ chunk_name }}")
    @fail_fast
    def commit(chunk: dict[str, Any]) -> dict[str, Any]:
        from tiering.run.pipeline import ChunkRef, commit_chunk  # noqa: PLC0415

        ctx = get_current_context()
        ref = ChunkRef.from_json(chunk)
        ctx["chunk_name"] = ref.label  # type: ignore[typeddict-unknown-key]  # names the mapped task
        settings = _settings(ctx["params"], ctx["run_id"])
        result = commit_chunk(_store(settings), settings, ref.name, workers=COMMIT_WORKERS)
        print(f"committed {ref.name} ({ref.label}): {result.summary()}")
        return result.to_json()

    @task(trigger_rule="none_failed", outlets=[REPORT_ASSET])
    @fail_fast
    def report(planned: dict[str, Any]) -> dict[str, Any]:
        from tiering.report.publish import cost_config, publish_report  # noqa: PLC0415
        from tiering.report.render import to_table  # noqa: PLC0415
        from tiering.run.pipeline import collect_run, run_summary  # noqa: PLC0415

        ctx = get_current_context()
        params, settings = ctx["params"], _settings(ctx["params"], ctx["run_id"])
        store = _store(settings)
        run = collect_run(store, settings)
        headline, table = run_summary(run)
        if headline.segments:  # a dry run has no outcomes: its report below holds the forecast
            print(table)
        prices, options = cost_config(grace_days=params["cleanup_grace_days"])
        doc, keys = publish_report(store, settings.prefix, settings.run_id, prices, options)
        print(to_table(doc))
        t = doc.totals
        money = {"estimate": doc.estimate, "monthly_savings_usd": round(t.monthly_savings_usd, 2),
                 "yearly_savings_usd": round(t.yearly_savings_usd, 2), "one_off_usd": round(t.one_off_usd, 2),
                 "payback_months": None if t.payback_months is None else round(t.payback_months, 2)}
        uris = {fmt: f"s3://{settings.bucket}/{key}" for fmt, key in keys.items()}
        print(f"report: {uris['html']} (also {', '.join(sorted(uris))})")
        out = {**headline.to_json(), **money, "report": uris["json"], "report_html": uris["html"]}
        ctx["outlet_events"][REPORT_ASSET].extra = {**out, "bucket": settings.bucket, "prefix": settings.prefix}
        if run.pending and not headline.compacted:
            from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415

            raise AirflowFailException(
                f"nothing was compacted, and {run.pending} segments were left to a later run (partitions "
                f"busy: another run holds their leases, which expire {params['lease_ttl_seconds']} s after its "
                "last renewal; or S3 failing). The report above says which; run again later.")
        return out

    @task(trigger_rule="none_failed")
    @fail_fast
    def cleanup() -> dict[str, Any]:
        from tiering.run.compact import cleanup as clean  # noqa: PLC0415

        ctx = get_current_context()
        params, settings = ctx["params"], _settings(ctx["params"], ctx["run_id"])
        if params["dry_run"]:
            return {"dry_run": True}
        store = _store(settings)
        result = clean(store, settings.context(store), grace_days=params["cleanup_grace_days"])
        print(f"cleanup: {result.summary()}")
        return result.to_json()

    keys_done = key_compaction()
    scanned = scan()
    keys_done >> scanned
    planned = plan(scanned)
    committed = commit.expand(chunk=spark_compaction(planned))
    reported = report(planned)
    committed >> reported >> cleanup()


compaction_dag = kafka_segment_compaction()
