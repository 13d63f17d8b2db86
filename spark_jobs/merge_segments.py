"""Spark job: merge runs of small neighbouring sealed segments into fewer, larger ones, one Spark task per
unit of whole partitions.

    spark-submit --master 'local[*]' spark_jobs/merge_segments.py --bucket BUCKET --prefix PREFIX --run-id RUN \\
        [--policy FILE | --segment-bytes N [--index-bytes N]] [--topics REGEX] [--min-age-minutes M] \\
        [--lease-ttl-seconds 600] [--inventory s3://.../manifest.json] [--verify checksum|read-back] \\
        [--swap auto|copy|put]

Thin on purpose: argument parsing and a call to ``tiering.spark.jobs.partition_run``. The driver
finishes what a crashed run left in flight, lists the partitions of the topics to merge (with a policy,
those whose ``merge.enable`` is true, each with its own bounds and minimum record age), and cuts them into
units balanced by bytes; each task merges its partitions one after the other, each under the run's lease,
every group swapped in by the commit protocol (docs/commit-protocol.md, "Merging"), and writes its results
to ``PREFIX/_tiering/runs/RUN/merge/``; the driver then writes the run document (``runs/RUN/merge.json``).
Per-segment problems are results, not job failures. S3 endpoint and credentials come from each process's
AWS environment.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tiering.cli.args import add_merge_args, merge_limits
from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.plan.policy import load_policy
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import RunSettings
from tiering.spark.driver import run_driver
from tiering.spark.jobs import partition_run


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_driver(f"kafka-segment-merge {args.run_id}", lambda spark: run(spark, args))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--run-id", required=True, help="the run (leases are taken in its name)")
    p.add_argument("--topics", default=None, help="a regular expression of the topics to merge")
    p.add_argument("--policy", default=None, help="a policy file: its topics with merge.enable true, each up to "
                   "its merge.target.bytes (else segment.bytes)")
    add_merge_args(p, "the largest merged segment; a segment this large or larger is left as it is")
    p.add_argument("--min-age-minutes", type=int, default=15)
    p.add_argument("--lease-ttl-seconds", type=int, default=DEFAULT_TTL_SECONDS)
    p.add_argument("--inventory", default=None, help="plan from this S3 Inventory report's manifest.json instead "
                   "of listing the prefix")
    p.add_argument("--verify", choices=["checksum", "read-back"], default="checksum")
    p.add_argument("--swap", choices=["auto", "copy", "put"], default="auto")
    return p.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Plan on the driver, merge the units on the cluster, write the run document; 0 (per-segment problems
    are results in it)."""
    settings = RunSettings(args.bucket, args.prefix.strip("/"), args.run_id, "none", None, args.lease_ttl_seconds,
                           *RunSettings.modes(args.verify, args.swap))
    options = MergeOptions(merge_limits(args), args.topics, args.min_age_minutes, args.lease_ttl_seconds,
                           load_policy(args.policy) if args.policy else None)
    partition_run(spark, settings, Merging(options), log, inventory=args.inventory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
