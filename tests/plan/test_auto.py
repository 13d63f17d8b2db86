"""A policy driving a compaction against moto: producer topics untouched, auto topics chosen by net dollars
(differently for JSON events and incompressible data), per-topic codec and level, minimum savings and
minimum record age; the choices in the report."""

from __future__ import annotations

from typing import Any

import pytest

from tests.s3.conftest import PREFIX, check_consistent, context, seed
from tiering.cost.model import CostOptions
from tiering.cost.prices import load_prices
from tiering.kafka.codecs import Codec
from tiering.lifecycle.vocabulary import Action
from tiering.plan.auto import choose_codec
from tiering.plan.document import Plan
from tiering.plan.policy import parse_policy
from tiering.plan.scan import ScanOptions, scan
from tiering.report.publish import publish_report
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import RunSettings, compact, dry_run
from tiering.storage.s3 import S3Store

PRICES = load_prices("us-east-1")
POLICY: dict[str, Any] = {
    "cluster": {"compression.type": "zstd"},
    "topics": [
        {"topic": "payments", "compression.type": "producer"},
        {"regex": "events|noise", "compression.type": "auto", "auto.candidates": ["zstd:3", "zstd:19", "lz4"],
         "auto.horizon.months": 120},
        {"topic": "logs", "compression.type": "gzip", "compression.level": 9},
        {"topic": "picky", "min.savings.ratio": 0.95},
        {"topic": "recent", "min.segment.age.hours": 24 * 365 * 50},
    ],
}


def _seed_topics(store: S3Store) -> dict[str, Any]:
    return {
        "payments": seed(store, topic="payments", segments=2, kind="json"),
        "events": seed(store, topic="events", segments=3, kind="json", segment_bytes=400_000),
        "noise": seed(store, topic="noise", segments=3, kind="random", codec=Codec.NONE, segment_bytes=400_000),
        "logs": seed(store, topic="logs", segments=2, kind="logs", codec=Codec.LZ4),
        "picky": seed(store, topic="picky", segments=2, kind="json"),
        "recent": seed(store, topic="recent", segments=2, kind="json"),
    }


def _plan(store: S3Store) -> Plan:
    """The plan a run under the policy makes (its scan and plan steps, written to memory only)."""
    settings = RunSettings(store.bucket, PREFIX, "policy-plan", "zstd", None, 60)
    return dry_run(store, settings, ScanOptions("zstd", min_age_minutes=0, policy=parse_policy(POLICY)),
                   CompactOptions(), None, prices=PRICES)


def test_auto_chooses_differently_for_json_events_and_incompressible_data(store: S3Store) -> None:
    _seed_topics(store)
    listing = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0, policy=parse_policy(POLICY)))
    candidates = parse_policy(POLICY).resolve("events").auto_candidates
    by_topic = {t: [s for s in listing.segments if s.topic == t and s.action == Action.COMPACT]
                for t in ("events", "noise")}
    events = choose_codec(store, by_topic["events"], candidates, PRICES, horizon_months=120)
    noise = choose_codec(store, by_topic["noise"], candidates, PRICES, horizon_months=120)
    assert events["chosen"] is not None
    assert events["chosen"]["codec"] == "zstd"
    best = max(events["candidates"], key=lambda c: c["net_usd"])
    assert (best["codec"], best["level"]) == (events["chosen"]["codec"], events["chosen"]["level"])
    assert best["ratio"] < 0.9
    assert best["net_usd"] > 0
    assert noise["chosen"] is None  # random bytes: no candidate saves anything
    assert all(c["ratio"] >= 0.99 for c in noise["candidates"])
    assert all(c["net_usd"] <= 0 for c in noise["candidates"])
    for c in events["candidates"]:
        assert c["one_off_usd"] == pytest.approx(c["compute_usd"] + events["requests_and_grace_usd"])
        assert c["net_usd"] == pytest.approx(c["monthly_savings_usd"] * 120 - c["one_off_usd"])
    # The same data over one month does not pay for its requests: small topics are left alone.
    short = choose_codec(store, by_topic["events"], candidates, PRICES, horizon_months=1)
    assert short["chosen"] is None


def test_the_plan_follows_the_policy_topic_by_topic(store: S3Store) -> None:
    _seed_topics(store)
    plan = _plan(store)
    sealed = {(s.topic, s.base_offset): s for s in plan.segments if not s.reason.startswith("active")}
    for (topic, _), s in sealed.items():
        if topic == "payments":
            assert s.action == Action.SKIP
            assert s.reason == "policy: compression.type producer (keep what the producer wrote)"
        elif topic == "events":
            assert (s.action, s.codec) == (Action.COMPACT, "zstd")
        elif topic == "noise":
            assert s.action == Action.SKIP
            assert s.reason.startswith("auto: no candidate codec pays off")
        elif topic == "logs":
            assert (s.action, s.codec, s.level) == (Action.COMPACT, "gzip", 9)
        elif topic == "picky":
            assert (s.action, s.codec, s.min_savings_ratio) == (Action.COMPACT, "zstd", 0.95)
        elif topic == "recent":
            assert s.action == Action.SKIP
            assert s.reason.startswith("too young by its records")
    assert plan.auto is not None
    assert set(plan.auto) == {"events", "noise"}


def test_a_compaction_under_the_policy(store: S3Store) -> None:
    originals = _seed_topics(store)
    plan = _plan(store)
    run = compact(store, plan, context(store, "policy-run"), CompactOptions())
    results = {(r.directory.rsplit("-", 1)[0], r.base_offset): r for r in run.segments}
    codecs = {t: check_consistent(store, o, topic=t) for t, o in originals.items()}
    assert set(codecs["payments"].values()) == {"snappy"}  # untouched
    assert set(codecs["noise"].values()) == {"none"}
    sealed_events = sorted(originals["events"])[:-1]
    assert {codecs["events"][b] for b in sealed_events} == {"zstd"}
    assert {codecs["logs"][b] for b in sorted(originals["logs"])[:-1]} == {"gzip"}
    picky = results[("picky", 0)]
    assert picky.status == "skipped"
    assert picky.reason.startswith("below min.savings.ratio")
    report, _ = publish_report(store, PREFIX, "policy-run", PRICES, CostOptions())
    assert report.auto["events"]["chosen"]["codec"] == "zstd"
    assert report.auto["noise"]["chosen"] is None
    assert {(s.status, s.reason) for s in report.skipped} >= {
        ("skipped", "left as the producer wrote it (policy)"), ("skipped", "no codec pays off (auto)"),
        ("skipped", "too young"), ("skipped", "below min.savings.ratio")}


def test_the_pipeline_steps_carry_each_topics_codec_to_the_executors(store: S3Store) -> None:
    """scan -> plan (policy applied) -> the engine's units as Spark runs them (the kind, its settings and each
    unit read back from their JSON) -> the run document."""
    from collections import Counter

    from tiering.run import engine
    from tiering.run.kinds import kind_from_json
    from tiering.run.pipeline import RunSettings, compaction_kind, plan_files, plan_run, scan_run

    originals = _seed_topics(store)
    policy = parse_policy(POLICY)
    settings = RunSettings(store.bucket, PREFIX, "policy-pipeline", "zstd")
    scan_run(store, settings, ScanOptions("zstd", min_age_minutes=0, policy=policy))
    plan_run(store, settings, CompactOptions(), policy=policy, prices=PRICES)
    manifest = plan_files(store, settings).manifest()
    assert manifest.header.auto is not None
    assert manifest.header.auto["events"]["chosen"]["codec"] == "zstd"
    kind = kind_from_json("compact", compaction_kind(settings, CompactOptions()).options_json()).started(store, PREFIX)
    ctx = RunSettings.from_json(settings.to_json()).context(store)
    planned = engine.plan(store, ctx, kind, parallelism=2)
    for unit in planned.units:  # as the Spark job's executors run them, from their JSON
        assert "failed" not in engine.unit_task(store, RunSettings.from_json(settings.to_json()).context(
            store, one_core=True), kind, unit.to_json())
    run = engine.collect(store, ctx, kind, planned, manifest.header.created_at, Counter())
    assert run.totals().get("failed", 0) == 0
    codecs = {t: check_consistent(store, o, topic=t) for t, o in originals.items()}
    assert {codecs["logs"][b] for b in sorted(originals["logs"])[:-1]} == {"gzip"}
    assert {codecs["events"][b] for b in sorted(originals["events"])[:-1]} == {"zstd"}
    assert set(codecs["payments"].values()) == {"snappy"}
    from tiering.lifecycle.state import load_state

    assert load_state(store, PREFIX, "logs-0").segments[0].level == 9  # the topic's level reached the executor
    picky = next(r for r in run.segments if r.directory == "picky-0" and r.base_offset == 0)
    assert picky.reason.startswith("below min.savings.ratio")  # so did its minimum savings
    # A second run under the same policy finds nothing left to do.
    settings2 = RunSettings(store.bucket, PREFIX, "policy-pipeline-2", "zstd")
    scan_run(store, settings2, ScanOptions("zstd", min_age_minutes=0, policy=policy))
    again = plan_run(store, settings2, CompactOptions(), policy=policy, prices=PRICES)
    assert again.segments == 0  # the picky segment's outcome is remembered: it is not read again
    [picky2] = [s for s in plan_files(store, settings2).segments() if s.directory == "picky-0" and s.base_offset == 0]
    assert picky2.reason.startswith("no-savings last time")


def test_the_plan_step_logs_its_choices_on_stderr_never_on_stdout(store: S3Store,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``s3 compact --json`` prints one JSON document on stdout: the plan step's lines go to stderr."""
    from tiering.run.pipeline import RunSettings, plan_run, scan_run

    _seed_topics(store)
    policy = parse_policy(POLICY)
    settings = RunSettings(store.bucket, PREFIX, "auto-logs", "zstd")
    scan_run(store, settings, ScanOptions("zstd", min_age_minutes=0, policy=policy))
    plan_run(store, settings, CompactOptions(), policy=policy, prices=PRICES)
    out, err = capsys.readouterr()
    assert out == ""
    assert "auto: events: zstd" in err
