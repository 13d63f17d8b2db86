"""The local demo end to end (at a tenth of its size): generate, rewrite, prove, summarise."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tiering.cli import main
from tiering.demo.local import CORRUPT_SEGMENT, DEMO_TOPICS, run_demo
from tiering.kafka.files import parse_segment_name
from tiering.local import verify_file

pytestmark = pytest.mark.slow

SCALE = 0.1
INCOMPRESSIBLE = "media_blobs-0"
ALREADY_ZSTD = "audit.zstd-0"
CORRUPT_PARTITION, CORRUPT_INDEX = CORRUPT_SEGMENT


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("demo-module") / "demo"
    lines: list[str] = []
    report = run_demo(workdir, scale=SCALE, log=lines.append).to_json()
    assert any("corrupted" in line for line in lines)
    return workdir, report


def _rows(report: dict[str, Any], partition: str) -> list[dict[str, Any]]:
    return [r for r in report["segments"] if r["partition"] == partition]


def _sealed(report: dict[str, Any], partition: str) -> list[dict[str, Any]]:
    return [r for r in _rows(report, partition) if r["status"] != "skipped"]


def test_every_segment_is_reported_once(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    on_disk = sorted((p.parent.name, p.name) for p in (workdir / "logdir").glob("*/*.log"))
    assert sorted((r["partition"], r["segment"]) for r in report["segments"]) == on_disk
    assert len(on_disk) == sum(t.sealed_segments + 1 for t in DEMO_TOPICS)
    assert {r["status"] for r in report["segments"]} <= {"rewritten", "skipped", "failed"}


def test_sealed_segments_rewritten_except_the_corrupt_one(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    failed = [r for r in report["segments"] if r["status"] == "failed"]
    assert len(failed) == 1
    victim = failed[0]
    assert victim["partition"] == CORRUPT_PARTITION
    assert victim == _sealed(report, CORRUPT_PARTITION)[CORRUPT_INDEX]
    assert victim["expected"] is True
    assert report["expected_failures_only"] is True
    assert victim["segment"] in victim["reason"]
    assert "byte " in victim["reason"]
    assert "batch base offset " in victim["reason"]
    assert not (workdir / "rewritten" / CORRUPT_PARTITION / victim["segment"]).exists()
    for topic in DEMO_TOPICS:
        sealed = _sealed(report, topic.partition_dir)
        assert len(sealed) == topic.sealed_segments
        for row in sealed:
            if row is not victim:
                assert row["status"] == "rewritten", row
                assert row["reason"] is None


def test_rewrites_are_on_disk_and_prove_out(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    for row in report["segments"]:
        if row["status"] != "rewritten":
            continue
        source = workdir / "logdir" / row["partition"] / row["segment"]
        rewritten = workdir / "rewritten" / row["partition"] / row["segment"]
        assert rewritten.stat().st_size == row["bytes_after"]
        assert source.stat().st_size == row["bytes_before"]
        summary = verify_file(rewritten, indexes=True)
        assert summary.records_sha256 == row["records_sha256"] == verify_file(source).records_sha256
        assert summary.record_count == row["records"]
        assert summary.index_equals_rebuild == {"index": True, "timeindex": True}
        assert sum(row["codecs_before"].values()) == sum(row["codecs_after"].values()) == summary.batch_count


def test_weakly_compressed_topics_shrink_to_zstd(demo: tuple[Path, dict[str, Any]]) -> None:
    _, report = demo
    for topic in DEMO_TOPICS:
        if topic.partition_dir in (INCOMPRESSIBLE, ALREADY_ZSTD):
            continue
        for row in _sealed(report, topic.partition_dir):
            if row["status"] == "rewritten":
                assert row["codecs_before"] == {topic.producer_codec.label: sum(row["codecs_before"].values())}
                assert set(row["codecs_after"]) == {"zstd"}
                assert row["bytes_after"] < row["bytes_before"]


def test_incompressible_topic_is_kept(demo: tuple[Path, dict[str, Any]]) -> None:
    """Random payloads: recompressing would not shrink them, so every batch is kept as it was."""
    _, report = demo
    rows = _sealed(report, INCOMPRESSIBLE)
    assert rows
    for row in rows:
        assert row["status"] == "rewritten"
        batches = sum(row["codecs_before"].values())
        assert row["batches_kept"] == {"recompression would not shrink it": batches}
        assert row["codecs_after"] == row["codecs_before"]
        assert row["bytes_after"] == row["bytes_before"]


def test_already_zstd_topic_is_kept(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    rows = _sealed(report, ALREADY_ZSTD)
    assert rows
    for row in rows:
        assert row["status"] == "rewritten"
        batches = sum(row["codecs_before"].values())
        assert row["codecs_before"] == row["codecs_after"] == {"zstd": batches}
        assert row["batches_kept"] == {"already in the target codec": batches}
        assert row["bytes_after"] == row["bytes_before"]
        source = workdir / "logdir" / ALREADY_ZSTD / row["segment"]
        assert (workdir / "rewritten" / ALREADY_ZSTD / row["segment"]).read_bytes() == source.read_bytes()


def test_active_segments_skipped(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    skipped = [r for r in report["segments"] if r["status"] == "skipped"]
    assert len(skipped) == len(DEMO_TOPICS)
    for topic in DEMO_TOPICS:
        rows = _rows(report, topic.partition_dir)
        bases = [parse_segment_name(r["segment"]) for r in rows]
        assert all(b is not None for b in bases)
        highest = max(rows, key=lambda r: r["segment"])
        assert highest["status"] == "skipped"
        assert "active segment" in highest["reason"]
        assert [r for r in rows if r["status"] == "skipped"] == [highest]
        assert not (workdir / "rewritten" / topic.partition_dir / highest["segment"]).exists()


def test_totals_are_consistent(demo: tuple[Path, dict[str, Any]]) -> None:
    _, report = demo
    totals = report["totals"]
    rows = report["segments"]
    done = [r for r in rows if r["status"] == "rewritten"]
    assert totals["rewritten"] == len(done)
    assert totals["skipped"] == sum(r["status"] == "skipped" for r in rows)
    assert totals["failed"] == sum(r["status"] == "failed" for r in rows) == 1
    assert totals["rewritten"] + totals["skipped"] + totals["failed"] == len(rows)
    assert totals["bytes_before"] == sum(r["bytes_before"] for r in done)
    assert totals["bytes_after"] == sum(r["bytes_after"] for r in done)
    assert totals["bytes_after"] < totals["bytes_before"]
    assert totals["ratio"] == round(totals["bytes_after"] / totals["bytes_before"], 4)
    assert totals["monthly_savings_usd"] > 0
    assert totals["monthly_savings_usd_per_tib_like_this"] > 0
    assert (report["codec"], report["level"], report["schema_version"]) == ("zstd", 3, 1)


def test_summary_json_equals_returned_document(demo: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = demo
    assert report["summary_path"] == str(workdir / "summary.json")
    assert json.loads((workdir / "summary.json").read_text()) == report


def test_cli_demo_json(tmp_path: Path) -> None:
    out_dir = tmp_path / "demo-cli"
    out_dir.mkdir()
    (out_dir / ".tiering-demo").write_text("an earlier demo run made this directory")
    (out_dir / "leftover-from-an-earlier-run").write_text("replaced on each run")
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["demo-local", "--out", str(out_dir), "--scale", str(SCALE), "--json"], stdout=stdout, stderr=stderr)
    assert (code, stderr.getvalue()) == (0, "")
    doc = json.loads(stdout.getvalue())
    assert doc == json.loads((out_dir / "summary.json").read_text())
    assert doc["totals"]["failed"] == 1
    assert doc["expected_failures_only"] is True
    assert not (out_dir / "leftover-from-an-earlier-run").exists()


def test_demo_refuses_to_replace_a_directory_it_did_not_make(tmp_path: Path) -> None:
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    stdout, stderr = io.StringIO(), io.StringIO()
    code = main(["demo-local", "--out", str(precious), "--scale", str(SCALE)], stdout=stdout, stderr=stderr)
    assert code == 2
    assert "refusing to replace a directory the demo did not create" in stderr.getvalue()
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert sorted(p.name for p in precious.iterdir()) == ["thesis.tex"]


@pytest.mark.parametrize("scale", ["nan", "inf", "0", "-1"])
def test_demo_scale_must_be_a_positive_finite_number(tmp_path: Path, scale: str) -> None:
    stderr = io.StringIO()
    code = main(["demo-local", "--out", str(tmp_path / "d"), "--scale", scale], stdout=io.StringIO(), stderr=stderr)
    assert code == 2
    assert "demo scale out of range" in stderr.getvalue()
