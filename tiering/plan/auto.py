"""A policy applied to a scanned plan: minimum age by record timestamps, and ``auto`` codec choice.

``auto`` samples each auto topic's batches (the first ``sample_bytes`` of up to ``sample_segments`` of its
segments to compact, spread over their sizes), recompresses them with every candidate codec and level of
the policy, and measures bytes out and CPU seconds. For a candidate, over the topic's bytes to compact:

    storage saved per month = bytes saved / 2^30 x the storage class's marginal rate
    compute                 = CPU seconds per sampled byte x topic bytes / 3600 x the vCPU-hour price
    one-off                 = compute + S3 requests (per segment, as a compaction measures them)
                              + the originals kept for the grace period
    net over the horizon    = saved per month x auto.horizon.months - one-off

The candidate with the highest net wins; when none is positive the topic is left alone (the producer's
codec stays). Set ``auto.horizon.months`` no longer than the topic's retention: savings stop when Kafka
deletes the segment. The numbers of every candidate are kept in the plan (``plan.auto``) and shown by the
report. Not counted here: IA retrieval and early deletion (the report counts them for the run).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Final

from tiering.errors import TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import RawBatch
from tiering.kafka.rewrite import RewriteOptions, process_batch
from tiering.plan.policy import AUTO, Policy
from tiering.plan.tier import max_timestamp
from tiering.report.model import REQUESTS_PER_SEGMENT
from tiering.report.prices import DAYS_PER_MONTH, GB, PriceBook
from tiering.s3.estimate import sample_batches, spread
from tiering.s3.journal import Cause
from tiering.s3.scan import COMPACT, SKIP, Plan, PlannedSegment
from tiering.s3.store import S3Store

HORIZON_MONTHS: Final = 12.0
GRACE_DAYS: Final = 7.0  # the cleanup's default grace period
AUTO_SAMPLE_SEGMENTS: Final = 4
AUTO_SAMPLE_BYTES: Final = 2 << 20


def choose_codec(store: S3Store, segments: list[PlannedSegment], candidates: tuple[tuple[str, int | None], ...],
                 prices: PriceBook, *, horizon_months: float = HORIZON_MONTHS, grace_days: float = GRACE_DAYS,
                 sample_segments: int = AUTO_SAMPLE_SEGMENTS, sample_bytes: int = AUTO_SAMPLE_BYTES
                 ) -> dict[str, Any]:
    """The candidate with the best net dollars for ``segments`` (one topic), with every candidate's numbers."""
    batches: list[RawBatch] = []
    for seg in spread(segments, sample_segments):
        try:
            batches += sample_batches(store, seg, sample_bytes)
        except TieringError:
            continue  # a corrupt segment is reported by the compaction itself
    sampled = sum(raw.header.size for raw in batches)
    total = sum(s.size for s in segments)
    classes = {s.log.storage_class if s.log else "STANDARD" for s in segments}
    rate = max(prices.of(c).rate() for c in classes)  # the dearest class present: the bytes that matter most
    std = prices.of("STANDARD")
    fixed = (len(segments) * (REQUESTS_PER_SEGMENT["tier1"] * std.put_per_1000
                              + REQUESTS_PER_SEGMENT["tier2"] * std.get_per_1000) / 1000
             + total / GB * rate * grace_days / DAYS_PER_MONTH)
    rows: list[dict[str, Any]] = []
    for codec, level in candidates:
        options = RewriteOptions(Codec.parse(codec), level)
        out, started = 0, time.process_time()
        for raw in batches:
            out += sum(len(p) for p in process_batch(raw, options).parts)
        cpu = time.process_time() - started
        ratio = out / sampled if sampled else 1.0
        monthly = total * (1 - ratio) / GB * rate
        compute = (cpu / sampled * total if sampled else 0.0) / 3600 * prices.vcpu_hour
        rows.append({"codec": codec, "level": options.level, "ratio": ratio, "monthly_savings_usd": monthly,
                     "compute_usd": compute, "one_off_usd": compute + fixed,
                     "net_usd": monthly * horizon_months - compute - fixed, "cpu_seconds_sampled": cpu})
    best = max(rows, key=lambda r: float(r["net_usd"])) if rows else None
    chosen = best if best is not None and float(best["net_usd"]) > 0 else None
    return {"sampled_bytes": sampled, "topic_bytes": total, "horizon_months": horizon_months,
            "requests_and_grace_usd": fixed,
            "candidates": rows, "chosen": None if chosen is None else {"codec": chosen["codec"],
                                                                      "level": chosen["level"]}}


def apply_policy(store: S3Store, plan: Plan, policy: Policy, prices: PriceBook,
                 log: Callable[[str], None] | None = None) -> Plan:
    """The plan with the policy's record-age minimum applied and every ``auto`` topic's codec chosen."""
    clock = datetime.fromisoformat(plan.created_at)
    segments = list(plan.segments)
    for i, seg in enumerate(segments):
        if seg.action != COMPACT:
            continue
        need = policy.resolve(seg.topic).min_age_hours
        if need <= 0:
            continue
        try:
            newest, _ = max_timestamp(store, seg)
        except TieringError:
            continue  # the compaction reports it
        if newest is None:
            continue
        hours = (clock.timestamp() * 1000 - newest) / 3_600_000
        if hours < need:
            segments[i] = dataclasses.replace(seg, action=SKIP, cause=Cause.TOO_YOUNG,
                                              reason=f"too young by its records: the newest is {hours:.1f} h old, "
                                              f"the policy's min.segment.age.hours is {need:g}")
    by_topic: dict[str, list[int]] = {}
    for i, seg in enumerate(segments):
        if seg.action == COMPACT and seg.codec == AUTO:
            by_topic.setdefault(seg.topic, []).append(i)
    choices: dict[str, Any] = {}
    for topic, idx in sorted(by_topic.items()):
        tp = policy.resolve(topic)
        decision = choose_codec(store, [segments[i] for i in idx], tp.auto_candidates, prices,
                                horizon_months=tp.auto_horizon_months)
        choices[topic] = decision
        chosen = decision["chosen"]
        if log is not None:
            log(f"auto: {topic}: " + (f"{chosen['codec']}:{chosen['level']}" if chosen else "left alone"))
        for i in idx:
            if chosen is None:
                segments[i] = dataclasses.replace(segments[i], action=SKIP, cause=Cause.AUTO_DECLINED,
                                                  reason="auto: no candidate codec pays "
                                                  f"off within {tp.auto_horizon_months:g} months (see the plan's "
                                                  "auto section)")
            else:
                segments[i] = dataclasses.replace(segments[i], codec=chosen["codec"], level=chosen["level"])
    return dataclasses.replace(plan, segments=segments, policy=policy.path, auto=choices or None)
