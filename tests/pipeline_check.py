"""Runs the pipeline demo (small) in its own process and prints the facts tests/test_pipeline.py asserts.

A separate process keeps Airflow's configuration and logging, and the demo's environment, out of the
pytest process."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from tiering.demo_s3 import run_pipeline_demo
from tiering.kafka.index import build_indexes
from tiering.kafka.segment import verify_segment


def main() -> None:
    workdir = Path(sys.argv[1])
    demo = run_pipeline_demo(workdir, scale=float(sys.argv[2]), log=lambda line: print(line, file=sys.stderr))
    seeded = demo["seeded"]
    segments = {}
    for key, original in seeded.originals.items():
        final = demo["finals"][key]
        fact: dict[str, object] = {"identical": final == original, "active": key in seeded.active}
        base = int(key.rsplit("/", 1)[1][:20])
        if key != seeded.corrupt:
            before = verify_segment(io.BytesIO(original), segment_base=base)
            after = verify_segment(io.BytesIO(final), segment_base=base)
            rebuilt = build_indexes(base, after.batches)
            index, timeindex = demo["final_indexes"][key]
            fact |= {"records_equal": before.records_sha256 == after.records_sha256,
                     "codecs_after": sorted(after.codecs),
                     "index_equals_rebuild": index == rebuilt.offset_index,
                     "timeindex_equals_rebuild": timeindex == rebuilt.time_index,
                     "index_missing": index is None}
        segments[key] = fact
    runs = [{"state": r["state"], "document": r["document"]} for r in demo["runs"]]
    print(json.dumps({"segments": segments, "runs": runs, "corrupt": seeded.corrupt, "indexless": seeded.indexless,
                      "changed_by_second_run": demo["changed_by_second_run"], "prefix": demo["prefix"]}))


if __name__ == "__main__":
    main()
