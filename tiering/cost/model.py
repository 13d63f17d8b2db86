"""The cost model: a run's documents in, the report document out (pure: no I/O, no clock).

Savings
    Per storage class of the rewritten objects (a rewrite keeps the class): the monthly cost of the
    billed bytes before minus after, where an object under the class's minimum billable size counts as
    that size. Standard's volume tiers apply to the account's whole volume in the region, so the bytes
    saved come off the top of it: ``monthly(V) - monthly(V - saved)`` with ``V`` the account's current
    volume in that class (an input; by default just the bytes the run saw, i.e. the first tier). A year
    is twelve months. Only ``.log`` bytes are counted (the indexes shrink too, a little: not claimed).

One-off costs of the run
    - S3 requests, as counted by every step of the run, priced at the storage class of the partition they
      served (an upper bound: staging objects are Standard), the run's own documents at Standard;
    - compute: the rewrite tasks' seconds on one core each (Spark tasks, or the CLI's rewrites), as
      vCPU-hours at the price book's rate;
    - retrieval fees for IA and Glacier Instant Retrieval sources (read once to rewrite, copied once to the
      backup);
    - early deletion: replacing an object younger than its class's minimum duration bills the rest;
    - the originals kept for the grace period (a copy billed at least the class's minimum duration);
    - in a versioned bucket, the noncurrent versions (the replaced original, the deleted backup and the
      staging copy) until a lifecycle rule expires them; without such a rule the savings never arrive,
      and the report says so and counts the storage that is added instead;
    - KMS requests for SSE-KMS objects (none counted with an S3 Bucket Key).
    Payback is the one-off total divided by the monthly savings.

A dry run reports the same from the plan and the sampled estimate; every figure is then an estimate
and the savings carry the sample's range.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from tiering.cost.prices import DAYS_PER_MONTH, GB, PriceBook, StoragePrice

REPORT_SCHEMA_VERSION: Final = 1
# KMS calls per SSE-KMS segment of three objects: a Decrypt to read the .log, a Decrypt and a GenerateDataKey
# per backup copy (3 objects), a GenerateDataKey per object put in place (3).
KMS_CALLS_PER_SEGMENT: Final = 10
# A dry run has no counts yet: S3 requests per segment of a real compaction (stage, verify, commit; the DAG
# path measured 15.2 and 28.4 in the demo, checked by tests/test_pipeline.py), and a rewrite speed per core
# (bench-s3: 18 MiB/s through S3).
REQUESTS_PER_SEGMENT: Final = {"tier1": 15, "tier2": 28}
DRY_RUN_BYTES_PER_CORE_SECOND: Final = 18 << 20
DONE: Final = ("compacted",)


@dataclass(frozen=True, slots=True)
class CostOptions:
    """What the price book cannot know: the account and the run's retention settings."""

    account_bytes: Mapping[str, int] = field(default_factory=dict)  # current volume per storage class
    grace_days: float = 7.0
    versioned: bool | None = None  # None: as the bucket says
    noncurrent_days: int | None = None  # None: as the bucket's lifecycle says

    def to_json(self) -> dict[str, Any]:
        return {"account_bytes": dict(self.account_bytes), "grace_days": self.grace_days,
                "versioned": self.versioned, "noncurrent_days": self.noncurrent_days}


def topic_of(directory: str) -> str:
    return directory.rsplit("-", 1)[0]


def source_codec(stats: Mapping[str, Any] | None) -> str:
    """The codec most of a segment's batches had before the rewrite ("mixed: a+b" when no majority)."""
    counts: Counter[str] = Counter((stats or {}).get("codecs_before") or {})
    if not counts:
        return "unknown"
    (top, n), total = counts.most_common(1)[0], sum(counts.values())
    return top if n * 2 > total else "mixed: " + "+".join(sorted(counts))


def _gb(n: float) -> float:
    return n / GB


def _segments(run: Mapping[str, Any], plan: Sequence[Mapping[str, Any]], ratio: float | None
              ) -> list[dict[str, Any]]:
    """One row per segment the scan saw: its plan facts and the run's outcome (or, in a dry run, the
    estimate applied to it)."""
    results = {(r["directory"], int(r["base_offset"])): r for r in run.get("segments", [])}
    rows = []
    for s in plan:
        key = (s["directory"], int(s["base_offset"]))
        log = s.get("log") or {}
        r = results.pop(key, None)
        row = {"directory": s["directory"], "topic": s.get("topic") or topic_of(s["directory"]),
               "partition": int(s.get("partition", key[0].rsplit("-", 1)[-1])), "base_offset": key[1],
               "storage_class": log.get("storage_class") or "STANDARD", "last_modified": log.get("last_modified"),
               "size": int(log.get("size", 0)), "source_codec": "", "encryption": None}
        if r is not None:
            row.update(status=r["status"], reason=r.get("reason", ""), bytes_before=int(r.get("bytes_before", 0)),
                       bytes_after=int(r.get("bytes_after", 0)), source_codec=source_codec(r.get("stats")),
                       encryption=r.get("encryption"), error=r.get("error"))
        elif s["action"] == "skip":
            row.update(status="skipped", reason=s["reason"], bytes_before=0, bytes_after=0)
        elif ratio is not None and s["action"] == "compact":
            row.update(status="estimated", reason="dry run", bytes_before=row["size"],
                       bytes_after=round(row["size"] * ratio))
        else:
            row.update(status="planned" if ratio is not None else "not run",
                       reason=s["reason"] if ratio is not None else "planned, but no result was recorded",
                       bytes_before=0, bytes_after=0)
        rows.append(row)
    for (directory, base), r in sorted(results.items()):  # results without a plan entry (a rollback, say)
        rows.append({"directory": directory, "topic": topic_of(directory), "base_offset": base,
                     "partition": int(directory.rsplit("-", 1)[-1]), "storage_class": "STANDARD",
                     "last_modified": None, "size": 0, "status": r["status"], "reason": r.get("reason", ""),
                     "bytes_before": int(r.get("bytes_before", 0)), "bytes_after": int(r.get("bytes_after", 0)),
                     "source_codec": source_codec(r.get("stats")), "encryption": r.get("encryption"),
                     "error": r.get("error")})
    return rows


def _age_days(last_modified: str | None, now: datetime) -> float | None:
    if not last_modified:
        return None
    return (now - datetime.fromisoformat(last_modified)).total_seconds() / 86400


@dataclass
class _Line:
    item: str
    usd: float = 0.0
    detail: str = ""
    quantity: float = 0.0


def _savings(rows: list[dict[str, Any]], prices: PriceBook, options: CostOptions, factor: float = 1.0
             ) -> dict[str, float]:
    """Monthly $ saved per storage class; ``factor`` scales the bytes saved (a dry run's range)."""
    out: dict[str, float] = {}
    for cls, members in _by(rows, "storage_class").items():
        p = prices.of(cls)
        before = sum(p.billed_bytes(r["bytes_before"]) for r in members)
        after = sum(p.billed_bytes(r["bytes_after"]) for r in members)
        saved = (before - after) * factor
        volume = max(float(options.account_bytes.get(cls, 0)), float(before))
        out[cls] = p.monthly(_gb(volume)) - p.monthly(_gb(volume - saved))
    return out


def _by(rows: Iterable[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[str(r[key])].append(r)
    return dict(groups)


def _one_offs(done: list[dict[str, Any]], usage: Mapping[str, Any], prices: PriceBook, options: CostOptions,
              facts: tuple[bool, int | None], now: datetime, dry_run: bool) -> tuple[list[_Line], dict[str, Any]]:
    versioned, noncurrent_days = facts
    lines: list[_Line] = []
    # Requests: counted, priced at the class of the partition they served.
    class_of = {r["directory"]: r["storage_class"] for r in done}
    requests = usage.get("requests", {})
    counts: Counter[str] = Counter()
    req = _Line("S3 requests")
    for scope, ops in requests.items():
        cls = class_of.get(scope, "STANDARD")
        for op, n in ops.items():
            counts[op] += int(n)
            req.usd += prices.request_usd(op, int(n), cls)
    if dry_run:
        for r in done:
            p = prices.of(r["storage_class"])
            req.usd += (REQUESTS_PER_SEGMENT["tier1"] * p.put_per_1000 + REQUESTS_PER_SEGMENT["tier2"] * p.get_per_1000
                        ) / 1000
        counts["(estimated, per segment)"] += len(done) * sum(REQUESTS_PER_SEGMENT.values())
    req.quantity = sum(counts.values())
    req.detail = f"{int(req.quantity):,} requests" + (" (partly estimated)" if dry_run else "")
    lines.append(req)

    seconds = float(usage.get("compute_seconds", 0.0))
    if dry_run:
        seconds = sum(r["bytes_before"] for r in done) / DRY_RUN_BYTES_PER_CORE_SECOND
    lines.append(_Line("Compute (rewrite tasks)", seconds / 3600 * prices.vcpu_hour,
                       f"{seconds / 3600:.4f} vCPU-hours at ${prices.vcpu_hour:.4f}", seconds / 3600))

    retrieval = _Line("Retrieval fees (IA / Glacier IR sources)")
    early = _Line("Early deletion (minimum storage duration)")
    grace = _Line(f"Originals kept {options.grace_days:g} days (grace period)")
    noncurrent = _Line("Noncurrent versions until they expire")
    kms = _Line("KMS requests (SSE-KMS)")
    std: StoragePrice = prices.of("STANDARD")
    for r in done:
        p = prices.of(r["storage_class"])
        before_gb, after_gb = _gb(p.billed_bytes(r["bytes_before"])), _gb(r["bytes_after"])
        rate = p.rate(_gb(options.account_bytes.get(r["storage_class"], 0)))
        retrieval.usd += 2 * _gb(r["bytes_before"]) * p.retrieval_per_gb
        retrieval.quantity += 2 * _gb(r["bytes_before"]) if p.retrieval_per_gb else 0
        age = _age_days(r.get("last_modified"), now)
        if p.min_days and age is not None and age < p.min_days:
            early.usd += before_gb * rate * (p.min_days - age) / DAYS_PER_MONTH
            early.quantity += 1
        grace.usd += before_gb * rate * max(options.grace_days, p.min_days) / DAYS_PER_MONTH
        if versioned and noncurrent_days is not None:
            keep = max(noncurrent_days, p.min_days) / DAYS_PER_MONTH
            noncurrent.usd += 2 * before_gb * rate * keep + after_gb * std.rate() * noncurrent_days / DAYS_PER_MONTH
        if r.get("encryption") == "aws:kms":
            kms.quantity += KMS_CALLS_PER_SEGMENT
    kms.usd = kms.quantity * prices.kms_per_10000 / 10000
    retrieval.detail = f"{retrieval.quantity:.3f} GB read or copied from IA / Glacier IR objects"
    early.detail = f"{int(early.quantity)} objects replaced before their class's minimum duration"
    grace.detail = "a copy of each replaced .log, billed at least its class's minimum duration"
    kms.detail = f"{int(kms.quantity):,} KMS calls (none with an S3 Bucket Key)"
    noncurrent.detail = (f"replaced originals, deleted backups and staging copies for {noncurrent_days} days"
                         if versioned and noncurrent_days is not None else
                         "bucket not versioned" if not versioned else "no lifecycle rule expires them")
    lines += [retrieval, early, grace, noncurrent, kms]
    return lines, {"requests_by_operation": dict(sorted(counts.items()))}


def build_report(run: Mapping[str, Any], plan: Sequence[Mapping[str, Any]], prices: PriceBook,
                 options: CostOptions, *, versioned: bool | None, noncurrent_days: int | None,
                 ledger: Sequence[Mapping[str, Any]] = (), now: datetime,
                 auto: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report of one run. ``run`` is the run document (``compact.json``), ``plan`` the plan's segment
    entries, ``ledger`` the earlier runs' ledger entries, ``now`` the time the costs are computed at."""
    estimate = (run.get("settings") or {}).get("estimate")
    dry_run = bool(estimate)
    ratio = float(estimate["ratio"]) if estimate else None
    rows = _segments(run, plan, ratio)
    done = [r for r in rows if r["status"] in (*DONE, "estimated")]
    versioned = options.versioned if options.versioned is not None else versioned
    noncurrent_days = options.noncurrent_days if options.noncurrent_days is not None else noncurrent_days
    warnings: list[str] = []

    by_class = _savings(done, prices, options)
    monthly = sum(by_class.values())
    if versioned and noncurrent_days is None and done:
        # Nothing is ever removed: the new objects, the deleted backups and the staging copies are added.
        added = 0.0
        for cls, members in _by(done, "storage_class").items():
            p = prices.of(cls)
            added += sum(_gb(p.billed_bytes(r["bytes_before"])) * p.rate() + 2 * _gb(r["bytes_after"]) * p.rate()
                         for r in members)
        warnings.append("The bucket keeps versions and no lifecycle rule expires noncurrent ones: the replaced "
                        "originals stay billed forever, so this run ADDS storage instead of saving it. Add a "
                        "NoncurrentVersionExpiration rule (see infra/).")
        by_class = dict.fromkeys(by_class, 0.0)
        monthly = -added
    def delta(r: Mapping[str, Any]) -> int:
        p = prices.of(r["storage_class"])
        return p.billed_bytes(r["bytes_before"]) - p.billed_bytes(r["bytes_after"])

    per_row_delta = {cls: sum(delta(r) for r in members) for cls, members in _by(done, "storage_class").items()}
    done_ids = {id(r) for r in done}
    for r in rows:
        cls = r["storage_class"]
        if id(r) in done_ids and per_row_delta.get(cls):
            r["monthly_savings_usd"] = by_class[cls] * delta(r) / per_row_delta[cls]
        else:
            r["monthly_savings_usd"] = 0.0

    lines, counted = _one_offs(done, run.get("usage") or {}, prices, options, (bool(versioned), noncurrent_days),
                               now, dry_run)
    one_off = sum(line.usd for line in lines)
    before = sum(r["bytes_before"] for r in done)
    after = sum(r["bytes_after"] for r in done)
    if after > before:
        warnings.append(f"This run made the rewritten segments bigger: {before:,} -> {after:,} bytes.")
    statuses = Counter(r["status"] for r in rows)
    totals = {
        "segments_seen": len(rows), "segments_rewritten": statuses.get("compacted", 0),
        "segments_estimated": statuses.get("estimated", 0), "segments_skipped": statuses.get("skipped", 0),
        "segments_failed": statuses.get("failed", 0), "bytes_before": before, "bytes_after": after,
        "saved_bytes": before - after, "ratio": after / before if before else None,
        "monthly_savings_usd": monthly, "yearly_savings_usd": monthly * 12, "one_off_usd": one_off,
        "monthly_savings_per_tib_usd": monthly / before * (1 << 40) if before else None,
        "payback_months": one_off / monthly if monthly > 0 else None,
        "net_first_year_usd": monthly * 12 - one_off,
    }
    report: dict[str, Any] = {
        "schema_version": REPORT_SCHEMA_VERSION, "kind": "compaction-report", "run_id": run["run_id"],
        "bucket": run["bucket"], "prefix": run["prefix"], "started_at": run.get("started_at"),
        "finished_at": run.get("finished_at"), "generated_at": now.isoformat(), "estimate": dry_run,
        "settings": {k: v for k, v in (run.get("settings") or {}).items() if k != "estimate"},
        "prices": prices.describe(),
        "assumptions": {**options.to_json(), "versioned": versioned, "noncurrent_days": noncurrent_days,
                        "days_per_month": DAYS_PER_MONTH, "gb_bytes": GB},
        "totals": totals,
        "by_storage_class": _rollup(done, "storage_class", by_class),
        "by_topic": _rollup(done, "topic"),
        "by_partition": _rollup(done, "directory"),
        "by_source_codec": _rollup(done, "source_codec"),
        "one_off": [{"item": line.item, "usd": line.usd, "detail": line.detail} for line in lines],
        "requests": counted,
        "skipped": _reasons(r for r in rows if r["status"] not in (*DONE, "estimated")),
        "failed": [{"segment": f"{r['directory']}/{r['base_offset']}", "reason": r["reason"],
                    "error": r.get("error")} for r in rows if r["status"] == "failed"],
        "segments": rows,
        "auto": dict(auto or {}),  # per topic: the automatic codec choice and every candidate's numbers
        "warnings": warnings,
    }
    if dry_run:
        assert estimate is not None
        saved = before - after
        scale_low = estimate["saved_bytes_low"] / estimate["saved_bytes_estimate"] if estimate[
            "saved_bytes_estimate"] else 0.0
        scale_high = estimate["saved_bytes_high"] / estimate["saved_bytes_estimate"] if estimate[
            "saved_bytes_estimate"] else 0.0
        report["estimate_detail"] = {
            **estimate, "saved_bytes": saved,
            "monthly_savings_usd_low": sum(_savings(done, prices, options, scale_low).values()),
            "monthly_savings_usd_high": sum(_savings(done, prices, options, scale_high).values()),
        }
    report["ledger"] = cumulative([*[e for e in ledger if e.get("run_id") != run["run_id"]], ledger_entry(report)],
                                  now)
    return report


def _rollup(rows: list[dict[str, Any]], key: str, usd: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    out = []
    for name, members in sorted(_by(rows, key).items()):
        before = sum(r["bytes_before"] for r in members)
        after = sum(r["bytes_after"] for r in members)
        monthly = usd[name] if usd is not None else sum(r["monthly_savings_usd"] for r in members)
        out.append({key: name, "segments": len(members), "bytes_before": before, "bytes_after": after,
                    "saved_bytes": before - after, "ratio": after / before if before else None,
                    "monthly_savings_usd": monthly})
    return out


def _reasons(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str]] = Counter()
    for r in rows:
        counts[(r["status"], str(r.get("reason") or "").split(":")[0].split(" (")[0])] += 1
    return [{"status": s, "reason": reason, "segments": n} for (s, reason), n in sorted(counts.items())]


def ledger_entry(report: Mapping[str, Any]) -> dict[str, Any]:
    t = report["totals"]
    return {"run_id": report["run_id"], "finished_at": report["finished_at"] or report["generated_at"],
            "estimate": report["estimate"], "segments_rewritten": t["segments_rewritten"],
            "bytes_before": t["bytes_before"], "bytes_after": t["bytes_after"],
            "monthly_savings_usd": t["monthly_savings_usd"], "one_off_usd": t["one_off_usd"]}


def cumulative(entries: Sequence[Mapping[str, Any]], now: datetime) -> dict[str, Any]:
    """The ledger with running totals over the real (not estimated) runs in time order; ``to_date_usd`` is
    what the runs have saved by ``now`` net of their one-off costs (a run saves its monthly figure per month
    from when it finished)."""
    runs = sorted(entries, key=lambda e: (str(e["finished_at"]), str(e["run_id"])))
    monthly = one_off = accrued = 0.0
    rows = []
    for e in runs:
        if not e["estimate"]:
            monthly += float(e["monthly_savings_usd"])
            one_off += float(e["one_off_usd"])
            age = _age_days(str(e["finished_at"]), now) or 0.0
            accrued += float(e["monthly_savings_usd"]) * max(0.0, age) / DAYS_PER_MONTH
        rows.append({**e, "cumulative_monthly_usd": monthly, "cumulative_one_off_usd": one_off})
    return {"runs": rows, "monthly_run_rate_usd": monthly, "one_off_usd": one_off,
            "to_date_usd": accrued - one_off}
