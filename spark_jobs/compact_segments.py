"""Spark job: stage every planned segment of a run, one Spark task per segment, largest first.

    spark-submit --master 'local[*]' spark_jobs/compact_segments.py \\
        --plan s3://BUCKET/PREFIX/_tiering/runs/RUN/plan.json --run-id RUN [--lease-ttl-seconds 600]

Thin on purpose: argument parsing, the SparkSession, and calls into ``tiering.pipeline``. The driver takes
the run's partition leases and renews them while the tasks run; each task streams its segment from S3,
rewrites it, stages the new objects, reads them back to verify them and journals the segment as
``staged`` (the DAG's commit step swaps them in). Per-segment problems are results, not job failures;
the results go to ``PREFIX/_tiering/runs/RUN/stage.json``. S3 endpoint and credentials come from each
process's AWS environment (``AWS_ENDPOINT_URL``, the credentials chain; on a cluster, pass them with
``spark.executorEnv.*`` / ``spark.yarn.appMasterEnv.*`` or use instance roles); nothing is written to
a disk shared between driver and executors.
"""

from __future__ import annotations

import argparse
import sys
import time

from pyspark.sql import SparkSession

from tiering.pipeline import RunSettings, begin_stage, load_plan, put_usage, stage_task, write_results
from tiering.s3.lease import DEFAULT_TTL_SECONDS, LeaseKeeper
from tiering.s3.store import S3Store, make_client


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="the run's plan: s3://BUCKET/KEY or a local path")
    p.add_argument("--run-id", required=True, help="the run (leases are taken in its name)")
    p.add_argument("--lease-ttl-seconds", type=int, default=DEFAULT_TTL_SECONDS)
    args = p.parse_args(argv)

    spark = SparkSession.builder.appName(f"kafka-segment-compaction {args.run_id}").getOrCreate()
    try:
        bucket = args.plan[5:].split("/", 1)[0] if args.plan.startswith("s3://") else ""
        plan = load_plan(S3Store(make_client(), bucket), args.plan)
        settings = RunSettings(plan.bucket, plan.prefix, args.run_id, plan.codec, plan.level,
                               args.lease_ttl_seconds)
        store = settings.store()
        segments, leases, busy = begin_stage(store, settings, plan)
        print(f"staging {len(segments)} segments in {len(leases)} partitions ({len(busy)} busy, skipped)",
              file=sys.stderr, flush=True)
        conf = settings.to_json()
        started = time.perf_counter()
        with LeaseKeeper(leases) as keeper:
            rdd = spark.sparkContext.parallelize([s.to_json() for s in segments], max(1, len(segments)))
            results = rdd.map(lambda seg: stage_task(seg, conf)).collect()
        print(f"stage seconds: {time.perf_counter() - started:.3f}", file=sys.stderr, flush=True)
        put_usage(store, settings, "stage-driver")
        counts = write_results(store, settings.key("stage.json"), [*results, *(r.to_json() for r in busy)])
        if keeper.lost:
            print(f"leases lost while staging (their segments are committed by whoever holds them): "
                  f"{keeper.lost}", file=sys.stderr)
        print(f"stage results: {counts}", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
