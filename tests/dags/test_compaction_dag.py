"""The compaction DAG's failures with dag.test() (SQLite) against a moto server: what another attempt would
meet again fails at once; a run that could do nothing because every partition was busy is not a success."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.airflow, pytest.mark.spark]  # dag.test(), its Spark job local[1]
CHECK = Path(__file__).parent / "compaction_check.py"


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("compaction-dag")
    done = subprocess.run([sys.executable, str(CHECK), str(work)], capture_output=True, text=True, timeout=900,
                          check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def test_a_missing_policy_fails_the_first_task_reading_it_once_without_retries(facts: dict[str, Any]) -> None:
    run = facts["missing_policy"]
    assert run["state"] == "failed"
    assert run["tasks"]["merge"] == ["failed", 1]  # the DAG's tasks have two retries: not used
    assert run["tasks"]["scan"][0] == "upstream_failed"


def test_a_run_whose_partitions_are_all_busy_fails_with_the_work_left(facts: dict[str, Any]) -> None:
    run = facts["busy"]
    assert run["state"] == "failed"
    assert run["tasks"]["report"][0] == "failed"
    assert run["tasks"]["report"][1] == 1
    assert run["totals"].get("compacted", 0) == 0
    assert run["pending"] == run["totals"]["segments"] == 4  # two sealed segments in each of two partitions


def test_the_same_dag_compacts_everything_once_the_partitions_are_free(facts: dict[str, Any]) -> None:
    assert facts["free"]["state"] == "success"
    assert facts["free"]["totals"]["compacted"] == 4
    # the DAG's cleanup ran as a run of its own, within the grace period: every original the run kept stays
    cleanup = facts["free"]["cleanup"]
    assert (cleanup["exit_code"], cleanup["lease_ttl_seconds"]) == (0, 120)
    assert len(cleanup["backups"]) == 4 * 3


def test_compact_keys_cleans_the_compacted_topic_first_then_the_recompression_runs(facts: dict[str, Any]) -> None:
    run = facts["keys"]
    assert run["state"] == "success"
    # The two sealed segments cleaned into one, as the broker's cleaner groups them; the active one is not
    # cleaned. Segment 0 alone would have kept no record (each key's latest is in segment 100).
    assert run["keys_totals"]["merged"] == 2
    assert run["logs"] == [f"{0:020d}.log", f"{200:020d}.log"]
    assert run["records"] == 10 + 100  # each key's latest of the 200 updates cleaned, and the active segment's
    # then recompressed by the same DAG run: the merged segment
    assert run["totals"]["compacted"] == 1


def test_merge_merges_small_segments_then_the_recompression_rewrites_the_merged_ones(facts: dict[str, Any]) -> None:
    run = facts["merge"]
    assert run["state"] == "success"
    assert run["tasks"]["merge"] == ["success", 1]
    # two partitions of five small sealed segments (and an active one) each: each five merged into one
    assert run["merge_totals"]["merged"] == 10
    assert run["objects"] == {"before": 30, "after": 6}
    assert run["logs"] == [f"{0:020d}.log", run["logs"][1]]
    assert len(run["logs"]) == 2
    assert (run["report_merging"]["objects_before"], run["report_merging"]["objects_after"]) == (30, 6)
    assert run["totals"]["compacted"] == 2  # the merged segment of each partition, recompressed
