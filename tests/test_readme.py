"""The README's main command as a new user runs it: ``make demo`` is ``python -m tiering demo``, run here in a
fresh working directory, as its own process, with and without ``--json``. (The README's other command,
``make test``, is the suite this test is part of.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).parents[1]
TOPICS = ("app_logs", "clickstream.events", "metrics.zstd", "payments.encrypted")


def _demo(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``make demo DEMO_ARGS=...``'s command, from ``cwd``, with no AWS settings of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "AIRFLOW", "TIERING_"))}
    return subprocess.run([sys.executable, "-m", "tiering", "demo", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)


def test_the_makefile_runs_exactly_this_command() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^demo: .*\n\t\$\(BIN\)/python -m tiering demo \$\(DEMO_ARGS\)$", makefile, re.M)


@pytest.fixture(scope="module")
def human(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    cwd = tmp_path_factory.mktemp("fresh")
    return cwd, _demo(cwd)


@pytest.mark.airflow  # the demo: the compaction DAG with dag.test(), its Spark job local[*]
@pytest.mark.spark
def test_the_demo_ends_clean_and_prints_what_a_user_reads(human: tuple[Path, subprocess.CompletedProcess[str]]
                                                          ) -> None:
    cwd, done = human
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for stream in (done.stdout, done.stderr):
        assert "Traceback" not in stream
        assert "{'" not in stream  # no Python repr of a dict
        assert "[warning" not in stream.lower()
        assert "Warning:" not in stream
        assert "INFO" not in stream  # nor Spark's and Airflow's log lines
    progress = done.stderr
    for line in ("preparing Airflow", "seeded s3://kafka-demo/kafka/logs", "dry run: success; forecast: saves",
                 "run 1: success", "run 2 plans from an S3 Inventory report", "run 2: success"):
        assert line in progress, line
    out = done.stdout
    assert "forecast (dry run) beside the real run, by topic" in out
    for topic in TOPICS:
        assert topic in out
    assert "2 of 2 likely skipped" in out  # metrics.zstd and payments.encrypted
    assert "unreadable in the" in out  # the corrupt segment of clickstream.events, which the sample met
    assert "compaction report: s3://kafka-demo/kafka/logs run" in out
    assert "per TiB of such data" in out
    assert "this prefix, per year" in out
    assert "run 2 (planned from an S3 Inventory report): 0 rewritten" in out
    assert "segment objects it changed: 0 (the dry run's: 0)" in out
    assert "At real scale: $" in out
    for n in (1, 2):
        report = cwd / "demo-out" / f"report-run-{n}.html"
        assert f"demo-out/report-run-{n}.html" in out
        assert "<svg" in report.read_text()
    tools = (cwd / "demo-out" / "demo.log").read_text()
    assert "Airflow's and Spark's own output: demo-out/demo.log" in out
    assert "spark-submit" in tools
    assert "SparkContext" in tools


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return _demo(tmp_path_factory.mktemp("fresh-json"), "--json")


@pytest.mark.airflow
@pytest.mark.spark
def test_with_json_stdout_is_one_document(machine: subprocess.CompletedProcess[str]) -> None:
    assert machine.returncode == 0, machine.stderr[-3000:]
    assert "Traceback" not in machine.stderr
    doc = json.loads(machine.stdout)  # the whole of stdout: one document, nothing before or after it
    assert doc["ok"] is True
    assert doc["segment_objects_changed_by_run_2"] == []
    assert doc["dry_run"]["segment_objects_changed"] == []
    assert [r["state"] for r in doc["runs"]] == ["success", "success"]


def _real_ratios(run: dict[str, Any]) -> dict[str, float]:
    """A topic's .log bytes after / before over what the run compacted; 1.0 for a topic it compacted none of."""
    compacted = {r["topic"]: r["bytes_after"] / r["bytes_before"] for r in run["by_topic"] if r["bytes_before"]}
    return {topic: compacted.get(topic, 1.0) for topic in TOPICS}


@pytest.mark.airflow
@pytest.mark.spark
def test_the_forecast_of_every_topic_is_within_a_tenth_of_the_real_run(machine: subprocess.CompletedProcess[str]
                                                                       ) -> None:
    doc = json.loads(machine.stdout)
    forecast = {r["topic"]: r for r in doc["dry_run"]["forecast"]["by_topic"]}
    run = doc["runs"][0]["document"]
    real = _real_ratios(run)
    assert set(forecast) == set(TOPICS)
    for topic in TOPICS:
        assert abs(forecast[topic]["ratio"] - real[topic]) <= 0.10, (topic, forecast[topic]["ratio"], real[topic])
    no_savings = {o["topic"] for o in run["outcomes"] if o["status"] == "skipped" and o["cause"] == "no savings"}
    assert no_savings == {"metrics.zstd", "payments.encrypted"}
    for topic in no_savings:
        assert forecast[topic]["segments_likely_skipped"] == forecast[topic]["segments"] > 0
    for topic in set(TOPICS) - no_savings:
        assert forecast[topic]["segments_likely_skipped"] == 0
