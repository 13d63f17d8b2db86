"""Re-batching through S3 (moto in-process): a policy turns it on per topic, the plan carries it to each
segment, the commit protocol merges and swaps, and the report splits the savings. Independent checks: the
records digest of every final .log against the source's (the reader, not the writer), its indexes against a
rebuild, and the re-batching share against a plain rewrite of the same source without re-batching."""

from __future__ import annotations

import io
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.reference_index import rebuild
from tests.s3.conftest import PREFIX, context
from tiering.cost.model import CostOptions, build_report
from tiering.cost.prices import load_prices
from tiering.errors import ConfigError
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.reader import iter_batches
from tiering.kafka.records import Record
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment
from tiering.kafka.segment import iter_decoded, verify_segment
from tiering.lifecycle.vocabulary import Action
from tiering.plan.policy import parse_policy
from tiering.plan.scan import ScanOptions, scan
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import segment_key
from tiering.storage.s3 import S3Store

T0 = 1_790_000_000_000
PER_SEGMENT = 300
MERGED, PLAIN = "clicks.tiny", "orders.tiny"


def tiny_segment(base: int, *, producer_id: int = -1) -> bytes:
    """One JSON record a batch (snappy), as a producer with linger.ms=0 writes them; with a producer id, its
    sequences run with the offsets."""
    parts = []
    for i in range(PER_SEGMENT):
        offset = base + i
        value = json.dumps({"user": f"u-{offset % 37}", "page": f"/item/{offset % 101}", "n": offset}).encode()
        spec = BatchSpec(offset, Codec.SNAPPY, producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                         base_sequence=offset if producer_id >= 0 else -1)
        parts.append(build_batch(spec, [Record(offset, T0 + offset, b"u-%d" % (offset % 37), value, ())]))
    return b"".join(parts)


def seed_topics(store: S3Store) -> dict[tuple[str, int], bytes]:
    """Two topics, three segments each (the last one active), one record a batch; MERGED's first partition
    written by an idempotent producer."""
    logs = {}
    for topic, pid in ((MERGED, 7), (PLAIN, -1)):
        for base in (0, PER_SEGMENT, 2 * PER_SEGMENT):
            log = tiny_segment(base, producer_id=pid)
            store.put(segment_key(PREFIX, topic, 0, base, LOG_SUFFIX), log)
            logs[topic, base] = log
    return logs


POLICY = parse_policy({"version": 1, "cluster": {"compression.type": "zstd"},
                       "topics": [{"topic": MERGED, "rebatch.enable": True, "max.message.bytes": 8192}]})


def test_a_policy_re_batches_one_topic_and_the_report_splits_the_savings(store: S3Store) -> None:
    logs = seed_topics(store)
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0, policy=POLICY))
    bounds = {(s.topic, s.base_offset): s.rebatch_max_bytes for s in plan.segments if s.action is Action.COMPACT}
    assert bounds == {(MERGED, 0): 8192, (MERGED, PER_SEGMENT): 8192, (PLAIN, 0): None, (PLAIN, PER_SEGMENT): None}
    run = compact(store, plan, context(store), CompactOptions())
    results = {(r.directory.rsplit("-", 1)[0], r.base_offset): r for r in run.segments}
    assert {k: r.status for k, r in results.items()} == dict.fromkeys(bounds, "compacted")
    for (topic, base), r in results.items():
        final = store.get(segment_key(PREFIX, topic, 0, base, LOG_SUFFIX))
        source = verify_segment(io.BytesIO(logs[topic, base]), segment_base=base)
        after = verify_segment(io.BytesIO(final), segment_base=base)
        assert after.records_sha256 == source.records_sha256
        offsets, times = rebuild(final, base)
        assert store.get(segment_key(PREFIX, topic, 0, base, INDEX_SUFFIX)) == offsets
        assert store.get(segment_key(PREFIX, topic, 0, base, TIME_INDEX_SUFFIX)) == times
        assert r.stats is not None
        alone = rewrite_segment(io.BytesIO(logs[topic, base]), io.BytesIO(), base_offset=base,
                                options=RewriteOptions(Codec.ZSTD)).stats.bytes_out
        if topic == PLAIN:
            assert "rebatch" not in r.stats
            assert len(after.batches) == PER_SEGMENT
            assert r.bytes_after == alone
            continue
        rb: dict[str, Any] = r.stats["rebatch"]  # type: ignore[assignment]
        # Merged batches stay under max.message.bytes; the producer's last batch of the segment stays alone.
        assert 1 < len(after.batches) < PER_SEGMENT // 10
        headers = [raw.header for raw in iter_batches(io.BytesIO(final))]
        assert max(h.size for h in headers) <= 8192
        assert (headers[-1].offset, headers[-1].last_offset, headers[-1].base_sequence) == (
            base + PER_SEGMENT - 1, base + PER_SEGMENT - 1, base + PER_SEGMENT - 1)
        assert (rb["batches_in"], rb["batches_out"]) == (PER_SEGMENT, len(after.batches))
        # recompression alone measured on the first 64 merged batches and one in 16 after (rebatching.md); all
        # but the producer's last batch merged
        merged = PER_SEGMENT - 1
        assert rb["recompressed_alone_measured"] == {"batches": 64 + len(range(64, merged, 16)), "of": merged,
                                                     "estimate": True}
        assert abs(rb["saved_by_rebatching"] - (alone - r.bytes_after)) <= 0.03 * alone
        assert rb["saved_by_rebatching"] > 0
    report = build_report(run.to_json(), [s.to_json() for s in plan.segments], load_prices("us-east-1"),
                          CostOptions(), versioned=False, noncurrent_days=None, now=datetime.now(UTC))
    split = report.savings_split
    assert split is not None
    merged = [r for (topic, _), r in results.items() if topic == MERGED]
    assert split.rebatching.segments == 2
    assert split.rebatching.saved_bytes == sum(r.stats["rebatch"]["saved_by_rebatching"]  # type: ignore[index]
                                               for r in merged)
    assert split.recompression_bytes == report.totals.saved_bytes - split.rebatching.saved_bytes > 0
    assert 0 < split.rebatching_monthly_usd < report.totals.monthly_savings_usd


def test_re_batching_for_every_topic_and_a_policy_do_not_go_together() -> None:
    with pytest.raises(ConfigError, match=r"set rebatch\.enable in the policy"):
        ScanOptions("zstd", policy=POLICY, rebatch_max_bytes=1 << 20)
    with pytest.raises(ConfigError, match="out of range"):
        ScanOptions("zstd", rebatch_max_bytes=61)


def test_the_policy_bound_is_the_lower_of_rebatch_max_bytes_and_max_message_bytes() -> None:
    policy = parse_policy({"version": 1, "cluster": {"rebatch.enable": True, "rebatch.max.bytes": 500_000},
                           "topics": [{"topic": "a", "max.message.bytes": 100_000},
                                      {"topic": "b", "max.message.bytes": 2_000_000},
                                      {"topic": "c", "rebatch.enable": False}]})
    assert [policy.resolve(t).rebatch_max_bytes for t in ("a", "b", "c", "d")] == [100_000, 500_000, None, 500_000]
    for bad in ({"rebatch.enable": "yes"}, {"rebatch.max.bytes": 10}, {"max.message.bytes": -1}):
        with pytest.raises(ConfigError, match=re.escape(next(iter(bad)))):
            parse_policy({"version": 1, "cluster": bad})


def test_the_run_wide_switch_re_batches_every_topic(store: S3Store) -> None:
    logs = seed_topics(store)
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0, rebatch_max_bytes=1 << 20))
    run = compact(store, plan, context(store), CompactOptions())
    assert len(run.segments) == 4
    for r in run.segments:
        assert r.status == "compacted"
        assert r.stats is not None
        assert r.stats["rebatch"]["batches_out"] < PER_SEGMENT // 10  # type: ignore[index]
        topic = r.directory.rsplit("-", 1)[0]
        final = store.get(segment_key(PREFIX, topic, 0, r.base_offset, LOG_SUFFIX))
        assert (verify_segment(io.BytesIO(final), segment_base=r.base_offset).records_sha256
                == verify_segment(io.BytesIO(logs[topic, r.base_offset]), segment_base=r.base_offset).records_sha256)


def test_a_re_batched_run_rolls_back_to_the_original_bytes(store: S3Store) -> None:
    """The state keeps the source's records digest (not the merged output's): a rollback proves the backup
    against it and puts every original back, byte for byte."""
    logs = seed_topics(store)
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0, rebatch_max_bytes=1 << 20))
    run = compact(store, plan, context(store), CompactOptions())
    assert {r.status for r in run.segments} == {"compacted"}
    for r in run.segments:
        assert r.stats is not None
        assert r.stats["codecs_before"] == {"snappy": PER_SEGMENT}  # the source's batches, not the merged ones
        assert r.stats["source_payload_xxh3"] != r.stats["payload_xxh3"]
    undone = rollback(store, context(store, "undo-1"), "run-1")
    assert [r.status for r in undone.segments] == ["rolled-back"] * 4
    for (topic, base), log in logs.items():
        assert store.get(segment_key(PREFIX, topic, 0, base, LOG_SUFFIX)) == log


def test_re_batching_is_another_target_than_recompression_alone(store: S3Store) -> None:
    """A plain run that found nothing to save, or compacted a segment, does not keep a re-batching run from
    it; a re-batching run's compaction satisfies a plain target."""
    seed_topics(store)
    for topic, base in ((MERGED, 0), (MERGED, PER_SEGMENT)):  # already zstd: recompression alone saves nothing
        log = b"".join(build_batch(BatchSpec(b.header.offset, Codec.ZSTD), b.records)
                       for b in iter_decoded(io.BytesIO(tiny_segment(base))))
        store.put(segment_key(PREFIX, topic, 0, base, LOG_SUFFIX), log)
    plain = ScanOptions("zstd", min_age_minutes=0, topics=MERGED)
    first = compact(store, scan(store, PREFIX, plain), context(store, "plain"), CompactOptions())
    assert {r.reason.split(":")[0] for r in first.segments} == {"no savings"}
    assert all(s.action is Action.SKIP for s in scan(store, PREFIX, plain).segments)
    merging = ScanOptions("zstd", min_age_minutes=0, topics=MERGED, rebatch_max_bytes=1 << 20)
    assert [s.base_offset for s in scan(store, PREFIX, merging).segments if s.action is Action.COMPACT] == [
        0, PER_SEGMENT]
    second = compact(store, scan(store, PREFIX, merging), context(store, "merge"), CompactOptions())
    assert {r.status for r in second.segments} == {"compacted"}
    assert all(s.action is Action.SKIP and "already compacted" in s.reason for s in scan(store, PREFIX, plain).segments
               if s.base_offset < 2 * PER_SEGMENT)
