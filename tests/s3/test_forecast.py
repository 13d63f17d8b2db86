"""The dry run's forecast, topic by topic, against what a real compaction of the same bucket then does."""

from __future__ import annotations

import json

import pytest

from tests.s3.conftest import PREFIX
from tiering.commit.operation import Context
from tiering.cost.forecast import NOT_SAMPLED, Forecast, Stratum, Verdict
from tiering.demo.seed import seed_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.plan.estimate import DEFAULT_SAMPLE_SEGMENTS, Sampling, StratifiedSample, allocate
from tiering.plan.scan import ScanOptions, scan
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.pipeline import RunSettings, compact, dry_run
from tiering.storage.s3 import S3Store

# topic -> (partitions, kind of payload, producer codec); three segments a partition, the last one active
TOPICS = {
    "events.json": (2, "json", Codec.SNAPPY),
    "app.logs": (1, "logs", Codec.NONE),
    "metrics.zstd": (1, "json", Codec.ZSTD),
    "payments.encrypted": (1, "random", Codec.NONE),
}
SEGMENT_BYTES = 160_000


def seed(store: S3Store, kinds: dict[str, str] | None = None) -> None:
    for i, (topic, (partitions, kind, codec)) in enumerate(TOPICS.items()):
        for p in range(partitions):
            seed_partition(store, PREFIX, topic, p, segments=3, kind=(kinds or {}).get(topic, kind), codec=codec,
                           segment_bytes=SEGMENT_BYTES, seed=10 * i + p)


def forecast_of(store: S3Store, segments: int = DEFAULT_SAMPLE_SEGMENTS) -> Forecast:
    """The forecast a dry run gives (its scan and plan steps, written to memory), 64 KiB read a segment."""
    plan = dry_run(store, RunSettings(store.bucket, PREFIX, "dry", "zstd", None, 60),
                   ScanOptions("zstd", min_age_minutes=0), CompactOptions(), Sampling(segments, 64 * 1024))
    assert plan.estimate is not None
    return plan.estimate


def real_ratios(run: RunResult) -> dict[str, float]:
    """A topic's .log bytes after / before over the segments the run compacted; 1.0 where it compacted none."""
    return {topic: (run.topics[topic][2] / run.topics[topic][1] if topic in run.topics else 1.0) for topic in TOPICS}


def test_every_topic_is_forecast_from_its_own_sample_within_a_tenth_of_the_real_run(store: S3Store) -> None:
    seed(store)
    forecast = forecast_of(store)
    assert Forecast.from_json(json.loads(json.dumps(forecast.to_json()))) == forecast
    by_topic = forecast.by_topic()
    assert set(by_topic) == set(TOPICS)
    assert not forecast.topics_not_sampled
    assert all(r.segments_sampled >= 1 for r in by_topic.values())
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0))
    run = compact(store, plan, Context(store, PREFIX, "real", RewriteOptions(Codec.ZSTD)), CompactOptions())
    real = real_ratios(run)
    for topic, r in by_topic.items():
        assert r.ratio is not None
        assert abs(r.ratio - real[topic]) <= 0.10, (topic, r.ratio, real[topic])
        assert r.saved_low <= r.saved_bytes <= r.saved_high
    skipped = {t for (t, status, reason), _ in run.outcomes.items() if status == "skipped" and reason == "no savings"}
    assert skipped == {"metrics.zstd", "payments.encrypted"}
    for topic in TOPICS:
        predicted = by_topic[topic].segments_skipped
        assert (predicted == by_topic[topic].segments) == (topic in skipped), topic
    # The compressible topics differ, and each keeps its own ratio (no single number copied to every row).
    assert abs(by_topic["app.logs"].bytes_after / by_topic["app.logs"].bytes_before
               - by_topic["events.json"].bytes_after / by_topic["events.json"].bytes_before) > 0.2
    # The total's figures are the strata's, summed.
    assert forecast.total.saved_bytes == sum(s.saved_bytes for s in forecast.strata)
    codecs = {s.source_codec for s in forecast.strata}
    assert {"snappy", "none", "zstd"} <= codecs


def test_changing_one_topics_data_moves_only_that_topics_forecast(store: S3Store) -> None:
    seed(store)
    before = forecast_of(store).by_topic()
    for info in list(store.list(f"{PREFIX}/app.logs-0/")):
        store.delete(info.key)
    seed(store, kinds={"app.logs": "random"})  # the topic's data now incompressible, every other topic's as it was
    after = forecast_of(store).by_topic()
    assert after["app.logs"].saved_bytes == 0
    assert before["app.logs"].saved_bytes > 0
    for topic in TOPICS:
        if topic != "app.logs":
            assert after[topic] == before[topic], topic


def test_a_topic_beyond_the_budget_borrows_the_pooled_ratio_and_says_so(store: S3Store) -> None:
    seed(store)
    forecast = forecast_of(store, segments=2)
    assert forecast.segments_sampled == 2
    assert len(forecast.topics_not_sampled) == 2
    for topic in forecast.topics_not_sampled:
        (stratum,) = [s for s in forecast.strata if s.topic == topic]
        assert stratum.source_codec == NOT_SAMPLED
        assert stratum.segments_sampled == 0


def test_allocation_gives_every_topic_one_and_the_rest_by_bytes() -> None:
    sizes = {"big": 900, "mid": 90, "small": 10}
    # one each, then 13 in proportion: 11.7, 1.17 and 0.13 (the last one by the largest remainder)
    assert allocate(sizes, {"big": 50, "mid": 50, "small": 50}, 16) == {"big": 13, "mid": 2, "small": 1}
    # a topic with only 3 segments to sample from gives its share to the others, by their bytes
    assert allocate(sizes, {"big": 3, "mid": 50, "small": 50}, 16) == {"big": 3, "mid": 11, "small": 2}
    assert allocate(sizes, dict.fromkeys(sizes, 5), 2) == {"big": 1, "mid": 1}
    assert sum(allocate({f"t{i}": i + 1 for i in range(40)}, {f"t{i}": 9 for i in range(40)}, 16).values()) == 16


def test_the_reservoir_keeps_every_topic_within_its_bound() -> None:
    from tiering.plan.document import PlannedSegment

    work = StratifiedSample(keep=8)
    for t in range(6):
        for base in range(50):
            work.add(PlannedSegment(f"t{t}-0", f"t{t}", 0, base, "compact", "sealed"))
    assert work.count == 300
    assert all(len(topic.sample) == 2 for topic in work.topics.values())


def test_a_stratum_that_misses_the_minimum_savings_is_predicted_skipped() -> None:
    s = Stratum("t", "lz4", 1, 10, 1000, 2, 200, 0.97, 0.005, min_savings_ratio=0.05)
    assert s.verdict is Verdict.BELOW_MIN_SAVINGS
    assert s.saved_bytes == 0
    assert s.bytes_after == 1000
    assert Stratum("t", "zstd", 1, 10, 1000, 2, 200, 1.0, 0.0).verdict is Verdict.NO_SAVINGS
    wide = Stratum("t", "lz4", 1, 10, 1000, 1, 100, 0.97, 0.02, min_savings_ratio=0.05)
    assert (wide.saved_low, wide.saved_bytes) == (0, 0)
    assert wide.saved_high == pytest.approx(70, abs=1)
