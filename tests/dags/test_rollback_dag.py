"""The rollback DAG end to end with dag.test() (SQLite) against a moto server: a compaction DAG run's merge and
recompression, then a tiering DAG run of the same id over what they wrote; undoing the compaction DAG run first
is refused and changes nothing (the tiering run of that id is not touched), undoing the tiering run puts every
class back, then undoing the compaction DAG run (both of its runs, newest first) puts every original object
back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.airflow]  # dag.test() of the rollback DAG; the runs it undoes
# are made in-process, without Spark
CHECK = Path(__file__).parent / "rollback_check.py"


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("rollback-dag")
    done = subprocess.run([sys.executable, str(CHECK), str(work)], capture_output=True, text=True, timeout=600,
                          check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def test_each_run_changed_the_bucket(facts: dict[str, Any]) -> None:
    """What the rollbacks undo is there to undo: the merge and recompression rewrote objects, the tiering run
    moved some to GLACIER_IR."""
    assert facts["compacted"] != facts["originals"]
    assert facts["tier_moved"] > 0
    assert {cls for _, cls in facts["tiered"].values()} == {"STANDARD", "GLACIER_IR"}


def test_undoing_a_dag_run_out_of_order_fails_and_changes_nothing(facts: dict[str, Any]) -> None:
    first = facts["rollbacks"][0]
    assert first["state"] == "failed"
    assert first["objects"] == facts["tiered"]
    r = facts["compaction_run"]
    refused = first["rollbacks"]
    assert list(refused) == [r]  # the newest of the DAG run's runs, refused: the one before it not tried
    assert refused[r]["exit_code"] == 3
    assert all(f"tiering run(s) {r}-tier moved" in reason for reason in refused[r]["reasons"])


def test_undoing_the_dag_runs_newest_first_restores_every_object_and_class(facts: dict[str, Any]) -> None:
    _, tier, compaction = facts["rollbacks"]
    assert tier["state"] == "success"
    assert list(compaction["rollbacks"]) == [facts["compaction_run"], f"{facts['compaction_run']}-merge"]
    assert all(done["exit_code"] == 0 and done["counts"] for done in compaction["rollbacks"].values())
    assert {k: cls for k, (_, cls) in tier["objects"].items()} == {k: cls for k, (_, cls) in facts["compacted"].items()}
    assert compaction["state"] == "success"
    assert compaction["objects"] == facts["originals"]  # the same ETags: the same bytes, each in its class
