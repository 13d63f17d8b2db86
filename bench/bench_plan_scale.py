"""Scan + plan at scale: the DAG's scan and plan steps over an S3 Inventory report of up to a million segments.

    .venv/bin/python bench/bench_plan_scale.py                          # 100,000 and 1,000,000 segments
    .venv/bin/python bench/bench_plan_scale.py --segments 20000 --json bench/out/bench_plan_scale.json

One moto server (``tiering.demo.s3.moto_server``, in this process) holds, per size, an inventory report of
a Kafka ``logdir`` (``bench/synth_inventory.py``: 4 objects a segment, 100 segments a partition, gzip CSV
files of 250,000 rows, written as AWS writes them; not measured). Each size is then planned by a fresh
child process running what the DAG's tasks run: ``scan_run(..., inventory=URI)`` (read the report, spill
it by partition, classify, write the scan's chunks) and ``plan_run`` (budget, chunks for the commit
step). The child reports per step its wall time and CPU time (``getrusage``, all threads), and its peak
resident size (VmHWM) against its size after imports. The claim checked: memory does not grow with the
bucket (peak RSS at the largest size within 1.5x of the smallest, and at most 512 MiB).

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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from bench_scan import _status_kib  # same directory: on sys.path as the script's
from synth_inventory import kafka_layout_rows

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


def child(endpoint: str, uri: str, run_id: str) -> dict[str, Any]:
    """Scan and plan from the inventory at ``uri``, in this fresh process; what each step cost."""
    from tiering.plan.scan import ScanOptions  # noqa: PLC0415
    from tiering.run.documents import CompactOptions  # noqa: PLC0415
    from tiering.run.pipeline import RunSettings, plan_run, scan_run  # noqa: PLC0415

    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    settings = RunSettings(BUCKET, PREFIX, run_id, "zstd", 3)
    baseline = _status_kib("VmRSS")
    steps: dict[str, dict[str, float]] = {}
    _reset_peak()
    wall, cpu = time.perf_counter(), _cpu()
    scanned = scan_run(store, settings, ScanOptions("zstd", 3, min_age_minutes=0), inventory=uri)
    steps["scan"] = {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu, "peak_rss_kib": _status_kib("VmHWM")}
    _reset_peak()
    wall, cpu = time.perf_counter(), _cpu()
    planned = plan_run(store, settings, CompactOptions())
    steps["plan"] = {"wall_s": time.perf_counter() - wall, "cpu_s": _cpu() - cpu, "peak_rss_kib": _status_kib("VmHWM")}
    return {"objects": scanned.objects, "segments": scanned.totals.segments,
            "to_compact": planned.segments, "chunks": len(planned.chunks), "steps": steps,
            "baseline_rss_kib": baseline, "peak_rss_kib": max(s["peak_rss_kib"] for s in steps.values()),
            "requests": dict(store.requests)}


def run_size(endpoint: str, segments: int) -> dict[str, Any]:
    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    now = datetime.now(UTC) - timedelta(hours=1)
    partitions = -(-segments // PER_PARTITION)
    started = time.perf_counter()
    uri = write_inventory(store, BUCKET, f"inventory/{segments}", kafka_layout_rows(
        partitions, PER_PARTITION, prefix=PREFIX, now=now), created_at=now)
    print(f"  {segments:,} segments: inventory written in {time.perf_counter() - started:.0f} s", file=sys.stderr,
          flush=True)
    out = subprocess.run([sys.executable, __file__, "--child", "--endpoint", endpoint, "--uri", uri, "--run-id",
                          f"bench-{segments}"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"the child failed (exit {out.returncode}): {out.stderr[-2000:]}")
    measured: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return measured


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'segments':>10} {'objects':>10} {'chunks':>6} {'scan s':>8} {'scan CPU':>9} {'plan s':>8} "
            f"{'plan CPU':>9} {'CPU s/M obj':>11} {'base MiB':>8} {'scan peak':>9} {'plan peak':>9}")
    lines = [head]
    for r in rows:
        scan, plan = r["steps"]["scan"], r["steps"]["plan"]
        per_million = (scan["cpu_s"] + plan["cpu_s"]) / r["objects"] * 1e6
        lines.append(f"{r['segments']:>10,} {r['objects']:>10,} {r['chunks']:>6} {scan['wall_s']:>8.1f} "
                     f"{scan['cpu_s']:>9.1f} {plan['wall_s']:>8.1f} {plan['cpu_s']:>9.1f} {per_million:>11.1f} "
                     f"{r['baseline_rss_kib'] / 1024:>8.0f} {scan['peak_rss_kib'] / 1024:>9.0f} "
                     f"{plan['peak_rss_kib'] / 1024:>9.0f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segments", default="100000,1000000", help="sizes, comma-separated (default %(default)s)")
    p.add_argument("--json", type=Path, default=Path("bench/out/bench_plan_scale.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--uri", help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")  # moto takes any credentials
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.child:
        print(json.dumps(child(args.endpoint, args.uri, args.run_id)))
        return 0
    from tiering.demo.s3 import moto_server  # noqa: PLC0415

    sizes = [int(s) for s in args.segments.split(",")]
    rows = []
    with moto_server() as endpoint:
        make_client(endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
        for segments in sizes:
            rows.append(run_size(endpoint, segments))
    print(table(rows))
    peaks = [r["peak_rss_kib"] / 1024 for r in rows]
    verdict = {"peak_rss_mib_max": round(max(peaks), 1), "peak_within_limit": max(peaks) <= PEAK_LIMIT_MIB,
               "growth_largest_over_smallest": round(peaks[-1] / peaks[0], 3),
               "growth_within_limit": peaks[-1] / peaks[0] <= GROWTH_LIMIT}
    print(f"peak RSS at most {verdict['peak_rss_mib_max']} MiB (limit {PEAK_LIMIT_MIB}); largest over smallest "
          f"{verdict['growth_largest_over_smallest']} (limit {GROWTH_LIMIT})")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "verdict": verdict, "python": platform.python_version(),
                                     "cpus": os.cpu_count(), "commit": _commit()}, indent=1) + "\n")
    return 0 if verdict["peak_within_limit"] and verdict["growth_within_limit"] else 1


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
