"""
### kafka_segment_compaction

Recompresses the sealed Kafka log segments of an S3 `logdir` prefix with a stronger codec, swaps them
in with a crash-safe commit protocol (see `docs/commit-protocol.md`), and reports what was saved.

**Tasks**: `key_compaction` (with `compact_keys` only: one pass of Kafka's log cleaner over each compacted
topic's partitions) → `merge` (with `merge` or a policy's `merge.enable` only: small neighbouring segments
merged into fewer, larger ones) → `scan` (list the prefix, classify every segment) → `plan` (apply the
budget, largest segments first; the plan is written as chunks of whole partitions) → `compaction`
(the run engine's compaction as a Spark job: operations crashed runs left in flight finished first, then
one Spark task per unit of whole partitions balanced by bytes, each partition under its lease: every
segment rewritten, proved, staged, verified and swapped in) → `report` (the run
document and the cost savings report: JSON, Markdown, CSV and an HTML page with charts under
`PREFIX/_tiering/reports/<run>/` and `.../reports/latest/`, the ledger of all runs; a summary table in the
log; publishes the report asset)
→ `cleanup` (kept originals past their grace period, abandoned staging objects, incomplete multipart
uploads).

Every task can be retried (with exponential backoff) and a whole run can be re-run: finished segments
are found compacted, operations left in flight are finished (a staged one taken over where the run would
stage the same), interrupted swaps are finished.

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
| | run's partitions are free again after it); default 600 |
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
| | as run `<run>-keys` with its own report; with `dry_run`, the partitions and segments it may clean |
| | are counted from the listing in the task's log |
| `merge` | then merge runs of small neighbouring sealed segments into segments up to `merge_target_bytes` |
| | (docs/merging.md), in every topic matching `topics`; with a policy, `merge.enable` decides per topic |
| | (the policy's merging runs whenever a scope enables it) and this must stay off; run `<run>-merge` |
| | with its own report; with `dry_run`, the merges are planned from the listing and their objects priced |
| | in the task's log |
| `merge_target_bytes` | with `merge`: a merged segment's bound (default 1 GiB, Kafka's `segment.bytes`) |
| `compact_keys_merge` | with `compact_keys`: clean neighbouring segments into one as the broker's cleaner groups |
| | them (the policy's `segment.bytes` and `segment.index.bytes`, else Kafka's 1 GiB and 10 MiB), swapped in |
| | like a merge (docs/merging.md); off: each segment cleaned into one of its own |

The schedule is `TIERING_COMPACTION_SCHEDULE` (default `@daily`); scheduled runs use the defaults of
`bucket` and `prefix`, set by `TIERING_BUCKET` and `TIERING_PREFIX`; the default Spark master is
`TIERING_SPARK_MASTER` (default `local[*]`); extra `spark-submit --conf` pairs come from
`TIERING_SPARK_CONF` (JSON object). S3 endpoint and credentials come from the worker's AWS environment.
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

from tiering.options import (  # light: the options' declarations alone
    CLEANUP,
    CODEC,
    KEY_COMPACTION,
    LEASE_TTL,
    LEVEL,
    MAX_BYTES,
    MAX_SEGMENTS,
    MIN_AGE,
    REBATCH,
    REBATCH_MAX_BYTES,
    SEGMENT_BYTES,
    SWAP,
    TOPICS,
    VERIFY,
    option,
    params,
)

SCHEDULE = os.environ.get("TIERING_COMPACTION_SCHEDULE", "@daily")
SPARK_MASTER = os.environ.get("TIERING_SPARK_MASTER", "local[*]")
# The one Spark job: a run of any of the run engine's kinds (compaction, key compaction, merging).
SPARK_JOB = Path(os.environ.get("TIERING_SPARK_JOB", Path(__file__).resolve().parents[1] / "spark_jobs"
                                / "run_kind.py"))
# Published after every run (its extra names the bucket, prefix, run and the report's S3 URI), so that
# other DAGs can be scheduled on it. Static: bucket and prefix are runtime params, the asset is not.
REPORT_ASSET = Asset(name="kafka_segment_compaction_report", uri="tiering://kafka_segment_compaction/report")

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


def _store(bucket: str) -> Any:
    """The run's bucket, through a client from the worker's AWS environment (never in params or XCom)."""
    from tiering.storage.s3 import S3Store, make_client  # noqa: PLC0415

    return S3Store(make_client(), bucket)


def _run() -> tuple[Any, Any]:
    """The running task's params, typed (:class:`~tiering.steps.compaction.CompactionParams`), and its store."""
    from tiering.steps.compaction import CompactionParams  # noqa: PLC0415 - heavy imports stay inside tasks

    ctx = get_current_context()
    run = CompactionParams.from_params(ctx["params"], ctx["run_id"])
    return run, _store(run.settings.bucket)


def _job(path: Path) -> Any:
    from tiering.steps.compaction import SparkJob  # noqa: PLC0415

    return SparkJob.configured(path, spark_master(get_current_context()["params"]["spark_master"]))


def _fail(failure: str | None) -> None:
    """Fail the task, without retries, for what the step says (another attempt would find the same)."""
    if failure:
        from airflow.sdk.exceptions import AirflowFailException  # noqa: PLC0415

        raise AirflowFailException(failure)


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
        "topics": Param(**{**TOPICS.param(), "minLength": 0}),  # empty, as a form sends it: every topic
        "codec": Param(**CODEC.param()),
        "level": Param(**LEVEL.param()),
        "min_segment_age_minutes": Param(**MIN_AGE.param()),
        "max_segments": Param(**MAX_SEGMENTS.param()),
        "max_bytes": Param(**MAX_BYTES.param()),
        "dry_run": Param(False, type="boolean", description="plan and estimate only"),
        "spark_master": Param(SPARK_MASTER, type="string", minLength=1, description="Spark master"),
        **{name: Param(**kw) for name, kw in params(CLEANUP, prefix="cleanup_", only=("grace_days",)).items()},
        "lease_ttl_seconds": Param(**LEASE_TTL.param(minimum=30)),  # a scheduled run's copies take time
        "verify": Param(**VERIFY.param()),
        "swap": Param(**SWAP.param()),
        "inventory": Param("", type="string", pattern=r"^(s3://[^/]+/.+/manifest\.json)?$",
                           description="an S3 Inventory manifest.json to plan from; empty: list the prefix"),
        "policy": Param(os.environ.get("TIERING_POLICY_FILE", ""), type="string",
                        description="policy YAML file on the workers; empty: codec and level for every topic"),
        "rebatch": Param(**REBATCH.param()),
        "rebatch_max_bytes": Param(**REBATCH_MAX_BYTES.param()),
        "compact_keys": Param(False, type="boolean",
                              description="first key-compact the compacted topics (the policy's with "
                              "cleanup.policy compact and compact.enable, else those matching topics)"),
        "merge": Param(False, type="boolean",
                       description="first merge runs of small neighbouring sealed segments into segments up to "
                       "merge_target_bytes, in every chosen topic; with a policy, its merge.enable decides per "
                       "topic instead"),
        "merge_target_bytes": Param(**SEGMENT_BYTES.param(minimum=1 << 20)),  # with merge
        "compact_keys_merge": Param(**option(KEY_COMPACTION, "merge").param()),  # with compact_keys
    },
)
def kafka_segment_compaction() -> None:
    @task
    @fail_fast
    def key_compaction() -> dict[str, Any]:
        """With ``compact_keys``: one key-compaction pass (run ``<run>-keys``, its report published)."""
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        step = compaction.key_compaction(store, run, _job(SPARK_JOB), print)
        _fail(step.failure)
        return step.to_json()

    @task
    @fail_fast
    def merge() -> dict[str, Any]:
        """With ``merge`` or a policy's ``merge.enable``: one merge run (``<run>-merge``, its report published)."""
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        step = compaction.merge(store, run, _job(SPARK_JOB), print)
        _fail(step.failure)
        return step.to_json()

    @task
    @fail_fast
    def scan() -> dict[str, Any]:
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        return compaction.scan(store, run, print).to_json()

    @task
    @fail_fast
    def plan(scanned: dict[str, Any]) -> dict[str, Any]:
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        return compaction.plan(store, run, print).to_json()

    @task
    @fail_fast
    def compaction(planned: dict[str, Any]) -> dict[str, Any]:
        """The plan carried out on Spark (the run engine's compaction); its run document written."""
        from tiering.run.pipeline import PlanStep  # noqa: PLC0415
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        return compaction.compaction(store, run, PlanStep.from_json(planned), _job(SPARK_JOB), print).to_json()

    @task(trigger_rule="none_failed", outlets=[REPORT_ASSET])
    @fail_fast
    def report(compacted: dict[str, Any]) -> dict[str, Any]:
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        step = compaction.report(store, run, print)
        out = step.to_json()
        get_current_context()["outlet_events"][REPORT_ASSET].extra = {
            **out, "bucket": run.settings.bucket, "prefix": run.settings.prefix}
        _fail(step.failure)
        return out

    @task(trigger_rule="none_failed")
    @fail_fast
    def cleanup() -> dict[str, Any]:
        from tiering.steps import compaction  # noqa: PLC0415

        run, store = _run()
        return compaction.clean(store, run, print).to_json()

    scanned = scan()
    key_compaction() >> merge() >> scanned
    report(compaction(plan(scanned))) >> cleanup()


compaction_dag = kafka_segment_compaction()
