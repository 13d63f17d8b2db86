"""Each suite's test count and time, from the JUnit XML a pytest run writes (``make test`` writes
``build/junit.xml`` and prints this table at its end; docs/testing.md's table of suite times is its output on a
fresh clone).

    python -m tests.suite_times build/junit.xml [--json]

A suite is the first two parts of a test's path: ``tests/s3`` for ``tests/s3/test_body.py``, and a file at the
top of ``tests/`` is its own suite (``tests/test_cli.py``). Its seconds are the sum of its tests' times as the
XML gives them (setup and teardown included, pytest's default ``junit_duration_report``): under pytest-xdist that
is time spent in the workers, not time on the wall.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET  # our own pytest's report, not input from elsewhere
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


@dataclass(frozen=True, slots=True)
class Suite:
    name: str
    tests: int
    seconds: float


def suite_of(classname: str, name: str) -> str:
    """The suite of one ``<testcase>``: ``tests.s3.test_body`` (a class after it or not) is ``tests/s3``,
    ``tests.test_cli`` is ``tests/test_cli.py``. A collection error has no class name: its name is the module."""
    parts = (classname or name).split(".")
    if len(parts) < 2:
        return parts[0]
    first, second = parts[0], parts[1]
    is_module = second.startswith("test_") or second.endswith("_test") or len(parts) == 2
    return f"{first}/{second}.py" if is_module else f"{first}/{second}"


def suites(junit: Path) -> list[Suite]:
    """Every suite in ``junit``, the longest first."""
    root = ET.parse(junit).getroot()
    counts: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for case in root.iter("testcase"):
        suite = suite_of(case.get("classname", ""), case.get("name", ""))
        counts[suite] = counts.get(suite, 0) + 1
        seconds[suite] = seconds.get(suite, 0.0) + float(case.get("time") or 0)
    return sorted((Suite(s, counts[s], round(seconds[s], 3)) for s in counts), key=lambda s: (-s.seconds, s.name))


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def write_table(rows: list[Suite], out: TextIO) -> None:
    total = Suite("total", sum(r.tests for r in rows), round(sum(r.seconds for r in rows), 3))
    width = max(len(r.name) for r in [*rows, total])
    out.write(f"{'suite':<{width}}  {'tests':>5}  {'seconds':>8}  {'':>12}\n")
    for r in [*rows, total]:
        if r is total:
            out.write(f"{'-' * width}  {'-' * 5}  {'-' * 8}\n")
        out.write(f"{r.name:<{width}}  {r.tests:>5}  {r.seconds:>8.1f}  {_clock(r.seconds):>12}\n")
    out.write("(seconds: the sum of each suite's test times, setup and teardown included; with workers, not wall "
              "time)\n")


def main(argv: Sequence[str] | None = None, stdout: TextIO = sys.stdout, stderr: TextIO = sys.stderr) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.suite_times", description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path, help="the JUnit XML pytest wrote (--junitxml)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    try:
        rows = suites(args.junit)
    except OSError as e:
        stderr.write(f"suite_times: {args.junit}: cannot read it: {e.strerror}\n")
        return 2
    except ET.ParseError as e:
        stderr.write(f"suite_times: {args.junit}: not a JUnit XML file: {e}\n")
        return 2
    if not rows:
        stderr.write(f"suite_times: {args.junit}: no test cases in it\n")
        return 2
    if args.json:
        doc = {"suites": [{"suite": r.name, "tests": r.tests, "seconds": r.seconds} for r in rows],
               "total": {"tests": sum(r.tests for r in rows), "seconds": round(sum(r.seconds for r in rows), 3)}}
        stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        write_table(rows, stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
