"""The scan benchmark still runs end to end (a small bucket: its figures are measured by the documented command)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "bench" / "bench_scan.py"


@pytest.mark.slow
def test_scan_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench_scan.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--objects", "2000,800", "--workers", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["entry"] == "tiering.plan.scan:scan"
    assert doc["entry_file"].endswith("scan.py")
    assert doc["machine"]["cpus"] > 0
    assert doc["machine"]["moto"]
    assert [row["objects"] for row in doc["rows"]] == [2000, 800]
    for row in doc["rows"]:
        assert row["objects_listed"] == row["objects"]
        assert row["segments"] == row["objects"] // 4  # .log, .index, .timeindex, .snapshot per segment
        assert row["partitions"] == -(-row["segments"] // 100)
        assert row["requests"]["ListObjectsV2"] > 0
        assert row["workers"] == 2
        assert row["cpu_s"] > 0
        assert row["cpu_s"] == pytest.approx(row["user_s"] + row["sys_s"], abs=0.002)
        assert row["wall_s"] > 0
        assert row["baseline_rss_mib"] > 0
        assert row["peak_rss_mib"] >= row["baseline_rss_mib"]
        assert row["rss_above_baseline_mib"] == pytest.approx(row["peak_rss_mib"] - row["baseline_rss_mib"], abs=0.2)
        assert row["kib_per_object"] >= 0
    assert "KiB/object" in proc.stdout


def test_scan_bench_counts_any_result_shape() -> None:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import bench_scan
    finally:
        sys.path.remove(str(SCRIPT.parent))

    class Streamed:
        def __init__(self) -> None:
            self.objects_listed = 0

        def __iter__(self) -> Iterator[object]:
            for _ in range(3):
                self.objects_listed += 4
                yield object()

    streamed = Streamed()
    assert bench_scan._counts(streamed) == (3, 12)  # objects_listed read after the stream is consumed
    assert bench_scan._counts({"segments": [1, 2], "objects_listed": 8}) == (2, 8)
    assert bench_scan._counts({"totals": {"segments": 5}}) == (5, None)
    assert bench_scan._counts(iter([1, 2, 3])) == (3, None)
