"""Fuzz the compiled code that reads segment bytes: libFuzzer (through atheris) drives each target of
tests/fuzz/targets.py against copies of the extension modules built with AddressSanitizer and
UndefinedBehaviorSanitizer, seeded from the Kafka-written segments in tests/data.

    make fuzz                                            # every target, 5 minutes each, a table at the end
    .venv/bin/python -m tests.fuzz.run --seconds 20 --targets merge digest --json out.json

Each target runs in its own process (the sanitizers' runtime preloaded), for ``--seconds`` or ``--runs``;
with ``--seed`` and ``--runs`` (what the ordinary test run gives) what a run tries depends on neither clock nor chance.
A finding (a crash, a sanitizer report, a hang past ``--timeout`` seconds, or a verdict that differs from
the Python reference's) stops that target, is saved under ``--artifacts`` and makes the exit code 1; copy
it into tests/fuzz/regressions/<target>/ and the ordinary test run replays it from then on. Needs clang
(``scripts/ensure-clang.sh`` installs Debian's) and the atheris package (in requirements.lock).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
BUILD: Final = ROOT / "build" / "fuzz"
# The extensions that read segment bytes: the walker, the record layer, and the proof (which decodes the
# rewritten batches through the system's libzstd and compares them with the originals).
MODULES: Final = ("_walker", "_records", "_keymap", "_proof")
FLAGS: Final = ["-shared", "-fPIC", "-O1", "-g", "-std=c99", "-fno-omit-frame-pointer",
                "-fsanitize=address,undefined,fuzzer-no-link", "-fno-sanitize-recover=undefined"]
SEEDS: Final = (ROOT / "tests" / "data" / "golden", ROOT / "tests" / "data" / "broker")


class Missing(RuntimeError):
    """A tool the fuzzer needs is not on this machine."""


def clang() -> str:
    for name in ("clang", "clang-19", "clang-18", "clang-17", "clang-16", "clang-15", "clang-14"):
        if path := shutil.which(name):
            return path
    raise Missing("no clang on PATH: run scripts/ensure-clang.sh (Debian's clang and its sanitizer runtimes)")


def atheris_runtime() -> Path:
    """atheris's AddressSanitizer runtime with libFuzzer (preloaded into each target's process)."""
    spec = importlib.util.find_spec("atheris")
    if spec is None or spec.origin is None:
        raise Missing("the atheris package is not installed (it is in requirements.lock: make install)")
    runtime = Path(spec.origin).parent.parent / "asan_with_fuzzer.so"  # beside the package, in site-packages
    if not runtime.exists():
        raise Missing(f"atheris has no sanitizer runtime at {runtime}")
    return runtime


def build(out: Path = BUILD) -> Path:
    """The sanitized modules under ``out`` (rebuilt when a source is newer); returns that folder."""
    compiler = clang()
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    include = sysconfig.get_paths()["include"]
    out.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        source = ROOT / "tiering" / "kafka" / f"{name}.c"
        target = out / f"{name}{suffix}"
        newest = max(p.stat().st_mtime for p in (source, source.with_name("_records.h")))
        if target.exists() and target.stat().st_mtime >= newest:
            continue
        done = subprocess.run([compiler, *FLAGS, f"-I{include}", str(source), "-o", str(target)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{compiler} could not build {source.name}:\n{done.stderr[-3000:]}")
    return out


def _v2_batches() -> list[tuple[int, int, bool, bytes]]:
    """(records count, last offset delta, LogAppendTime, records section) of every v2 batch in tests/data."""
    import io

    from tiering.kafka.batch import TimestampType
    from tiering.kafka.reader import iter_batches
    from tiering.kafka.segment import payload_of

    out = []
    for folder in SEEDS:
        for log in sorted(folder.rglob("*.log")):
            for raw in iter_batches(io.BytesIO(log.read_bytes())):
                h = raw.header
                if h.magic < 2 or h.records_count is None or h.last_offset - h.offset > 0xFFFF:
                    continue
                out.append((h.records_count & 0xFFFF, h.last_offset - h.offset,
                            h.timestamp_type is TimestampType.LOG_APPEND_TIME, bytes(payload_of(raw))))
    return out


def seeds(target: str) -> list[bytes]:
    """Inputs made from real segments, in the target's layout (see targets.py)."""
    batches = _v2_batches()
    if target in ("walk", "digest", "keymap"):
        return [struct.pack("<HHB", count, last, int(lat)) + section[:4096] for count, last, lat, section in batches
                if len(section) <= 4096]
    if target == "merge":
        out = []
        for i in range(0, len(batches) - 2, 3):
            parts = [b[3] for b in batches[i:i + 3] if len(b[3]) <= 2048]
            if len(parts) == 3:
                cut1, cut2 = len(parts[0]), len(parts[0]) + len(parts[1])
                out.append(struct.pack("<BHH", 2 | (4 if batches[i][2] else 0), cut1, cut2) + b"".join(parts))
        return out
    if target == "proof":
        return _proof_seeds([b[3] for b in batches if len(b[3]) <= 4096])
    if target == "zstd":
        return _zstd_seeds([b[3] for b in batches if len(b[3]) <= 4096])
    return [log.read_bytes()[:16384] for folder in SEEDS for log in sorted(folder.rglob("*.log"))]


def _proof_seeds(sections: list[bytes]) -> list[bytes]:
    """Groups of up to three records sections, each with its zstd frame; every fourth group with one frame
    of the wrong section (a mismatch the proof must name)."""
    from tests.fuzz.targets import proof_input
    from tiering.kafka.codecs import Codec, compress

    out = []
    for j, i in enumerate(range(0, len(sections) - 2, 3)):
        originals = sections[i:i + 1 + j % 3]
        news = [compress(Codec.ZSTD, o, level=1 + j % 5) for o in originals]
        if j % 4 == 3 and len(originals) > 1 and originals[0] != originals[-1]:
            news[-1] = news[0]
        out.append(proof_input(news, originals))
    return out


def _zstd_seeds(sections: list[bytes]) -> list[bytes]:
    """zstd records sections as Kafka wrote them (tests/data), and frames of other shapes made of the same
    sections: a declared size or none (a streamed frame), a content checksum, two frames back to back."""
    import io

    import zstandard

    from tests.fuzz.targets import zstd_input
    from tiering.kafka.codecs import Codec, compress
    from tiering.kafka.reader import iter_batches
    from tiering.kafka.records import records_section

    out = []
    for folder in SEEDS:
        for log in sorted(folder.rglob("*.log")):
            for raw in iter_batches(io.BytesIO(log.read_bytes())):
                if raw.header.magic == 2 and raw.header.codec is Codec.ZSTD and len(raw.data) <= 8192:
                    out.append(zstd_input(bytes(records_section(raw.data)), 1 << 20))
    for j, section in enumerate(sections[::7]):
        framed = compress(Codec.ZSTD, section, level=1 + j % 5)
        stream = io.BytesIO()
        with zstandard.ZstdCompressor(level=3, write_checksum=j % 2 == 0).stream_writer(stream, closefd=False) as w:
            w.write(section)
        out += [zstd_input(framed, len(section)), zstd_input(stream.getvalue(), 1 << 20),
                zstd_input(framed + stream.getvalue(), 2 * len(section) + (128 << 10))]
    return out


def regressions(target: str) -> list[Path]:
    return sorted((Path(__file__).parent / "regressions" / target).glob("*"))


def _child(target: str, modules: Path, fuzzer_args: list[str]) -> None:
    """In the target's process: the sanitized modules in place of the package's, then libFuzzer."""
    import atheris

    import tiering.kafka

    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for name in MODULES:
        spec = importlib.util.spec_from_file_location(f"tiering.kafka.{name}", modules / f"{name}{suffix}")
        if spec is None or spec.loader is None:
            raise RuntimeError(f"cannot load the sanitized {name} from {modules}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[f"tiering.kafka.{name}"] = module
        setattr(tiering.kafka, name, module)
    from tests.fuzz import targets

    for name in MODULES:
        assert getattr(targets, name) is sys.modules[f"tiering.kafka.{name}"], f"{name}: not the sanitized build"
    atheris.Setup([sys.argv[0], *fuzzer_args], targets.TARGETS[target])
    atheris.Fuzz()


def fuzz(target: str, *, seconds: float | None, runs: int | None, timeout: int, artifacts: Path,
         modules: Path, corpus_root: Path, random_seed: int | None = None) -> dict[str, object]:
    """Run one target in its own process; what libFuzzer reported."""
    corpus = corpus_root / target
    corpus.mkdir(parents=True, exist_ok=True)
    if not any(corpus.iterdir()):
        for i, seed in enumerate([*seeds(target), *(p.read_bytes() for p in regressions(target))]):
            (corpus / f"seed-{i:04d}").write_bytes(seed)
    found = artifacts / target
    found.mkdir(parents=True, exist_ok=True)
    args = [str(corpus), f"-artifact_prefix={found}/", f"-timeout={timeout}", "-print_final_stats=1",
            "-rss_limit_mb=2048", "-max_len=65536"]
    if seconds is not None:
        args.append(f"-max_total_time={int(seconds)}")
    if runs is not None:
        args.append(f"-runs={runs}")
    if random_seed is not None:
        args.append(f"-seed={random_seed}")
    env = dict(os.environ, LD_PRELOAD=str(atheris_runtime()), PYTHONPATH=str(ROOT),
               ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:abort_on_error=0",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tests.fuzz.run", "--child", target, "--modules", str(modules),
                           "--", *args], env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    log = done.stdout + done.stderr
    stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", log, re.M))
    cov = re.findall(r"cov: (\d+) ft: (\d+)", log)
    return {"target": target, "exit": done.returncode, "seconds": round(time.monotonic() - started, 1),
            "executions": int(stats.get("number_of_executed_units", 0)),
            "coverage": int(cov[-1][0]) if cov else 0, "features": int(cov[-1][1]) if cov else 0,
            "corpus": sum(1 for _ in corpus.iterdir()), "findings": sorted(p.name for p in found.iterdir()),
            "log_tail": "" if done.returncode == 0 else log[-6000:]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        cut = argv.index("--")
        _child(argv[1], Path(argv[argv.index("--modules") + 1]), argv[cut + 1:])
        return 0
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", nargs="+", choices=sorted(TARGETS), default=sorted(TARGETS))
    parser.add_argument("--seconds", type=float, default=300.0, help="per target (default 300)")
    parser.add_argument("--runs", type=int, nargs="+", metavar="N",
                        help="per target, instead of a time: one count for all, or one per target in --targets order")
    parser.add_argument("--seed", type=int, help="libFuzzer's random seed (default: a new one each run)")
    parser.add_argument("--timeout", type=int, default=10, help="seconds one input may take before it is a hang")
    parser.add_argument("--artifacts", type=Path, default=BUILD / "findings")
    parser.add_argument("--corpus", type=Path, default=BUILD / "corpus", help="grows from run to run")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    counts = args.runs or []
    if len(counts) == 1:
        counts = counts * len(args.targets)
    if counts and len(counts) != len(args.targets):
        parser.error(f"--runs takes one count or one per target: {len(args.targets)} targets, {len(counts)} counts")
    runs = dict(zip(args.targets, counts, strict=False))  # empty: each target runs for --seconds
    try:
        atheris_runtime()
        modules = build()
    except Missing as e:
        print(f"fuzz: {e}", file=sys.stderr)
        return 2
    results = []
    for target in args.targets:
        print(f"fuzzing {target} ...", file=sys.stderr, flush=True)
        results.append(fuzz(target, seconds=None if runs else args.seconds, runs=runs.get(target),
                            timeout=args.timeout, artifacts=args.artifacts, modules=modules, corpus_root=args.corpus,
                            random_seed=args.seed))
    print(f"\n{'target':<8} {'executions':>11} {'exec/s':>8} {'coverage':>9} {'features':>9} {'corpus':>7}  result")
    for r in results:
        rate = int(r["executions"]) / max(float(r["seconds"]), 0.001)  # type: ignore[arg-type]
        verdict = "clean" if r["exit"] == 0 and not r["findings"] else f"FINDING (exit {r['exit']}): {r['findings']}"
        print(f"{r['target']:<8} {r['executions']:>11,} {rate:>8,.0f} {r['coverage']:>9,} {r['features']:>9,} "
              f"{r['corpus']:>7,}  {verdict}")
    total = sum(int(r["executions"]) for r in results)  # type: ignore[call-overload]
    print(f"{'total':<8} {total:>11,}")
    for r in results:
        if r["log_tail"]:
            print(f"\n--- {r['target']}: the end of its log ---\n{r['log_tail']}", file=sys.stderr)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"targets": results, "total_executions": total}, indent=2) + "\n")
    return 0 if all(r["exit"] == 0 and not r["findings"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
