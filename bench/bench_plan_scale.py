"""Planning at scale: every kind of run planned from an S3 Inventory report of up to a million segments.

    .venv/bin/python bench/bench_plan_scale.py                          # 100,000 and 1,000,000 segments
    .venv/bin/python bench/bench_plan_scale.py --segments 20000 --kinds merge --json bench/out/plan.json
    .venv/bin/python bench/bench_plan_scale.py --segments 100000,1000000 --kinds rollback,tier

One moto server (``tiering.demo.s3.moto_server``, in this process) holds, per size, an inventory report of
a Kafka ``logdir`` (``bench/synth_inventory.py``: 4 objects a segment, 100 segments a partition, gzip CSV
files of 250,000 rows, written as AWS writes them; not measured). Each size is then planned, for each kind,
by a fresh child process running what the DAG's tasks run: for compaction ``scan_run(..., inventory=URI)``
(read the report, spill it by partition, classify, write the scan's chunks), ``plan_run`` (the budget, the
plan's chunks) and the run engine's plan of the compaction (the plan read a partition at a time, the work
written to the run's plan chunks, cut into units); for merging and key compaction the run engine's plan
(``engine.plan`` with the report's objects as its source: crashed operations looked for, partitions read,
each handed to the kind, written to the run's plan chunks, cut into units). Merging groups the segments up to 8 GiB (the
synthetic segments are about 1 GiB each), key compaction takes every topic; a cleanup plans from a second
report, of the originals a run kept a month ago of every segment (``kept_rows``: three objects a segment),
all past the grace period. The child reports per step
its wall time and CPU time (``getrusage``, all threads), and its peak resident size (VmHWM) against its
size after imports. The claim checked, per kind: memory does not grow with the bucket (peak RSS at the
largest size within 1.5x of the smallest, and at most 512 MiB).

A rollback and a tiering run (``--kinds rollback,tier``) plan from a listing, not from a report: a rollback
lists one run's ``_tiering/backup/<run>/``, a tiering plan reads each sealed segment's newest timestamp
(ranged GETs of its ``.timeindex``, ``.index`` and ``.log`` tails), which a report's rows cannot stand in for,
and moto walks every key of the bucket for each page of a listing. Their bucket is in the child process
itself: a :class:`tiering.storage.memory.MemoryStore` whose listings are cut a page at a time from its keys
in order (``bench/plan_buckets.py``: MemoryStore builds each listing whole, walking every key), filled before
the measured step (not measured): for ``rollback`` what a run ``compacted`` left after compacting every
segment (copied from a real compaction of a small partition: the originals under its backup prefix, the
compacted segments in place, each partition's state document naming the run for each segment), planned as
``engine.plan(store, ctx, Rollback(RollbackOptions("compacted")).started(...))``; for ``tier`` a ``logdir``
of generated segments (real snappy batches, records a year old), planned by ``Tiering`` with a policy of
30 days to STANDARD_IA and 90 to GLACIER_IR: every sealed segment's ``.log`` (about 200 KB) moves, its
indexes stay (under 128 KiB), the last, active segment of each partition stays. The objects share one value
per file type. The child checks that the plan holds every partition and every segment it seeded (a
rollback: all 100 a partition; tiering: the 99 sealed ones) and nothing refused; ``GETs`` counts the
store's GetObject requests (tiering: three a sealed segment, and a state document a partition). These rows'
``base MiB`` is the resident size once the store is filled (the store is the process's), and what their
verdict judges is the planner's growth (``judged MiB``; for the other kinds the step's peak itself): the size
after imports plus the step's peak above the filled store, less the plan chunks the step wrote to the store
(``written MiB``: the store keeps them; on S3 they leave the process). Freed memory the filling left could
hide some of that growth; the child collects garbage and trims malloc's heap before taking the baseline, and
``--traced`` also records the step's peak of Python allocations (tracemalloc, whatever memory they reuse;
several times slower, so its times and resident sizes are not the untraced run's).

Prints a table and writes ``--json`` (again after each row); ``--from-json`` prints them again from one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from bench_scan import _status_kib  # same directory: on sys.path as the script's
from synth_inventory import kafka_layout_rows, kept_rows

from tiering.demo.inventory import write_inventory
from tiering.storage.s3 import S3Store, make_client

BUCKET: Final = "segments"
PREFIX: Final = "logs"
PER_PARTITION: Final = 100
PEAK_LIMIT_MIB: Final = 512
GROWTH_LIMIT: Final = 1.5


def _reset_peak() -> None:
    """Start the high-water mark (VmHWM) afresh: each step's peak is its own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


MOTO_KINDS: Final = ("compact", "merge", "compact-keys", "cleanup")  # planned from an inventory in moto
MEMORY_KINDS: Final = ("rollback", "tier")  # planned from a bucket in the child's memory
KINDS: Final = MOTO_KINDS + MEMORY_KINDS


def _stepper(steps: dict[str, dict[str, float]]) -> Step:
    """A step's wall and CPU time and its own peak resident size (VmHWM reset at its start)."""
    def step(name: str, work: Callable[[], Any]) -> Any:
        _reset_peak()
        wall, cpu = time.perf_counter(), _cpu()
        out = work()
        steps[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu,
                       "peak_rss_kib": _status_kib("VmHWM")}
        return out
    return step


def child(endpoint: str, uri: str, run_id: str, kind: str) -> dict[str, Any]:
    """Plan a run of ``kind`` from the inventory at ``uri``, in this fresh process; what each step cost."""
    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    baseline = _status_kib("VmRSS")
    steps: dict[str, dict[str, float]] = {}
    step = _stepper(steps)
    if kind == "compact":
        figures = _plan_compaction(store, uri, run_id, step)
    else:
        figures = _plan_engine(store, uri, run_id, kind, step)
    return {"kind": kind, **figures, "steps": steps, "baseline_rss_kib": baseline,
            "peak_rss_kib": max(s["peak_rss_kib"] for s in steps.values()), "requests": dict(store.requests)}


Step = Callable[[str, Callable[[], Any]], Any]


def _plan_compaction(store: S3Store, uri: str, run_id: str, step: Step) -> dict[str, int]:
    from tiering.plan.scan import ScanOptions  # noqa: PLC0415
    from tiering.run import engine  # noqa: PLC0415
    from tiering.run.documents import CompactOptions  # noqa: PLC0415
    from tiering.run.pipeline import RunSettings, compaction_kind, plan_run, scan_run  # noqa: PLC0415

    settings = RunSettings(BUCKET, PREFIX, run_id, "zstd", 3)
    scanned = step("scan", lambda: scan_run(store, settings, ScanOptions("zstd", 3, min_age_minutes=0),
                                            inventory=uri))
    planned = step("plan", lambda: plan_run(store, settings, CompactOptions()))
    kind = compaction_kind(settings, CompactOptions()).started(store, PREFIX)
    units = step("units", lambda: engine.plan(store, settings.context(store), kind, parallelism=2))
    return {"objects": scanned.objects, "segments": scanned.totals.segments, "planned": planned.segments,
            "chunks": units.chunks, "units": len(units.units)}


def _plan_engine(store: S3Store, uri: str, run_id: str, kind_name: str, step: Step) -> dict[str, int]:
    from tiering.kafka.merge import Limits  # noqa: PLC0415
    from tiering.plan.inventory import inventory_objects  # noqa: PLC0415
    from tiering.run import engine  # noqa: PLC0415
    from tiering.run.cleanup import Cleanup, CleanupOptions  # noqa: PLC0415
    from tiering.run.keycompact import KeyCompaction, KeyCompactOptions  # noqa: PLC0415
    from tiering.run.merge import MergeOptions, Merging  # noqa: PLC0415
    from tiering.run.pipeline import RunSettings  # noqa: PLC0415

    ctx = RunSettings(BUCKET, PREFIX, run_id, "none", None).context(store)
    kind: engine.Kind[Any] = (Merging(MergeOptions(Limits(8 << 30, 1 << 30))) if kind_name == "merge" else
                              KeyCompaction(KeyCompactOptions(topics="events-.*")) if kind_name == "compact-keys"
                              else Cleanup(CleanupOptions()))
    kind = kind.started(store, PREFIX)
    listed = [0]

    def source() -> Any:
        _, objects = inventory_objects(store, uri, PREFIX)
        for info in objects:
            listed[0] += 1
            yield info

    planned = step("plan", lambda: engine.plan(store, ctx, kind, parallelism=2, source=source()))
    return {"objects": listed[0], "segments": sum(p.segments for u in planned.units for p in u.partitions),
            "planned": sum(len(u.partitions) for u in planned.units), "chunks": planned.chunks,
            "units": len(planned.units)}


TIER_POLICY: Final = {"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "STANDARD_IA"},
                                                      {"after.days": 90, "storage.class": "GLACIER_IR"}]}}


def child_in_memory(segments: int, run_id: str, kind: str, *, traced: bool = False) -> dict[str, Any]:
    """Plan a rollback or a tiering run of a bucket of ``segments`` segments held in this fresh process
    (``bench/plan_buckets.py``); the bucket filled before the measured step, its size the step's baseline.
    ``traced``: the step's Python allocations traced too (tracemalloc: their peak, whatever memory they reuse;
    slower, and the tracer's own memory is in the resident sizes)."""
    from plan_buckets import IndexedMemoryStore, fill_rollback, fill_tier, release_free_memory  # noqa: PLC0415

    from tiering.cost.prices import load_prices  # noqa: PLC0415
    from tiering.plan.policy import parse_policy  # noqa: PLC0415
    from tiering.run import engine  # noqa: PLC0415
    from tiering.run.pipeline import RunSettings  # noqa: PLC0415
    from tiering.run.rollback import Rollback, RollbackOptions  # noqa: PLC0415
    from tiering.run.tier import Tiering, TierOptions  # noqa: PLC0415
    from tiering.storage.layout import reserved_key  # noqa: PLC0415

    imports = _status_kib("VmRSS")
    partitions = -(-segments // PER_PARTITION)
    store = IndexedMemoryStore(BUCKET)
    started = time.perf_counter()
    target = "compacted"  # the run a rollback undoes
    objects = (fill_rollback(store, PREFIX, target, partitions, PER_PARTITION) if kind == "rollback" else
               fill_tier(store, PREFIX, partitions, PER_PARTITION))
    filled_s = time.perf_counter() - started
    store.requests.clear()
    release_free_memory()
    baseline = _status_kib("VmRSS")
    steps: dict[str, dict[str, float]] = {}
    step = _stepper(steps)
    if traced:
        step = _traced(step, steps)
    ctx = RunSettings(BUCKET, PREFIX, run_id, "none", None).context(store)
    planned: Any
    if kind == "rollback":
        rollback = Rollback(RollbackOptions(target)).started(store, PREFIX)
        planned = step("plan", lambda: engine.plan(store, ctx, rollback, parallelism=2))
        expected = partitions * PER_PARTITION  # every segment's originals put back
    else:
        tiering = Tiering(TierOptions(parse_policy(TIER_POLICY), load_prices("us-east-1"))).started(store, PREFIX)
        planned = step("plan", lambda: engine.plan(store, ctx, tiering, parallelism=2))
        expected = partitions * (PER_PARTITION - 1)  # every sealed segment's .log moves (the active one stays)
    requests = dict(store.requests)
    written = sum(o.size for o in store.list(reserved_key(PREFIX, "runs", run_id) + "/"))  # the plan chunks
    todo = sum(p.segments for u in planned.units for p in u.partitions)
    planned_partitions = sum(len(u.partitions) for u in planned.units)
    if (todo, planned_partitions) != (expected, partitions) or planned.refused:
        raise RuntimeError(f"the {kind} plan is not the bucket's: {todo:,} segments in {planned_partitions:,} "
                           f"partitions (expected {expected:,} in {partitions:,}), {len(planned.refused)} refused")
    return {"kind": kind, "objects": objects, "segments": todo, "seeded": partitions * PER_PARTITION,
            "planned": planned_partitions, "chunks": planned.chunks, "units": len(planned.units),
            "steps": steps, "imports_rss_kib": imports, "baseline_rss_kib": baseline, "fill_s": filled_s,
            "peak_rss_kib": max(s["peak_rss_kib"] for s in steps.values()), "requests": requests,
            "written_kib": written / 1024}


def _traced(step: Step, steps: dict[str, dict[str, float]]) -> Step:
    """``step`` with its Python allocations traced: their peak above the step's start (``traced_peak_kib``)."""
    def traced(name: str, work: Callable[[], Any]) -> Any:
        tracemalloc.start()
        try:
            return step(name, work)
        finally:
            steps[name]["traced_peak_kib"] = tracemalloc.get_traced_memory()[1] / 1024
            tracemalloc.stop()
    return traced


def planner_peak_kib(row: dict[str, Any]) -> float:
    """The peak a verdict judges: the step's own peak where the bucket is elsewhere (moto); where the bucket
    is in the process (rollback, tier), the size after imports plus what the step added above the filled
    store, less the plan chunks it wrote to the store (kept there: on S3 they leave the process)."""
    if "imports_rss_kib" not in row:
        return float(row["peak_rss_kib"])
    return float(row["imports_rss_kib"] + row["peak_rss_kib"] - row["baseline_rss_kib"] - row.get("written_kib", 0))


def run_size(endpoint: str | None, segments: int, kinds: list[str],
             done: Callable[[dict[str, Any]], object] = lambda row: None, flags: Sequence[str] = ()
             ) -> list[dict[str, Any]]:
    uri = kept = ""
    if endpoint is not None and any(k in MOTO_KINDS for k in kinds):
        store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
        now = datetime.now(UTC) - timedelta(hours=1)
        partitions = -(-segments // PER_PARTITION)
        started = time.perf_counter()
        uri = write_inventory(store, BUCKET, f"inventory/{segments}", kafka_layout_rows(
            partitions, PER_PARTITION, prefix=PREFIX, now=now), created_at=now)
        kept = "" if "cleanup" not in kinds else write_inventory(
            store, BUCKET, f"inventory/{segments}-kept", kept_rows(partitions, PER_PARTITION, prefix=PREFIX, now=now),
            created_at=now)
        print(f"  {segments:,} segments: inventory written in {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
    rows = []
    for kind in kinds:
        args = (["--segments-child", str(segments), *flags] if kind in MEMORY_KINDS else
                ["--endpoint", str(endpoint), "--uri", kept if kind == "cleanup" else uri])
        out = subprocess.run([sys.executable, __file__, "--child", *args, "--run-id", f"bench-{kind}-{segments}",
                              "--kind", kind], capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the {kind} child failed (exit {out.returncode}): {out.stderr[-2000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        done(rows[-1])
        took = sum(s["wall_s"] for s in rows[-1]["steps"].values())
        filled = f" (the bucket filled in {rows[-1]['fill_s']:.0f} s)" if "fill_s" in rows[-1] else ""
        print(f"  {segments:,} segments: {kind} planned in {took:.0f} s{filled}", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'kind':<13} {'segments':>10} {'objects':>10} {'planned':>8} {'chunks':>6} {'units':>5} "
            f"{'wall s':>7} {'CPU s':>7} {'CPU s/M obj':>11} {'GETs':>9} {'base MiB':>8} {'peak MiB':>8} "
            f"{'written MiB':>11} {'judged MiB':>10}")
    lines = [head]
    for r in rows:
        wall = sum(s["wall_s"] for s in r["steps"].values())
        cpu = sum(s["cpu_s"] for s in r["steps"].values())
        lines.append(f"{r['kind']:<13} {r['segments']:>10,} {r['objects']:>10,} {r['planned']:>8,} {r['chunks']:>6} "
                     f"{r['units']:>5} {wall:>7.1f} {cpu:>7.1f} {cpu / max(1, r['objects']) * 1e6:>11.1f} "
                     f"{r['requests'].get('GetObject', 0):>9,} {r['baseline_rss_kib'] / 1024:>8.0f} "
                     f"{r['peak_rss_kib'] / 1024:>8.0f} {_written(r):>11} {planner_peak_kib(r) / 1024:>10.0f}")
    return "\n".join(lines)


def _written(row: dict[str, Any]) -> str:
    """The plan chunks the step wrote to a store in the process (none where the bucket is moto's)."""
    return f"{row['written_kib'] / 1024:.1f}" if "written_kib" in row else "-"


def verdicts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind: the largest peak against the limit, and the largest size's peak over the smallest's (the peak
    :func:`planner_peak_kib` gives: for rollback and tier, the size after imports plus the step's growth above
    the filled store, less the plan chunks the store keeps)."""
    out = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        peaks = [planner_peak_kib(r) / 1024 for r in rows if r["kind"] == kind]
        out[kind] = {"peak_rss_mib_max": round(max(peaks), 1), "peak_within_limit": max(peaks) <= PEAK_LIMIT_MIB,
                     "growth_largest_over_smallest": round(peaks[-1] / peaks[0], 3),
                     "growth_within_limit": peaks[-1] / peaks[0] <= GROWTH_LIMIT}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", default="100000,1000000", help="sizes, comma-separated (default %(default)s)")
    p.add_argument("--kinds", default=",".join(KINDS), help="kinds of run to plan, comma-separated "
                   "(default %(default)s)")
    p.add_argument("--json", type=Path, default=Path("bench/out/bench_plan_scale.json"))
    p.add_argument("--from-json", type=Path, help="print the table and verdicts of a run's --json (nothing run)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help="rollback and tier: also trace the plan step's Python "
                   "allocations (tracemalloc; slower, its own memory in the resident sizes)")
    p.add_argument("--segments-child", dest="child_segments", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")  # moto takes any credentials
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.from_json is not None:  # a run's rows judged again (nothing measured)
        saved = json.loads(args.from_json.read_text())["rows"]
        return report(saved, verdicts(saved))
    if args.child:
        print(json.dumps(child_in_memory(args.child_segments, args.run_id, args.kind, traced=args.traced)
                         if args.kind in MEMORY_KINDS
                         else child(args.endpoint, args.uri, args.run_id, args.kind)))
        return 0

    sizes = [int(s) for s in args.segments.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        p.error(f"unknown kinds {unknown}: expected some of {', '.join(KINDS)}")
    rows: list[dict[str, Any]] = []
    measured: list[dict[str, Any]] = []

    def write_json(row: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
        """The rows so far and their verdicts, written to ``--json`` (again after each row)."""
        measured.extend([row] if row else [])
        verdict = verdicts(measured)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": measured, "verdict": verdict, "python": platform.python_version(),
                                         "cpus": os.cpu_count(), "commit": _commit()}, indent=1) + "\n")
        return verdict

    with contextlib.ExitStack() as stack:
        endpoint = None
        if any(k in MOTO_KINDS for k in kinds):
            from tiering.demo.s3 import moto_server  # noqa: PLC0415

            endpoint = stack.enter_context(moto_server())
            make_client(endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        for segments in sizes:
            rows += run_size(endpoint, segments, kinds, write_json, ["--traced"] if args.traced else [])
    return report(rows, write_json())


def report(rows: list[dict[str, Any]], verdict: dict[str, dict[str, Any]]) -> int:
    """The table and the verdict lines printed; 0 when every kind held."""
    print(table(rows))
    for kind, v in verdict.items():
        what = ("peak RSS" if kind in MOTO_KINDS else
                "RSS after imports plus the plan's peak above the filled store, less the plan chunks it holds,")
        print(f"{kind}: {what} at most {v['peak_rss_mib_max']} MiB (limit {PEAK_LIMIT_MIB}); largest over smallest "
              f"{v['growth_largest_over_smallest']} (limit {GROWTH_LIMIT})")
    held = all(v["peak_within_limit"] and v["growth_within_limit"] for v in verdict.values())
    return 0 if held else 1


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
