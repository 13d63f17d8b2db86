"""Spark job: stage every planned segment of a run, in units of whole partitions, largest first.

    spark-submit --master 'local[*]' spark_jobs/compact_segments.py \\
        --plan s3://BUCKET/PREFIX/_tiering/runs/RUN/plan/manifest.json --run-id RUN [--lease-ttl-seconds 600] \\
        [--verify checksum|read-back]

Thin on purpose: argument parsing and a call to ``tiering.spark.jobs.stage_plan``. The driver reads
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
from typing import Any

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.lifecycle.vocabulary import Verify
from tiering.spark.driver import run_driver
from tiering.spark.jobs import stage_plan
from tiering.storage.layout import PlanName, plan_manifest_key


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    example = plan_manifest_key("PREFIX", "RUN", PlanName.PLAN)
    p.add_argument("--plan", required=True, help=f"the run's plan: s3://BUCKET/{example}")
    p.add_argument("--run-id", required=True, help="the run (leases are taken in its name)")
    p.add_argument("--lease-ttl-seconds", type=int, default=DEFAULT_TTL_SECONDS)
    p.add_argument("--verify", choices=[v.value for v in Verify], default=Verify.CHECKSUM.value,
                   help="how staged files are accepted: S3's CRC-32C of what it stored, or read back")
    args = p.parse_args(argv)
    return run_driver(f"kafka-segment-compaction {args.run_id}", lambda spark: stage(spark, args))


def stage(spark: Any, args: argparse.Namespace) -> int:
    """0: per-segment problems are results in the run's step documents, not the job's exit code."""
    stage_plan(spark, args.plan, args.run_id, args.lease_ttl_seconds, Verify(args.verify), log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
