"""The scanner's listing path alone: CPU time and memory of ``scan`` over buckets of ``--objects`` objects.

    .venv/bin/python bench/bench_scan.py                       # 100,000 objects
    .venv/bin/python bench/bench_scan.py --objects 30000,100000 --json bench/out/bench_scan.json

One moto server (``tiering.demo.s3.moto_server``, in this process) holds one bucket per size, seeded
through moto's backend (not measured; HTTP PUTs to a server sharing this process's GIL go at ~160/s):
a Kafka ``logdir`` under ``logs/``, partitions ``<topic>-<p>`` of up to 100 segments, each segment
``<20-digit base offset>.log``, ``.index``, ``.timeindex`` and ``.snapshot`` with 16-byte bodies (the scan
reads listings only). A bucket per size, because moto answers a prefixed listing by walking every key of
the bucket.

Each size is scanned by a fresh child process (this script with ``--child``) so that its memory is the
scan's alone: after its imports and the S3 client, it reads its resident size (VmRSS, the baseline),
resets its high-water mark, then calls ``--entry`` (``module:function`` taking ``(store, prefix, options)``)
with ``ScanOptions("zstd", min_age_minutes=0)``; it counts the result's segments (a plan's ``segments``, a
dict's, or any iterable, consumed inside the measurement) and reads ``objects_listed`` when the result has
it. Around that call only: wall time, CPU time (``getrusage(RUSAGE_SELF)``, user + system, all threads),
then peak RSS (VmHWM). The wall time includes the moto server's work (same machine, other process); the
CPU seconds and the memory are the scanner's.

Prints a table and writes ``--json`` (rows plus the machine, versions and git commit).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import importlib
import importlib.metadata
import io
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterable, Sized
from pathlib import Path
from typing import Any

from tiering.plan.scan import ScanOptions
from tiering.storage.s3 import S3Store, make_client

OUT_DIR = Path(__file__).parent / "out"
ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
PREFIX = "logs"
SEGMENTS_PER_PARTITION = 100
FILES_PER_SEGMENT = (".log", ".index", ".timeindex", ".snapshot")
TOPICS = 20
BODY = b"\0" * 16
DEFAULT_ENTRY = "tiering.plan.scan:scan"


def _status_kib(field: str) -> int:
    """A ``VmRSS``/``VmHWM``-like field of this process's ``/proc/self/status``, in KiB (0 if absent)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _reset_peak_rss() -> bool:
    """Set VmHWM back to the current RSS (Linux >= 4.0); False where the kernel does not allow it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _counts(result: Any) -> tuple[int, int | None]:
    """(segments, objects listed or None) of whatever the entry returned: a plan, a dict or an iterable."""
    if isinstance(result, dict):
        segs = result.get("segments")
        segments = len(segs) if segs is not None else int(result["totals"]["segments"])
        objects = result.get("objects_listed")
    else:
        items = getattr(result, "segments", result)
        segments = len(items) if isinstance(items, Sized) else sum(1 for _ in items)
        objects = getattr(result, "objects_listed", None)  # read after the iteration: a stream knows it only then
    return segments, None if objects is None else int(objects)


def scan_step(store: S3Store, prefix: str, options: ScanOptions) -> dict[str, Any]:
    """The DAG's scan step (``tiering.run.pipeline.scan_run``): the scan and the plan documents it writes to S3.
    The same call works on earlier versions of the package, so that one command compares them."""
    from tiering.run.pipeline import RunSettings, scan_run  # noqa: PLC0415 - the entry measured is imported late

    result: Any = scan_run(store, RunSettings(store.bucket, prefix, "bench-scan", "zstd"), options)
    doc = result.to_json() if hasattr(result, "to_json") else result  # a typed step, or an earlier version's dict
    return {"totals": doc["totals"], "objects_listed": doc["objects"]}


def child(endpoint: str, bucket: str, entry: str, workers: int | None) -> dict[str, Any]:
    """One measured scan, in this (fresh) process."""
    module, _, name = entry.partition(":")
    loaded = importlib.import_module(module)
    fn = getattr(loaded, name)
    store = S3Store(make_client(endpoint_url=endpoint), bucket)
    options = ScanOptions("zstd", min_age_minutes=0)
    if workers:  # else the scanner's default
        options = dataclasses.replace(options, workers=workers)
    gc.collect()
    baseline_kib = _status_kib("VmRSS")
    hwm_reset = _reset_peak_rss()
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    result = fn(store, PREFIX, options)
    segments, objects = _counts(result)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    peak_kib = _status_kib("VmHWM")
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    return {"segments": segments, "objects_listed": objects, "wall_s": wall, "user_s": user, "sys_s": system,
            "cpu_s": user + system, "baseline_rss_kib": baseline_kib, "peak_rss_kib": peak_kib,
            "rss_after_kib": _status_kib("VmRSS"), "hwm_reset": hwm_reset, "workers": options.workers,
            "requests": dict(store.requests), "entry_file": getattr(loaded, "__file__", None)}


def seed(endpoint: str, bucket: str, objects: int) -> int:
    """``objects`` segment files in ``bucket`` (created here) through moto's backend; the number of partitions."""
    from moto.core.models import DEFAULT_ACCOUNT_ID  # noqa: PLC0415 - moto only where a server runs
    from moto.s3.models import s3_backends  # noqa: PLC0415

    make_client(endpoint_url=endpoint).create_bucket(Bucket=bucket)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]  # the server's own backend: this process
    segments = objects // len(FILES_PER_SEGMENT)
    partitions = -(-segments // SEGMENTS_PER_PARTITION)
    for s in range(segments):
        p, n = divmod(s, SEGMENTS_PER_PARTITION)
        directory = f"{PREFIX}/events.t{p % TOPICS:02d}-{p // TOPICS}"
        for suffix in FILES_PER_SEGMENT:
            backend.put_object(bucket, f"{directory}/{n * 1000:020d}{suffix}", BODY)
    return partitions


def run_child(endpoint: str, bucket: str, entry: str, workers: int | None, tree: str | None = None) -> dict[str, Any]:
    """One measured scan in a fresh process; ``tree``: a directory whose ``tiering`` package it imports."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--endpoint", endpoint, "--bucket", bucket,
           "--entry", entry] + (["--workers", str(workers)] if workers else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*([tree] if tree else []), str(ROOT)])}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"the scan of {bucket} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def export_tree(rev: str) -> str:
    """``rev``'s ``tiering`` package in a temporary directory (removed at exit), with this checkout's compiled
    extensions (they are built at install, not committed)."""
    import atexit  # noqa: PLC0415
    import shutil  # noqa: PLC0415
    import tarfile  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    tree = tempfile.mkdtemp(prefix="bench-scan-")
    atexit.register(shutil.rmtree, tree, True)
    archive = subprocess.run(["git", "archive", rev, "tiering"], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    for built in (ROOT / "tiering").rglob("*.so"):
        shutil.copy2(built, Path(tree) / built.relative_to(ROOT))
    return tree


def row(objects: int, partitions: int, measured: dict[str, Any]) -> dict[str, Any]:
    m = measured
    above_kib = m["peak_rss_kib"] - m["baseline_rss_kib"]
    return {"objects": objects, "objects_listed": m["objects_listed"], "partitions": partitions,
            "segments": m["segments"], "wall_s": round(m["wall_s"], 3), "cpu_s": round(m["cpu_s"], 3),
            "user_s": round(m["user_s"], 3), "sys_s": round(m["sys_s"], 3),
            "cpu_ms_per_1k_objects": round(m["cpu_s"] * 1e6 / objects, 2),
            "peak_rss_mib": round(m["peak_rss_kib"] / 1024, 1),
            "baseline_rss_mib": round(m["baseline_rss_kib"] / 1024, 1),
            "rss_above_baseline_mib": round(above_kib / 1024, 1),
            "kib_per_object": round(above_kib / objects, 3), "rss_after_mib": round(m["rss_after_kib"] / 1024, 1),
            "peak_rss_reset_before_scan": m["hwm_reset"], "workers": m["workers"], "requests": m["requests"],
            "entry_file": m["entry_file"]}


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def entry_source(entry: str, file: str | None) -> dict[str, Any]:
    """Which scanner was measured: its file, and whether that file is the one in ``HEAD`` (the working tree may
    hold someone's uncommitted changes; ``PYTHONPATH`` may point at another tree)."""
    module = entry.partition(":")[0]
    head = _git("rev-parse", f"HEAD:{module.replace('.', '/')}.py")
    measured = _git("hash-object", file) if file else None
    return {"entry": entry, "entry_file": file,
            "entry_file_matches_head": None if head is None or measured is None else head == measured}


def machine() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for package in ("moto", "boto3", "botocore"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            **versions, "git_commit": _git("rev-parse", "HEAD"),
            "git_tracked_changes": None if status is None else bool(status)}


def print_table(rows: Iterable[dict[str, Any]]) -> None:
    header = ("objects", "segments", "wall s", "CPU s", "CPU ms/1k obj", "peak RSS MiB", "above base MiB",
              "KiB/object")
    print(" ".join(f"{h:>14}" for h in header), " tree")
    for r in rows:
        cells = (f"{r['objects']:,}", f"{r['segments']:,}", f"{r['wall_s']:.2f}", f"{r['cpu_s']:.2f}",
                 f"{r['cpu_ms_per_1k_objects']:.1f}", f"{r['peak_rss_mib']:.1f}", f"{r['rss_above_baseline_mib']:.1f}",
                 f"{r['kib_per_object']:.2f}")
        print(" ".join(f"{c:>14}" for c in cells), "", r.get("tree", ""))


def _sizes(text: str) -> list[int]:
    sizes = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    if not sizes or any(n <= 0 or n % len(FILES_PER_SEGMENT) for n in sizes):
        raise argparse.ArgumentTypeError(f"positive multiples of {len(FILES_PER_SEGMENT)} (files per segment)")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=_sizes, default=[100_000], help="objects per bucket, comma-separated")
    parser.add_argument("--json", type=Path, default=OUT_DIR / "bench_scan.json", help="where the JSON goes")
    parser.add_argument("--workers", type=int, default=None, help="scan workers (default: the scanner's)")
    parser.add_argument("--entry", default=DEFAULT_ENTRY,
                        help=f"the scanner, module:function(store, prefix, options) (default {DEFAULT_ENTRY})")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also measure the package as it was at this git revision, each size in turn, and "
                             "print new over old (the revision's tiering/ is exported to a temporary directory, "
                             "with this checkout's compiled extensions)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--bucket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workers is not None and args.workers < 1:
        parser.error("--workers must be at least 1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto accepts any; never a real account here
        os.environ[name] = "bench"
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.pop("AWS_ENDPOINT_URL_S3", None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.child:
        print(json.dumps(child(args.endpoint, args.bucket, args.entry, args.workers)))
        return 0
    from tiering.demo.s3 import moto_server  # noqa: PLC0415 - not in the child: its baseline stays the scanner's

    rows = []
    with moto_server() as endpoint:
        seeded = {}
        for objects in dict.fromkeys(args.objects):
            started = time.perf_counter()
            seeded[objects] = seed(endpoint, f"bench-scan-{objects}", objects)
            print(f"  seeded {objects:,} objects ({seeded[objects]} partitions) in "
                  f"{time.perf_counter() - started:.1f} s", file=sys.stderr)
        old_tree = export_tree(args.baseline) if args.baseline else None
        for objects in args.objects:
            print(f"  scanning {objects:,} objects ...", file=sys.stderr)
            if old_tree is not None:
                old = row(objects, seeded[objects], run_child(endpoint, f"bench-scan-{objects}", args.entry,
                                                              args.workers, old_tree))
                rows.append({**old, "tree": args.baseline})
            rows.append({**row(objects, seeded[objects], run_child(endpoint, f"bench-scan-{objects}", args.entry,
                                                                   args.workers)), "tree": "working tree"})
    doc = {**entry_source(args.entry, rows[0]["entry_file"]), "prefix": PREFIX, "machine": machine(), "rows": rows}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    print()
    print_table(rows)
    if args.baseline:
        for old, new in zip(rows[::2], rows[1::2], strict=True):
            print(f"{new['objects']:,} objects: CPU new/old {new['cpu_s'] / old['cpu_s']:.2f}, peak RSS above "
                  f"baseline new/old {new['rss_above_baseline_mib'] / max(old['rss_above_baseline_mib'], 0.1):.2f}")
    print(f"\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
