"""The tasks of the DAG ``kafka_segment_compaction``: key compaction and merging (optional), scan, plan, the
compaction on Spark (the run engine's kind: each task compacts and swaps in its partitions), report,
cleanup."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tiering.cost.forecast import Range
from tiering.cost.prices import PriceBook
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import RunKind
from tiering.options import SEGMENT_BYTES
from tiering.plan.estimate import Sampling
from tiering.plan.inventory import inventory_objects
from tiering.plan.policy import Policy, load_policy
from tiering.plan.scan import ScanOptions
from tiering.report.publish import cost_config, publish_report
from tiering.report.render import to_table, usd
from tiering.run import engine
from tiering.run.cleanup import CleanupFigures, CleanupOptions, cleanup
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.engine import Kind
from tiering.run.keycompact import KeyCompaction, KeyCompactOptions, KeyPartition
from tiering.run.merge import MergeOptions, Merging, PlannedMerges, plan_merges
from tiering.run.pipeline import (
    PlanStep,
    RunHeadline,
    RunSettings,
    ScanStep,
    collect_planned,
    compaction_kind,
    plan_run,
    run_local,
    run_summary,
    safe_run_id,
    scan_run,
)
from tiering.spark.submit import submit
from tiering.storage.layout import run_result_key
from tiering.storage.objects import ObjectStore

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class SparkJob:
    """Where a Spark job runs: its file, the master URL, and ``spark-submit --conf`` pairs."""

    path: Path
    master: str
    conf: Mapping[str, str]

    @classmethod
    def configured(cls, path: Path, master: str) -> SparkJob:
        """The job with Spark's log level at WARN and the pairs of ``TIERING_SPARK_CONF`` (a JSON object)."""
        try:
            extra = json.loads(os.environ.get("TIERING_SPARK_CONF", "{}"))
        except ValueError as e:
            raise ConfigError("TIERING_SPARK_CONF is not JSON", expected='{"spark.key": "value", ...}',
                              found=str(e)) from None
        return cls(path, master, {"spark.log.level": "WARN", **{str(k): str(v) for k, v in extra.items()}})

    def run(self, args: list[str], log: Log) -> None:
        submit(self.path, args, master=self.master, conf=self.conf, log=log)


@dataclass(frozen=True, slots=True)
class CompactionParams:
    """A compaction run as the DAG's params describe it, typed once."""

    settings: RunSettings
    topics: str | None
    min_age_minutes: int
    max_segments: int | None
    max_bytes: int | None
    dry_run: bool
    grace_days: float
    inventory: str | None
    policy_file: str | None
    rebatch_max_bytes: int | None  # None: no re-batching
    compact_keys: bool
    keys_merge: bool = True  # key compaction cleans neighbours into one segment as the broker's cleaner does
    merge_target_bytes: int | None = None  # None: no merging of small segments

    @classmethod
    def from_params(cls, params: Mapping[str, Any], run_id: str) -> CompactionParams:
        verify, swap = RunSettings.modes(params["verify"], params["swap"])
        settings = RunSettings(params["bucket"], params["prefix"].strip("/"), safe_run_id(run_id), params["codec"],
                               params["level"], params["lease_ttl_seconds"], verify, swap)
        return cls(settings, params["topics"] or None, params["min_segment_age_minutes"], params["max_segments"],
                   params["max_bytes"], bool(params["dry_run"]), float(params["cleanup_grace_days"]),
                   (params["inventory"] or "").strip() or None, (params.get("policy") or "").strip() or None,
                   params["rebatch_max_bytes"] if params["rebatch"] else None, bool(params["compact_keys"]),
                   bool(params.get("compact_keys_merge", True)),
                   params.get("merge_target_bytes", SEGMENT_BYTES.default) if params.get("merge") else None)

    def policy(self) -> Policy | None:
        """The run's policy, read and checked (a bad file fails the first task, naming the key and problem)."""
        return load_policy(self.policy_file) if self.policy_file else None


@dataclass(frozen=True, slots=True)
class SideRunStep:
    """What a task that makes a run of its own did (key compaction, merging): nothing (not asked, or a dry
    run), or run ``run`` with its report."""

    what: str  # "key compaction", "merge"
    run: RunResult | None
    report: str | None = None  # the report's S3 URI
    forecast: MergeForecast | KeysForecast | None = None  # a dry run's work, as the listing plans it

    @property
    def failure(self) -> str | None:
        """Why the task fails (segments failed for a reason a retry does not fix), else None."""
        if self.run is None or not self.run.failed:
            return None
        return f"{self.what} run {self.run.run_id}: {self.run.hard_failures} segments failed (see {self.report})"

    def to_json(self) -> dict[str, Any]:
        if self.forecast is not None:
            return {"dry_run": True, **self.forecast.to_json()}
        if self.run is None:
            return {"skipped": True}
        return {"run_id": self.run.run_id, **self.run.totals(), "pending": self.run.pending, "report": self.report}


@dataclass(frozen=True, slots=True)
class MergeForecast:
    """What a merge run would do, from the listing: groups, segments and objects before and after, and the
    objects' storage a month before and after (priced by the object)."""

    groups: int
    segments_before: int
    segments_after: int
    objects_before: int
    objects_after: int
    monthly_before_usd: float
    monthly_after_usd: float

    @classmethod
    def of(cls, planned: PlannedMerges, prices: PriceBook) -> MergeForecast:
        """One partition's merges."""
        f = planned.figures(prices)
        return cls(len(planned.groups), planned.segments_before, planned.segments_after, planned.objects_before,
                   planned.objects_after, f.monthly_before_usd if f else 0.0, f.monthly_after_usd if f else 0.0)

    def plus(self, other: MergeForecast) -> MergeForecast:
        return MergeForecast(*(getattr(self, n) + getattr(other, n) for n in self.__dataclass_fields__))

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class KeysForecast:
    """What a key-compaction pass would clean, from the listing: partitions, the segments it may clean (those it
    reads but the last) and their .log bytes."""

    partitions: int
    segments: int
    log_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def _kind_run(store: ObjectStore, settings: RunSettings, job: SparkJob, log: Log, kind: Kind[Any],
              inventory: str | None) -> RunResult:
    """A run of ``kind`` as the Spark job ``job`` (the run's settings and the kind's options sent as the JSON
    they read back); its run document (the job fails only where it wrote none)."""
    job.run(["--kind", kind.run_kind.value, "--settings", json.dumps(settings.to_json()),
             "--options", json.dumps(kind.options_json()), *(["--inventory", inventory] if inventory else []),
             "--exit-code", "job"], log)  # the run document says what became of each segment
    key = run_result_key(settings.prefix, settings.run_id, kind.run_kind)
    return RunResult.from_json(store.get_json(key)[0], f"s3://{settings.bucket}/{key}")


def _side_run(store: ObjectStore, run: CompactionParams, job: SparkJob, log: Log, kind: Kind[Any], suffix: str
              ) -> SideRunStep:
    """A run ``<run>-<suffix>`` of ``kind`` as the Spark job ``job``, its report published."""
    settings = replace(run.settings, run_id=f"{run.settings.run_id}-{suffix}", codec=None, level=None)
    result = _kind_run(store, settings, job, log, kind, run.inventory)
    prices, cost = cost_config(grace_days=run.grace_days)
    doc, keys = publish_report(store, settings.prefix, settings.run_id, prices, cost, kind=result.kind)
    log(to_table(doc))
    return SideRunStep(kind.label, result, f"s3://{settings.bucket}/{keys['json']}")


def key_compaction(store: ObjectStore, run: CompactionParams, job: SparkJob, log: Log) -> SideRunStep:
    """With ``compact_keys`` (and not a dry run): one pass of Kafka's cleaner over the compacted topics, as the
    Spark job ``job``, run ``<run>-keys`` (its own backups: the recompression that follows keeps its own),
    its report published."""
    if not run.compact_keys:
        return SideRunStep("key compaction", None)
    if not run.policy_file and not run.topics:
        raise ConfigError("compact_keys needs the compacted topics: a policy, or the topics param")
    # the DAG's params read as the declarations read them (the rest their defaults); a bad policy file fails
    # here, with the key and the problem
    options = KeyCompactOptions.from_json({"topics": run.topics, "min_age_minutes": run.min_age_minutes,
                                           "lease_ttl_seconds": run.settings.lease_ttl_seconds,
                                           "policy": run.policy_file, "merge": run.keys_merge}, "the DAG's params")
    kind = KeyCompaction(options)
    if not run.dry_run:
        return _side_run(store, run, job, log, kind, "keys")
    forecast = KeysForecast(0, 0, 0)

    def add(part: KeyPartition) -> None:  # one partition's pass folded in: nothing is held
        nonlocal forecast
        row = part.preview_json()
        forecast = KeysForecast(forecast.partitions + bool(row["segments"]), forecast.segments + row["segments"],
                                forecast.log_bytes + row["log_bytes"])

    source = inventory_objects(store, run.inventory, run.settings.prefix)[1] if run.inventory else None
    engine.preview(store, run.settings.prefix, kind, add, source=source)
    log(f"key compaction (dry run): {forecast.partitions:,} partitions, {forecast.segments:,} segments it may "
        f"clean ({forecast.log_bytes:,} .log bytes); what it removes is known only by reading them")
    return SideRunStep("key compaction", None, forecast=forecast)


def merge(store: ObjectStore, run: CompactionParams, job: SparkJob, log: Log) -> SideRunStep:
    """Runs of small neighbouring sealed segments merged, as the Spark job ``job``, run ``<run>-merge``, its
    report published: with ``merge``, every chosen topic's into segments up to ``merge_target_bytes``; with
    a policy, the topics whose ``merge.enable`` is true, each with its own bounds. A dry run plans them from
    the listing and changes nothing.
    Before the recompression, which then rewrites the merged segments (its rollback gives them back)."""
    policy = run.policy()  # a bad file fails here, with the key and the problem
    if policy is not None and run.merge_target_bytes is not None:
        raise ConfigError("merging every topic and a policy: set merge.enable (and merge.target.bytes) in the "
                          "policy instead of the merge param")
    wanted = policy.enables("merge.enable") if policy is not None else run.merge_target_bytes is not None
    if not wanted:
        return SideRunStep("merge", None)
    options = MergeOptions.from_json({"topics": run.topics, "min_age_minutes": run.min_age_minutes,
                                      "lease_ttl_seconds": run.settings.lease_ttl_seconds, "policy": run.policy_file,
                                      **({"segment_bytes": run.merge_target_bytes} if run.merge_target_bytes else {})},
                                     "the DAG's params")
    if run.dry_run:
        source = inventory_objects(store, run.inventory, run.settings.prefix)[1] if run.inventory else None
        prices, forecast = cost_config()[0], MergeForecast(0, 0, 0, 0, 0, 0.0, 0.0)

        def add(planned: PlannedMerges) -> None:  # one partition's merges folded in: nothing is held
            nonlocal forecast
            forecast = forecast.plus(MergeForecast.of(planned, prices))

        plan_merges(store, run.settings.prefix, options, add, source)
        log(f"merge (dry run): {forecast.groups:,} groups, {forecast.segments_before:,} segments -> "
            f"{forecast.segments_after:,}, {forecast.objects_before:,} objects -> {forecast.objects_after:,}; their "
            f"storage {usd(forecast.monthly_before_usd)} -> {usd(forecast.monthly_after_usd)} a month")
        return SideRunStep("merge", None, forecast=forecast)
    return _side_run(store, run, job, log, Merging(options), "merge")


def scan(store: ObjectStore, run: CompactionParams, log: Log) -> ScanStep:
    """List the prefix (or read the S3 Inventory report) and classify every segment."""
    settings = run.settings
    options = ScanOptions(settings.compaction_codec, settings.level, run.topics, run.min_age_minutes,
                          policy=run.policy(), rebatch_max_bytes=run.rebatch_max_bytes)
    result = scan_run(store, settings, options, inventory=run.inventory)
    totals = result.totals
    log(f"scanned s3://{settings.bucket}/{settings.prefix}: {result.objects:,} objects, {totals.segments:,} "
        f"segments: {totals.to_compact:,} to compact, {totals.skipped:,} skipped ("
        + ", ".join(f"{n:,} {why}" for why, n in totals.skipped_by_reason.items()) + ")")
    return result


def plan(store: ObjectStore, run: CompactionParams, log: Log) -> PlanStep:
    """The budget applied, the plan written as chunks of whole partitions; a dry run's plan holds the forecast
    and is not carried out."""
    planned = plan_run(store, run.settings, _budget(run),
                       forecast=Sampling() if run.dry_run else None, policy=run.policy(), prices=cost_config()[0])
    saved = _forecast_text(planned.forecast)
    log(f"plan: {planned.segments:,} segments to compact ({planned.bytes:,} bytes) in {planned.chunks} chunks"
        + saved)
    return planned.dry() if run.dry_run else planned


def _forecast_text(saved: Range | None) -> str:
    return (f"; forecast: saves {saved.saved_bytes:,} bytes ({saved.saved_low:,} to {saved.saved_high:,}), by topic "
            "in the plan's manifest" if saved else "")


def _budget(run: CompactionParams) -> CompactOptions:
    return CompactOptions(run.max_segments, run.max_bytes, run.settings.lease_ttl_seconds)


def compaction(store: ObjectStore, run: CompactionParams, planned: PlanStep, job: SparkJob, log: Log) -> SideRunStep:
    """The plan carried out through the engine's compaction (operations crashed runs left in flight finished
    first, then each unit of whole partitions, each segment swapped in at once) and its run document
    written: by the Spark job ``job``, one task per unit; in this process where the plan has no segment to
    compact and nothing is in flight (the document then counts what the plan notes: an earlier attempt's
    compactions). Nothing on a dry run (the report writes its document)."""
    if planned.dry_run:
        log("nothing to compact (dry run)")
        return SideRunStep("compaction", None)
    settings = run.settings
    if planned.segments or planned.in_flight:
        result = _kind_run(store, settings, job, log, compaction_kind(settings, _budget(run)), None)
    else:
        result = run_local(store, settings, settings.context(store), _budget(run))
    log(f"compaction run {result.run_id}: " + ", ".join(f"{n:,} {k}" for k, n in sorted(result.totals().items())))
    return SideRunStep("compaction", result)


@dataclass(frozen=True, slots=True)
class ReportStep:
    """The run's headline and the savings its report gives, with the report's URIs."""

    headline: RunHeadline
    estimate: bool  # a dry run's forecast, not a measurement
    monthly_usd: float
    yearly_usd: float
    one_off_usd: float
    payback_months: float | None
    report: str
    report_html: str
    failure: str | None  # why the task fails: nothing was compacted and work was left to a later run

    def to_json(self) -> dict[str, Any]:
        return {**self.headline.to_json(), "estimate": self.estimate, "monthly_savings_usd": round(self.monthly_usd, 2),
                "yearly_savings_usd": round(self.yearly_usd, 2), "one_off_usd": round(self.one_off_usd, 2),
                "payback_months": None if self.payback_months is None else round(self.payback_months, 2),
                "report": self.report, "report_html": self.report_html}


def report(store: ObjectStore, run: CompactionParams, log: Log) -> ReportStep:
    """The run document (the compaction's; a dry run's written here, from its plan), then the savings report
    in every format and the ledger."""
    settings = run.settings
    key = run_result_key(settings.prefix, settings.run_id, RunKind.COMPACT)
    result = (collect_planned(store, settings, _budget(run)) if run.dry_run
              else RunResult.from_json(store.get_json(key)[0], f"s3://{settings.bucket}/{key}"))
    headline, table = run_summary(result)
    if headline.segments:  # a dry run has no outcomes: its report holds the forecast
        log(table)
    prices, options = cost_config(grace_days=run.grace_days)
    doc, keys = publish_report(store, settings.prefix, settings.run_id, prices, options)
    log(to_table(doc))
    uris = {fmt: f"s3://{settings.bucket}/{key}" for fmt, key in keys.items()}
    log(f"report: {uris['html']} (also {', '.join(sorted(uris))})")
    failure = None
    if result.pending and not headline.compacted:
        failure = (f"nothing was compacted, and {result.pending} segments were left to a later run (partitions "
                   f"busy: another run holds their leases, which expire {settings.lease_ttl_seconds} s after its "
                   "last renewal; or S3 failing). The report above says which; run again later.")
    t = doc.totals
    return ReportStep(headline, doc.estimate, t.monthly_savings_usd, t.yearly_savings_usd, t.one_off_usd,
                      t.payback_months, uris["json"], uris["html"], failure)


@dataclass(frozen=True, slots=True)
class CleanupStep:
    """What the DAG's cleanup did: its run (None on a dry run, which cleans nothing)."""

    run: RunResult | None

    def to_json(self) -> dict[str, Any]:
        if self.run is None:
            return {"dry_run": True}
        return {"run_id": self.run.run_id, **self.run.totals(), "pending": self.run.pending,
                **CleanupFigures.of(self.run).counts()}


def clean(store: ObjectStore, run: CompactionParams, log: Log) -> CleanupStep:
    """Originals past their grace period, abandoned staging objects and multipart uploads (a cleanup run of the
    engine, run ``<run>-cleanup``); nothing on a dry run."""
    if run.dry_run:
        return CleanupStep(None)
    settings = replace(run.settings, run_id=f"{run.settings.run_id}-cleanup", codec=None, level=None)
    result = cleanup(store, settings.context(store),
                     CleanupOptions(run.grace_days, lease_ttl_seconds=settings.lease_ttl_seconds))
    log(f"cleanup run {settings.run_id}: {CleanupFigures.of(result).summary()} "
        f"({result.totals()['segments']:,} segments' objects)")
    return CleanupStep(result)
