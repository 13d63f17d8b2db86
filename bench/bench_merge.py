"""Merging small segments: objects and bytes before and after, and the time it takes.

    make bench-merge
    .venv/bin/python bench/bench_merge.py --segments 1000 --records 200 --target-mib 1 16 1024

A partition of ``--segments`` small sealed segments (``--records`` JSON click events each, snappy batches of
5 records, as a low-throughput topic rolled by ``segment.ms`` leaves them; each with the ``.index`` and
``.timeindex`` Kafka builds) and its active segment is merged by ``tiering partition merge`` (its own process,
as a user runs it) once per target ``segment.bytes``. Reported per target: segments and files before and
after, the bytes of all files before and after, wall seconds, source MiB per second and peak RSS (VmHWM).
The partition is written once and only read by the merges.

With ``--s3`` the same partition is also uploaded to a moto server (its own process, on loopback) and merged
there by ``tiering s3 merge`` (its own process) at the first target: objects before and after, wall seconds,
the S3 requests the run counted and what they cost at list prices (the run's report).

Prints a table and writes ``bench/out/bench_merge.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_rebatch import json_records  # same directory: on sys.path as the script's
from bench_rewrite import run_measured
from bench_s3 import moto_process

from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.index import BatchPosition, build_indexes
from tiering.kafka.records import Record

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
PER_BATCH = 5


def write_partition(folder: Path, segments: int, records: int) -> None:
    """``segments`` sealed segments of ``records`` records each, then an active one, with their indexes."""
    events = json_records(segments * records + PER_BATCH)
    folder.mkdir(parents=True)
    for s in range(segments + 1):
        chunk = events[s * records:(s + 1) * records] if s < segments else events[segments * records:]
        base = chunk[0].offset
        log, positions = bytearray(), []
        for at in range(0, len(chunk), PER_BATCH):
            batch = chunk[at:at + PER_BATCH]
            positions.append(BatchPosition(len(log), batch[-1].offset, max(r.timestamp for r in batch)))
            log += build_batch(BatchSpec(base + at, Codec.SNAPPY), [Record(r.offset, r.timestamp, r.key, r.value)
                                                                   for r in batch])
        indexes = build_indexes(base, positions)
        (folder / f"{base:020d}.log").write_bytes(log)
        (folder / f"{base:020d}.index").write_bytes(indexes.offset_index)
        (folder / f"{base:020d}.timeindex").write_bytes(indexes.time_index)
    (folder / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")


def _files(folder: Path) -> tuple[int, int, int]:
    """(segments, files, bytes of all files) of a partition directory."""
    files = [p for p in folder.iterdir() if p.is_file()]
    return sum(p.suffix == ".log" for p in files), len(files), sum(p.stat().st_size for p in files)


def merge_once(partition: Path, out: Path, target: int) -> dict[str, Any]:
    run = run_measured([sys.executable, "-m", "tiering", "partition", "merge", str(partition), "--out", str(out),
                        "--segment-bytes", str(target), "--json"])
    seconds = run.seconds
    if run.returncode != 0:
        raise RuntimeError(f"tiering partition merge exited {run.returncode} on {partition}: {run.stderr.decode()}")
    doc = json.loads(run.stdout)
    segments, files, size = _files(partition)
    after_segments, after_files, after_size = _files(out)
    assert (doc["segments_before"], doc["segments_after"]) == (segments, after_segments)
    return {"target_bytes": target, "segments_before": segments, "segments_after": after_segments,
            "files_before": files, "files_after": after_files, "bytes_before": size, "bytes_after": after_size,
            "merged_segments": len(doc["merged"]), "seconds": round(seconds, 2),
            "mib_per_s": round(size / MIB / seconds, 1), "peak_rss_mib": round(run.peak_rss_mib, 1)}


def merge_on_s3(partition: Path, target: int) -> dict[str, Any]:
    """The partition uploaded to a moto server and merged there by ``tiering s3 merge``, as a user runs it."""
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})  # moto's: any key will do
    env = dict(os.environ)
    with moto_process("bench-merge") as (store, endpoint, _):
        for f in sorted(partition.iterdir()):
            store.put(f"kafka/{partition.name}/{f.name}", f.read_bytes())
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tiering", "s3", "merge", "--bucket", "bench-merge", "--prefix",
                               "kafka", "--endpoint-url", endpoint, "--segment-bytes", str(target),
                               "--min-age-minutes", "0", "--run-id", "bench", "--json"],
                              capture_output=True, text=True, env=env, check=False)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"tiering s3 merge exited {done.returncode}: {done.stderr[-2000:]}")
        run = json.loads(done.stdout)
        report = store.get_json("kafka/_tiering/reports/bench/report.json")[0]
    assert run["exit_code"] == 0, run["totals"]
    by_operation = report["requests"]["requests_by_operation"]
    merged = report["merging"]
    return {"target_bytes": target, "segments_before": merged["segments_before"],
            "segments_after": merged["segments_after"], "objects_before": merged["objects_before"],
            "objects_after": merged["objects_after"], "seconds": round(seconds, 1),
            "requests": sum(by_operation.values()), "requests_usd": round(sum(c["usd"] for c in report["one_off"]
                                                           if c["item"] == "S3 requests"), 4),
            "requests_by_operation": by_operation}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--segments", type=int, default=1000, help="small sealed segments in the partition")
    parser.add_argument("--records", type=int, default=200, help="records in each")
    parser.add_argument("--target-mib", type=float, nargs="+", default=[1, 16, 1024],
                        help="the segment.bytes each merge aims at, in MiB (1024: Kafka's default)")
    parser.add_argument("--s3", action="store_true", help="also merge the partition on a moto server (first target)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_merge.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        partition = Path(tmp) / "clicks-0"
        print(f"  writing {args.segments:,} segments of {args.records} records ...", file=sys.stderr)
        write_partition(partition, args.segments, args.records)
        for i, mib in enumerate(args.target_mib):
            print(f"  merging up to {mib:g} MiB ...", file=sys.stderr)
            rows.append(merge_once(partition, Path(tmp) / f"out-{i}", int(mib * MIB)))
        on_s3 = None
        if args.s3:
            print(f"  uploading to a moto server and merging there up to {args.target_mib[0]:g} MiB ...",
                  file=sys.stderr)
            on_s3 = merge_on_s3(partition, int(args.target_mib[0] * MIB))
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "segments": args.segments, "records_per_segment": args.records, "records_per_batch": PER_BATCH,
           "source_codec": "snappy", "rows": rows, "s3": on_s3}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'segment.bytes':>13} {'segments':>17} {'files':>17} {'bytes':>25} {'seconds':>8} {'MiB/s':>6} "
          f"{'peak RSS':>9}")
    for r in rows:
        print(f"{r['target_bytes'] / MIB:>9g} MiB {r['segments_before']:>7,} → {r['segments_after']:<7,} "
              f"{r['files_before']:>7,} → {r['files_after']:<7,} {r['bytes_before']:>11,} → {r['bytes_after']:<11,} "
              f"{r['seconds']:>8.2f} {r['mib_per_s']:>6.1f} {r['peak_rss_mib']:>5.0f} MiB")
    if on_s3 is not None:
        print(f"\non S3 (moto), up to {on_s3['target_bytes'] / MIB:g} MiB: segments {on_s3['segments_before']:,} → "
              f"{on_s3['segments_after']:,}, objects {on_s3['objects_before']:,} → {on_s3['objects_after']:,}, "
              f"{on_s3['seconds']:.1f} s, {on_s3['requests']:,} requests "
              f"(${on_s3['requests_usd']} at list prices)")
    print(f"\nwritten to {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
