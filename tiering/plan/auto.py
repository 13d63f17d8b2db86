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

from tiering.cost.model import REQUESTS_PER_SEGMENT
from tiering.cost.prices import DAYS_PER_MONTH, GB, PriceBook
from tiering.errors import TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import RawBatch
from tiering.kafka.rewrite import RewriteOptions, process_batch
from tiering.lifecycle.vocabulary import Action, Cause, StorageClass
from tiering.plan.ages import max_timestamp
from tiering.plan.document import PlannedSegment
from tiering.plan.estimate import WorkSample, sample_batches, spread
from tiering.plan.policy import AUTO, Policy
from tiering.storage.objects import ObjectStore

HORIZON_MONTHS: Final = 12.0
GRACE_DAYS: Final = 7.0  # the cleanup's default grace period
AUTO_SAMPLE_SEGMENTS: Final = 4
AUTO_SAMPLE_BYTES: Final = 2 << 20


def choose_codec(store: ObjectStore, segments: list[PlannedSegment], candidates: tuple[tuple[str, int | None], ...],
                 prices: PriceBook, *, horizon_months: float = HORIZON_MONTHS, grace_days: float = GRACE_DAYS,
                 sample_segments: int = AUTO_SAMPLE_SEGMENTS, sample_bytes: int = AUTO_SAMPLE_BYTES,
                 work: WorkSample | None = None) -> dict[str, Any]:
    """The candidate with the best net dollars for ``segments`` (one topic), with every candidate's numbers.
    ``work``: the topic's whole work when ``segments`` is only a sample of it."""
    if work is None:
        work = WorkSample()
        for seg in segments:
            work.add(seg)
    batches: list[RawBatch] = []
    for seg in spread(segments, sample_segments):
        try:
            batches += sample_batches(store, seg, sample_bytes)
        except TieringError:
            continue  # a corrupt segment is reported by the compaction itself
    sampled = sum(raw.header.size for raw in batches)
    total, classes = work.bytes, work.classes
    rate = max(prices.of(c).rate() for c in classes)  # the dearest class present: the bytes that matter most
    std = prices.of(StorageClass.STANDARD)
    fixed = (work.count * (REQUESTS_PER_SEGMENT["tier1"] * std.put_per_1000
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


def record_age(store: ObjectStore, seg: PlannedSegment, policy: Policy, clock: datetime) -> PlannedSegment:
    """``seg`` skipped when its newest record is younger than its topic's ``min.segment.age.hours``."""
    if seg.action != Action.COMPACT:
        return seg
    need = policy.resolve(seg.topic).min_age_hours
    if need <= 0:
        return seg
    try:
        newest, _ = max_timestamp(store, seg)
    except TieringError:
        return seg  # the compaction reports it
    if newest is None:
        return seg
    hours = (clock.timestamp() * 1000 - newest) / 3_600_000
    if hours >= need:
        return seg
    return dataclasses.replace(seg, action=Action.SKIP, cause=Cause.TOO_YOUNG,
                               reason=f"too young by its records: the newest is {hours:.1f} h old, "
                               f"the policy's min.segment.age.hours is {need:g}")


def decide_auto(store: ObjectStore, topics: dict[str, WorkSample], policy: Policy, prices: PriceBook,
                log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every ``auto`` topic's decision (see the module docstring), by topic."""
    choices: dict[str, Any] = {}
    for topic, work in sorted(topics.items()):
        tp = policy.resolve(topic)
        decision = choose_codec(store, work.sample, tp.auto_candidates, prices,
                                horizon_months=tp.auto_horizon_months, work=work)
        choices[topic] = decision
        chosen = decision["chosen"]
        if log is not None:
            log(f"auto: {topic}: " + (f"{chosen['codec']}:{chosen['level']}" if chosen else "left alone"))
    return choices


def with_auto(seg: PlannedSegment, choices: dict[str, Any], policy: Policy) -> PlannedSegment:
    """``seg`` with its topic's automatic choice: the chosen codec, or skipped when none pays off."""
    if seg.action != Action.COMPACT or seg.codec != AUTO:
        return seg
    chosen = choices[seg.topic]["chosen"]
    if chosen is None:
        return dataclasses.replace(seg, action=Action.SKIP, cause=Cause.AUTO_DECLINED,
                                   reason="auto: no candidate codec "
                                   f"pays off within {policy.resolve(seg.topic).auto_horizon_months:g} months "
                                   "(see the plan's auto section)")
    return dataclasses.replace(seg, codec=chosen["codec"], level=chosen["level"])
