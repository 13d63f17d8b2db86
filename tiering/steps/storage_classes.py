"""The tasks of the DAG ``kafka_segment_tiering``: plan which objects move to which storage class and move them
(a run of the engine's kind :class:`~tiering.run.tier.Tiering`), report what they save."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.commit.operation import Context
from tiering.cost.prices import PriceBook
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.inventory import inventory_objects
from tiering.plan.policy import Policy, load_policy
from tiering.report.publish import cost_config
from tiering.run import engine
from tiering.run.pipeline import safe_run_id
from tiering.run.tier import (
    Tiering,
    TierOptions,
    TierPartition,
    TierPlan,
    TierTally,
    plan_document,
    run_results,
    tier_report,
    tier_table,
)
from tiering.steps import segment_lines
from tiering.storage.layout import run_result_key, tier_plan_key, tier_report_key
from tiering.storage.objects import ObjectStore

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class TieringParams:
    """A storage-class tiering run as the DAG's params (or the command line) describe it, typed once."""

    bucket: str
    prefix: str
    run_id: str
    policy_file: str
    dry_run: bool
    include_internal: bool = False  # plan the internal topics (__consumer_offsets, ...) too
    lease_ttl: int = DEFAULT_TTL_SECONDS
    inventory: str | None = None  # the manifest.json of an S3 Inventory report to plan from (None: list)
    workers: int = 1  # partitions worked on at once (threads, each with its own S3 client)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], run_id: str) -> TieringParams:
        # "-tier": the compaction DAG's run of the same schedule has the same Airflow run id, and a run id
        # owns leases (a run's end releases every lease its id holds).
        return cls(params["bucket"], params["prefix"].strip("/"), f"{safe_run_id(run_id)}-tier",
                   params["policy"].strip(), bool(params["dry_run"]), bool(params.get("include_internal", False)),
                   inventory=(params.get("inventory") or "").strip() or None)

    def policy(self) -> Policy:
        """The policy file read and checked (a :class:`ConfigError` naming what is wrong in it)."""
        if not self.policy_file:
            raise ConfigError("storage-class tiering needs a policy: pass the policy param or set "
                              "TIERING_POLICY_FILE")
        return load_policy(self.policy_file)


@dataclass(frozen=True, slots=True)
class TierStep:
    """What the tiering step did: its plan document's key, the objects it planned to move, and (not on a dry
    run) its run document's key and the segments with moves (not the operations of other runs it finished
    first)."""

    plan_key: str
    objects_to_move: int
    run_key: str | None = None
    segments: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"plan_key": self.plan_key, "objects_to_move": self.objects_to_move,
                **({"run_key": self.run_key} if self.run_key else {}), "segments": self.segments}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TierStep:
        return cls(str(doc["plan_key"]), int(doc["objects_to_move"]), doc.get("run_key"), int(doc["segments"]))


@dataclass(frozen=True, slots=True)
class TierReportStep:
    """What the run moved and what that saves, with the report's URI."""

    run_id: str
    dry_run: bool
    objects_moved: int
    bytes_moved: int
    monthly_usd: float
    one_off_usd: float
    report: str
    failed: int  # segments whose moves failed

    @property
    def failure(self) -> str | None:
        return f"{self.failed} segments failed to move (see {self.report})" if self.failed else None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "dry_run": self.dry_run, "objects_moved": self.objects_moved,
                "bytes_moved": self.bytes_moved, "monthly_savings_usd": round(self.monthly_usd, 6),
                "one_off_usd": round(self.one_off_usd, 6), "report": self.report}


def tier(store: ObjectStore, run: TieringParams, log: Log, *, prices: PriceBook | None = None,
         write_plan: bool = True, each: Callable[[TierPartition], None] | None = None) -> tuple[TierStep, TierPlan]:
    """Each sealed segment's target class, from its newest record's age and its topic's policy (the segments
    listed, or read from the run's S3 Inventory report), and (not on a dry run) the moves, a partition at a
    time under its lease, through the run engine; the plan's sums go to the run's ``tier-plan`` document
    (unless not ``write_plan``: the command line's dry run writes nothing). ``each``: every partition's
    decisions as they are made. ``prices``: the price book (default: the configured one)."""
    options = TierOptions(run.policy(), prices or cost_config()[0], run.include_internal, run.lease_ttl)
    kind = Tiering(options).started(store, run.prefix)  # a bad policy failed above, before any request
    tally = TierTally()

    def seen(part: TierPartition) -> None:
        tally.add(part)
        if each is not None:
            each(part)

    run_key, segments = None, 0
    source = inventory_objects(store, run.inventory, run.prefix)[1] if run.inventory else None
    if run.dry_run:
        engine.preview(store, run.prefix, kind, seen, source=source)
        log("dry run: nothing is moved")
    else:
        ctx = Context(store, run.prefix, run.run_id)
        engine.run(store, ctx, kind, segment_lines(log), seen=seen, source=source, workers=run.workers)
        run_key = run_result_key(run.prefix, run.run_id, RunKind.TIER)
        segments = sum(1 for _ in run_results(store, run.prefix, run.run_id))
    planned = plan_document(store, run.prefix, kind.options, tally.totals())
    key = tier_plan_key(run.prefix, run.run_id)
    if write_plan:
        store.put_json(key, planned.to_json())
    totals = planned.totals
    staying = ", ".join(f"{n:,} {reason}" for reason, n in sorted(totals.staying.items())) or "none"
    log(f"plan: {totals.objects_to_move:,} objects to move ({totals.bytes_to_move:,} bytes); staying: {staying}")
    return TierStep(key, totals.objects_to_move, run_key, segments), planned


def report(store: ObjectStore, run: TieringParams, step: TierStep, log: Log) -> TierReportStep:
    """The report (JSON and Markdown beside the run's other reports) of what moved and what it saves."""
    tier_plan = TierPlan.from_json(store.get_json(step.plan_key)[0])
    results = list(run_results(store, run.prefix, run.run_id)) if step.run_key else []
    doc = tier_report(tier_plan, results, run.run_id, dry_run=run.dry_run)
    text = tier_table(doc)
    log(text)
    key = tier_report_key(run.prefix, run.run_id, "json")
    store.put_json(key, doc.to_json())
    store.put(tier_report_key(run.prefix, run.run_id, "md"), ("```\n" + text + "\n```\n").encode())
    monthly, one_off = doc.money()
    return TierReportStep(run.run_id, doc.dry_run, doc.objects_moved, doc.bytes_moved, monthly, one_off,
                          f"s3://{store.bucket}/{key}", len(doc.segments_failed))
