"""The chaos suite's long mode: many seeded trials across every kind, a table and a JSON report.

    .venv/bin/python bench/chaos.py --trials 120 --seed 1 [--json out.json] [--kinds flaky,mirror]

Each trial (see ``tests/chaos/harness.py``) seeds a fresh bucket on a moto server in this process, runs
``tiering s3 compact|rollback|cleanup`` in their own processes through a fault-injecting proxy (SIGKILL at
random or aimed instants, a flaky S3, racing runs, a naive mirror), re-runs without faults until the
bucket converges, checks the invariants, rolls every run back and checks that the originals are back.
The trials' details are drawn from ``--seed``; trials are spread round-robin over the kinds. Progress goes
to stderr, the table to stdout; exit 1 if any trial did not converge or had a bad outcome.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.chaos

from tests.chaos.harness import FULL, KINDS, SMALL, Lab, TrialResult, random_spec, run_trial
from tiering.demo.s3 import moto_server


def _table(results: list[TrialResult], seconds: float) -> Table:
    t = Table(title=f"chaos: {len(results)} trials in {seconds:.0f} s", title_justify="left")
    for col in ("kind", "trials", "converged", "clean failures", "other failures", "bad", "exit codes"):
        t.add_column(col, justify="left" if col in ("kind", "exit codes") else "right")
    for kind in KINDS:
        rows = [r for r in results if r.spec.kind == kind]
        if not rows:
            continue
        codes: dict[str, int] = {}
        for r in rows:
            for code in r.exit_codes:
                codes[code] = codes.get(code, 0) + 1
        t.add_row(kind, str(len(rows)), str(sum(r.converged for r in rows)), str(sum(r.clean_failures for r in rows)),
                  str(sum(r.other_failures for r in rows)), str(sum(bool(r.bad) for r in rows)),
                  " ".join(f"{c}×{n}" for c, n in sorted(codes.items())))
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=120, help="trials in all (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="draws every trial's details (default %(default)s)")
    p.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default: all)")
    p.add_argument("--small", action="store_true", help="seed the tests' smaller bucket (two partitions, no third)")
    p.add_argument("--no-golden", action="store_true", help="leave the Kafka-written golden logdir out")
    p.add_argument("--source", type=Path, default=None,
                   help="run the CLI from this source tree (a directory holding a tiering package), e.g. an "
                        "export of an older commit")
    p.add_argument("--json", type=Path, default=None, metavar="OUT.json", help="write every trial's result here")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        p.error(f"unknown kinds {sorted(unknown)}; choose from {', '.join(KINDS)}")
    rng = random.Random(args.seed)
    specs = [random_spec(kinds[i % len(kinds)], i, rng) for i in range(args.trials)]
    results: list[TrialResult] = []
    started = time.monotonic()
    with moto_server() as endpoint:
        lab = Lab(endpoint, SMALL if args.small else FULL, golden=not args.no_golden,
                  source=args.source.resolve() if args.source else None)
        for n, spec in enumerate(specs, 1):
            result = run_trial(lab, spec)
            results.append(result)
            state = "ok" if result.ok else ("BAD" if result.bad else "NOT CONVERGED")
            print(f"[{n}/{len(specs)}] {spec.name}: {state} ({result.seconds:.1f}s, exits "
                  f"{' '.join(result.exit_codes)})", file=sys.stderr, flush=True)
            if not result.ok:
                print(result.describe(), file=sys.stderr, flush=True)
    seconds = time.monotonic() - started
    Console(highlight=False, width=None if sys.stdout.isatty() else 140).print(_table(results, seconds))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"seed": args.seed, "trials": len(results), "seconds": round(seconds, 1),
                                         "results": [r.to_json() for r in results]}, indent=1) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
