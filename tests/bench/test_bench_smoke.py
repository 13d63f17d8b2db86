"""The benchmark script still runs end to end (tiny sizes: its figures are measured by `make bench`, not here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "bench_rewrite.py"


@pytest.mark.slow
def test_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--size-mib", "2", "--rss-sizes-mib", "2", "--repeat", "1",
                           "--json-out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    names = [row["name"] for row in doc["in_process"]]
    assert names[0].startswith("bare loop")
    assert doc["in_process"][0]["ratio_to_bare"] == 1.0
    assert all(row["uncompressed_bytes"] == doc["in_process"][0]["uncompressed_bytes"] for row in doc["in_process"])
    assert doc["cli"][0]["peak_rss_mib"] > 0
    assert len(doc["cli"][0]["pair_ratios"]) == 3  # --cli-repeat's default
    assert all(len(row["paired_ratios"]) == 3 for row in doc["in_process"])  # quartiles, even of one visit
    assert doc["in_process"][0]["paired_ratios"] == [1.0, 1.0, 1.0]
    rows = doc["in_process"]
    assert all(row["ratio_to_bare"] == row["paired_ratios"][1] for row in rows)  # the median of the bracketed visits
    assert all(row["best_of_ratio"] > 0 for row in rows)
    assert [len(v) for v in rows[0]["bare_visits"]] == [len(rows)]  # one slice: a bare visit before and after each
    assert [len(b) for b in doc["cli"][0]["pair_bare_seconds"]] == [2, 2, 2]  # before and after each run
    assert "ratio" in proc.stdout


@pytest.mark.slow
def test_ab_bench_compares_two_trees() -> None:
    root = BENCH.parents[1]
    proc = subprocess.run([sys.executable, str(BENCH.parent / "bench_ab.py"), str(root), str(root), "--size-mib", "2",
                           "--slice-mib", "1", "--rounds", "2", "--modes", "deep,nodeep"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].endswith("paired visits per mode; quartiles")
    assert int(lines[0].split()[0]) >= 2  # at least one slice, two rounds
    assert sum(line.startswith(("deep ", "nodeep ")) for line in lines) == 2
    assert sum("vs bare loop" in line for line in lines) == 4


@pytest.mark.slow
def test_s3_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench_s3.json"
    script = BENCH.parent / "bench_s3.py"
    proc = subprocess.run([sys.executable, str(script), "--objects", "800", "--segment-mib", "1", "2", "--repeat", "1",
                           "--json-out", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["scan"]["objects"] == 800
    assert doc["scan"]["segments"] == 200
    assert [row["segment_mib"] for row in doc["rewrite"]] == [1, 2]
    for row in doc["rewrite"]:
        before, after = row["configs"]["read-back + put"], row["configs"]["checksum + auto"]
        assert after["swap"] == "put"  # moto ignores a copy's If-Match: the probe chooses the PUT swap
        assert after["ratio_s3_to_local"] > 0
        assert after["cpu_x_local"] > 0
        assert after["server_cpu_seconds"] > 0
        # Read back at staging, then downloaded for the PUT swap; by checksum: read once, for the PUT.
        assert (before["staged_log_gets"], after["staged_log_gets"]) == (2, 1)
        assert row["configs"]["checksum + put"]["requests"] < before["requests"]  # auto adds the swap probe's
        assert after["peak_rss_mib"] > 0
    assert doc["rss_growth"]["from_mib"] == 1
    assert "checksum + auto (put)" in proc.stdout


@pytest.mark.slow
@pytest.mark.seaweedfs
def test_s3_bench_on_seaweedfs_swaps_by_copy_and_uploads_the_new_log_once(tmp_path: Path) -> None:
    from tests.s3 import seaweedfs

    seaweedfs.require()
    out = tmp_path / "bench_s3.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "bench_s3.py"), "--store", "seaweedfs", "--segment-mib",
                           "2", "--repeat", "1", "--baseline", "HEAD", "--json-out", str(out)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert "scan" not in doc
    assert doc["store"]["kind"] == "seaweedfs"
    (row,) = doc["rewrite"]
    c = row["configs"]["checksum + auto"]
    assert c["swap"] == "copy"
    assert (c["staged_gets"], c["work_dir_max_bytes"]) == (0, 0)  # never downloaded, never spooled
    # Sent: the new .log once, its indexes and the protocol's documents; received: the source .log once.
    assert c["new_log_bytes"] <= c["bytes_sent"] < c["new_log_bytes"] * 1.1
    assert row["segment_bytes"] <= c["bytes_received"] < row["segment_bytes"] * 1.1
    assert c["server_cpu_seconds"] > 0
    assert 0 <= c["system_seconds"] <= c["cpu_seconds"]
    assert "checksum + auto (copy)" in proc.stdout
    assert "in the kernel" in proc.stdout
    before = row["configs"]["checksum + auto @HEAD"]  # the committed package, exported and run the same way
    assert (before["revision"], before["swap"], before["staged_gets"]) == ("HEAD", "copy", 0)
    assert "the same at HEAD (copy)" in proc.stdout
    assert set(doc["request_cpu_ms"]) == {"HeadObject", "GetObject", "PutObject", "ListObjectsV2"}
    assert all(0 < ms < 100 for ms in doc["request_cpu_ms"].values())
    assert "HeadObject" in proc.stdout


@pytest.mark.slow
@pytest.mark.spark  # local[1] and local[2] sessions
def test_spark_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench_spark.json"
    script = BENCH.parent / "bench_spark.py"
    proc = subprocess.run([sys.executable, str(script), "--partitions", "2", "--segments", "2", "--segment-mib",
                           "0.25", "--repeat", "1", "--json-out", str(out)], capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["segments"] == 2
    assert doc["cli"]["compacted"] == 2
    assert doc["speedup_stage"] > 0
    assert len(doc["pairs"]) == 1
    assert 0 < doc["machine_ceiling"]["ceiling"] < 4
    assert len(doc["machine_ceiling"]["two_at_once_seconds"]) == 3
    assert "speed-up local[2] / local[1], stage" in proc.stdout


@pytest.mark.slow
def test_rebatch_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench_rebatch.json"
    script = BENCH.parent / "bench_rebatch.py"
    proc = subprocess.run([sys.executable, str(script), "--records", "3000", "--per-batch", "1", "100", "--repeat", "1",
                           "--rss-mib", "1", "2", "--json-out", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert [m["segment_mib"] for m in doc["memory"]] == [1, 2]
    assert all(m["bytes"] >= m["segment_mib"] << 20 and m["peak_rss_mib"] > 20 for m in doc["memory"])
    assert "peak RSS, largest over smallest" in proc.stdout
    rows = {r["records_per_batch"]: r for r in doc["rows"]}
    assert (rows[1]["batches"], rows[100]["batches"]) == (3000, 30)
    assert rows[1]["batches_after_rebatch"] < 3000 / 50
    assert rows[1]["rebatched_bytes"] < rows[1]["recompressed_bytes"]
    assert rows[1]["rebatched_over_recompressed"] < rows[100]["rebatched_over_recompressed"] <= 1.05
    assert "re-batched" in proc.stdout


@pytest.mark.slow
def test_keycompact_bench_runs_and_writes_its_json(tmp_path: Path) -> None:
    """An unbounded pass and bounded passes leave the same records: one per key that still has a value."""
    out = tmp_path / "bench_keycompact.json"
    script = BENCH.parent / "bench_keycompact.py"
    proc = subprocess.run([sys.executable, str(script), "--keys", "300", "--updates", "6000", "--segment-mib", "0.05",
                           "--max-keys", "0", "200", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    unbounded, bounded = doc["runs"]
    assert (unbounded["passes"], doc["source"]["records"]) == (1, 6000)
    assert bounded["passes"] > 1
    assert bounded["records_after"] == unbounded["records_after"] <= 300
    assert unbounded["bytes_after"] < doc["source"]["bytes"] / 5
    assert "peak RSS MiB" in proc.stdout


def test_the_segment_walk_bench_follows_each_walk_through_the_commit_steps(tmp_path: Path) -> None:
    """A compaction walks stage, verify and swap, a recovery recover and swap, a merge its kind and the
    many-for-one swap; neither of the first two calls into the plan layer (the state document the commit
    protocol writes is the lifecycle's)."""
    out = tmp_path / "segment_walk.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "segment_walk.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    compact, recover, merge = json.loads(out.read_text())
    assert {"tiering.commit.stage", "tiering.commit.verify", "tiering.commit.swap"} <= set(compact["visited"])
    assert {"tiering.commit.recover", "tiering.commit.swap"} <= set(recover["visited"])
    assert "tiering.commit.stage" not in recover["visited"]
    assert {"tiering.run.merge", "tiering.kafka.merge", "tiering.commit.regroup"} <= set(merge["visited"])
    assert merge["depth"] >= merge["module_depth"] > 1
    for walk in (compact, recover):
        assert not [m for m in walk["visited"] if m.startswith("tiering.plan.")], walk["visited"]
        assert walk["depth"] >= walk["module_depth"] > 1
    assert "module depth" in proc.stdout


def test_the_cleanup_requests_bench_deletes_every_kept_object_a_partition_at_a_time(tmp_path: Path) -> None:
    """Each partition costs its lease, one journal listing and one DeleteObjects for all its objects."""
    out = tmp_path / "cleanup.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "cleanup_requests.py"), "--partitions", "20",
                           "--runs", "2", "--json", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["objects_deleted"] == 20 * 2 * 2 * 3
    assert doc["requests"]["DeleteObject"] == 20  # the leases released: never one an object
    assert 20 <= doc["requests"]["DeleteObjects"] <= 20 + 2  # one a partition (and the probe's)
    assert "a partition" in proc.stdout


@pytest.mark.slow
def test_merge_bench_runs_and_counts_objects_before_and_after(tmp_path: Path) -> None:
    out = tmp_path / "bench_merge.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "bench_merge.py"), "--segments", "30", "--records", "50",
                           "--target-mib", "0.05", "1024", "--json-out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    small, large = json.loads(out.read_text())["rows"]
    assert small["segments_before"] == large["segments_before"] == 31
    assert (large["segments_after"], large["files_after"]) == (2, 7)  # one merged segment and the active one
    assert 2 < small["segments_after"] < 31
    assert small["files_after"] < small["files_before"]
    assert "segment.bytes" in proc.stdout


@pytest.mark.slow
def test_plan_scale_bench_plans_a_rollback_and_a_tiering_run_from_a_bucket_of_its_own(tmp_path: Path) -> None:
    """Each kind's plan holds every partition and segment seeded (a rollback all of them, tiering the sealed
    ones), and tiering really reads each sealed segment's newest timestamp (three GETs a segment, one state
    document a partition)."""
    out = tmp_path / "plan.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "bench_plan_scale.py"), "--segments", "1000",
                           "--kinds", "rollback,tier", "--json", str(out)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {row["kind"]: row for row in json.loads(out.read_text())["rows"]}
    assert (rows["rollback"]["planned"], rows["rollback"]["segments"]) == (10, 1000)
    assert (rows["tier"]["planned"], rows["tier"]["segments"]) == (10, 990)
    assert rows["tier"]["requests"]["GetObject"] == 3 * 990 + 10
    assert rows["rollback"]["requests"]["GetObject"] == 10  # the state documents: the backups are listed only
    assert "largest over smallest" in proc.stdout


def test_the_documents_bench_measures_each_way_on_one_document(tmp_path: Path) -> None:
    out = tmp_path / "documents.json"
    proc = subprocess.run([sys.executable, str(BENCH.parent / "bench_documents.py"), "--segments", "300",
                           "--repeat", "1", "--json", str(out)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["segments"] == 300
    assert [row["way"] for row in doc["rows"]] == ["baseline", "pydantic", "msgspec"]
    assert all(row["decode_ms"] > 0 and row["encode_ms"] > 0 for row in doc["rows"])
    assert "unknown field `colour`" in proc.stdout
