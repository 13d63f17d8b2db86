"""The walk of one segment's operation through the package: which modules it visits and how deep it goes.

    .venv/bin/python bench/segment_walk.py            # a table
    .venv/bin/python bench/segment_walk.py --json     # the same as JSON (always written to --out too)

A partition of three segments is generated in a memory store and scanned; then the first sealed segment is
compacted and swapped by ``run_segment`` (stage, back up, swap, indexes, state, journal forgotten), and a
second one is staged by a run that "dies" and finished by the next run's recovery (``iter_recover``). In
another partition, the two sealed segments of three are merged into one by the merge kind's work on the
partition (read, checked, staged, backed up, swapped in as a group).
Every Python call into a ``tiering`` module during each walk is recorded (calls into the standard library,
boto3 and the codecs are not; the records' inner loops are folded: a call from a module to itself is
counted once per caller frame). For each walk it prints:

- modules: the distinct modules the walk enters;
- depth: the deepest nesting of ``tiering`` frames below the walk's entry point, and the deepest nesting of
  modules (a stack's frames counted once per run of the same module);
- switches: calls whose callee is in another module than its caller;
- upward: calls from a module into one of a higher layer (callbacks; the layers of
  ``tests/test_architecture.py``);
- commit entries: calls into ``tiering.commit`` from outside it (how often the walk leaves the protocol
  and comes back);
- and the calls between packages (``commit -> kafka``: calls from a ``tiering.commit`` module into a
  ``tiering.kafka`` one), storage and errors aside.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from tiering.commit.lease import Lease
from tiering.commit.operation import Staged
from tiering.commit.recover import iter_recover
from tiering.commit.stage import stage_segment
from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.merge import Limits
from tiering.lifecycle.vocabulary import Action, Status
from tiering.plan.scan import ScanOptions
from tiering.run import engine
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import RunSettings, plan_files, scan_run
from tiering.run.segment import run_segment
from tiering.storage.layout import PlanName, lease_key
from tiering.storage.memory import MemoryStore

ROOT = Path(__file__).resolve().parents[1]

LAYER_OF = {"errors": 0, "documents": 0, "lifecycle.vocabulary": 0, "kafka": 1, "cost": 1, "storage": 2,
            "local": 2, "lifecycle": 3, "plan": 4, "commit": 5, "run": 6, "report": 7, "spark": 7, "steps": 8}


def _package(module: str) -> str:
    return module.split(".")[1]


def _layer(module: str) -> int:
    parts = module.split(".")[1:]
    return LAYER_OF.get(".".join(parts[:2]), LAYER_OF.get(parts[0], 9))


@dataclass(frozen=True, slots=True)
class Walk:
    name: str
    modules: int
    depth: int
    module_depth: int
    switches: int
    upward: int
    commit_entries: int
    visited: tuple[str, ...]
    between: dict[str, int]


def trace(name: str, fn: Callable[[], Any]) -> Walk:
    """Run ``fn`` and measure the walk of its calls through ``tiering`` modules."""
    stack: list[str] = []  # the module of each tiering frame now running (the entry point's first)
    frames: list[FrameType] = []
    visited: list[str] = []
    counts = {"depth": 0, "module_depth": 0, "switches": 0, "upward": 0, "commit": 0}
    between: dict[str, int] = {}

    def profile(frame: FrameType, event: str, _: object) -> None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("tiering."):
            return
        if event == "call":
            caller = stack[-1] if stack else None
            stack.append(module)
            frames.append(frame)
            if module not in visited:
                visited.append(module)
            counts["depth"] = max(counts["depth"], len(stack) - 1)
            runs = 1 + sum(a != b for a, b in itertools.pairwise(stack))
            counts["module_depth"] = max(counts["module_depth"], runs)
            if caller is not None and caller != module:
                counts["switches"] += 1
                counts["upward"] += _layer(module) > _layer(caller)
                counts["commit"] += module.startswith("tiering.commit.") and not caller.startswith("tiering.commit.")
                pair = f"{_package(caller)} -> {_package(module)}"
                if _package(module) not in ("storage", "errors") and _package(caller) != _package(module):
                    between[pair] = between.get(pair, 0) + 1
        elif event == "return" and frames and frames[-1] is frame:
            stack.pop()
            frames.pop()

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return Walk(name, len(visited), counts["depth"], counts["module_depth"], counts["switches"], counts["upward"],
                counts["commit"], tuple(visited), dict(sorted(between.items())))


def walks() -> list[Walk]:
    store = MemoryStore("walk")
    upload_partition(store, "kafka/", "walk", 0, generate_partition(segments=3, kind="json", codec=Codec.SNAPPY,
                                                                    segment_bytes=256 * 1024, seed=1))
    run = RunSettings("walk", "kafka/", "walk-1", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    first, second = [s for s in plan_files(store, run, PlanName.SCAN).segments() if s.action == Action.COMPACT][:2]
    ctx = run.context(store)
    lease = Lease(store, lease_key("kafka/", first.directory), run.run_id, 60)
    lease.acquire("kafka/")

    def compact() -> None:
        result = run_segment(ctx, first, lease)
        assert result.status is Status.COMPACTED, result

    def crash_then_recover() -> None:
        results = list(iter_recover(ctx, second.directory, lease))
        assert [r.status for r in results] == [Status.COMPACTED], results

    measured = [trace("compact one segment (run_segment)", compact)]
    assert isinstance(stage_segment(ctx, second, lease), Staged)  # the run dies here; the next one recovers
    measured.append(trace("finish a staged one (iter_recover)", crash_then_recover))
    lease.release()
    measured.append(_merge_walk(store))
    return measured


def _merge_walk(store: MemoryStore) -> Walk:
    """Two sealed neighbours of a partition merged into one, as a merge run's unit does it."""
    upload_partition(store, "kafka/", "merged", 0, generate_partition(segments=3, kind="json", codec=Codec.SNAPPY,
                                                                      segment_bytes=64 * 1024, seed=2))
    kind = Merging(MergeOptions(Limits(), topics="merged", min_age_minutes=0)).started(store, "kafka/")
    parts: list[Any] = []
    engine.preview(store, "kafka/", kind, parts.append)
    [part] = parts
    ctx = RunSettings("walk", "kafka/", "walk-merge", None).context(store)
    lease = Lease(store, lease_key("kafka/", part.directory), ctx.run_id, 60)
    lease.acquire("kafka/")

    def merge() -> None:
        out: list[Any] = []
        kind.work(ctx, part, lease, out, None)
        assert [r.status for r in out] == [Status.MERGED, Status.MERGED, Status.SKIPPED], out  # the active one stays

    try:
        return trace("merge two segments (the merge kind)", merge)
    finally:
        lease.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the measures as JSON")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "segment_walk.json",
                        help="where the JSON goes (default: %(default)s)")
    args = parser.parse_args()
    measured = walks()
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = [asdict(w) for w in measured]
    out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"{'walk':38} {'modules':>7} {'depth':>5} {'module depth':>12} {'switches':>8} {'upward':>6} "
          f"{'commit entries':>14}")
    for w in measured:
        print(f"{w.name:38} {w.modules:>7} {w.depth:>5} {w.module_depth:>12} {w.switches:>8} {w.upward:>6} "
              f"{w.commit_entries:>14}")
    for w in measured:
        print(f"\n{w.name}:\n  modules: " + ", ".join(m.removeprefix("tiering.") for m in w.visited))
        print("  calls between packages: " + ", ".join(f"{pair} {n}" for pair, n in w.between.items()))
    print(f"\nwritten: {out}")


if __name__ == "__main__":
    main()
