"""A/B of two source trees of this project (e.g. a change and the commit before it), paired on one machine.

    git worktree add /tmp/before HEAD~1
    (cd /tmp/before && "$OLDPWD/.venv/bin/python" setup.py -q build_ext --inplace)  # its compiled modules
    .venv/bin/python bench/bench_ab.py /tmp/before . --modes deep,default --rounds 3

Each tree runs in its own worker process (its own compiled modules, imported once), both over the same
slices of a generated segment (``bench_rewrite.make_segment``). For every slice, in every round, the bare
loop (from tree A) and each mode of each tree visit it once, in a shuffled order. Printed per mode: the
quartiles of B's speed over A's, visit by visit on the same slice in the same round (above 1: B is
faster), and each tree's quartiles against the bare loop. A change of a percent or two shows here where
``bench_rewrite.py``'s ratios, taken at different moments of this noisy machine, cannot tell it apart.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_rewrite import make_segment

_WORKER = r"""
import sys, time
tree, segment, slice_mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path[:0] = [tree, tree + "/bench"]
from pathlib import Path
from bench_rewrite import MIB, bare_loop, rewrite_loop, split_segment
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
slices = split_segment(Path(segment).read_bytes(), slice_mib * MIB)
modes = {
    "bare": bare_loop,
    "nodeep": lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, deep_validation=False, proof=False)),
    "deep": lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, proof=False)),
    "default": lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3)),
    "inline": lambda d: rewrite_loop(d, RewriteOptions(Codec.ZSTD, 3, proof_thread=False)),
}
print(len(slices), flush=True)
for line in sys.stdin:
    index, mode = line.split()
    started = time.perf_counter()
    modes[mode](slices[int(index)])
    print(time.perf_counter() - started, flush=True)
"""
MODES = ("nodeep", "deep", "default", "inline")


class _Worker:
    def __init__(self, tree: Path, segment: Path, slice_mib: int) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(tree), str(segment), str(slice_mib)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tree)
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.slices = int(self.stdout.readline())

    def visit(self, index: int, mode: str) -> float:
        self.stdin.write(f"{index} {mode}\n")
        self.stdin.flush()
        return float(self.stdout.readline())

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait()


def _quartiles(over: list[float], under: list[float]) -> str:
    """Quartiles of over[i] / under[i]."""
    ratios = [x / y for x, y in zip(over, under, strict=True)]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return " / ".join(f"{v:.3f}" for v in quartiles)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tree_a", type=Path, help="the tree to compare against (its compiled modules built)")
    parser.add_argument("tree_b", type=Path, help="the tree under test")
    parser.add_argument("--modes", default="deep,default", help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=64, help="the generated segment")
    parser.add_argument("--slice-mib", type=int, default=16)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")

    with tempfile.TemporaryDirectory(prefix="tiering-ab-") as tmp:
        segment = Path(tmp) / "00000000000000000000.log"
        make_segment(segment, args.size_mib)
        a, b = _Worker(args.tree_a.resolve(), segment, args.slice_mib), _Worker(args.tree_b.resolve(), segment,
                                                                                 args.slice_mib)
        try:
            visits = [("bare", a, "bare")] + [(f"{side}:{m}", w, m) for m in modes for side, w in (("A", a), ("B", b))]
            times: dict[str, list[float]] = {name: [] for name, _, _ in visits}
            shuffle = random.Random(3)
            for round_no in range(args.rounds):
                for index in range(a.slices):
                    order = visits[:]
                    shuffle.shuffle(order)
                    for name, worker, mode in order:
                        times[name].append(worker.visit(index, mode))
                print(f"  round {round_no + 1}/{args.rounds} done", file=sys.stderr)
        finally:
            a.close()
            b.close()
    print(f"{a.slices * args.rounds} paired visits per mode; quartiles")
    for m in modes:
        print(f"{m:8s} B's speed / A's: {_quartiles(times['A:' + m], times['B:' + m])}")
        for side in "AB":
            name = f"{side}:{m}"
            print(f"         {side} vs bare loop:  {_quartiles(times['bare'], times[name])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
