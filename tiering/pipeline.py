"""The pipeline's steps as plain functions: what the Airflow DAG's tasks and the Spark job call.

    scan+plan  ->  stage (one Spark task per segment)  ->  commit (per chunk of partitions)  ->  report

- :func:`plan_run` scans, applies the run's budget and writes the run's plan to
  ``PREFIX/_tiering/runs/<run>/plan.json``; it returns the chunks of partitions the commit step maps over.
- :func:`begin_stage` (Spark driver) takes the leases of the plan's partitions for the run; the driver
  renews them while the executors run :func:`stage_task` (rewrite, stage, read back, journal ``staged``).
  The leases are not released at the end: the commit step takes them back (same owner, the run id).
- :func:`commit_chunk` finishes every journal entry of its partitions under their leases (this is the
  protocol's recovery path: a staged segment is rolled forward), then releases the leases.
- :func:`collect_run` merges the stage and commit results into the run document.

Every result document lives under ``PREFIX/_tiering/runs/<run>/``, so that no step needs a disk shared
with another; XComs carry only keys, chunk names and counts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from tiering.errors import TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.plan.auto import apply_policy
from tiering.plan.policy import Policy
from tiering.report.prices import PriceBook, load_prices
from tiering.s3.compact import (
    RUNS_DIR,
    STAGED_STATUS,
    CompactOptions,
    RunResult,
    run_result_key,
    run_segment,
    select,
    with_lease,
)
from tiering.s3.estimate import estimate
from tiering.s3.journal import Cause, Pending, Status
from tiering.s3.layout import reserved_key
from tiering.s3.lease import DEFAULT_TTL_SECONDS, Lease, LeaseHeld, RunLease, lease_key
from tiering.s3.protocol import FAILED, SKIPPED, Context, SegmentResult, journal_key, recover_partition
from tiering.s3.scan import SKIP, Plan, PlannedSegment, ScanOptions, scan
from tiering.s3.store import ObjectNotFound, S3Store, make_client

RUN_SCOPE: Final = "_run"  # requests of the run outside any partition's work (listing, plan, documents)
DEFAULT_CHUNK_PARTITIONS: Final = 64  # partitions per commit task (Airflow maps at most 1024 tasks)


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What every step of one run needs; small and JSON-able (it travels to Spark executors)."""

    bucket: str
    prefix: str
    run_id: str
    codec: str
    level: int | None = None
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RunSettings:
        return cls(**doc)

    def store(self) -> S3Store:
        """A client from this process's AWS environment (endpoint and credentials are never in settings)."""
        return S3Store(make_client(), self.bucket)

    def context(self, store: S3Store, work_dir: str | None = None, *, one_core: bool = False) -> Context:
        """``one_core``: the rewrite proves inline instead of on a second thread (a Spark task has one core)."""
        options = RewriteOptions(Codec.parse(self.codec), self.level, proof_thread=not one_core)
        return Context(store, self.prefix, self.run_id, options, work_dir=work_dir)

    def key(self, name: str) -> str:
        return reserved_key(self.prefix, RUNS_DIR, self.run_id, name)


def scan_run(store: S3Store, settings: RunSettings, options: ScanOptions) -> dict[str, Any]:
    """Scan the prefix into ``runs/<run>/scan.json``; its key and totals."""
    plan = scan(store, settings.prefix, options)
    store.put_json(settings.key("scan.json"), plan.to_json())
    put_usage(store, settings, "scan")
    return {"scan_key": settings.key("scan.json"), "objects": plan.objects_listed, "totals": plan.totals()}


def plan_run(store: S3Store, settings: RunSettings, budget: CompactOptions, *, estimate_savings: bool = False,
             chunk_partitions: int = DEFAULT_CHUNK_PARTITIONS, policy: Policy | None = None,
             prices: PriceBook | None = None) -> dict[str, Any]:
    """From the run's scan, keep what the budget allows (largest first) and store ``runs/<run>/plan.json``;
    return its key, totals and the chunks of partitions to commit (each named after what it holds).
    ``estimate_savings`` adds the dry-run estimate (sampled batches) to the plan."""
    plan = Plan.from_json(store.get_json(settings.key("scan.json"))[0])
    if policy is not None:  # record-age minimums and the automatic codec choices
        plan = apply_policy(store, plan, policy, prices or load_prices(), log=print)
    chosen, left = select(plan, budget)
    over = {(r.directory, r.base_offset): r.reason for r in left}
    plan.segments = [dataclasses.replace(s, action=SKIP, reason=over[(s.directory, s.base_offset)], cause=Cause.BUDGET)
                     if (s.directory, s.base_offset) in over else s for s in plan.segments]
    if estimate_savings:
        plan.estimate = estimate(store, plan, RewriteOptions(Codec.parse(settings.codec), settings.level))
    store.put_json(settings.key("plan.json"), plan.to_json())
    put_usage(store, settings, "plan")
    directories = sorted({s.directory for s in chosen})
    chunks = [directories[i : i + chunk_partitions] for i in range(0, len(directories), chunk_partitions)]
    return {"plan_key": settings.key("plan.json"), "totals": plan.totals(), "segments": len(chosen),
            "bytes": sum(s.size for s in chosen), "estimate": plan.estimate,
            "chunks": [{"name": f"{c[0]}..{c[-1]}" if len(c) > 1 else c[0], "partitions": c} for c in chunks]}


def load_plan(store: S3Store, where: str) -> Plan:
    """A plan from an ``s3://bucket/key`` URI (read with ``store``'s client) or a local path."""
    if where.startswith("s3://"):
        bucket, _, key = where[5:].partition("/")
        return Plan.from_json(S3Store(store.client, bucket).get_json(key)[0])
    with open(where, encoding="utf-8") as f:
        return Plan.from_json(json.load(f))


def begin_stage(store: S3Store, settings: RunSettings, plan: Plan
                ) -> tuple[list[PlannedSegment], list[Lease], list[SegmentResult]]:
    """Driver side of the stage step: take the run's lease on each partition of the plan. Returns the
    segments to stage, largest first (the tail of the job is short), the leases to keep renewed, and
    the segments of busy partitions as skipped results."""
    todo = plan.to_compact()
    leases, skipped = [], []
    for directory in sorted({s.directory for s in todo}):
        lease = Lease(store, lease_key(settings.prefix, directory), settings.run_id, settings.lease_ttl_seconds)
        try:
            lease.acquire(settings.prefix)
            leases.append(lease)
        except LeaseHeld as e:
            skipped += [SegmentResult(s.directory, s.base_offset, SKIPPED, f"partition busy: {e.message}",
                                      pending=Pending.BUSY) for s in todo if s.directory == directory]
        except TieringError as e:  # S3 failing for this partition's lease: the others go on
            skipped += [SegmentResult(s.directory, s.base_offset, FAILED, f"partition not touched: {e}",
                                      error=e.to_dict(), pending=Pending.TRANSIENT if e.retryable else None)
                        for s in todo if s.directory == directory]
    held = {lease.key for lease in leases}
    ordered = sorted((s for s in todo if lease_key(settings.prefix, s.directory) in held),
                     key=lambda s: (-s.size, s.directory, s.base_offset))
    return ordered, leases, skipped


def stage_task(segment: dict[str, Any], settings: dict[str, Any], work_dir: str | None = None) -> dict[str, Any]:
    """Executor side: stage one segment (or repair it) under the run's lease; a result document. A
    segment this run already staged (a re-run of the job) is reported as staged again."""
    started = time.perf_counter()
    run = RunSettings.from_json(settings)
    seg = PlannedSegment.from_json(segment)
    store = run.store()
    result: SegmentResult | None = None
    try:
        doc, _ = store.get_json(journal_key(run.prefix, seg.directory, seg.base_offset))
        if doc.get("run_id") == run.run_id:
            result = SegmentResult(seg.directory, seg.base_offset, STAGED_STATUS, "staged by an earlier attempt",
                                   run_id=run.run_id)
    except ObjectNotFound:
        pass
    if result is None:
        lease = RunLease(store, lease_key(run.prefix, seg.directory), run.run_id)
        result = run_segment(run.context(store, work_dir, one_core=True), seg, lease, commit=False)
    # What the cost report prices: this task's S3 requests and its time on one executor core.
    return {**result.to_json(), "usage": {"requests": dict(store.requests),
                                          "seconds": round(time.perf_counter() - started, 3)}}


def put_usage(store: S3Store, settings: RunSettings, step: str) -> None:
    """Record the S3 requests ``store`` made for this run outside any partition's work (``usage/<step>``)."""
    store.put_json(settings.key(f"usage/{step}.json"), {"schema_version": 1, "requests": dict(store.requests)})


def write_results(store: S3Store, key: str, results: Iterable[dict[str, Any]],
                  usage: dict[str, dict[str, int]] | None = None) -> dict[str, int]:
    """Store a step's result documents (and the S3 requests per partition it made); counts by status."""
    docs = list(results)
    counts: dict[str, int] = {}
    for d in docs:
        counts[str(d["status"])] = counts.get(str(d["status"]), 0) + 1
    store.put_json(key, {"schema_version": 1, "results": docs, "usage": usage or {}})
    return counts


def commit_chunk(store: S3Store, settings: RunSettings, partitions: list[str], name: str) -> dict[str, Any]:
    """Finish every journal entry of ``partitions`` under their leases, then release them; the results go
    to ``runs/<run>/commit/<name>.json``. Idempotent: a retry finds nothing left to finish."""
    ctx = settings.context(store)
    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    for directory in partitions:
        def work(lease: Lease, out: list[SegmentResult], directory: str = directory) -> None:
            out += recover_partition(ctx, directory, lease)

        before = Counter(store.requests)
        results += with_lease(ctx, directory, settings.lease_ttl_seconds, work, [])
        requests[directory] = dict(store.requests - before)
    counts = write_results(store, settings.key(f"commit/{name}.json"), (r.to_json() for r in results),
                           usage=requests)
    return {"chunk": name, "partitions": len(partitions), **counts}


def collect_run(store: S3Store, settings: RunSettings, estimate: dict[str, Any] | None = None) -> RunResult:
    """The run document from the stage and commit results: one entry per planned segment, with its final
    outcome (a staged segment's commit result wins over its staging result)."""
    run = RunResult("compact", settings.run_id, settings.bucket, settings.prefix, "",
                    settings={"codec": settings.codec, "level": settings.level, "estimate": estimate})
    by_segment: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        plan = Plan.from_json(store.get_json(settings.key("plan.json"))[0])
        run.started_at = plan.created_at
        for s in plan.segments:
            if s.cause is Cause.BUDGET:
                by_segment[(s.directory, s.base_offset)] = {"directory": s.directory, "base_offset": s.base_offset,
                                                            "status": SKIPPED, "reason": s.reason}
    except ObjectNotFound:
        pass
    requests: dict[str, Counter[str]] = {}
    seconds = 0.0
    for prefix in ("stage.json", "commit/"):
        for info in store.list(settings.key(prefix)):
            doc = store.get_json(info.key)[0]
            for directory, counts in doc.get("usage", {}).items():
                requests.setdefault(directory, Counter()).update(counts)
            for r in doc["results"]:
                used = r.pop("usage", None)
                key = (r["directory"], int(r["base_offset"]))
                by_segment[key] = {**by_segment.get(key, {}), **r}  # commit after stage: its outcome wins
                if used:
                    requests.setdefault(r["directory"], Counter()).update(used["requests"])
                    seconds += float(used["seconds"])
    for info in store.list(settings.key("usage/")):
        requests.setdefault(RUN_SCOPE, Counter()).update(store.get_json(info.key)[0]["requests"])
    run.usage = {"requests": {k: dict(sorted(v.items())) for k, v in sorted(requests.items())},
                 "compute_seconds": round(seconds, 3)}
    for key in sorted(by_segment):
        d = by_segment[key]
        run.segments.append(SegmentResult(d["directory"], int(d["base_offset"]), Status(d["status"]),
                                          d.get("reason", ""), int(d.get("bytes_before", 0)),
                                          int(d.get("bytes_after", 0)),
                                          bool(d.get("recovered", False)), d.get("stats"), d.get("error"),
                                          d.get("run_id"), d.get("encryption"),
                                          Pending(d["pending"]) if d.get("pending") else None))
    run.finished_at = datetime.now(UTC).isoformat()
    store.put_json(run_result_key(settings.prefix, settings.run_id, "compact"), run.to_json())
    return run


def safe_run_id(run_id: str) -> str:
    """An Airflow run id made key-safe: it names S3 keys and lease owners."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id)


def by_topic(segments: Iterable[dict[str, Any]]) -> tuple[dict[str, list[int]], dict[tuple[str, str, str], int]]:
    """Per topic, [segments compacted, bytes before, bytes after]; and the count of every other outcome by
    (topic, status, the reason's first clause)."""
    rows: dict[str, list[int]] = {}
    notes: dict[tuple[str, str, str], int] = {}
    for r in segments:
        topic = str(r["directory"]).rsplit("-", 1)[0]
        if r["status"] == "compacted":
            row = rows.setdefault(topic, [0, 0, 0])
            row[0] += 1
            row[1] += int(r["bytes_before"])
            row[2] += int(r["bytes_after"])
        else:
            key = (topic, str(r["status"]), str(r.get("reason") or "").split(":")[0])
            notes[key] = notes.get(key, 0) + 1
    return rows, notes


def run_summary(run: RunResult) -> tuple[dict[str, Any], str]:
    """Headline numbers and a plain-text table (per topic, then the skip reasons) for task logs."""
    totals = run.totals()
    before, after = totals["bytes_before"], totals["bytes_after"]
    headline = {"run_id": run.run_id, "segments": totals["segments"],
                "compacted": totals.get("compacted", 0), "failed": totals.get("failed", 0),
                "skipped": totals.get("skipped", 0), "bytes_before": before, "bytes_after": after,
                "saved_bytes": before - after, "ratio": round(after / before, 4) if before else None}
    rows, notes = by_topic(r.to_json() for r in run.segments)
    reasons: dict[str, int] = {}
    for (_, status, reason), n in notes.items():
        key = f"{status}: {reason}" if reason else status
        reasons[key] = reasons.get(key, 0) + n
    lines = [f"{'topic':<32} {'segments':>8} {'before':>14} {'after':>14} {'ratio':>6}"]
    for topic, (n, b, a) in sorted(rows.items()):
        lines.append(f"{topic:<32} {n:>8} {b:>14,} {a:>14,} {a / b if b else 0:>6.3f}")
    lines.append(f"{'total':<32} {headline['compacted']:>8} {before:>14,} {after:>14,} "
                 f"{after / before if before else 0:>6.3f}")
    for reason, n in sorted(reasons.items()):
        lines.append(f"  {n:>6} {reason}")
    return headline, "\n".join(lines)
