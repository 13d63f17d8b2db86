"""The Spark path's scaling and cost, measured in one run.

    make bench-spark                # 16 sealed segments of 64 MiB (1 GiB), 2 pairs: ~12 minutes here
    .venv/bin/python bench/bench_spark.py --partitions 8 --segments 3 --segment-mib 64 --repeat 2
    .venv/bin/python bench/bench_spark.py --segment-mib 8 --repeat 3   # a small plan: Spark's fixed costs show

The same plan (``--partitions`` partitions of ``--segments`` segments, the last one active, snappy JSON
events) is compacted to zstd, each time on its own copy of the data in a moto server running in another
process on this machine:

1. ``--repeat`` interleaved pairs of Spark ``local[1]`` (one single-threaded task at a time) and Spark
   ``local[2]`` (two at a time), the run engine's compaction (each task compacts and swaps in its
   partitions); the best work time of each master gives the speed-up (every pair's own ratio is printed too);
2. the machine's own ceiling for the same kind of work: one single-threaded rewrite alone, then two at once
   (no Spark, no S3, no JVM), so the speed-up can be read against what two vCPUs here actually give;
3. the single-process CLI path (``tiering s3 compact``), for comparison.

Reported: the speed-up of ``local[2]`` over ``local[1]`` for the tasks' work (measured inside the job,
without the JVM's start-up) and for the whole ``spark-submit``; the Spark path's wall time as a ratio to
the CLI path's; and the share of the machine's CPU the moto server took during the ``local[2]`` job (the
endpoint competes with Spark for the same two cores).

Prints a table and writes ``bench/out/bench_spark.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_s3 import moto_process

from tiering.demo.sample import write_segment
from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.plan.scan import ScanOptions
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.pipeline import RunSettings, compaction_kind, plan_run, scan_run
from tiering.spark.daemon import DAEMON_CONF, DAEMON_MODULE
from tiering.spark.submit import submit
from tiering.storage.layout import run_result_key
from tiering.storage.s3 import S3Store

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
JOB = Path(__file__).parents[1] / "spark_jobs" / "run_kind.py"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rewrite_seconds(stats: dict[str, object] | None) -> float:
    value = (stats or {}).get("seconds", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def _seed(store: S3Store, prefix: str, generated: Any, partitions: int) -> None:
    for p in range(partitions):
        upload_partition(store, prefix, "events", p, generated)


def _spark_path(store: S3Store, prefix: str, master: str, server_pid: int, daemon: str) -> dict[str, Any]:
    settings = RunSettings(store.bucket, prefix, f"bench-{re.sub(r'[^a-z0-9]', '', master)}", "zstd", 3)
    scan_run(store, settings, ScanOptions("zstd", 3, min_age_minutes=0))
    planned = plan_run(store, settings, CompactOptions())
    lines: list[str] = []
    server_cpu = _cpu_seconds(server_pid)
    started = time.perf_counter()
    kind = compaction_kind(settings, CompactOptions())
    submit(JOB, ["--kind", kind.run_kind.value, "--settings", json.dumps(settings.to_json()),
                 "--options", json.dumps(kind.options_json())],
           master=master, conf={"spark.log.level": "WARN", DAEMON_CONF: daemon}, log=lines.append)
    submit_seconds = time.perf_counter() - started
    server_cpu = _cpu_seconds(server_pid) - server_cpu
    work = float(next(line.split(":")[1].split(";")[0] for line in lines
                      if line.startswith(f"{kind.label} seconds:")))
    key = run_result_key(prefix, settings.run_id, kind.run_kind)
    run = RunResult.from_json(store.get_json(key)[0], key)
    assert run.totals().get("compacted") == planned.segments, run.totals()
    return {"master": master, "segments": planned.segments, "bytes": planned.bytes,
            "stage_seconds": round(work, 2), "submit_seconds": round(submit_seconds, 2),
            "wall_seconds": round(submit_seconds, 2),
            "server_cpu_seconds_during_submit": round(server_cpu, 2),
            # the rewrite loop of every task (GET stream, decompress, validate, compress, proof), summed: if it
            # grows from local[1] to local[2], the tasks slow each other down (CPU, memory bandwidth, server)
            "task_rewrite_seconds_sum": round(sum(_rewrite_seconds(r.stats) for r in run.segments), 2),
            # each Spark task from start to result (S3 reads and writes, read-back, journal included), summed
            "task_seconds_sum": round(float(run.usage.get("compute_seconds", 0.0)), 2)}


_ONE_CORE_REWRITE = """
import io, sys
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment
data = open(sys.argv[1], "rb").read()
rewrite_segment(io.BytesIO(data), io.BytesIO(), base_offset=0,
                options=RewriteOptions(Codec.ZSTD, 3, proof_thread=False))
"""


def _machine_ceiling(segment_mib: float, repeat: int) -> dict[str, Any]:
    """What this machine gives two single-threaded rewrites at once, without Spark, S3 or a JVM: the same
    rewrite (one core, as a Spark task runs it) alone, then two copies at the same time, interleaved; the
    ceiling is 2 x alone / the slower of the two together (2.0 on two cores that do not slow each other)."""
    with tempfile.TemporaryDirectory(prefix="tiering-ceiling-") as tmp:
        path = Path(tmp) / "00000000000000000000.log"
        with path.open("wb") as f:
            write_segment(f, base_offset=0, kind="json", codec=Codec.SNAPPY, target_bytes=int(segment_mib * MIB),
                          seed=11)
        cmd = [sys.executable, "-c", _ONE_CORE_REWRITE, str(path)]
        alone, together = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            subprocess.run(cmd, check=True)
            alone.append(time.perf_counter() - started)
            started = time.perf_counter()
            procs = [subprocess.Popen(cmd) for _ in range(2)]
            for proc in procs:
                if proc.wait() != 0:
                    raise RuntimeError("the ceiling's rewrite failed")
            together.append(time.perf_counter() - started)
    ceiling = 2 * statistics.median(alone) / statistics.median(together)
    return {"segment_mib": segment_mib, "alone_seconds": [round(x, 2) for x in alone],
            "two_at_once_seconds": [round(x, 2) for x in together], "ceiling": round(ceiling, 3)}


def _cli_path(endpoint: str, bucket: str, prefix: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "tiering", "s3", "compact", "--bucket", bucket, "--prefix", prefix,
                           "--codec", "zstd", "--level", "3", "--min-age-minutes", "0", "--json",
                           "--endpoint-url", endpoint], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    totals = json.loads(done.stdout)["totals"]
    return {"wall_seconds": round(seconds, 2), "compacted": totals.get("compacted", 0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--segments", type=int, default=3, help="per partition, the last one active")
    parser.add_argument("--segment-mib", type=float, default=64,
                        help="segment size (Kafka's default is 1 GiB; small segments measure Spark's fixed costs)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="local[1] / local[2] pairs, interleaved, each on fresh copies (default %(default)s)")
    parser.add_argument("--daemon", choices=[DAEMON_MODULE, "pyspark.daemon"], default=DAEMON_MODULE,
                        help="the executors' Python daemon: ours (imports done once, before the fork) or Spark's "
                             "(imports in every worker, pyspark from Spark's zip)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_spark.json")
    args = parser.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ[name] = "bench"
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with moto_process("bench") as (store, endpoint, server_pid):
        os.environ["AWS_ENDPOINT_URL"] = endpoint  # for spark-submit's driver and executors
        generated = generate_partition(segments=args.segments, kind="json", codec=Codec.SNAPPY,
                                       segment_bytes=int(args.segment_mib * MIB))
        pairs = []
        for rep in range(max(1, args.repeat)):  # interleaved: a slow spell of the machine hits both masters
            for prefix in (f"local1-{rep}", f"local2-{rep}"):
                _seed(store, prefix, generated, args.partitions)
            print(f"pair {rep + 1}: local[1] ...", file=sys.stderr)
            first = _spark_path(store, f"local1-{rep}", "local[1]", server_pid, args.daemon)
            print(f"  {first}\npair {rep + 1}: local[2] ...", file=sys.stderr)
            second = _spark_path(store, f"local2-{rep}", "local[2]", server_pid, args.daemon)
            print(f"  {second}", file=sys.stderr)
            pairs.append((first, second))
        print("machine ceiling: one rewrite alone, then two at once ...", file=sys.stderr)
        ceiling = _machine_ceiling(max(1.0, args.segment_mib), max(3, args.repeat))
        _seed(store, "cli", generated, args.partitions)
        print("CLI ...", file=sys.stderr)
        cli = _cli_path(endpoint, "bench", "cli")
    # Best of the repeats for each master (the usual guard against a noisy machine), and every pair's ratio.
    one = min((a for a, _ in pairs), key=lambda r: r["stage_seconds"])
    two = min((b for _, b in pairs), key=lambda r: r["stage_seconds"])
    doc = {"daemon": args.daemon, "segments": one["segments"], "bytes": one["bytes"], "local_1": one, "local_2": two,
           "cli": cli, "machine_ceiling": ceiling,
           "pairs": [{"local_1_stage": a["stage_seconds"], "local_2_stage": b["stage_seconds"],
                      "speedup_stage": round(a["stage_seconds"] / b["stage_seconds"], 3)} for a, b in pairs],
           "speedup_stage": round(one["stage_seconds"] / two["stage_seconds"], 3),
           "speedup_submit": round(one["submit_seconds"] / two["submit_seconds"], 3),
           "spark_wall_to_cli": round(two["wall_seconds"] / cli["wall_seconds"], 3),
           "server_cpu_share_local_2": round(two["server_cpu_seconds_during_submit"]
                                             / (2 * two["submit_seconds"]), 3),
           "cpus": os.cpu_count()}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'measure':<58} {'value':>10}")
    for name, value in (
        (f"plan: {doc['segments']} segments, {doc['bytes'] / MIB:.0f} MiB", ""),
        *((f"pair {i + 1}: local[1] / local[2] stage seconds, speed-up",
           f"{p['local_1_stage']:.1f}/{p['local_2_stage']:.1f} {p['speedup_stage']:.2f}")
          for i, p in enumerate(doc["pairs"])),
        ("local[1] work seconds, best of the pairs (inside the job)", f"{one['stage_seconds']:.1f}"),
        ("local[2] work seconds, best of the pairs (inside the job)", f"{two['stage_seconds']:.1f}"),
        ("speed-up local[2] / local[1], stage, best of each", f"{doc['speedup_stage']:.2f}"),
        ("speed-up local[2] / local[1], whole spark-submit", f"{doc['speedup_submit']:.2f}"),
        ("this machine's ceiling: 2 one-core rewrites at once vs one", f"{ceiling['ceiling']:.2f}"),
        ("Spark path wall (submit + commit), local[2], seconds", f"{two['wall_seconds']:.1f}"),
        ("CLI path wall (tiering s3 compact), seconds", f"{cli['wall_seconds']:.1f}"),
        ("Spark path / CLI path, wall time", f"{doc['spark_wall_to_cli']:.2f}"),
        ("moto server's share of the 2 CPUs during local[2]", f"{doc['server_cpu_share_local_2']:.0%}"),
        ("tasks' rewrite loops summed, local[1] / local[2], seconds",
         f"{one['task_rewrite_seconds_sum']:.1f}/{two['task_rewrite_seconds_sum']:.1f}"),
        ("whole tasks summed, local[1] / local[2], seconds",
         f"{one['task_seconds_sum']:.1f}/{two['task_seconds_sum']:.1f}"),
    ):
        print(f"{name:<58} {value:>10}")
    print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
