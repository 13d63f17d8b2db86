"""Key compaction of a compacted topic's partition: time, peak memory, and what is left.

    make bench-keycompact
    .venv/bin/python bench/bench_keycompact.py --keys 100000 --updates 2000000 --max-keys 0 50000

A partition directory is generated: ``--updates`` records of a changelog (a key drawn from ``--keys`` keys,
skewed so that some keys change often; a JSON value; 3 % tombstones), 100 records a batch, zstd, a plain
producer, in segments of ``--segment-mib``, then one more record in the active segment. Each run is
``tiering partition compact-keys`` on it in its own process (``--max-keys`` 0: no bound on the key map;
N: at most N keys a pass, passes repeated from the printed end offset until the range is done). Reported:
bytes and records before and after, passes, wall and CPU seconds, source MiB/s, and the process's own peak
RSS (VmHWM).

With ``--s3``, each bound is also run through S3: the partition uploaded to a moto server in its own
process, then ``tiering s3 compact-keys`` (each run in its own process; with a bound, runs repeated until
the partition's checkpoint is cleared), every changed segment staged, backed up and swapped. Reported
beside the local pass, in the same run: wall seconds (S3 / local), the CLI process's CPU seconds and peak
RSS, and the S3 requests from the run documents. The moto server shares this machine's cores.

Prints a table and writes ``bench/out/bench_keycompact.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_s3 import moto_process  # same directory: on sys.path as the script's

from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.records import Record
from tiering.lifecycle.state import load_state
from tiering.run.documents import RunResult
from tiering.storage.layout import run_result_key

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
T0 = 1_764_000_000_000
PER_BATCH = 100
LETTERS = "abcdefghijklmnopqrstuvwxyz"
CHILD = """
import json, resource, sys, time
from pathlib import Path
from tiering.kafka.keycompact import CleanOptions
from tiering.kafka.records import Engine
from tiering.local import compact_keys_dir
src, out, max_keys, first = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
started, cpu = time.perf_counter(), time.process_time()
done = compact_keys_dir(src, out, CleanOptions(now_ms=int(sys.argv[5]), first_dirty_offset=first,
                                               max_keys=max_keys or None, engine=Engine(sys.argv[6])))
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                  "vmhwm_kib": hwm, "end_offset": done.facts.end_offset, "upper": done.facts.upper,
                  "stats": done.stats.to_json()}))
"""


def generate(directory: Path, keys: int, updates: int, segment_bytes: int, seed: int = 3,
             note_bytes: int = 0) -> dict[str, int]:
    """A changelog partition directory; what it holds. ``note_bytes``: a free-text field of that many random
    letters in each value (what zstd cannot shrink: it sets the partition's size)."""
    rng = random.Random(seed)
    directory.mkdir(parents=True)
    offset = base = 0
    seg = bytearray()
    size = segments = 0

    def seal(next_base: int) -> None:
        nonlocal seg, base, size, segments
        (directory / f"{base:020d}.log").write_bytes(seg)
        size += len(seg)
        segments += 1
        seg, base = bytearray(), next_base

    while offset < updates:
        records = []
        for _ in range(min(PER_BATCH, updates - offset)):
            key = int(keys * rng.random() ** 2)  # skewed: low keys change more often
            value = None if rng.random() < 0.03 else json.dumps(
                {"id": key, "version": offset, "status": rng.choice(("new", "paid", "shipped", "done")),
                 "amount_cents": rng.randint(100, 99_999),
                 **({"note": "".join(rng.choices(LETTERS, k=note_bytes))} if note_bytes else {})},
                separators=(",", ":")).encode()
            records.append(Record(offset, T0 + offset, b"order-%d" % key, value, ()))
            offset += 1
        batch = build_batch(BatchSpec(records[0].offset, Codec.ZSTD), records)
        if seg and len(seg) + len(batch) > segment_bytes:
            seal(records[0].offset)
        seg += batch
    seal(offset)
    active = build_batch(BatchSpec(offset, Codec.ZSTD), [Record(offset, T0 + offset, b"order-0", b"{}", ())])
    (directory / f"{offset:020d}.log").write_bytes(active)
    return {"bytes": size, "segments": segments, "records": updates, "keys": keys}


def compact(src: Path, work: Path, max_keys: int, engine: str = "native") -> dict[str, Any]:
    """Passes of ``compact-keys`` (each in its own process, with ``engine``) until the cleaned range is done."""
    passes, seconds, cpu, hwm, first = 0, 0.0, 0.0, 0, 0
    current = src
    while True:
        out = work / f"pass{passes}"
        done = subprocess.run([sys.executable, "-c", CHILD, str(current), str(out), str(max_keys), str(first),
                               str(T0 + 10**9), engine], capture_output=True, text=True, check=True)
        doc = json.loads(done.stdout)
        passes += 1
        seconds += doc["seconds"]
        cpu += doc["cpu"]
        hwm = max(hwm, doc["vmhwm_kib"])
        if current != src:
            shutil.rmtree(current)
        current, first = out, doc["end_offset"]
        if doc["end_offset"] >= doc["upper"]:
            break
    after = sum(p.stat().st_size for p in current.glob("*.log")) - (current / max(
        p.name for p in current.glob("*.log"))).stat().st_size
    records = doc["stats"]["records_out"]
    shutil.rmtree(current)
    return {"engine": engine, "max_keys": max_keys, "passes": passes, "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu, 2), "peak_rss_mib": round(hwm / 1024, 1), "bytes_after": after,
            "records_after": records}


S3_CHILD = """
import json, sys
from tiering.cli import main
code = main(sys.argv[1:])
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"exit": code, "vmhwm_kib": hwm}), file=sys.stderr)
"""


def compact_s3(src: Path, max_keys: int) -> dict[str, Any]:
    """Runs of ``tiering s3 compact-keys`` over ``src`` uploaded to a moto server, until a run clears the
    partition's checkpoint."""
    bucket, prefix = "bench-keys", "kafka"
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(name, value)  # the moto server's (it checks no credential)
    with moto_process(bucket) as (store, endpoint, _):
        for path in sorted(src.iterdir()):
            with path.open("rb") as body:
                store.client.upload_fileobj(body, bucket, f"{prefix}/{src.name}/{path.name}")
        runs, seconds, cpu, hwm, requests = 0, 0.0, 0.0, 0, 0
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        while True:
            run_id = f"bench-{runs}"
            cmd = [sys.executable, "-c", S3_CHILD, "s3", "compact-keys", "--bucket", bucket, "--prefix", prefix,
                   "--topics", ".*", "--now-ms", str(T0 + 10**9), "--min-age-minutes", "0", "--run-id", run_id,
                   "--no-report", "--json", *(["--max-keys", str(max_keys)] if max_keys else [])]
            started = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            seconds += time.perf_counter() - started
            tail = json.loads(done.stderr.strip().splitlines()[-1])
            if tail["exit"] != 0:
                raise RuntimeError(f"s3 compact-keys exited {tail['exit']}: {done.stderr[-2000:]}")
            runs += 1
            hwm = max(hwm, tail["vmhwm_kib"])
            key = run_result_key(prefix, run_id, "compact-keys")
            run = RunResult.from_json(store.get_json(key)[0], key)
            cpu += float(run.usage.get("compute_seconds", 0.0))
            requests += sum(n for ops in run.usage.get("requests", {}).values() for n in ops.values())
            if load_state(store, prefix, src.name).keys_checkpoint is None:
                break
        logs = sorted((i for i in store.list(f"{prefix}/{src.name}/") if i.key.endswith(".log")), key=lambda i: i.key)
        after = sum(info.size for info in logs[:-1])
    return {"runs": runs, "s3_seconds": round(seconds, 2), "s3_pass_seconds": round(cpu, 2),
            "s3_peak_rss_mib": round(hwm / 1024, 1), "s3_requests": requests, "s3_bytes_after": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--updates", type=int, default=2_000_000)
    ap.add_argument("--segment-mib", type=float, default=64)
    ap.add_argument("--max-keys", type=int, nargs="+", default=[0, 50_000],
                    help="key map bounds to run with (0: none)")
    ap.add_argument("--note-bytes", type=int, default=0,
                    help="random letters added to each value (sets the partition's size; default none)")
    ap.add_argument("--engines", nargs="+", choices=["native", "python"], default=["native"],
                    help="who does the record work: the compiled engine, the Python reference, or both in turn "
                         "(the S3 runs use the first)")
    ap.add_argument("--s3", action="store_true", help="also run each bound through S3 (a moto server)")
    ap.add_argument("--out", type=Path, default=OUT_DIR / "bench_keycompact.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-keycompact-") as tmp:
        src = Path(tmp) / "orders.changelog-0"
        started = time.perf_counter()
        source = generate(src, args.keys, args.updates, int(args.segment_mib * MIB), note_bytes=args.note_bytes)
        print(f"generated {source['records']:,} records over {source['keys']:,} keys: {source['bytes']:,} bytes in "
              f"{source['segments']} segments ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
        rows = [compact(src, Path(tmp), n, e) for n in args.max_keys for e in args.engines]
        if args.s3:
            for r in rows:
                if r["engine"] != args.engines[0]:
                    continue
                r.update(compact_s3(src, r["max_keys"]))
                r["s3_over_local"] = round(r["s3_seconds"] / r["seconds"], 2)
    for r in rows:
        r["ratio"] = round(r["bytes_after"] / source["bytes"], 4)
        r["mib_per_s"] = round(source["bytes"] / MIB / r["seconds"], 2)
    print(f"\n{'engine':>7} {'max keys':>9} {'passes':>6} {'bytes after':>12} {'ratio':>7} {'records after':>13} "
          f"{'s':>7} {'cpu s':>7} {'MiB/s':>6} {'peak RSS MiB':>12}")
    for r in rows:
        print(f"{r['engine']:>7} {r['max_keys'] or 'none':>9} {r['passes']:>6} {r['bytes_after']:>12,} {r['ratio']:>7} "
              f"{r['records_after']:>13,} {r['seconds']:>7} {r['cpu_seconds']:>7} {r['mib_per_s']:>6} "
              f"{r['peak_rss_mib']:>12}")
    if args.s3:
        print(f"\n{'max keys':>9} {'S3 runs':>7} {'S3 s':>7} {'S3/local':>8} {'pass s':>7} {'requests':>8} "
              f"{'bytes after':>12} {'CLI peak RSS MiB':>16}")
        for r in rows:
            if "runs" not in r:
                continue
            print(f"{r['max_keys'] or 'none':>9} {r['runs']:>7} {r['s3_seconds']:>7} {r['s3_over_local']:>8} "
                  f"{r['s3_pass_seconds']:>7} {r['s3_requests']:>8,} {r['s3_bytes_after']:>12,} "
                  f"{r['s3_peak_rss_mib']:>16}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"source": source, "runs": rows, "machine": {
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "max_rss_self_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}}, indent=2))
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
