"""Kafka's own segment checker, ``org.apache.kafka.tools.DumpLogSegments`` (kafka-tools 4.3), on many files.

Three passes, each ONE JVM over all the files (they cannot share a JVM: the options apply to every file):
- ``--deep-iteration`` on the ``.log`` files: every batch's CRC (``isValid``), every record decoded;
- ``--verify-index-only`` on the ``.index`` / ``.timeindex`` files: each entry checked against the log
  (offset index entries found at their positions, time index entries equal to the batches' max timestamps);
- ``--index-sanity-check`` on the same: the check a broker runs at start-up to decide on a rebuild.
Problems are collected per segment name (``<topic>-<partition>/<base>.<ext>``) so that those of a rewritten
segment can be compared with those of its original.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.kafka_broker.broker import java

MAIN = "org.apache.kafka.tools.DumpLogSegments"
PROBLEM = re.compile(r"isvalid: false|Mismatches in|not found in|Index offset: |Index timestamp: |"
                     r"Found timestamp mismatch|Found out of order timestamp|invalid bytes at the end|Error at|"
                     r"Exception|is followed by|There were errors|failed|corrupt", re.IGNORECASE)
DUMPING = re.compile(r"^Dumping (\S+)")
SECTION = re.compile(r"(?:Mismatches in|not found in|Found timestamp mismatch in|Found out of order timestamp in|"
                     r"Non-consecutive offsets in)\s*:?\s*(/\S+)")


def seg_name(path: str | Path) -> str:
    p = Path(path)
    return f"{p.parent.name}/{p.name}"


@dataclass
class DumpResult:
    files: list[str]
    problems: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    sane: set[str] = field(default_factory=set)  # index files that passed the sanity check (or are empty)
    batches: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # .log -> batches dumped
    records: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # .log -> records dumped
    output: str = ""

    def new_problems(self, original: DumpResult) -> dict[str, set[str]]:
        """Problems reported here that the original segment of the same name did not have."""
        out = {}
        for name, lines in self.problems.items():
            extra = lines - original.problems.get(name, set())
            if extra:
                out[name] = extra
        return out


def _normalise(line: str) -> str:
    # Paths differ between the original and the rewritten tree: keep <topic-partition>/<file> only.
    return re.sub(r"/\S*/([^/\s]+/[^/\s:,]+)", r"\1", line).strip()


def _parse(mode: str, output: str, result: DumpResult) -> None:
    current: str | None = None
    for line in output.splitlines():
        m = DUMPING.match(line)
        if m:
            current = seg_name(m.group(1))
            continue
        m = SECTION.search(line)
        if m:
            current = seg_name(m.group(1))
        if mode == "sanity" and line.rstrip().endswith(("passed sanity check.", " is empty.")):
            result.sane.add(seg_name(line.split()[0]))
            continue
        if current is None:
            if PROBLEM.search(line):
                result.problems["?"].add(f"{mode}: {_normalise(line)}")
            continue
        if mode == "deep" and line.startswith("baseOffset:"):
            result.batches[current] += 1
            if "isvalid: false" in line.lower():  # the batch's CRC does not hold
                result.problems[current].add(f"{mode}: {_normalise(line)}")
            continue
        if mode == "deep" and line.startswith("| offset:"):
            result.records[current] += 1
            continue
        if PROBLEM.search(line):
            result.problems[current].add(f"{mode}: {_normalise(line)}")


def _run(mode: str, files: Sequence[str]) -> tuple[str, str]:
    opts = {"deep": ["--deep-iteration"], "verify": ["--verify-index-only"], "sanity": ["--index-sanity-check"]}
    done = java(MAIN, [*opts[mode], "--files", ",".join(files)], timeout=600, heap="-Xmx768m")
    text = done.stdout + ("\n" + done.stderr if done.stderr.strip() else "")
    if done.returncode != 0:
        text += f"\n{MAIN} Exception: exit {done.returncode}"
    return mode, text


def dump(paths: Iterable[Path]) -> DumpResult:
    paths = sorted(paths)
    logs = [str(p) for p in paths if p.suffix == ".log"]
    indexes = [str(p) for p in paths if p.suffix in (".index", ".timeindex")]
    result = DumpResult([seg_name(p) for p in paths])
    jobs = [(m, f) for m, f in (("deep", logs), ("verify", indexes), ("sanity", indexes)) if f]
    with ThreadPoolExecutor(2) as pool:
        for mode, text in pool.map(lambda j: _run(*j), jobs):
            result.output += f"\n===== {mode}\n{text}"
            _parse(mode, text, result)
    for f in indexes:
        if seg_name(f) not in result.sane:
            result.problems[seg_name(f)].add("sanity: no 'passed sanity check.' line")
    return result
