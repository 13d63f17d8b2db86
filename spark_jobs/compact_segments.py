"""Spark job: stage every planned segment of a run, in units of whole partitions, largest first.

    spark-submit --master 'local[*]' spark_jobs/compact_segments.py \\
        --plan s3://BUCKET/PREFIX/_tiering/runs/RUN/plan/manifest.json --run-id RUN [--lease-ttl-seconds 600] \\
        [--verify checksum|read-back]

Thin on purpose: argument parsing, the SparkSession, and calls into ``tiering.run.pipeline``. The driver reads
the plan's chunks one at a time and cuts their work into units (up to 64 segments or 4 GiB of whole
partitions); each task takes the run's leases of its partitions and renews them while it streams each
segment from S3, rewrites it straight into a multipart upload to staging (no local copy), verifies the
staged objects (by S3's CRC-32C, or by reading them back) and journals the segment as ``staged`` (the DAG's
commit step swaps them in). Per-segment problems are results, not job
failures; each task writes its results to ``PREFIX/_tiering/runs/RUN/stage/`` and returns only counts.
S3 endpoint and credentials come from each process's AWS environment (``AWS_ENDPOINT_URL``, the
credentials chain; on a cluster, pass them with ``spark.executorEnv.*`` / ``spark.yarn.appMasterEnv.*``
or use instance roles); nothing is written to a disk shared between driver and executors.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter

from pyspark.sql import SparkSession

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.run.pipeline import RunSettings, load_manifest, manifest_location, put_usage, stage_unit, stage_units
from tiering.spark.driver import run_driver
from tiering.storage.store import S3Store, make_client


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", required=True, help="the run's plan: s3://BUCKET/.../runs/RUN/plan/manifest.json")
    p.add_argument("--run-id", required=True, help="the run (leases are taken in its name)")
    p.add_argument("--lease-ttl-seconds", type=int, default=DEFAULT_TTL_SECONDS)
    p.add_argument("--verify", choices=["checksum", "read-back"], default="checksum",
                   help="how staged files are accepted: S3's CRC-32C of what it stored, or read back")
    args = p.parse_args(argv)

    return run_driver(f"kafka-segment-compaction {args.run_id}", lambda spark: stage(spark, args))


def stage(spark: SparkSession, args: argparse.Namespace) -> int:
    """Cut the plan into units and stage them on the cluster; 0 (per-segment problems are results)."""
    plan_bucket, _ = manifest_location(args.plan)
    plan, manifest = load_manifest(S3Store(make_client(), plan_bucket), args.plan)
    header = manifest.header
    settings = RunSettings(header.bucket, header.prefix, args.run_id, header.codec, header.level,
                           args.lease_ttl_seconds, RunSettings.modes(args.verify, "auto")[0])
    units = stage_units(plan, manifest, parallelism=spark.sparkContext.defaultParallelism)
    print(f"staging {sum(u.segments for u in units)} segments in {len(units)} tasks", file=sys.stderr,
          flush=True)
    conf, bucket = settings.to_json(), settings.bucket
    started = time.perf_counter()
    counts: Counter[str] = Counter()
    if units:
        rdd = spark.sparkContext.parallelize([u.to_json() for u in units], len(units))
        # Each task builds its store from its executor's AWS environment.
        for done in rdd.map(lambda unit: stage_unit(S3Store(make_client(), bucket), unit, conf)).collect():
            counts.update(done)
    print(f"stage seconds: {time.perf_counter() - started:.3f}", file=sys.stderr, flush=True)
    put_usage(plan.store, settings, "stage-driver")
    print(f"stage results: {dict(sorted(counts.items()))}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
