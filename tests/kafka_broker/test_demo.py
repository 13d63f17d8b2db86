"""`make demo-kafka` keeps working: the demo (tests/kafka_broker/demo.py) runs end to end and says every
partition came back identical after a real compaction."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def test_the_kafka_demo_restores_every_partition_identically() -> None:
    done = subprocess.run([sys.executable, "-m", "tests.kafka_broker.demo", "--json"], capture_output=True, text=True,
                          timeout=600, check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-2000:]
    doc = json.loads(done.stdout)
    assert doc["identical"] is True
    rows = doc["partitions"]
    assert len(rows) >= 3
    assert sum(r["aborted"] for r in rows) > 0  # the transactional topic is in it
    for r in rows:
        name = f"{r['topic']}-{r['partition']}"
        assert r["identical"] is True, name
        assert r["segments_compacted"] > 0, name
        assert r["read_uncommitted"]["after"] == r["read_uncommitted"]["before"] == r["produced"], name
        assert r["read_committed"]["after"] == r["read_committed"]["before"] == r["produced"] - r["aborted"], name
        assert 0 < r["log_bytes_after"] < r["log_bytes_before"], name
