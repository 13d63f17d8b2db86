"""The demo scenario end to end: moto server, DAG with dag.test() (SQLite), local Spark, two runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
CHECK = Path(__file__).parent / "pipeline_check.py"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    workdir = tmp_path_factory.mktemp("pipeline") / "demo"
    done = subprocess.run([sys.executable, str(CHECK), str(workdir), "0.3"], capture_output=True, text=True,
                          timeout=600, check=False, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return facts


def _results(demo: dict[str, Any], n: int) -> dict[str, dict[str, Any]]:
    doc = demo["runs"][n]["document"]
    return {f"{demo['prefix']}/{r['directory']}/{r['base_offset']:020d}.log": r for r in doc["segments"]}


def test_both_runs_succeed(demo: dict[str, Any]) -> None:
    assert [r["state"] for r in demo["runs"]] == ["success", "success"]


def test_sealed_segments_are_in_the_target_codec_unless_the_report_says_why(demo: dict[str, Any]) -> None:
    results = _results(demo, 0)
    for key, fact in demo["segments"].items():
        if fact["active"] or "__consumer_offsets" in key:
            assert key not in results
            continue
        r = results[key]
        if r["status"] == "compacted":
            assert fact["codecs_after"] == ["zstd"], key
        else:
            assert r["reason"], key  # skipped or failed, always with a reason
    assert {r["reason"].split(":")[0] for r in results.values() if r["status"] == "skipped"} == {"no savings"}


def test_active_and_internal_segments_are_byte_identical(demo: dict[str, Any]) -> None:
    untouched = [f for k, f in demo["segments"].items() if f["active"] or "__consumer_offsets" in k]
    assert len(untouched) == 9
    assert all(f["identical"] for f in untouched)


def test_records_and_indexes(demo: dict[str, Any]) -> None:
    for key, fact in demo["segments"].items():
        if key == demo["corrupt"]:
            continue
        assert fact["records_equal"], key
        assert not fact["index_missing"], key
        assert fact["index_equals_rebuild"], key
        assert fact["timeindex_equals_rebuild"], key
    assert not demo["segments"][demo["indexless"]]["identical"]  # compacted, and its indexes were rebuilt
    assert not demo["segments"][demo["indexless"]]["index_missing"]


def test_the_corrupt_segment_is_untouched_and_reported(demo: dict[str, Any]) -> None:
    assert demo["segments"][demo["corrupt"]]["identical"]
    r = _results(demo, 0)[demo["corrupt"]]
    assert r["status"] == "failed"
    assert r["error"]["error"] in ("CorruptBatchError", "DecompressionError")
    assert r["error"]["position"] is not None


def test_report_totals_are_the_sum_of_the_segments(demo: dict[str, Any]) -> None:
    doc = demo["runs"][0]["document"]
    done = [r for r in doc["segments"] if r["status"] == "compacted"]
    assert doc["totals"]["compacted"] == len(done) > 0
    assert doc["totals"]["bytes_before"] == sum(r["bytes_before"] for r in done)
    assert doc["totals"]["bytes_after"] == sum(r["bytes_after"] for r in done)
    assert doc["totals"]["bytes_after"] < doc["totals"]["bytes_before"]


def test_a_second_run_changes_no_segment_object(demo: dict[str, Any]) -> None:
    assert demo["changed_by_second_run"] == []
    assert demo["runs"][1]["document"]["totals"].get("compacted", 0) == 0


def test_the_dry_run_changes_nothing_and_estimates_close_to_the_real_savings(demo: dict[str, Any]) -> None:
    dry = demo["dry_run"]
    assert dry["state"] == "success"
    assert dry["changed"] == []
    totals = demo["runs"][0]["document"]["totals"]
    actual = totals["bytes_before"] - totals["bytes_after"]
    estimate = dry["estimate"]
    # Segments that were skipped or failed saved nothing, so the run's savings are those of the whole plan.
    assert estimate["segments_sampled"] > 0
    assert estimate["saved_bytes_low"] <= estimate["saved_bytes_estimate"] <= estimate["saved_bytes_high"]
    assert actual > 0
    assert abs(estimate["saved_bytes_estimate"] - actual) / actual < 0.25
