"""What the drivers of the Spark jobs do: cut a run's work into units, run each unit as a Spark task, and
collect what the tasks wrote. The job files under ``spark_jobs/`` parse their arguments and call these.

A task builds its own store from its executor's AWS environment (endpoint and credentials never travel
with the task), runs one unit through the engine as the CLI does in one process
(:func:`~tiering.run.engine.unit_task`), writes its results to the run's step documents on S3 and returns
only counts by status.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from tiering.plan.inventory import inventory_objects
from tiering.run import engine
from tiering.run.documents import RunResult
from tiering.run.kinds import kind_from_json
from tiering.run.pipeline import RunSettings
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


def _unit_task(kind: engine.Kind[Any]) -> UnitTask:
    """The executor's side of a unit of ``kind`` (the kind travels with the task, its settings with it)."""
    def task(store: ObjectStore, unit: dict[str, Any], settings: dict[str, Any]) -> dict[str, int]:
        return engine.unit_task(store, RunSettings.from_json(settings).context(store, one_core=True), kind, unit)
    return task


def partition_run(spark: Any, settings: RunSettings, kind: engine.Kind[Any], log: Callable[[str], None], *,
                  inventory: str | None = None) -> RunResult:
    """A run of ``kind`` (compaction, key compaction, merging, storage tiering, rollback, cleanup): the
    engine's plan on the driver (the kind's work on the run as a whole and the crashed runs' operations
    first; from a listing, or from the S3 Inventory report whose manifest is ``inventory``), one Spark task
    per unit on the cluster, the run document collected on the driver."""
    store = S3Store(make_client(), settings.bucket)
    ctx = settings.context(store)
    started = datetime.now(UTC).isoformat()
    kind = kind.started(store, settings.prefix)
    source = None
    if inventory:
        manifest, source = inventory_objects(store, inventory, settings.prefix)
        log(f"{kind.label}: planned from the S3 Inventory report {inventory} ({len(manifest.files)} files)")
    planned = engine.plan(store, ctx, kind, parallelism=spark.sparkContext.defaultParallelism, source=source)
    driver = Counter(store.requests)
    what = kind.label
    log(f"{what}: {sum(len(u.partitions) for u in planned.units)} partitions in {len(planned.units)} tasks")
    clock = time.perf_counter()
    counts = run_units(spark, planned.units, _unit_task(kind), settings)
    log(f"{what} seconds: {time.perf_counter() - clock:.3f}; results: {dict(sorted(counts.items()))}")
    result = engine.collect(store, ctx, kind, planned, started, driver)
    key = run_result_key(settings.prefix, settings.run_id, result.kind)
    log(f"run document: s3://{settings.bucket}/{key} ({result.totals()})")
    return result


def kind_run(spark: Any, run_kind: str, settings: object, options: object, log: Callable[[str], None], *,
             inventory: str | None = None) -> RunResult:
    """:func:`partition_run` of the engine's kind ``run_kind``, its settings and options as the JSON
    ``RunSettings.to_json`` and the kind's options' ``to_json`` write (read strictly: a field they do not
    write is an error naming it)."""
    return partition_run(spark, RunSettings.from_json(settings, "--settings"),
                         kind_from_json(run_kind, options, "--options"), log, inventory=inventory)
