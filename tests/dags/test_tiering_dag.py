"""The tiering DAG end to end with dag.test() (SQLite) against a moto server: a dry run moves nothing, a
run moves the old .log objects and leaves small and active ones, a re-run moves nothing, a bad policy
fails the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.airflow]  # dag.test(); the DAG submits no Spark job
CHECK = Path(__file__).parent / "tiering_check.py"


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("tiering-dag")
    done = subprocess.run([sys.executable, str(CHECK), str(work)], capture_output=True, text=True, timeout=600,
                          check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    doc: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return doc


def test_dry_run_then_run_then_rerun(facts: dict[str, Any]) -> None:
    dry, real, again = facts["runs"]
    assert [r["state"] for r in facts["runs"]] == ["success"] * 3
    sealed, active = facts["logs"][:2], facts["logs"][2]
    assert dry["report"]["dry_run"] is True
    assert dry["report"]["objects_moved"] == 0
    assert dry["report"]["planned"]["objects_to_move"] == 2
    assert set(dry["classes"].values()) == {"STANDARD"}
    assert real["report"]["objects_moved"] == 2
    for key, cls in real["classes"].items():
        assert cls == ("GLACIER_IR" if key in sealed else "STANDARD"), key  # indexes and the active log stay
    assert real["classes"][active] == "STANDARD"
    assert again["report"]["objects_moved"] == 0
    assert again["classes"] == real["classes"]
    assert "already there" in again["report"]["planned"]["staying"]


def test_a_missing_policy_fails_the_run(facts: dict[str, Any]) -> None:
    assert facts["missing_policy_state"] == "failed"
