"""The S3 requests of a cleanup, by kind, for a bucket of kept originals past their grace period.

    .venv/bin/python bench/cleanup_requests.py                              # 100 partitions, 3 runs
    .venv/bin/python bench/cleanup_requests.py --partitions 1000 --json bench/out/cleanup.json

An in-memory store (``tiering.storage.memory``, which counts requests as S3 would bill them) holds, for each
of ``--runs`` runs, the backups of two segments (``.log``, ``.index``, ``.timeindex``) in each of
``--partitions`` partitions, all past their age; one cleanup deletes them (each partition under its lease).
Deterministic: the same counts every time. Prints a table and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from tiering.commit.operation import Context
from tiering.run.cleanup import CleanupFigures, CleanupOptions, cleanup
from tiering.storage.layout import backup_key
from tiering.storage.memory import MemoryStore

PREFIX = "logs"


def measure(partitions: int, runs: int) -> dict[str, object]:
    store = MemoryStore("bench")
    for run in range(runs):
        for p in range(partitions):
            for base in (0, 100):
                for suffix in (".log", ".index", ".timeindex"):
                    store.put(backup_key(PREFIX, f"run-{run}", f"topic-{p}", base, suffix), b"x" * 100)
    before = Counter(store.requests)
    result = cleanup(store, Context(store, PREFIX, "cleanup"), CleanupOptions(grace_days=0, stale_hours=0))
    used = Counter(store.requests) - before
    figures = CleanupFigures.of(result)
    return {"partitions": partitions, "runs": runs, "objects_deleted": figures.backups_deleted,
            "requests": dict(sorted(used.items())), "requests_total": sum(used.values()),
            "requests_per_partition": round(sum(used.values()) / partitions, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path, default=Path("bench/out/cleanup_requests.json"))
    args = p.parse_args(argv)
    out = measure(args.partitions, args.runs)
    print(f"cleanup of {out['objects_deleted']:,} kept objects in {args.partitions:,} partitions "
          f"({args.runs} runs): {out['requests_total']:,} requests, {out['requests_per_partition']} a partition")
    requests = out["requests"]
    assert isinstance(requests, dict)
    for name, n in requests.items():
        print(f"  {name:<22} {n:>8,}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
