"""Spark job: a run of one of the run engine's kinds (compaction, key compaction, merging, storage tiering,
rollback, cleanup), one Spark task per unit of whole partitions.

    spark-submit --master 'local[*]' spark_jobs/run_kind.py --kind merge \\
        --settings '{"bucket": "B", "prefix": "P", "run_id": "R", ...}' \\
        --options '{"segment_bytes": 16777216, "topics": "clicks\\\\..*", "min_age_minutes": 15}' \\
        [--inventory s3://.../manifest.json] [--exit-code run|job]

``--settings`` is the run's settings as ``RunSettings.to_json`` writes them (bucket, prefix, run id, lease
time, a compaction's codec and level, how staged files are accepted and swapped in); ``--options`` the
kind's options as its ``to_json`` writes them (``CompactionOptions``, ``KeyCompactOptions``,
``MergeOptions``, ``TierOptions``, ``RollbackOptions``, ``CleanupOptions``: a field they do not write is an
error naming it, a field left out takes the command line's default; a policy travels as its file's path).
The DAG builds both from its typed params; nothing is parsed twice.

Thin on purpose: arguments, then a call to ``tiering.spark.jobs.kind_run``. The driver finishes what a
crashed run left in flight, plans the partitions (from the listing, or from the S3 Inventory report) into
the run's plan chunks and units balanced by bytes; each task works on its partitions one after the other,
each under the run's lease, and writes its results to ``PREFIX/_tiering/runs/RUN/<step>/``; the driver then
writes the run document (``runs/RUN/<kind>.json``). Per-segment problems are results, not task failures;
the job's exit code is the run document's (0 done, 1 invalid data, 3 work left for a later run or a
rollback refused, 4 S3 failing, 5 a proof failed; ``--exit-code job``: 0 once the document is written, for
a caller that reads the document itself, as the DAG does). S3 endpoint and credentials come from each
process's AWS environment.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tiering.run.kinds import ENGINE_KINDS
from tiering.spark.driver import run_driver
from tiering.spark.jobs import kind_run


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def json_object(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected a JSON object, found {text[:80]!r}: {e}") from None
    if not isinstance(doc, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, found {type(doc).__name__}")
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", required=True, choices=[k.value for k in ENGINE_KINDS], help="the kind of run")
    p.add_argument("--settings", required=True, type=json_object, help="the run's settings (a JSON object)")
    p.add_argument("--options", default={}, type=json_object, help="the kind's options (a JSON object)")
    p.add_argument("--inventory", default=None, help="plan from this S3 Inventory report's manifest.json instead "
                   "of listing the prefix")
    p.add_argument("--exit-code", choices=["run", "job"], default="run",
                   help="run: the run document's exit code (default); job: 0 once the run document is written")
    args = p.parse_args(argv)
    return run_driver(f"kafka-{args.kind} {args.settings.get('run_id')}", lambda spark: run(spark, args))


def run(spark: Any, args: argparse.Namespace) -> int:
    """Plan on the driver, work on the units on the cluster, write the run document; its exit code (or 0 with
    ``--exit-code job``). Settings or options that do not read are the driver's error, said in one line."""
    result = kind_run(spark, args.kind, args.settings, args.options, log, inventory=args.inventory)
    return 0 if args.exit_code == "job" else int(result.exit_code())


if __name__ == "__main__":
    sys.exit(main())
