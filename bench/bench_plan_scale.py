"""Planning at scale: every kind of run planned from an S3 Inventory report of up to a million segments.

    .venv/bin/python bench/bench_plan_scale.py                          # 100,000 and 1,000,000 segments
    .venv/bin/python bench/bench_plan_scale.py --segments 20000 --kinds merge --json bench/out/plan.json

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

Prints a table and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
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


KINDS: Final = ("compact", "merge", "compact-keys", "cleanup")


def child(endpoint: str, uri: str, run_id: str, kind: str) -> dict[str, Any]:
    """Plan a run of ``kind`` from the inventory at ``uri``, in this fresh process; what each step cost."""
    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    baseline = _status_kib("VmRSS")
    steps: dict[str, dict[str, float]] = {}

    def step(name: str, work: Callable[[], Any]) -> Any:
        _reset_peak()
        wall, cpu = time.perf_counter(), _cpu()
        out = work()
        steps[name] = {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu,
                       "peak_rss_kib": _status_kib("VmHWM")}
        return out

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


def run_size(endpoint: str, segments: int, kinds: list[str]) -> list[dict[str, Any]]:
    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    now = datetime.now(UTC) - timedelta(hours=1)
    partitions = -(-segments // PER_PARTITION)
    started = time.perf_counter()
    uri = write_inventory(store, BUCKET, f"inventory/{segments}", kafka_layout_rows(
        partitions, PER_PARTITION, prefix=PREFIX, now=now), created_at=now)
    kept = None if "cleanup" not in kinds else write_inventory(
        store, BUCKET, f"inventory/{segments}-kept", kept_rows(partitions, PER_PARTITION, prefix=PREFIX, now=now),
        created_at=now)
    print(f"  {segments:,} segments: inventory written in {time.perf_counter() - started:.0f} s", file=sys.stderr,
          flush=True)
    rows = []
    for kind in kinds:
        source = kept if kind == "cleanup" and kept is not None else uri
        out = subprocess.run([sys.executable, __file__, "--child", "--endpoint", endpoint, "--uri", source, "--run-id",
                              f"bench-{kind}-{segments}", "--kind", kind], capture_output=True, text=True,
                             check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the {kind} child failed (exit {out.returncode}): {out.stderr[-2000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        took = sum(s["wall_s"] for s in rows[-1]["steps"].values())
        print(f"  {segments:,} segments: {kind} planned in {took:.0f} s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'kind':<13} {'segments':>10} {'objects':>10} {'planned':>8} {'chunks':>6} {'units':>5} "
            f"{'wall s':>7} {'CPU s':>7} {'CPU s/M obj':>11} {'base MiB':>8} {'peak MiB':>8}")
    lines = [head]
    for r in rows:
        wall = sum(s["wall_s"] for s in r["steps"].values())
        cpu = sum(s["cpu_s"] for s in r["steps"].values())
        lines.append(f"{r['kind']:<13} {r['segments']:>10,} {r['objects']:>10,} {r['planned']:>8,} {r['chunks']:>6} "
                     f"{r['units']:>5} {wall:>7.1f} {cpu:>7.1f} {cpu / max(1, r['objects']) * 1e6:>11.1f} "
                     f"{r['baseline_rss_kib'] / 1024:>8.0f} {r['peak_rss_kib'] / 1024:>8.0f}")
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind: the largest peak against the limit, and the largest size's peak over the smallest's."""
    out = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        peaks = [r["peak_rss_kib"] / 1024 for r in rows if r["kind"] == kind]
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
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    p.add_argument("--kind", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")  # moto takes any credentials
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.child:
        print(json.dumps(child(args.endpoint, args.uri, args.run_id, args.kind)))
        return 0
    from tiering.demo.s3 import moto_server  # noqa: PLC0415

    sizes = [int(s) for s in args.segments.split(",")]
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        p.error(f"unknown kinds {unknown}: expected some of {', '.join(KINDS)}")
    rows = []
    with moto_server() as endpoint:
        make_client(endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        for segments in sizes:
            rows += run_size(endpoint, segments, kinds)
    print(table(rows))
    verdict = verdicts(rows)
    for kind, v in verdict.items():
        print(f"{kind}: peak RSS at most {v['peak_rss_mib_max']} MiB (limit {PEAK_LIMIT_MIB}); largest over smallest "
              f"{v['growth_largest_over_smallest']} (limit {GROWTH_LIMIT})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "verdict": verdict, "python": platform.python_version(),
                                     "cpus": os.cpu_count(), "commit": _commit()}, indent=1) + "\n")
    held = all(v["peak_within_limit"] and v["growth_within_limit"] for v in verdict.values())
    return 0 if held else 1


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
