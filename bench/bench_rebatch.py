"""Re-batching: what merging small batches saves on top of recompression, and what it costs.

    make bench-rebatch
    .venv/bin/python bench/bench_rebatch.py --records 100000 --repeat 7

For topics of 1, 5, 20 and 100 records a batch (JSON events of a plain producer, snappy, as a producer with
``linger.ms=0`` writes them), one segment of ``--records`` records is rewritten to zstd level 3 twice in the
same run: recompression alone (``tiering segment rewrite``), and re-batching then recompression
(``--rebatch``). Reported: stored bytes of each, the re-batched size over the recompressed-only size,
batches before and after, the throughput of both (source MiB per second, best of ``--repeat`` rounds that
alternate the two) and their ratio, in wall time and in CPU seconds (re-batching compresses and proves on a
second thread). ``--engine python`` re-batches with the Python reference instead of the
compiled record layer.

Then memory: ``tiering segment rewrite --rebatch`` as its own process on segments of ``--rss-mib`` sizes
(default 64 and 1024 MiB) of the same 5-records-a-batch topic, its peak RSS (VmHWM, which exec starts
afresh, unlike the ``wait4`` figure that keeps the forking parent's);
re-batching holds at most its lookahead of batches, so the peak should not grow with the segment.

Prints a table and writes ``bench/out/bench_rebatch.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_rewrite import run_measured  # same directory: on sys.path as the script's

from tiering.kafka.builder import BatchSpec, build_batch, rebase_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.records import Engine, Record
from tiering.kafka.rewrite import RewriteOptions
from tiering.local import rewrite_file

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
T0 = 1_764_000_000_000
PAGES = ("/", "/cart", "/checkout", "/search", "/product", "/account")


def json_records(n: int, seed: int = 7) -> list[Record]:
    """Click events like a web frontend's: a user id key, a JSON value, a timestamp a few ms apart."""
    rng = random.Random(seed)
    out = []
    ts = T0
    for i in range(n):
        ts += rng.randint(0, 40)
        user = rng.randint(1, 50_000)
        value = json.dumps({"event": rng.choice(("view", "click", "add_to_cart", "purchase")), "user_id": user,
                            "session": f"{rng.getrandbits(64):016x}", "page": rng.choice(PAGES),
                            "product_id": rng.randint(1, 9_999), "price_cents": rng.randint(99, 99_999),
                            "ts": ts}, separators=(",", ":")).encode()
        out.append(Record(i, ts, b"user-%d" % user, value))
    return out


def write_topic(path: Path, records: list[Record], per_batch: int) -> int:
    """A segment of ``per_batch`` records a batch (snappy, no producer id); its batch count."""
    batches = 0
    with path.open("wb") as f:
        for at in range(0, len(records), per_batch):
            chunk = records[at:at + per_batch]
            f.write(build_batch(BatchSpec(chunk[0].offset, Codec.SNAPPY), chunk))
            batches += 1
    return batches


def _best_pair(path: Path, tmp: Path, options: RewriteOptions, rebatch: RebatchOptions,
               repeat: int) -> tuple[tuple[float, Any, float], tuple[float, Any, float]]:
    """Best of ``repeat`` rewrites without and with re-batching, their rounds interleaved so that both see
    the same machine (a ratio of two separate series drifts with whatever else the machine does): for each,
    (wall seconds, result, CPU seconds of the process, every thread's)."""
    best: dict[bool, tuple[float, Any]] = {False: (float("inf"), None), True: (float("inf"), None)}
    cpu = {False: float("inf"), True: float("inf")}
    for _ in range(repeat):
        for merged in (False, True):
            started, cpu_started = time.perf_counter(), time.process_time()
            result, _ = rewrite_file(path, tmp / ("merged" if merged else "plain"), options,
                                     rebatch=rebatch if merged else None)
            best[merged] = min(best[merged], (time.perf_counter() - started, result), key=lambda b: b[0])
            cpu[merged] = min(cpu[merged], time.process_time() - cpu_started)
    return (best[False][0], best[False][1], cpu[False]), (best[True][0], best[True][1], cpu[True])


def rss_of_rebatching(tmp: Path, records: list[Record], size_mib: int, per_batch: int = 5) -> dict[str, Any]:
    """Peak RSS and wall time of ``tiering segment rewrite --rebatch`` on a segment of ``size_mib`` MiB: the
    batches of ``records`` laid out again and again (rebase_batch) until the size is reached."""
    templates = [build_batch(BatchSpec(0, Codec.SNAPPY),
                             [dataclasses.replace(r, offset=j) for j, r in enumerate(records[i:i + per_batch])])
                 for i in range(0, len(records), per_batch)]
    folder = tmp / f"rss-{size_mib}"
    folder.mkdir()
    path = folder / f"{0:020d}.log"
    written, offset, shift = 0, 0, 0
    with path.open("wb") as f:
        while written < size_mib * MIB:
            for template in templates:
                batch = rebase_batch(template, offset, shift)
                f.write(batch)
                written += len(batch)
                offset += per_batch
            shift += 10_000_000
    run = run_measured([sys.executable, "-m", "tiering", "segment", "rewrite", str(path), "--out",
                        str(folder / "out"), "--codec", "zstd", "--rebatch"])
    if run.returncode != 0:
        raise RuntimeError(f"tiering segment rewrite --rebatch exited {run.returncode} on {path}: "
                           f"{run.stderr.decode()}")
    path.unlink()
    return {"segment_mib": size_mib, "bytes": written, "peak_rss_mib": round(run.peak_rss_mib, 1),
            "seconds": round(run.seconds, 1), "mib_per_s": round(written / MIB / run.seconds, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000, help="records in each topic's segment")
    parser.add_argument("--per-batch", type=int, nargs="+", default=[1, 5, 20, 100], help="records a batch")
    parser.add_argument("--repeat", type=int, default=7, help="rounds of both rewrites (the best of each is kept)")
    parser.add_argument("--engine", choices=[e.value for e in Engine], default=Engine.NATIVE.value,
                        help="what does the record work (default: the compiled record layer)")
    parser.add_argument("--rss-mib", type=int, nargs="*", default=[64, 1024],
                        help="segment sizes whose re-batching's peak RSS is measured (none: skip)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_rebatch.json")
    args = parser.parse_args(argv)
    records = json_records(args.records)
    options = RewriteOptions(Codec.ZSTD, 3)
    rebatch = RebatchOptions(Codec.ZSTD, 3, engine=Engine(args.engine))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for per_batch in args.per_batch:
            path = Path(tmp) / f"{0:020d}.log"
            batches = write_topic(path, records, per_batch)
            size = path.stat().st_size
            (plain_s, plain, plain_cpu), (merged_s, merged, merged_cpu) = _best_pair(path, Path(tmp), options,
                                                                                   rebatch, args.repeat)
            rows.append({
                "records_per_batch": per_batch, "records": args.records, "batches": batches, "source_bytes": size,
                "recompressed_bytes": plain.stats.bytes_out, "rebatched_bytes": merged.stats.bytes_out,
                "rebatched_over_recompressed": round(merged.stats.bytes_out / plain.stats.bytes_out, 3),
                "batches_after_rebatch": merged.rebatch.batches_out,
                "recompress_mib_per_s": round(size / MIB / plain_s, 1),
                "rebatch_mib_per_s": round(size / MIB / merged_s, 1),
                "rebatch_speed_over_recompress": round(plain_s / merged_s, 2),
                "recompress_cpu_seconds": round(plain_cpu, 3), "rebatch_cpu_seconds": round(merged_cpu, 3),
                "rebatch_cpu_speed_over_recompress": round(plain_cpu / merged_cpu, 2)})
            print(f"  {per_batch} a batch: {plain.stats.bytes_out:,} vs {merged.stats.bytes_out:,} bytes",
                  file=sys.stderr)
        memory = []
        for size_mib in args.rss_mib:
            print(f"  peak RSS of re-batching {size_mib} MiB ...", file=sys.stderr)
            memory.append(rss_of_rebatching(Path(tmp), records, size_mib))
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "codec": "zstd", "level": 3, "source_codec": "snappy", "engine": args.engine, "rows": rows,
           "memory": memory}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\n{'a batch':>7} {'batches':>8} {'source':>10} {'recompressed':>13} {'re-batched':>11} {'ratio':>6} "
          f"{'batches after':>13} {'MiB/s':>6} {'MiB/s rb':>8} {'speed rb/alone':>14} {'CPU rb/alone':>12}")
    for r in rows:
        print(f"{r['records_per_batch']:>7} {r['batches']:>8,} {r['source_bytes']:>10,} {r['recompressed_bytes']:>13,} "
              f"{r['rebatched_bytes']:>11,} {r['rebatched_over_recompressed']:>6.3f} {r['batches_after_rebatch']:>13,} "
              f"{r['recompress_mib_per_s']:>6.1f} {r['rebatch_mib_per_s']:>8.1f} "
              f"{r['rebatch_speed_over_recompress']:>14.2f} {r['rebatch_cpu_speed_over_recompress']:>12.2f}")
    if memory:
        print(f"\n{'segment':>10} {'peak RSS':>9} {'seconds':>8} {'MiB/s':>6}  (tiering segment rewrite --rebatch)")
        for m in memory:
            print(f"{m['segment_mib']:>6} MiB {m['peak_rss_mib']:>5.0f} MiB {m['seconds']:>8.1f} "
                  f"{m['mib_per_s']:>6.1f}")
        print(f"peak RSS, largest over smallest: {memory[-1]['peak_rss_mib'] / memory[0]['peak_rss_mib']:.2f}")
    print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
