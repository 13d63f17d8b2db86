"""Storage-class tiering against moto: age from record timestamps, what moves and what stays (with reasons),
transitions that keep the object, idempotent re-runs, state documents following ETags, lifecycle output."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.s3.conftest import BUCKET, PREFIX, TOPIC, context, plan_for, seed
from tiering.cli import main
from tiering.commit.operation import Context, SegmentResult
from tiering.cost.prices import GB, PriceBook, load_prices
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Status
from tiering.plan.policy import Policy, parse_policy
from tiering.run import engine
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.pipeline import compact
from tiering.run.tier import (
    MOVE,
    STAY,
    Tiering,
    TierOptions,
    TierPlan,
    TierReport,
    TierTally,
    TierTotals,
    Transition,
    lifecycle_configuration,
    moved_objects,
    plan_document,
    tier_report,
)
from tiering.storage.layout import segment_key
from tiering.storage.s3 import S3Store

PRICES = load_prices("us-east-1")
DOC: dict[str, Any] = {"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "STANDARD_IA"},
                                                     {"after.days": 90, "storage.class": "GLACIER_IR"}]},
                       "topics": [{"topic": "fresh", "storage.tiers": [{"after.days": 10,
                                                                        "storage.class": "STANDARD_IA"}]}]}
BIG = 300_000  # .log objects above 128 KiB; their indexes stay below it


def _options(policy: dict[str, Any] | Policy, prices: PriceBook) -> TierOptions:
    return TierOptions(policy if isinstance(policy, Policy) else parse_policy(policy), prices)


def plan_tiers(store: S3Store, policy: dict[str, Any] | Policy, prices: PriceBook = PRICES) -> TierPlan:
    """What a tiering run would do, every segment's decision (a dry run: nothing written)."""
    kind = Tiering(_options(policy, prices)).started(store, PREFIX)
    tally, decided = TierTally(), []

    def seen(part: Any) -> None:
        tally.add(part)
        decided.extend(part.decided)

    engine.preview(store, PREFIX, kind, seen)
    return plan_document(store, PREFIX, kind.options, tally.totals(), decided)


def planned_tiers(store: S3Store, policy: dict[str, Any] | Policy, run_id: str, prices: PriceBook = PRICES
                  ) -> Callable[[], RunResult]:
    """A tiering run planned now; what it returns does the run's work and gives its document (whatever happens
    to the bucket in between)."""
    ctx = Context(store, PREFIX, run_id, RewriteOptions(Codec.NONE))
    kind = Tiering(_options(policy, prices)).started(store, PREFIX)
    started = datetime.now(UTC).isoformat()
    planned = engine.plan(store, ctx, kind)

    def finish() -> RunResult:
        for unit in planned.units:
            engine.run_unit(store, ctx, kind, unit)
        return engine.collect(store, ctx, kind, planned, started, Counter())

    return finish


def run_tiers(store: S3Store, policy: dict[str, Any] | Policy, run_id: str, prices: PriceBook = PRICES) -> RunResult:
    """A whole tiering run, as the command line and the DAG do it."""
    return planned_tiers(store, policy, run_id, prices)()


def moved_by(run: RunResult) -> list[dict[str, Any]]:
    return moved_objects(run.segments)


def _key(base: int, suffix: str = ".log", topic: str = TOPIC, partition: int = 0) -> str:
    return segment_key(PREFIX, topic, partition, base, suffix)


def _moves(plan: Any) -> dict[str, Any]:
    return {o.key: o for s in plan.segments for o in s.objects}


def test_old_records_move_small_and_active_objects_stay(store: S3Store) -> None:
    originals = seed(store, segments=3, segment_bytes=BIG)  # records from 2025-11-22: a year old
    plan = plan_tiers(store, DOC)
    objects = _moves(plan)
    sealed, active = sorted(originals)[:2], sorted(originals)[2]
    for base in sealed:
        log = objects[_key(base)]
        assert (log.action, log.target) == (MOVE, "GLACIER_IR")
        assert log.monthly_savings_usd == pytest.approx(log.size / GB * (0.023 - 0.004))
        assert log.one_off_usd == pytest.approx(0.02 / 1000)
        index = objects[_key(base, ".index")]
        assert index.action == STAY
        assert "under 128 KiB" in index.reason
        seg = next(s for s in plan.segments if s.base_offset == base)
        assert seg.age_source == ".timeindex's last entry and the batches after the last .index entry"
        assert seg.age_days is not None
        assert seg.age_days > 300
    assert next(s for s in plan.segments if s.base_offset == active).reason.startswith("not tiered: active")
    totals = plan.totals
    assert totals.objects_to_move == 2
    assert totals.by_transition == {"STANDARD -> GLACIER_IR": Transition(2, sum(len(originals[b].log) for b in sealed))}
    assert totals.payback_months == pytest.approx(totals.one_off_usd / totals.monthly_savings_usd)
    assert TierPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_age_comes_from_the_records_not_from_last_modified(store: S3Store) -> None:
    now_ms = int(time.time() * 1000)
    seed(store, segments=2, segment_bytes=BIG, topic="fresh", start_ms=now_ms - 5 * 86_400_000)
    seed(store, segments=2, segment_bytes=BIG, topic="older", start_ms=now_ms - 40 * 86_400_000)
    plan = plan_tiers(store, DOC)
    fresh = _moves(plan)[_key(0, topic="fresh")]
    older = _moves(plan)[_key(0, topic="older")]
    assert (fresh.action, fresh.reason) == (STAY, "not old enough for any storage tier")  # 5 days < 10
    assert (older.action, older.target) == (MOVE, "STANDARD_IA")  # 40 days: IA, not yet Glacier IR
    # Both were uploaded seconds ago: LastModified would have said "young" for both.


def test_apply_keeps_the_object_and_a_rerun_moves_nothing(store: S3Store) -> None:
    originals = seed(store, segments=2, segment_bytes=BIG)
    key = _key(0)
    store.client.put_object_tagging(Bucket=BUCKET, Key=key, Tagging={"TagSet": [{"Key": "team", "Value": "a"}]})
    before = store.client.head_object(Bucket=BUCKET, Key=key)
    plan = plan_tiers(store, DOC)
    log_move = _moves(plan)[key]
    run = run_tiers(store, DOC, "tier-1")
    assert [r.status for r in run.segments] == ["moved"]
    after = store.client.head_object(Bucket=BUCKET, Key=key)
    assert after["StorageClass"] == "GLACIER_IR"
    assert store.get(key) == originals[0].log
    assert after.get("ContentType") == before.get("ContentType")
    assert store.client.get_object_tagging(Bucket=BUCKET, Key=key)["TagSet"] == [{"Key": "team", "Value": "a"}]
    assert "StorageClass" not in store.client.head_object(Bucket=BUCKET, Key=_key(0, ".index"))  # stays STANDARD
    again = plan_tiers(store, DOC)
    log = _moves(again)[key]
    assert (log.action, log.reason) == (STAY, "already in GLACIER_IR")
    assert run_tiers(store, DOC, "tier-2").segments == ()
    doc = RunResult.from_json(store.get_json(f"{PREFIX}/_tiering/runs/tier-1/tier.json")[0], "tier.json")
    assert doc == run
    assert [m["to"] for m in moved_by(doc)] == ["GLACIER_IR"]
    assert doc.usage["objects_moved"] == {"STANDARD -> GLACIER_IR": 1}
    report = tier_report(plan, doc.segments, "tier-1", dry_run=False)
    assert (report.objects_moved, report.bytes_moved) == (1, len(originals[0].log))
    assert report.money() == pytest.approx((log_move.monthly_savings_usd, log_move.one_off_usd))
    assert TierReport.from_json(json.loads(json.dumps(report.to_json()))) == report


def test_an_object_changed_since_planning_is_left_alone(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    finish = planned_tiers(store, DOC, "tier-1")
    data = store.get(_key(0))
    store.client.put_object(Bucket=BUCKET, Key=_key(0), Body=data[: len(data) // 2])  # someone wrote another one
    [result] = finish().segments
    assert result.status == "skipped"
    assert "changed since planning" in result.reason
    assert "StorageClass" not in store.client.head_object(Bucket=BUCKET, Key=_key(0))


def test_minimum_duration_of_the_current_class_is_respected(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    store.client.copy_object(Bucket=BUCKET, Key=_key(0), CopySource={"Bucket": BUCKET, "Key": _key(0)},
                             StorageClass="STANDARD_IA", MetadataDirective="COPY")
    log = _moves(plan_tiers(store, DOC))[_key(0)]
    assert log.action == STAY
    assert "under its 30-day minimum" in log.reason


def test_the_compaction_state_follows_the_tiered_objects(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    run = compact(store, plan_for(store), context(store), CompactOptions())
    assert run.totals().get("compacted") == 1
    run_tiers(store, DOC, "tier-1")
    entry = load_state(store, PREFIX, f"{TOPIC}-0").get(0)
    assert entry is not None
    assert entry.log_etag == store.head(_key(0)).etag
    [first] = [s for s in plan_for(store).segments if s.base_offset == 0]
    assert first.reason.startswith("already compacted")  # not mistaken for a mirror re-upload


def test_lifecycle_configuration_states_what_s3_cannot_do() -> None:
    config, notes = lifecycle_configuration(parse_policy(DOC), PREFIX)
    assert set(config) == {"Rules"}  # what put-bucket-lifecycle-configuration accepts
    [cluster, fresh] = config["Rules"]
    assert cluster["Filter"] == {"And": {"Prefix": f"{PREFIX}/", "ObjectSizeGreaterThan": 131072}}
    assert cluster["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"},
                                      {"Days": 90, "StorageClass": "GLACIER_IR"}]
    assert fresh["Filter"]["And"]["Prefix"] == f"{PREFIX}/fresh-"
    assert fresh["Transitions"] == [{"Days": 30, "StorageClass": "STANDARD_IA"}]  # S3's minimum for IA, not 10
    assert any("after 30 days at the earliest" in n for n in notes)
    assert any("not from the newest record" in n for n in notes)
    bare, _ = lifecycle_configuration(parse_policy(DOC), "")
    assert bare["Rules"][0]["Filter"] == {"ObjectSizeGreaterThan": 131072}


def test_the_state_entry_follows_a_changed_etag(store: S3Store) -> None:
    from tiering.commit.moves import follow_etags
    from tiering.lifecycle.state import SegmentState, record_segment

    record_segment(store, PREFIX, f"{TOPIC}-0", 0, SegmentState('"old"', "r1", "zstd", index_etag='"i"'))
    follow_etags(store, PREFIX, f"{TOPIC}-0", 0, load_state(store, PREFIX, f"{TOPIC}-0").get(0),
                  {"log": ('"old"', '"new-3"'), "timeindex": ('"t"', '"t2"')}, lambda marks: marks)
    entry = load_state(store, PREFIX, f"{TOPIC}-0").get(0)
    assert entry is not None
    assert (entry.log_etag, entry.index_etag) == ('"new-3"', '"i"')
    assert entry.timeindex_etag is None  # only ETags we wrote are followed


def test_a_segment_being_compacted_is_not_moved(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    finish = planned_tiers(store, DOC, "tier-1")
    store.put_json(f"{PREFIX}/_tiering/journal/{TOPIC}-0/{0:020d}.json", {"state": "staged"})
    [result] = finish().segments
    assert result.status == "skipped"
    assert "compaction of this segment is in progress" in result.reason
    assert "StorageClass" not in store.client.head_object(Bucket=BUCKET, Key=_key(0))


def test_cli_tier_dry_run_then_apply(store: S3Store, tmp_path: Path) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(DOC))
    where = ["s3", "tier", "--bucket", BUCKET, "--prefix", PREFIX, "--policy", str(policy)]
    out = StringIO()
    assert main([*where, "--dry-run", "--json"], stdout=out) == 0
    assert json.loads(out.getvalue())["plan"]["totals"]["objects_to_move"] == 1
    assert "StorageClass" not in store.client.head_object(Bucket=BUCKET, Key=_key(0))  # a dry run moves nothing
    assert not [o.key for o in store.list(f"{PREFIX}/_tiering/") if "/runs/" in o.key or "/reports/" in o.key]
    out = StringIO()
    assert main([*where, "--run-id", "cli-tier"], stdout=out) == 0
    assert "1 objects moved" in out.getvalue()
    written = {o.key.removeprefix(f"{PREFIX}/_tiering/") for o in store.list(f"{PREFIX}/_tiering/")}
    assert {"runs/cli-tier/tier-plan.json", "runs/cli-tier/tier.json", "reports/cli-tier/tiering.json",
            "reports/cli-tier/tiering.md"} <= written  # the DAG's steps, as the DAG writes them
    assert store.client.head_object(Bucket=BUCKET, Key=_key(0))["StorageClass"] == "GLACIER_IR"
    planned = TierPlan.from_json(store.get_json(f"{PREFIX}/_tiering/runs/cli-tier/tier-plan.json")[0])
    assert (planned.totals.objects_to_move, planned.totals.segments, planned.segments) == (1, 2, ())
    report = TierReport.from_json(store.get_json(f"{PREFIX}/_tiering/reports/cli-tier/tiering.json")[0])
    assert (report.objects_moved, report.bytes_moved) == (1, planned.totals.bytes_to_move)
    out = StringIO()
    assert main([*where, "--emit-lifecycle"], stdout=out) == 0
    assert json.loads(out.getvalue())["Rules"][0]["ID"] == "kafka-tiering-cluster"  # stdout: the bare config


def test_an_invalid_policy_stops_before_any_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiering.cli.s3

    def no_s3(*_: Any) -> Any:
        raise AssertionError("an S3 client was made before the policy was checked")

    monkeypatch.setattr(tiering.cli.s3, "_store", no_s3)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"cluster": {"storage.tiers": [{"after.days": 1, "storage.class": "GLACIER"}]}}))
    err = StringIO()
    code = main(["s3", "tier", "--bucket", "no-such-bucket", "--prefix", PREFIX, "--policy", str(policy)],
                stdout=StringIO(), stderr=err)
    assert code == 2
    assert "storage.allow.archive" in err.getvalue()


def test_archive_classes_only_when_allowed_and_the_report_says_so(store: S3Store) -> None:
    from tiering.run.tier import tier_table

    seed(store, segments=2, segment_bytes=BIG)
    doc = {"cluster": {"storage.allow.archive": True,
                       "storage.tiers": [{"after.days": 30, "storage.class": "GLACIER"}]}}
    plan = plan_tiers(store, doc)
    log = _moves(plan)[_key(0)]
    assert (log.action, log.target) == (MOVE, "GLACIER")
    # 40 KiB of per-object overhead (32 at GLACIER's rate, 8 at Standard's) is counted.
    assert log.monthly_savings_usd == pytest.approx((log.size * (0.023 - 0.0036) - 32768 * 0.0036 - 8192 * 0.023) / GB)
    index = _moves(plan)[_key(0, ".index")]
    assert index.action == STAY  # a small index would cost more there than it saves
    report = tier_report(plan, [], "dry", dry_run=True)
    assert report.warnings == ("1 objects go to GLACIER: they cannot be read (by Kafka, a consumer or the "
                               "compaction) without a restore first",)
    assert "WARNING" in tier_table(report)
    failed = SegmentResult(f"{TOPIC}-0", 0, Status.FAILED, "S3 error: SlowDown")
    lines = tier_table(tier_report(plan, [failed], "run", dry_run=False)).splitlines()
    assert f"  FAILED {TOPIC}-0/0: S3 error: SlowDown" in lines


def test_a_partition_with_nothing_to_move_counts_in_the_plan_and_gets_no_chunk_line_nor_unit(
        store: S3Store, tmp_path: Path) -> None:
    from tiering.steps.storage_classes import TieringParams, tier

    now_ms = int(time.time() * 1000)
    seed(store, segments=3, segment_bytes=BIG)  # a year old: its sealed .log objects move
    seed(store, segments=3, segment_bytes=BIG, topic="fresh", start_ms=now_ms - 86_400_000)  # a day old: stays
    dry = plan_tiers(store, DOC)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(DOC))
    step, planned = tier(store, TieringParams(BUCKET, PREFIX, "tier-1", str(policy), False), lambda _: None,
                         prices=PRICES)
    assert planned.totals == dry.totals  # every partition counted, the one with nothing to move too
    assert planned.totals.staying["not old enough"] > 0
    lines = [json.loads(line) for info in store.list(f"{PREFIX}/_tiering/runs/tier-1/tier-plan/")
             for line in gzip.decompress(store.get(info.key)).splitlines()]
    assert [line["directory"] for line in lines] == [f"{TOPIC}-0"]  # the fresh topic's partition: no line
    assert [len(line["work"]["decided"]) for line in lines] == [2]  # the segments that move, not the others
    units = [info.key for info in store.list(f"{PREFIX}/_tiering/runs/tier-1/tier/")]
    assert len(units) == 1
    assert (step.objects_to_move, step.segments) == (2, 2)


def test_a_tiering_run_plans_from_an_s3_inventory_and_checks_each_object_before_it_moves(
        store: S3Store, tmp_path: Path) -> None:
    from tiering.demo.inventory import write_inventory
    from tiering.steps.storage_classes import TieringParams, tier

    seed(store, segments=3, segment_bytes=BIG)
    listed = plan_tiers(store, DOC)
    manifest = write_inventory(store, BUCKET, "inventory/daily", list(store.list(PREFIX + "/")))
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(DOC))
    out = StringIO()
    assert main(["s3", "tier", "--bucket", BUCKET, "--prefix", PREFIX, "--policy", str(policy), "--inventory",
                 manifest, "--dry-run", "--json"], stdout=out) == 0
    assert TierTotals.from_json(json.loads(out.getvalue())["plan"]["totals"]) == listed.totals  # as listed
    data = store.get(_key(0))
    store.client.put_object(Bucket=BUCKET, Key=_key(0), Body=data[:-100])  # rewritten since the inventory
    decided: list[Any] = []
    step, _ = tier(store, TieringParams(BUCKET, PREFIX, "tier-inv", str(policy), False, inventory=manifest),
                   lambda _: None, prices=PRICES, each=lambda part: decided.extend(part.decided))
    [first] = [s for s in decided if s.base_offset == 0]
    assert first.reason.startswith("not tiered: its .log changed since it was listed"), first.reason
    run = RunResult.from_json(store.get_json(str(step.run_key))[0], "tier.json")
    assert [(r.base_offset, r.status) for r in run.segments] == [(2860, Status.MOVED)]
    assert store.head(_key(0)).storage_class == "STANDARD"
    assert store.head(_key(2860)).storage_class == "GLACIER_IR"
