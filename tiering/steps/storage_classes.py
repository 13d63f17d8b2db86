"""The tasks of the DAG ``kafka_segment_tiering``: plan which objects move to which storage class, apply the
moves, report what they save."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.cost.prices import PriceBook
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.policy import Policy, load_policy
from tiering.report.publish import cost_config
from tiering.run.pipeline import safe_run_id
from tiering.run.tier import TierPlan, TierRun, apply_tiering, plan_tiering, tier_report, tier_table
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

    @classmethod
    def from_params(cls, params: Mapping[str, Any], run_id: str) -> TieringParams:
        # "-tier": the compaction DAG's run of the same schedule has the same Airflow run id, and a run id
        # owns leases (a run's end releases every lease its id holds).
        return cls(params["bucket"], params["prefix"].strip("/"), f"{safe_run_id(run_id)}-tier",
                   params["policy"].strip(), bool(params["dry_run"]))

    def policy(self) -> Policy:
        """The policy file read and checked (a :class:`ConfigError` naming what is wrong in it)."""
        if not self.policy_file:
            raise ConfigError("storage-class tiering needs a policy: pass the policy param or set "
                              "TIERING_POLICY_FILE")
        return load_policy(self.policy_file)


@dataclass(frozen=True, slots=True)
class TierPlanStep:
    """Where the plan is, and how many objects it moves."""

    plan_key: str
    objects_to_move: int

    def to_json(self) -> dict[str, Any]:
        return {"plan_key": self.plan_key, "objects_to_move": self.objects_to_move}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TierPlanStep:
        return cls(str(doc["plan_key"]), int(doc["objects_to_move"]))


@dataclass(frozen=True, slots=True)
class TierApplyStep:
    """The run document's key (None: a dry run) and the segments with moves."""

    run_key: str | None
    segments: int

    def to_json(self) -> dict[str, Any]:
        return {**({"run_key": self.run_key} if self.run_key else {}), "segments": self.segments}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TierApplyStep:
        return cls(doc.get("run_key"), int(doc["segments"]))


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


def plan_of(store: ObjectStore, run: TieringParams, *, prices: PriceBook | None = None) -> TierPlan:
    """Each sealed segment's target class, from its newest record's age and its topic's policy; nothing is
    written (the command line's dry run shows it). ``prices``: the price book (default: the configured one)."""
    policy = run.policy()  # a bad policy fails here, before any request
    return plan_tiering(store, run.prefix, policy, prices or cost_config()[0], include_internal=run.include_internal)


def plan(store: ObjectStore, run: TieringParams, log: Log, *, prices: PriceBook | None = None) -> TierPlanStep:
    """:func:`plan_of`, written to the run's ``tier-plan`` document."""
    planned = plan_of(store, run, prices=prices)
    key = tier_plan_key(run.prefix, run.run_id)
    store.put_json(key, planned.to_json())
    totals = planned.totals()
    staying = ", ".join(f"{n:,} {reason}" for reason, n in sorted(totals.staying.items())) or "none"
    log(f"plan: {totals.objects_to_move:,} objects to move ({totals.bytes_to_move:,} bytes); staying: {staying}")
    return TierPlanStep(key, totals.objects_to_move)


def apply(store: ObjectStore, run: TieringParams, planned: TierPlanStep, log: Log) -> TierApplyStep:
    """Each planned move: an in-place copy with the new class, under the partition's lease; the run document
    is written whatever the plan holds (none on a dry run)."""
    if run.dry_run:
        log("dry run: nothing is moved")
        return TierApplyStep(None, 0)
    result = apply_tiering(store, TierPlan.from_json(store.get_json(planned.plan_key)[0]), run.run_id,
                           lease_ttl=run.lease_ttl,
                           progress=lambda r: log(f"  {r.directory}/{r.base_offset:020d}: {r.status}"
                                                  + (f" ({r.reason})" if r.reason else "")))
    return TierApplyStep(run_result_key(run.prefix, run.run_id, RunKind.TIER), len(result.results))


def report(store: ObjectStore, run: TieringParams, planned: TierPlanStep, applied: TierApplyStep,
           log: Log) -> TierReportStep:
    """The report (JSON and Markdown beside the run's other reports) of what moved and what it saves."""
    tier_plan = TierPlan.from_json(store.get_json(planned.plan_key)[0])
    results = TierRun.from_json(store.get_json(applied.run_key)[0]).results if applied.run_key else ()
    doc = tier_report(tier_plan, results, run.run_id, dry_run=run.dry_run)
    text = tier_table(doc)
    log(text)
    key = tier_report_key(run.prefix, run.run_id, "json")
    store.put_json(key, doc.to_json())
    store.put(tier_report_key(run.prefix, run.run_id, "md"), ("```\n" + text + "\n```\n").encode())
    monthly, one_off = doc.money()
    return TierReportStep(run.run_id, doc.dry_run, doc.objects_moved, doc.bytes_moved, monthly, one_off,
                          f"s3://{store.bucket}/{key}", len(doc.segments_failed))
