"""Runs the rollback DAG with dag.test() against a moto server in its own process (Airflow's configuration stays
out of pytest's) and prints the facts tests/dags/test_rollback_dag.py asserts.

The runs to undo are those one compaction DAG run ``R`` makes (``R-merge``, then ``R``, named as the DAG names
them; run here in this process, without Spark), then the tiering DAG's run of the same id (``R-tier``, its task
run here too: scheduled runs of the two DAGs share their ids) over what they wrote. The rollback DAG is
triggered for the compaction DAG's ``R`` first (refused: ``R-tier`` moved what ``R`` wrote; the tiering run is
not touched), then for the tiering DAG's ``R``, then for the compaction DAG's again."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import yaml

from tiering.commit.operation import Context
from tiering.demo.s3 import load_dag, moto_server, run_dag, use_airflow_home
from tiering.demo.seed import seed_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.merge import Limits
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.scan import ScanOptions, scan
from tiering.run import engine
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import compact, safe_run_id
from tiering.steps import storage_classes
from tiering.steps.storage_classes import TieringParams
from tiering.storage.layout import run_result_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store, make_client

BUCKET, PREFIX = "undo-dag", "kafka/logs"
COMPACTION_RUN = "manual__2026-12-07T01:00:00+00:00"  # an Airflow run id, as the UI shows it


def main() -> None:
    work = Path(sys.argv[1])
    os.environ.update(AWS_ACCESS_KEY_ID="demo", AWS_SECRET_ACCESS_KEY="demo", AWS_DEFAULT_REGION="us-east-1")
    use_airflow_home(work / "airflow")
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump({"cluster": {"storage.tiers": [{"after.days": 30,
                                                                     "storage.class": "GLACIER_IR"}]}}))
    with moto_server(lambda line: print(line, file=sys.stderr)) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        store = S3Store(make_client(), BUCKET)
        store.client.create_bucket(Bucket=BUCKET)
        seed_partition(store, PREFIX, "clicks", 0, segments=5, kind="json", codec=Codec.SNAPPY,
                       segment_bytes=200_000)  # records a year old

        def objects() -> dict[str, tuple[str, str]]:
            """Every object outside _tiering/: its ETag and storage class."""
            return {o.key: (o.etag, o.storage_class) for o in store.list(PREFIX + "/") if "/_tiering/" not in o.key}

        originals = objects()
        r = safe_run_id(COMPACTION_RUN)
        engine.run(store, Context(store, PREFIX, f"{r}-merge"), Merging(MergeOptions(Limits(1 << 20),
                                                                                     min_age_minutes=0)))
        plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0))
        compact(store, plan, Context(store, PREFIX, r, RewriteOptions(Codec.ZSTD)), CompactOptions())
        compacted = objects()
        tier_run = f"{r}-tier"  # the tiering DAG's task, as its run of the same id runs it
        tiered_step, _ = storage_classes.tier(store, TieringParams(BUCKET, PREFIX, tier_run, str(policy), False),
                                              lambda line: print(line, file=sys.stderr))
        tiered = objects()
        undo = load_dag("kafka_segment_rollback", "rollback_dag")
        states = []
        # the tiering DAG run's id is also a compaction DAG run's (the two DAGs' scheduled runs share theirs)
        for target, dag in ((COMPACTION_RUN, "kafka_segment_compaction"), (COMPACTION_RUN, "kafka_segment_tiering"),
                            (COMPACTION_RUN, "kafka_segment_compaction")):
            state, undo_run = run_dag({"bucket": BUCKET, "prefix": PREFIX, "undo": target, "dag": dag}, undo)
            done = {}  # each rollback's document, by the run it undid
            for undone in (r, f"{r}-merge", f"{r}-tier"):
                key = run_result_key(PREFIX, f"{undo_run}-{undone}", RunKind.ROLLBACK)
                with contextlib.suppress(ObjectNotFound):
                    doc = RunResult.from_json(store.get_json(key)[0], key)
                    done[undone] = {"exit_code": int(doc.exit_code()), "counts": dict(doc.counts),
                                    "reasons": sorted({s.reason for s in doc.segments if s.reason})}
            states.append({"undo": target, "state": state, "objects": objects(), "rollbacks": done})
        print(json.dumps({"originals": originals, "compacted": compacted, "tiered": tiered,
                          "tier_moved": tiered_step.objects_to_move, "compaction_run": r, "rollbacks": states}))


if __name__ == "__main__":
    main()
