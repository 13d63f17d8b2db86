"""Spark job: key-compact the partitions of compacted topics, one Spark task per unit of whole partitions.

    spark-submit --master 'local[*]' spark_jobs/compact_keys.py --bucket BUCKET --prefix PREFIX --run-id RUN \\
        (--policy FILE | --topics REGEX) [--now-ms MS] [--delete-retention-ms MS] [--min-compaction-lag-ms MS] \\
        [--codec C [--level N]] [--min-age-minutes M] [--max-keys N] [--lease-ttl-seconds 600] \\
        [--inventory s3://.../manifest.json] \\
        [--verify checksum|read-back] [--swap auto|copy|put] [--segment-bytes N] [--index-bytes N] [--no-merge]

Thin on purpose: argument parsing and a call to ``tiering.spark.jobs.partition_run``. The driver
finishes what a crashed run left in flight, lists the partitions and resolves each topic's cleaner settings
(the policy is read here only), and cuts them into units balanced by bytes; each task cleans its partitions
one after the other, each under the run's lease, every changed segment swapped by the commit protocol in
offset order (one partition's pass is one task: its key map is its own), and writes its results to
``PREFIX/_tiering/runs/RUN/keys/``; the driver then writes the run document
(``runs/RUN/compact-keys.json``). Per-segment problems are results, not job failures. S3 endpoint and
credentials come from each process's AWS environment.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tiering.cli.args import add_merge_args, merge_limits
from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.kafka.keycompact import DEFAULT_DELETE_RETENTION_MS, DEFAULT_MAX_KEYS
from tiering.plan.policy import load_policy
from tiering.run.keycompact import KeyCompaction, KeyCompactOptions
from tiering.run.pipeline import RunSettings
from tiering.spark.driver import run_driver
from tiering.spark.jobs import partition_run


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_driver(f"kafka-key-compaction {args.run_id}", lambda spark: run(spark, args))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--run-id", required=True, help="the run (leases are taken in its name)")
    p.add_argument("--topics", default=None, help="a regular expression of the compacted topics to clean")
    p.add_argument("--policy", default=None, help="a policy file: its topics with cleanup.policy compact and "
                   "compact.enable true")
    p.add_argument("--now-ms", type=int, default=None, help="the pass's clock (default: S3's)")
    p.add_argument("--delete-retention-ms", type=int, default=DEFAULT_DELETE_RETENTION_MS)
    p.add_argument("--min-compaction-lag-ms", type=int, default=0)
    p.add_argument("--codec", default=None, help="the codec of rebuilt batches (default: each batch's own)")
    p.add_argument("--level", type=int, default=None)
    p.add_argument("--min-age-minutes", type=int, default=15)
    p.add_argument("--max-keys", type=int, default=DEFAULT_MAX_KEYS,
                   help="bound each pass's key map (default: a broker's default 128 MiB dedupe buffer's keys)")
    p.add_argument("--lease-ttl-seconds", type=int, default=DEFAULT_TTL_SECONDS)
    p.add_argument("--inventory", default=None, help="plan from this S3 Inventory report's manifest.json instead "
                   "of listing the prefix")
    p.add_argument("--verify", choices=["checksum", "read-back"], default="checksum")
    p.add_argument("--swap", choices=["auto", "copy", "put"], default="auto")
    add_merge_args(p, "neighbours are cleaned into one segment while their sources fit it, as the broker's "
                      "cleaner groups them (with --policy: each topic's segment.bytes and segment.index.bytes)")
    p.add_argument("--no-merge", action="store_true", help="clean each segment into one of its own")
    return p.parse_args(argv)


def run(spark: Any, args: argparse.Namespace) -> int:
    """Plan on the driver, clean the units on the cluster, write the run document; 0 (per-segment problems
    are results in it)."""
    settings = RunSettings(args.bucket, args.prefix.strip("/"), args.run_id, "none", None, args.lease_ttl_seconds,
                           *RunSettings.modes(args.verify, args.swap))
    options = KeyCompactOptions(args.now_ms, args.delete_retention_ms, args.min_compaction_lag_ms, args.codec,
                                args.level, args.topics, args.min_age_minutes, args.lease_ttl_seconds,
                                load_policy(args.policy) if args.policy else None, args.max_keys,
                                None if args.no_merge else merge_limits(args))
    partition_run(spark, settings, KeyCompaction(options), log, inventory=args.inventory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
