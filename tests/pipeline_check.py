"""Runs the pipeline demo (small) in its own process and prints the facts tests/test_pipeline.py asserts.

A separate process keeps Airflow's configuration and logging, and the demo's environment, out of the
pytest process."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

from tests.reference_index import rebuild
from tiering.demo.s3 import run_pipeline_demo
from tiering.kafka.reader import iter_batches
from tiering.kafka.rewrite import read_back


def main() -> None:
    workdir = Path(sys.argv[1])
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {line}", file=sys.stderr, flush=True)

    demo = run_pipeline_demo(workdir, scale=float(sys.argv[2]), log=log)
    log("demo done; checking")
    seeded = demo.seeded
    segments = {}
    for key, original in seeded.originals.items():
        final = demo.finals[key]
        fact: dict[str, object] = {"identical": final == original, "active": key in seeded.active}
        base = int(key.rsplit("/", 1)[1][:20])
        if key != seeded.corrupt:
            # Records compared through the digest of every batch's uncompressed records (codec-independent),
            # computed by an independent full read of each segment.
            before = read_back(io.BytesIO(original), base_offset=base)
            after = read_back(io.BytesIO(final), base_offset=base)
            codecs = {raw.header.codec.label for raw in iter_batches(io.BytesIO(final))}
            index, timeindex = demo.final_indexes[key]
            offsets, times = rebuild(final, base)  # the suites' own rebuild, not the rewriter's
            fact |= {"records_equal": (before.payload_xxh3, before.records) == (after.payload_xxh3, after.records),
                     "codecs_after": sorted(codecs),
                     "index_equals_rebuild": index == offsets,
                     "timeindex_equals_rebuild": timeindex == times,
                     "index_missing": index is None}
        segments[key] = fact
    doc = demo.to_json()
    print(json.dumps({"segments": segments, "runs": doc["runs"], "dry_run": doc["dry_run"],
                      "corrupt": seeded.corrupt, "indexless": seeded.indexless, "local_reports": doc["local_copies"],
                      "changed_by_second_run": doc["segment_objects_changed_by_run_2"], "prefix": demo.prefix}))

if __name__ == "__main__":
    main()
