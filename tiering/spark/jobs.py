"""What the drivers of the Spark jobs do: cut a run's work into units, run each unit as a Spark task, and
collect what the tasks wrote. The job files under ``spark_jobs/`` parse their arguments and call these.

A task builds its own store from its executor's AWS environment (endpoint and credentials never travel
with the task), runs one unit through the same step functions the CLI runs in one process
(:func:`~tiering.run.pipeline.stage_unit`, :func:`~tiering.run.keycompact.keys_unit_task`,
:func:`~tiering.run.merge.merge_unit_task`), writes its results
to the run's step documents on S3 and returns only counts by status.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from tiering.commit.operation import Context
from tiering.lifecycle.vocabulary import Verify
from tiering.run.documents import RunResult
from tiering.run.keycompact import KeyCompactOptions, collect_keys_run, keys_unit_task, plan_keys
from tiering.run.merge import MergeOptions, collect_merge_run, merge_unit_task, plan_merge_run
from tiering.run.pipeline import RunSettings, load_manifest, manifest_location, put_usage, stage_unit, stage_units
from tiering.storage.layout import run_result_key
from tiering.storage.objects import ObjectStore
from tiering.storage.s3 import S3Store, make_client


class Unit(Protocol):
    def to_json(self) -> dict[str, Any]: ...


UnitTask = Callable[[ObjectStore, dict[str, Any], dict[str, Any]], dict[str, int]]


def run_units(spark: Any, units: Sequence[Unit], task: UnitTask, settings: RunSettings) -> Counter[str]:
    """``task`` over each unit, one Spark task per unit; the counts by status they return, added up."""
    counts: Counter[str] = Counter()
    if not units:
        return counts
    conf, bucket = settings.to_json(), settings.bucket
    rdd = spark.sparkContext.parallelize([u.to_json() for u in units], len(units))
    for done in rdd.map(lambda unit: task(S3Store(make_client(), bucket), unit, conf)).collect():
        counts.update(done)
    return counts


def stage_plan(spark: Any, plan_uri: str, run_id: str, lease_ttl_seconds: int, verify: Verify,
               log: Callable[[str], None]) -> Counter[str]:
    """Stage every planned segment of the plan whose manifest is ``plan_uri``, in units of whole partitions
    (largest first); the commit step swaps them in. Counts by status."""
    plan_bucket, _ = manifest_location(plan_uri)
    plan, manifest = load_manifest(S3Store(make_client(), plan_bucket), plan_uri)
    header = manifest.header
    settings = RunSettings(header.bucket, header.prefix, run_id, header.codec, header.level, lease_ttl_seconds,
                           verify)
    units = stage_units(plan, manifest, parallelism=spark.sparkContext.defaultParallelism)
    log(f"staging {sum(u.segments for u in units)} segments in {len(units)} tasks")
    started = time.perf_counter()
    counts = run_units(spark, units, stage_unit, settings)
    log(f"stage seconds: {time.perf_counter() - started:.3f}")
    put_usage(plan.store, settings, "stage-driver")
    log(f"stage results: {dict(sorted(counts.items()))}")
    return counts


class _PartitionsUnit(Unit, Protocol):
    @property
    def partitions(self) -> Sequence[object]: ...


class _UnitPlan(Protocol):
    @property
    def units(self) -> Sequence[_PartitionsUnit]: ...


P = TypeVar("P", bound=_UnitPlan)


def _unit_run(spark: Any, settings: RunSettings, what: str, plan: Callable[[ObjectStore, Context, int], P],
              task: UnitTask, collect: Callable[[ObjectStore, Context, P, str, Counter[str]], RunResult],
              log: Callable[[str], None]) -> RunResult:
    """A run made of units of whole partitions: ``plan`` on the driver (crashed runs' operations finished
    first), ``task`` over each unit on the cluster, ``collect`` its run document."""
    store = S3Store(make_client(), settings.bucket)
    ctx = settings.context(store)
    started = datetime.now(UTC).isoformat()
    planned = plan(store, ctx, spark.sparkContext.defaultParallelism)
    driver = Counter(store.requests)
    log(f"{what}: {sum(len(u.partitions) for u in planned.units)} partitions in {len(planned.units)} tasks")
    clock = time.perf_counter()
    counts = run_units(spark, planned.units, task, settings)
    log(f"{what} seconds: {time.perf_counter() - clock:.3f}; results: {dict(sorted(counts.items()))}")
    result = collect(store, ctx, planned, started, driver)
    key = run_result_key(settings.prefix, settings.run_id, result.kind)
    log(f"run document: s3://{settings.bucket}/{key} ({result.totals()})")
    return result


def merge_segments_plan(spark: Any, settings: RunSettings, options: MergeOptions,
                        log: Callable[[str], None]) -> RunResult:
    """One merge run over the chosen partitions: the units planned on the driver, merged on the cluster."""
    return _unit_run(spark, settings, "merge",
                     lambda store, ctx, n: plan_merge_run(store, ctx, options, parallelism=n), merge_unit_task,
                     lambda store, ctx, plan, started, driver: collect_merge_run(
                         store, ctx, plan, started, options.settings_json(), driver), log)


def compact_keys_plan(spark: Any, settings: RunSettings, options: KeyCompactOptions,
                      log: Callable[[str], None]) -> RunResult:
    """One key-compaction pass over the chosen partitions: the units planned on the driver, cleaned on the
    cluster."""
    return _unit_run(spark, settings, "key compaction",
                     lambda store, ctx, n: plan_keys(store, ctx, options, parallelism=n), keys_unit_task,
                     lambda store, ctx, plan, started, driver: collect_keys_run(
                         store, ctx, plan, started, options.settings_json(plan.now_ms), driver), log)
