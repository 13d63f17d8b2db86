"""The side-by-side benchmark of key compaction and Kafka's log cleaner (bench_cleaner.py) on a small
partition: it runs end to end, reads the broker's own figures, and our files equal the cleaner's where the
batches are uncompressed (the benchmark's claim of identical output rests on this comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.kafka_broker import bench_cleaner

pytestmark = pytest.mark.kafka


def test_the_benchmark_reads_the_cleaner_s_figures_and_finds_our_segments_identical(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert bench_cleaner.main(["--records", "40000", "--keys", "4000", "--codecs", "none", "--segment-mib", "1",
                               "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    kafka, ours = run["kafka"], run["ours"]
    assert run["segments"] >= 3
    assert kafka["dirty_section"][0] == 0
    assert kafka["mb_processed"] > 0
    assert kafka["log_seconds"] is not None
    assert kafka["cleaner_cpu_seconds"] > 0
    assert ours["seconds"] > 0
    assert run["cleaned_segments"] >= 1
    assert run["identical_segments"] == run["cleaned_segments"]
