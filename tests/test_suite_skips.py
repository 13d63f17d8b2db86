"""The suite's own skips: a machine without what one suite needs skips that suite, never another."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_without_java_the_broker_tests_skip_and_the_format_tests_still_run(tmp_path: Path) -> None:
    """The broker suite's skip (no java, no Kafka jars) marks only the tests that need a broker: the format
    tests under ``tests/kafka/`` (whose folder name is one of their keywords) still run."""
    env = {k: v for k, v in os.environ.items() if k != "TIERING_REQUIRE_KAFKA"}
    env["PATH"] = str(tmp_path)  # no java on it
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/kafka/test_buffers.py", "tests/kafka_broker/test_demo.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped
    assert all("tests/kafka_broker/" in line and "needs java" in line for line in skipped), skipped
    assert " passed" in done.stdout.splitlines()[-1]
