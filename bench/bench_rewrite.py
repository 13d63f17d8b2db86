"""Rewrite throughput as a ratio to the bare codec loop, and peak RSS of the CLI, measured in one run.

    make bench        # 256 MiB segment, RSS at 256 MiB and 1 GiB; the same as (--repeat 5 --slice-mib 16):
    .venv/bin/python bench/bench_rewrite.py --size-mib 256 --rss-sizes-mib 256,1024 --cli-repeat 3

The segment: JSON-like event values in ~16 KiB (uncompressed) batches compressed with snappy, as a
Java producer with ``compression.type=snappy`` writes them. Each configuration rewrites it to zstd
level 3; the baseline is the bare loop over the same batches in the same process: read, CRC-32C,
decompress, compress, nothing else. Throughput counts uncompressed record bytes.

The measurement is paired, because this machine's speed swings by tens of percent within seconds: the
segment is cut into slices (``--slice-mib``), and in each of ``--repeat`` rounds every slice is visited
by the configurations in a shuffled order, each visit bracketed by two visits of the bare loop to the
same slice (bare, A, bare, B, bare, ...). A visit's ratio is the mean of its two bare-loop visits over
its own time, so a slow spell weighs on both sides of it; a configuration's ratio is the median of its
visits' ratios (quartiles printed beside it). The best-of ratio (each slice's best time, summed: the
bare loop's visits right before the configuration's over the configuration's) is printed too: it
compares the fastest moments of different visits and so moves more with the machine. Then the whole
``tiering segment rewrite`` command runs as users run it (a new process: imports, start-up, reading and
writing real files, fsync included) for each segment size, ``--cli-repeat`` times, each run between two
passes of the bare loop over the same segment; its peak RSS is read from the kernel (VmHWM) while it runs.

Prints a table and writes ``bench/out/bench_rewrite.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import platform
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c

from tiering.demo.sample import write_segment
from tiering.kafka import _proof
from tiering.kafka.codecs import Codec, compress, decompress
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
_PREFIX = struct.Struct(">qi")


def make_segment(path: Path, size_mib: int) -> None:
    with path.open("wb") as f:
        write_segment(f, base_offset=0, kind="json", codec=Codec.SNAPPY, target_bytes=size_mib * MIB,
                      batch_bytes=16 * 1024, seed=7)


def bare_loop(data: bytes) -> int:
    """The floor: per batch only CRC-32C, decompress, compress. Returns uncompressed bytes."""
    view = memoryview(data)
    pos = total = 0
    while pos < len(view):
        _, length = _PREFIX.unpack_from(view, pos)
        batch = view[pos : pos + 12 + length]
        if crc32c.crc32c(batch[21:]) != struct.unpack_from(">I", batch, 17)[0]:
            raise ValueError(f"bad CRC at {pos}")
        records = decompress(Codec.SNAPPY, batch[61:])
        compress(Codec.ZSTD, records, level=3)
        total += len(records)
        pos += 12 + length
    return total


def split_segment(data: bytes, slice_bytes: int) -> list[bytes]:
    """The segment cut at batch boundaries into pieces of about ``slice_bytes`` (each a valid segment)."""
    pieces, start, pos = [], 0, 0
    while pos < len(data):
        _, length = _PREFIX.unpack_from(data, pos)
        pos += 12 + length
        if pos - start >= slice_bytes or pos == len(data):
            pieces.append(data[start:pos])
            start = pos
    return pieces


def rewrite_loop(data: bytes, options: RewriteOptions) -> int:
    """The rewriter over ``data``, its output written to the null device: real ``write`` calls whose bytes go
    nowhere, as the bare loop's compressed bytes go nowhere (a growing in-memory buffer would add page faults
    that writing to a file does not have; the CLI rows measure real files)."""
    base = _PREFIX.unpack_from(data, 0)[0]  # a slice starts at its first batch's offset
    with open(os.devnull, "wb") as sink:
        result = rewrite_segment(io.BytesIO(data), sink, base_offset=base, options=options)
    return result.stats.uncompressed_bytes


def best_of(repeat: int, fn: Callable[[], int]) -> tuple[float, int]:
    best = float("inf")
    produced = 0
    for _ in range(repeat):
        started = time.perf_counter()
        produced = fn()
        best = min(best, time.perf_counter() - started)
    return best, produced


def _vm_hwm_kib(pid: int) -> int | None:
    """The process's resident high-water mark (VmHWM): per address space, so exec starts it afresh
    (unlike ru_maxrss, which keeps the forking parent's size)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


@dataclasses.dataclass(frozen=True)
class Measured:
    """A command run as its own process: exit code, wall seconds, peak RSS (VmHWM), what it printed."""

    returncode: int
    seconds: float
    peak_rss_mib: float
    stdout: bytes
    stderr: bytes


def run_measured(cmd: list[str]) -> Measured:
    """Run ``cmd`` and poll its VmHWM every 20 ms while it runs (the mark only grows: what is missed is growth
    in its last 20 ms)."""
    started = time.perf_counter()
    peak_kib = 0
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        while proc.poll() is None:
            peak_kib = max(peak_kib, _vm_hwm_kib(proc.pid) or 0)
            time.sleep(0.02)
        seconds = time.perf_counter() - started
        stdout.seek(0)
        stderr.seek(0)
        return Measured(proc.returncode, seconds, peak_kib / 1024, stdout.read(), stderr.read())


def cli_run(segment: Path, out: Path) -> dict[str, Any]:
    """The whole ``tiering segment rewrite`` process: wall seconds and its peak RSS (VmHWM, polled)."""
    run = run_measured([sys.executable, "-m", "tiering", "segment", "rewrite", str(segment), "--out", str(out),
                        "--codec", "zstd", "--level", "3", "--json"])
    if run.returncode != 0:
        raise RuntimeError(f"rewrite failed ({run.returncode}): {run.stderr.decode()}")
    stats = json.loads(run.stdout)
    return {"seconds": run.seconds, "peak_rss_mib": run.peak_rss_mib,
            "uncompressed_bytes": stats["uncompressed_bytes"], "bytes_in": stats["bytes_in"],
            "bytes_out": stats["bytes_out"], "rewrite_seconds": stats["seconds"]}


def cli_pairs(segment: Path, out: Path, repeat: int) -> list[dict[str, Any]]:
    """``repeat`` CLI runs, each bracketed by passes of the bare loop over the same segment (in memory: the
    command reads the file, the bare loop does not), with the pair's ratio: the mean of the passes right before
    and right after the run over the run's seconds."""
    data = segment.read_bytes()
    pairs = []
    before, _ = best_of(1, lambda: bare_loop(data))
    for _ in range(repeat):
        run = cli_run(segment, out)
        shutil.rmtree(out)
        after, _ = best_of(1, lambda: bare_loop(data))
        run["bare_seconds"] = [before, after]
        run["ratio_to_bare"] = (before + after) / 2 / run["seconds"]
        pairs.append(run)
        print(f"  CLI on {len(data) / MIB:.0f} MiB: {run['seconds']:.1f} s ({run['rewrite_seconds']:.1f} s in the "
              f"rewrite; the rest is start-up, fsync and publishing), bare loop {before:.1f} s before, {after:.1f} s "
              f"after, peak RSS {run['peak_rss_mib']:.0f} MiB", file=sys.stderr)
        before = after
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=256, help="segment size for the throughput ratios")
    parser.add_argument("--rss-sizes-mib", default="256,1024", help="segment sizes for the CLI RSS runs")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds: visits of each slice by each configuration (each bracketed by the bare loop)")
    parser.add_argument("--slice-mib", type=int, default=16,
                        help="the segment is measured in slices of this size, every configuration on each in turn")
    parser.add_argument("--cli-repeat", type=int, default=3,
                        help="CLI runs per segment size, each between two bare-loop passes; the median pair counts")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_rewrite.json")
    args = parser.parse_args(argv)
    rss_sizes = [int(s) for s in args.rss_sizes_mib.split(",") if s]

    with tempfile.TemporaryDirectory(prefix="tiering-bench-") as tmp_name:
        tmp = Path(tmp_name)
        segment = tmp / "00000000000000000000.log"
        make_segment(segment, args.size_mib)
        data = segment.read_bytes()
        print(f"segment: {len(data) / MIB:.0f} MiB of snappy batches (JSON-like values, ~16 KiB batches)",
              file=sys.stderr)
        slices = split_segment(data, args.slice_mib * MIB)
        configs: list[tuple[str, Callable[[bytes], int]]] = [
            ("bare loop (CRC + decompress + compress)", bare_loop),
            ("rewrite, no deep validation, no proof",
             lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, deep_validation=False, proof=False))),
            ("rewrite, deep validation, no proof",
             lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, proof=False))),
            ("rewrite, default (deep validation + proof)",
             lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3))),
            ("rewrite, default, proof inline (one core: Spark)",
             lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, proof_thread=False))),
        ]
        # Paired measurement: this machine's speed drifts by tens of percent from one second to the next (shared
        # vCPUs, CPU steal), so each configuration's visit of a slice is bracketed by two visits of the bare loop
        # to the same slice, right before and right after it (bare, A, bare, B, bare, ...: the configurations in
        # a shuffled order), and its ratio is the mean of those two over its own time. A slow spell then hits
        # both sides of a ratio alike; the median of all those ratios is a configuration's figure.
        times = [[[0.0] * len(slices) for _ in range(args.repeat)] for _ in configs]  # [config][round][slice]
        preceding = [[[0.0] * len(slices) for _ in range(args.repeat)] for _ in configs]  # the bare visit before
        bracketed: list[list[float]] = [[] for _ in configs]
        bare_visits: list[list[float]] = [[] for _ in slices]  # every visit of the bare loop, per slice
        produced = [0] * len(configs)
        shuffle = random.Random(1)

        def visit(i: int, j: int, round_no: int) -> float:
            seconds, made = best_of(1, lambda: configs[i][1](slices[j]))
            if round_no == 0 and (i or not bare_visits[j]):
                produced[i] += made
            if i == 0:
                bare_visits[j].append(seconds)
            return seconds

        for round_no in range(args.repeat):
            for j in range(len(slices)):
                order = list(range(1, len(configs)))
                shuffle.shuffle(order)
                before = visit(0, j, round_no)
                for i in order:
                    seconds = visit(i, j, round_no)
                    after = visit(0, j, round_no)
                    times[i][round_no][j] = seconds
                    preceding[i][round_no][j] = before
                    bracketed[i].append((before + after) / 2 / seconds)
                    before = after
                times[0][round_no][j] = statistics.median(bare_visits[j][-len(configs):])
            print(f"  round {round_no + 1}/{args.repeat} done", file=sys.stderr)
        bracketed[0] = [1.0] * len(bracketed[1])
        preceding[0] = times[0]

        def best(t: list[list[float]]) -> float:  # each slice's best time, summed
            return sum(min(r[j] for r in t) for j in range(len(slices)))

        rows: list[dict[str, Any]] = []
        for i, (name, _) in enumerate(configs):
            typical = sum(statistics.median(t[j] for t in times[i]) for j in range(len(slices)))
            ratios = sorted(bracketed[i])
            quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3  # (one visit)
            rows.append({"name": name, "ratio_to_bare": quartiles[1], "paired_ratios": quartiles,
                         "best_of_ratio": best(preceding[i]) / best(times[i]), "seconds": typical,
                         "uncompressed_bytes": produced[i], "mib_per_s": produced[i] / MIB / typical,
                         "times": times[i]})
        rows[0]["bare_visits"] = bare_visits

        cli_rows = []
        for size in rss_sizes:
            seg = tmp / f"rss-{size}" / "00000000000000000000.log"
            seg.parent.mkdir()
            make_segment(seg, size)
            pairs = cli_pairs(seg, tmp / "cli-out", args.cli_repeat)
            run = dict(sorted(pairs, key=lambda r: r["ratio_to_bare"])[len(pairs) // 2])  # the median pair
            run["segment_mib"] = seg.stat().st_size / MIB
            run["mib_per_s"] = run["uncompressed_bytes"] / MIB / run["seconds"]
            run["pair_ratios"] = [r["ratio_to_bare"] for r in pairs]
            run["pair_bare_seconds"] = [r["bare_seconds"] for r in pairs]
            run["peak_rss_mib"] = max(r["peak_rss_mib"] for r in pairs)
            cli_rows.append(run)
            seg.unlink()

    targets = {"deep_validation_ratio": 0.90, "default_ratio": 0.80, "peak_rss_mib_1gib": 256}
    doc = {
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                    "zstd_proof": _proof.library() or "zstandard package (no libzstd shared library found)"},
        "segment_mib": args.size_mib, "repeat": args.repeat, "in_process": rows, "cli": cli_rows, "targets": targets,
        "results": {
            "deep_validation_ratio": rows[2]["ratio_to_bare"],
            "default_ratio": rows[3]["ratio_to_bare"],
            "default_one_core_ratio": rows[4]["ratio_to_bare"],
            "best_of_ratios": {row["name"]: row["best_of_ratio"] for row in rows[1:]},
            "peak_rss_mib_by_size": {f"{r['segment_mib']:.0f}": r["peak_rss_mib"] for r in cli_rows},
            "cli_ratio_by_size": {f"{r['segment_mib']:.0f}": r["ratio_to_bare"] for r in cli_rows},
        },
    }
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")

    print(f"\n{'configuration':<50} {'MiB/s':>8} {'ratio':>6}   {'quartiles':>11}   best-of ratio")
    for row in rows:
        q1, median, q3 = row["paired_ratios"]
        print(f"{row['name']:<50} {row['mib_per_s']:>8.1f} {median:>6.2f}   {q1:.2f} / {q3:.2f}   "
              f"{row['best_of_ratio']:.2f}")
    for run in cli_rows:
        name = f"CLI process on {run['segment_mib']:.0f} MiB (start-up included)"
        pair_list = ", ".join(f"{r:.2f}" for r in run["pair_ratios"])
        print(f"{name:<50} {run['mib_per_s']:>8.1f} {run['ratio_to_bare']:>6.2f}   "
              f"peak RSS {run['peak_rss_mib']:.0f} MiB; pairs {pair_list}")
    print(f"\ntargets: deep validation >= {targets['deep_validation_ratio']}, default >= {targets['default_ratio']}, "
          f"peak RSS <= {targets['peak_rss_mib_1gib']} MiB for 1 GiB; JSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
