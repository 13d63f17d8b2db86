"""The ``tiering`` command line, end to end on the Kafka-written golden segments.

Most cases call ``tiering.cli.main(argv, stdout=..., stderr=...)``; a few run the real console script
(or ``python -m tiering``) in a subprocess to hold the installed entry point to the same contract.
Golden files are only read: anything that gets damaged is a copy under ``tmp_path``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.golden import GOLDEN, SEGMENTS, by_topic, index_path, log_path, segment_id
from tiering import __version__
from tiering.cli import main
from tiering.kafka.rewrite import read_back

V2_SEGMENTS = [s for s in SEGMENTS if s["magics"] == [2]]
TIMESTAMP_TYPE_IDS = {"NoTimestampType": -1, "CreateTime": 0, "LogAppendTime": 1}
CONSOLE_SCRIPT = Path(sys.executable).with_name("tiering")


def _cli(*argv: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tiering`` in a subprocess (the same entry point as the console script)."""
    return subprocess.run([sys.executable, "-m", "tiering", *map(str, argv)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)


def _jsonl(seg: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (GOLDEN / seg["batches_jsonl"]).read_text().splitlines()]


def _json_lines(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


def _copy_segment(seg: dict[str, Any], directory: Path, *, indexes: bool = False) -> Path:
    """Copy a golden ``.log`` (and its .index/.timeindex) into ``directory``, keeping its name."""
    directory.mkdir(parents=True, exist_ok=True)
    src = log_path(seg)
    dst = directory / src.name
    shutil.copyfile(src, dst)
    if indexes:
        for suffix in (".index", ".timeindex"):
            shutil.copyfile(src.with_suffix(suffix), dst.with_suffix(suffix))
    return dst


def _corrupt_copy(seg: dict[str, Any], directory: Path) -> tuple[Path, int, int]:
    """A copy with one byte flipped inside the middle batch's payload: (path, batch position, base offset)."""
    batches = _jsonl(seg)
    victim = batches[len(batches) // 2]
    path = _copy_segment(seg, directory)
    data = bytearray(path.read_bytes())
    data[victim["position"] + victim["size"] // 2 + 10] ^= 0xFF
    path.write_bytes(data)
    # The entry's own offset field: v2's baseOffset; a legacy wrapper's is its last inner offset.
    base: int = struct.unpack_from(">q", data, victim["position"])[0]
    if victim["magic"] >= 2:
        assert base == victim["base_offset"]
    return path, victim["position"], base


def _digests_from_deep_dump(docs: list[dict[str, Any]]) -> tuple[str, str]:
    """records_sha256 and batches_sha256 as the golden MANIFEST defines them, from ``dump --deep --json``."""
    records, batches = hashlib.sha256(), hashlib.sha256()
    for b in docs:
        horizon = b["delete_horizon_ms"]
        batches.update(struct.pack(
            ">qqbbqqhibbibqi", b["base_offset"], b["last_offset"], b["magic"], TIMESTAMP_TYPE_IDS[b["timestamp_type"]],
            b["max_timestamp"], b["producer_id"], b["producer_epoch"], b["base_sequence"], b["is_transactional"],
            b["is_control"], b["partition_leader_epoch"], horizon is not None, -1 if horizon is None else horizon,
            len(b["records"])))
        for r in b["records"]:
            records.update(struct.pack(">qq", r["offset"], r["timestamp"]))
            for field in ("key", "value"):
                data = r[f"{field}_b64"]
                if data is None:
                    records.update(struct.pack(">i", -1))
                else:
                    raw = base64.b64decode(data, validate=True)
                    assert len(raw) == r[f"{field}_size"]
                    records.update(struct.pack(">i", len(raw)) + raw)
            records.update(struct.pack(">i", len(r["headers"])))
            for h in r["headers"]:
                key = h["key"].encode("utf-8")
                records.update(struct.pack(">i", len(key)) + key)
                if h["value_b64"] is None:
                    records.update(struct.pack(">i", -1))
                else:
                    value = base64.b64decode(h["value_b64"], validate=True)
                    records.update(struct.pack(">i", len(value)) + value)
    return records.hexdigest(), batches.hexdigest()


def _entries(directory: Path) -> list[str]:
    """Every name in ``directory``, hidden temporary files included."""
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


def _assert_one_error_line(err: str, *needles: str) -> None:
    assert err.endswith("\n")
    assert err.count("\n") == 1, err
    assert err.startswith("tiering: ")
    for needle in needles:
        assert needle in err, (needle, err)


# --- segment dump ------------------------------------------------------------------------------


def test_dump_text_one_line_per_batch(golden: dict[str, Any]) -> None:
    code, out, err = _cli("segment", "dump", log_path(golden))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    expected = _jsonl(golden)
    assert len(lines) == golden["batch_count"] == len(expected)
    for line, b in zip(lines, expected, strict=True):
        assert line.startswith(f"baseOffset: {b['base_offset']} lastOffset: {b['last_offset']} "
                               f"count: {b['record_count']} position: {b['position']} size: {b['size']} "
                               f"magic: {b['magic']} compresscodec: {b['codec']} ")
        assert f" crc: {b['crc']}" in line
        assert f"isControl: {str(b['is_control']).lower()}" in line


def test_dump_text_names_transaction_markers() -> None:
    seg = by_topic("txn")
    code, out, _ = _cli("segment", "dump", log_path(seg))
    assert code == 0
    markers = [b["control_type"] for b in _jsonl(seg) if b["is_control"]]
    assert markers
    found = [line.split("endTxnMarker: ")[1].split()[0] for line in out.splitlines() if "endTxnMarker: " in line]
    assert found == markers


def test_dump_json_lines_equal_kafkas_view(golden: dict[str, Any]) -> None:
    code, out, err = _cli("segment", "dump", "--json", log_path(golden))
    assert (code, err) == (0, "")
    assert _json_lines(out) == _jsonl(golden)


def test_dump_deep_text_prints_every_record(golden: dict[str, Any]) -> None:
    code, out, _ = _cli("segment", "dump", "--deep", log_path(golden))
    assert code == 0
    lines = out.splitlines()
    record_lines = [line for line in lines if line.startswith("| offset: ")]
    assert len(record_lines) == golden["record_count"]
    assert len(lines) == golden["record_count"] + golden["batch_count"]
    offsets = [int(line.split()[2]) for line in record_lines]
    assert offsets == sorted(offsets)
    assert len(set(offsets)) == len(offsets)


def test_dump_deep_text_shows_null_and_empty() -> None:
    code, out, _ = _cli("segment", "dump", "--deep", log_path(by_topic("edge")))
    assert code == 0
    by_offset = {int(line.split()[2]): line for line in out.splitlines() if line.startswith("| offset: ")}
    assert by_offset[0].endswith("keySize: -1 valueSize: 5 headers: [] key: null value: 'hello'")
    assert by_offset[1].endswith("keySize: 0 valueSize: 0 headers: [] key: '' value: ''")
    assert by_offset[2].endswith("key: 'k-tomb' value: null")


def test_dump_deep_json_records_reproduce_manifest_digests(golden: dict[str, Any]) -> None:
    """Every record of the dump (base64 keys, values, header values) digests to Kafka's own MANIFEST digest."""
    code, out, err = _cli("segment", "dump", "--deep", "--json", log_path(golden))
    assert (code, err) == (0, "")
    docs = _json_lines(out)
    assert [{k: v for k, v in d.items() if k != "records"} for d in docs] == _jsonl(golden)
    assert sum(len(d["records"]) for d in docs) == golden["record_count"]
    for d in docs:
        assert [r["offset"] for r in d["records"]][:1] == [o for o in [d["first_record_offset"]] if o is not None]
    records_sha256, batches_sha256 = _digests_from_deep_dump(docs)
    assert records_sha256 == golden["records_sha256"]
    assert batches_sha256 == golden["batches_sha256"]


def test_dump_deep_json_null_empty_and_headers() -> None:
    code, out, _ = _cli("segment", "dump", "--deep", "--json", log_path(by_topic("edge")))
    assert code == 0
    records = {r["offset"]: r for d in _json_lines(out) for r in d["records"]}
    assert (records[0]["key_b64"], records[0]["key_size"]) == (None, -1)
    assert base64.b64decode(records[0]["value_b64"]) == b"hello"
    assert (records[1]["key_b64"], records[1]["value_b64"], records[1]["key_size"]) == ("", "", 0)
    assert (records[2]["value_b64"], records[2]["value_size"]) == (None, -1)
    headers = records[4]["headers"]
    assert {"key": "h-null", "value_b64": None} in headers
    assert {"key": "h-empty", "value_b64": ""} in headers
    assert [h["key"] for h in headers].count("dup") == 2


def test_dump_corrupt_copy_exits_1(tmp_path: Path) -> None:
    seg = by_topic("events-gzip")
    path, position, base = _corrupt_copy(seg, tmp_path)
    code, out, err = _cli("segment", "dump", "--json", path)
    assert code == 1
    _assert_one_error_line(err, str(path), f"byte {position}", f"batch base offset {base}")
    lines = _json_lines(out)
    assert [d["position"] for d in lines[:-1]] == [b["position"] for b in _jsonl(seg) if b["position"] < position]
    # The error closes the JSON Lines stream, for machines.
    assert lines[-1]["type"] == "error"
    assert lines[-1]["exit_code"] == 1
    assert (lines[-1]["error"]["position"], lines[-1]["error"]["base_offset"]) == (position, base)


def test_dump_decompression_limit_is_enforced() -> None:
    path = log_path(by_topic("events-zstd"))
    code, _, err = _cli("segment", "dump", "--decompression-limit", "100", path)
    assert code == 1
    _assert_one_error_line(err, str(path), "byte 0", "decompression limit")


# --- segment verify ----------------------------------------------------------------------------


def test_verify_golden_exits_0(golden: dict[str, Any]) -> None:
    code, out, err = _cli("segment", "verify", log_path(golden))
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "valid"
    assert str(golden["batch_count"]) in out


def test_verify_json_digests_equal_manifest(golden: dict[str, Any]) -> None:
    code, out, err = _cli("segment", "verify", "--json", log_path(golden))
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["valid"] is True
    assert doc["records_sha256"] == golden["records_sha256"]
    assert doc["batches_sha256"] == golden["batches_sha256"]
    for key in ("size_bytes", "batch_count", "record_count", "control_batch_count", "empty_batch_count",
                "first_offset", "last_offset", "next_offset", "max_timestamp", "magics"):
        assert doc[key] == golden[key], key
    assert set(doc["codecs"]) == set(golden["codecs"])
    assert sum(doc["codecs"].values()) == golden["batch_count"]


@pytest.mark.parametrize("seg", [by_topic("edge"), by_topic("events-gzip")], ids=segment_id)
def test_verify_json_reports_uncompressed_bytes(seg: dict[str, Any], tmp_path: Path) -> None:
    """``uncompressed_record_bytes`` is the decompressed records sections, as the rewrite counts them."""
    code, out, _ = _cli("segment", "verify", "--json", log_path(seg))
    assert code == 0
    verified = json.loads(out)["uncompressed_record_bytes"]
    code, out, _ = _cli("segment", "rewrite", log_path(seg), "--out", tmp_path, "--codec", "zstd", "--json")
    assert code == 0
    rewritten = json.loads(out)["uncompressed_bytes"]
    assert rewritten > 0
    assert verified == rewritten


def test_verify_indexes_on_golden_valid(golden: dict[str, Any]) -> None:
    code, out, err = _cli("segment", "verify", "--indexes", "--json", log_path(golden))
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["valid"] is True
    assert doc["index_problems"] == []
    assert doc["index_missing"] == []
    assert doc["index_equals_rebuild"] == {"index": True, "timeindex": True}


def test_verify_indexes_text_says_equal() -> None:
    code, out, _ = _cli("segment", "verify", "--indexes", log_path(by_topic("txn")))
    assert code == 0
    assert ".index: valid, equal to a rebuild (index.interval.bytes=4096" in out
    assert ".timeindex: valid, equal to a rebuild (index.interval.bytes=4096" in out
    assert out.splitlines()[-1] == "valid"


def test_verify_indexes_at_1024_against_golden_1024(tmp_path: Path) -> None:
    seg = by_topic("events-snappy")
    path = _copy_segment(seg, tmp_path)
    for kind in ("index", "timeindex"):
        shutil.copyfile(index_path(seg, 1024, kind), path.with_suffix(f".{kind}"))
    code, out, _ = _cli("segment", "verify", "--indexes", "--index-interval-bytes", "1024", "--json", path)
    assert code == 0
    assert json.loads(out)["index_equals_rebuild"] == {"index": True, "timeindex": True}
    # Valid indexes built at another interval are still valid, only not equal to this rebuild.
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 0
    doc = json.loads(out)
    assert doc["index_problems"] == []
    assert doc["index_equals_rebuild"] == {"index": False, "timeindex": False}


def test_verify_missing_index_is_a_note(tmp_path: Path) -> None:
    path = _copy_segment(by_topic("events-lz4"), tmp_path, indexes=True)
    path.with_suffix(".index").unlink()
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 0
    doc = json.loads(out)
    assert doc["index_missing"] == ["index"]
    assert doc["index_equals_rebuild"] == {"timeindex": True}


@pytest.mark.parametrize("seg", SEGMENTS, ids=segment_id)
def test_verify_corrupt_copy_one_line(seg: dict[str, Any], tmp_path: Path) -> None:
    path, position, base = _corrupt_copy(seg, tmp_path)
    code, out, err = _cli("segment", "verify", path)
    assert code == 1
    assert out == ""
    _assert_one_error_line(err, "tiering: invalid: ", path.name, f"byte {position}", f"batch base offset {base}")
    assert "expected" in err
    assert "found" in err


def test_verify_corrupt_copy_json(tmp_path: Path) -> None:
    path, position, base = _corrupt_copy(by_topic("events-lz4"), tmp_path)
    code, out, err = _cli("segment", "verify", "--json", path)
    assert (code, err) == (1, "")
    doc = json.loads(out)
    assert doc["valid"] is False
    assert doc["path"] == str(path)
    assert doc["error"]["path"] == str(path)
    assert (doc["error"]["position"], doc["error"]["base_offset"]) == (position, base)
    assert doc["error"]["retryable"] is False


def test_verify_truncated_copy_exits_1(tmp_path: Path) -> None:
    seg = by_topic("events-zstd")
    path = _copy_segment(seg, tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    last = _jsonl(seg)[-1]
    code, _, err = _cli("segment", "verify", path)
    assert code == 1
    _assert_one_error_line(err, path.name, f"byte {last['position']}", f"batch base offset {last['base_offset']}")


def test_verify_decompression_limit_is_enforced() -> None:
    """``--decompression-limit`` is offered by verify; a batch decompressing past it is invalid data."""
    path = log_path(by_topic("events-zstd"))
    code, _, err = _cli("segment", "verify", "--decompression-limit", "100", path)
    assert code == 1
    _assert_one_error_line(err, path.name, "decompression limit")


def test_verify_missing_file_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    code, out, err = _cli("segment", "verify", path)
    assert (code, out) == (2, "")
    _assert_one_error_line(err, str(path), "cannot open")


def test_verify_unnamed_file_needs_base_offset(tmp_path: Path) -> None:
    path = tmp_path / "segment.log"
    shutil.copyfile(log_path(by_topic("mixed")), path)
    code, _, err = _cli("segment", "verify", path)
    assert code == 2
    _assert_one_error_line(err, "--base-offset")
    code, out, _ = _cli("segment", "verify", "--json", "--base-offset", "1000000", path)
    assert code == 0
    assert json.loads(out)["records_sha256"] == by_topic("mixed")["records_sha256"]
    # A base offset above the first batch's offset is invalid data.
    code, _, err = _cli("segment", "verify", "--base-offset", "1000001", path)
    assert code == 1
    _assert_one_error_line(err, "below the segment's base offset")


@pytest.mark.parametrize("argv", [
    ["segment", "verify", "--bogus", "x.log"],
    ["segment", "verify"],
    ["segment", "verify", "--base-offset", "-1", "00000000000000000000.log"],
    ["segment", "verify", "--index-interval-bytes", "many", "00000000000000000000.log"],
    ["segment", "frobnicate"],
    ["segment"],
    [],
], ids=["unknown-option", "no-path", "negative-base", "not-an-int", "unknown-verb", "no-verb", "nothing"])
def test_usage_errors_exit_2(argv: list[str]) -> None:
    code, out, err = _cli(*argv)
    assert code == 2
    assert out == ""
    assert err


def test_bad_option_is_one_line() -> None:
    code, _, err = _cli("segment", "verify", "--bogus", "x.log")
    assert code == 2
    _assert_one_error_line(err, "--bogus")


def _damaged_index_copy(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    seg = by_topic("events-zstd")
    return _copy_segment(seg, tmp_path, indexes=True), seg


def test_verify_indexes_entry_not_at_a_batch_exits_1(tmp_path: Path) -> None:
    path, _ = _damaged_index_copy(tmp_path)
    index = path.with_suffix(".index")
    data = bytearray(index.read_bytes())
    rel, pos = struct.unpack_from(">ii", data, 8)
    struct.pack_into(">ii", data, 8, rel, pos + 1)
    index.write_bytes(data)
    code, out, _ = _cli("segment", "verify", "--indexes", path)
    assert code == 1
    assert f"index entry 1: position {pos + 1} is not the start of a batch" in out
    assert out.splitlines()[-1] == "INVALID"
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 1
    doc = json.loads(out)
    assert doc["valid"] is False
    assert doc["index_problems"] == [f"index entry 1: position {pos + 1} is not the start of a batch"]
    # The log itself is fine: without --indexes it verifies.
    assert _cli("segment", "verify", path)[0] == 0


def test_verify_indexes_text_never_calls_a_broken_index_valid(tmp_path: Path) -> None:
    path, _ = _damaged_index_copy(tmp_path)
    index = path.with_suffix(".index")
    data = bytearray(index.read_bytes())
    rel, pos = struct.unpack_from(">ii", data, 0)
    struct.pack_into(">ii", data, 0, rel, pos + 1)
    index.write_bytes(data)
    code, out, _ = _cli("segment", "verify", "--indexes", path)
    assert code == 1
    assert ".index: valid" not in out


@pytest.mark.parametrize("damage", ["wrong-offset", "unsorted", "odd-size", "past-the-end"])
def test_verify_indexes_offset_index_damage_exits_1(tmp_path: Path, damage: str) -> None:
    path, _ = _damaged_index_copy(tmp_path)
    index = path.with_suffix(".index")
    data = bytearray(index.read_bytes())
    if damage == "wrong-offset":
        rel, pos = struct.unpack_from(">ii", data, 0)
        struct.pack_into(">ii", data, 0, rel - 1, pos)
    elif damage == "unsorted":
        data[0:8], data[8:16] = data[8:16], data[0:8]
    elif damage == "odd-size":
        data += b"\x00\x00\x00"
    else:
        data += struct.pack(">ii", 0x7FFFFFF0, path.stat().st_size + 10)
    index.write_bytes(data)
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 1
    doc = json.loads(out)
    assert doc["valid"] is False
    assert doc["index_problems"]
    assert all(p.startswith("index entry ") for p in doc["index_problems"])


def test_verify_indexes_time_index_damage_exits_1(tmp_path: Path) -> None:
    path, _ = _damaged_index_copy(tmp_path)
    timeindex = path.with_suffix(".timeindex")
    data = bytearray(timeindex.read_bytes())
    ts, rel = struct.unpack_from(">qi", data, 0)
    struct.pack_into(">qi", data, 0, ts + 1, rel)
    timeindex.write_bytes(data)
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 1
    doc = json.loads(out)
    assert len(doc["index_problems"]) == 1
    assert doc["index_problems"][0].startswith("timeindex entry 0: timestamp ")
    assert doc["index_equals_rebuild"] == {"index": True, "timeindex": False}


# --- segment rewrite ---------------------------------------------------------------------------


def _rewrite_json(src: Path, out_dir: Path, *extra: str) -> dict[str, Any]:
    code, out, err = _cli("segment", "rewrite", src, "--out", out_dir, "--json", *extra)
    assert (code, err) == (0, ""), err
    doc: dict[str, Any] = json.loads(out)
    return doc


def test_rewrite_creates_dir_and_writes_segment_files(golden: dict[str, Any], tmp_path: Path) -> None:
    src = log_path(golden)
    out_dir = tmp_path / "new" / "dir"
    stats = _rewrite_json(src, out_dir, "--codec", "zstd")
    name = src.stem
    expected = [f"{name}.index", f"{name}.log", f"{name}.timeindex"]
    if src.with_suffix(".txnindex").exists():  # offsets are unchanged, so the aborted-txn index is carried along
        expected.append(f"{name}.txnindex")
        assert (out_dir / f"{name}.txnindex").read_bytes() == src.with_suffix(".txnindex").read_bytes()
    assert _entries(out_dir) == expected
    assert stats["outputs"] == {"log": str(out_dir / f"{name}.log"), "index": str(out_dir / f"{name}.index"),
                                "timeindex": str(out_dir / f"{name}.timeindex")}
    assert stats["base_offset"] == golden["base_offset"]
    assert (stats["codec"], stats["level"]) == ("zstd", 3)
    assert stats["bytes_in"] == golden["size_bytes"]
    assert stats["bytes_out"] == (out_dir / f"{name}.log").stat().st_size
    assert stats["saved_bytes"] == stats["bytes_in"] - stats["bytes_out"]
    assert stats["batches"] == golden["batch_count"]
    assert stats["records"] == golden["record_count"]
    assert sum(stats["codecs_before"].values()) == golden["batch_count"]
    assert set(stats["codecs_before"]) == set(golden["codecs"])
    assert sum(stats["codecs_after"].values()) == golden["batch_count"]
    assert stats["batches_rewritten"] + sum(stats["batches_kept"].values()) == golden["batch_count"]
    with (out_dir / f"{name}.log").open("rb") as written:  # the output decoded on its own
        assert read_back(written, base_offset=golden["base_offset"]).payload_xxh3 == stats["payload_xxh3"]
    assert isinstance(stats["seconds"], float | int)
    assert stats["seconds"] >= 0


def test_rewrite_output_verifies_with_source_digests(golden: dict[str, Any], tmp_path: Path) -> None:
    stats = _rewrite_json(log_path(golden), tmp_path, "--codec", "zstd")
    code, out, err = _cli("segment", "verify", "--indexes", "--json", stats["outputs"]["log"])
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["records_sha256"] == golden["records_sha256"]
    assert doc["batches_sha256"] == golden["batches_sha256"]
    assert doc["index_problems"] == []
    assert doc["index_equals_rebuild"] == {"index": True, "timeindex": True}
    assert doc["size_bytes"] == stats["bytes_out"]


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_rewrite_every_codec_keeps_digests(codec: str, tmp_path: Path) -> None:
    seg = by_topic("edge")
    stats = _rewrite_json(log_path(seg), tmp_path, "--codec", codec, "--force")
    with open(stats["outputs"]["log"], "rb") as written:
        assert read_back(written, base_offset=seg["base_offset"]).payload_xxh3 == stats["payload_xxh3"]
    code, out, _ = _cli("segment", "verify", "--json", stats["outputs"]["log"])
    assert code == 0
    doc = json.loads(out)
    assert (doc["records_sha256"], doc["batches_sha256"]) == (seg["records_sha256"], seg["batches_sha256"])
    if codec == "none":
        assert stats["codecs_after"] == {"none": seg["batch_count"]}


def test_rewrite_snappy_to_zstd_shrinks(tmp_path: Path) -> None:
    seg = by_topic("events-snappy")
    stats = _rewrite_json(log_path(seg), tmp_path, "--codec", "zstd")
    assert stats["codecs_before"] == {"snappy": seg["batch_count"]}
    assert stats["codecs_after"] == {"zstd": seg["batch_count"]}
    assert stats["batches_rewritten"] == seg["batch_count"]
    assert stats["bytes_out"] < stats["bytes_in"]
    assert stats["ratio"] == round(stats["bytes_out"] / stats["bytes_in"], 6)


def test_rewrite_keeps_batches_already_in_target_codec(tmp_path: Path) -> None:
    seg = by_topic("events-zstd")
    stats = _rewrite_json(log_path(seg), tmp_path, "--codec", "zstd")
    assert stats["batches_rewritten"] == 0
    assert stats["batches_kept"] == {"already in the target codec": seg["batch_count"]}
    assert Path(stats["outputs"]["log"]).read_bytes() == log_path(seg).read_bytes()


def test_rewrite_legacy_to_zstd_keeps_codecs(tmp_path: Path) -> None:
    seg = by_topic("legacy-v1")
    stats = _rewrite_json(log_path(seg), tmp_path, "--codec", "zstd")
    assert stats["codecs_after"] == stats["codecs_before"]
    assert "zstd" not in stats["codecs_after"]
    assert stats["batches_kept"]["legacy magic cannot hold zstd (needs v2)"] > 0


def test_rewrite_text_output(tmp_path: Path) -> None:
    src = log_path(by_topic("events-lz4"))
    code, out, err = _cli("segment", "rewrite", src, "--out", tmp_path, "--codec", "gzip", "--level", "9")
    assert (code, err) == (0, "")
    for field in ("bytes in → out", "saved", "batches", "records", "codecs before", "codecs after", "seconds"):
        assert field in out
    assert (tmp_path / src.name).exists()


@pytest.mark.parametrize("seg", [by_topic("events-gzip"), by_topic("legacy-v0")], ids=segment_id)
def test_rewrite_invalid_input_leaves_nothing(seg: dict[str, Any], tmp_path: Path) -> None:
    src, position, base = _corrupt_copy(seg, tmp_path / "src")
    out_dir = tmp_path / "out"
    code, out, err = _cli("segment", "rewrite", src, "--out", out_dir, "--codec", "zstd")
    assert (code, out) == (1, "")
    _assert_one_error_line(err, "tiering: invalid: ", str(src), f"byte {position}", f"batch base offset {base}")
    assert _entries(out_dir) == []


def test_rewrite_invalid_input_json_leaves_nothing(tmp_path: Path) -> None:
    src, position, _ = _corrupt_copy(by_topic("events-snappy"), tmp_path / "src")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    code, _, err = _cli("segment", "rewrite", src, "--out", out_dir, "--codec", "zstd", "--json")
    assert code == 1
    _assert_one_error_line(err, f"byte {position}")
    assert _entries(out_dir) == []


@pytest.mark.parametrize(("codec", "level"), [("zstd", "23"), ("zstd", "-131073"), ("gzip", "0"), ("gzip", "10"),
                                              ("lz4", "18"), ("snappy", "1"), ("none", "1")])
def test_rewrite_level_out_of_range_exits_2(tmp_path: Path, codec: str, level: str) -> None:
    out_dir = tmp_path / "out"
    code, out, err = _cli("segment", "rewrite", log_path(by_topic("edge")), "--out", out_dir, "--codec", codec,
                          "--level", level)
    assert (code, out) == (2, "")
    _assert_one_error_line(err, level)
    assert not out_dir.exists()


def test_rewrite_unknown_codec_exits_2(tmp_path: Path) -> None:
    code, _, err = _cli("segment", "rewrite", log_path(by_topic("edge")), "--out", tmp_path, "--codec", "brotli")
    assert code == 2
    _assert_one_error_line(err, "brotli")


def test_rewrite_missing_input_exits_2(tmp_path: Path) -> None:
    code, _, err = _cli("segment", "rewrite", tmp_path / "00000000000000000000.log", "--out", tmp_path / "out",
                        "--codec", "zstd")
    assert code == 2
    _assert_one_error_line(err, "cannot open")
    assert not (tmp_path / "out" / "00000000000000000000.log").exists()


@pytest.mark.parametrize("spelling", ["same", "dot", "dotdot"])
def test_rewrite_into_source_dir_refused(tmp_path: Path, spelling: str) -> None:
    src_dir = tmp_path / "src"
    src = _copy_segment(by_topic("events-snappy"), src_dir, indexes=True)
    before = {p.name: p.read_bytes() for p in src_dir.iterdir()}
    out_dir = {"same": src_dir, "dot": src_dir / ".", "dotdot": src_dir / ".." / "src"}[spelling]
    code, out, err = _cli("segment", "rewrite", src, "--out", out_dir, "--codec", "zstd")
    assert (code, out) == (2, "")
    _assert_one_error_line(err, "overwrite the input")
    assert {p.name: p.read_bytes() for p in src_dir.iterdir()} == before


def test_rewrite_index_interval_1024_equals_reindex(tmp_path: Path) -> None:
    seg = by_topic("orders")
    stats = _rewrite_json(log_path(seg), tmp_path / "rw", "--codec", "zstd", "--index-interval-bytes", "1024")
    new_log = Path(stats["outputs"]["log"])
    code, _, _ = _cli("segment", "reindex", new_log, "--out", tmp_path / "ri", "--index-interval-bytes", "1024")
    assert code == 0
    for suffix in (".index", ".timeindex"):
        assert new_log.with_suffix(suffix).read_bytes() == (tmp_path / "ri" / f"{new_log.stem}{suffix}").read_bytes()
    # The interval mattered: the default interval gives fewer entries for the same bytes.
    default = _rewrite_json(log_path(seg), tmp_path / "rw4096", "--codec", "zstd")
    assert len(Path(default["outputs"]["index"]).read_bytes()) < len(new_log.with_suffix(".index").read_bytes())
    code, out, _ = _cli("segment", "verify", "--indexes", "--index-interval-bytes", "1024", "--json", new_log)
    assert code == 0
    assert json.loads(out)["index_equals_rebuild"] == {"index": True, "timeindex": True}


def test_rewrite_replaces_previous_generation(tmp_path: Path) -> None:
    seg = by_topic("events-snappy")
    first = _rewrite_json(log_path(seg), tmp_path, "--codec", "lz4")
    second = _rewrite_json(log_path(seg), tmp_path, "--codec", "zstd")
    assert first["outputs"] == second["outputs"]
    assert _entries(tmp_path) == sorted(Path(p).name for p in second["outputs"].values())
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", second["outputs"]["log"])
    assert code == 0
    doc = json.loads(out)
    assert set(doc["codecs"]) == {"zstd"}
    assert doc["index_equals_rebuild"] == {"index": True, "timeindex": True}


# --- segment reindex ---------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [4096, 1024])
def test_reindex_equals_kafkas_indexes(golden: dict[str, Any], tmp_path: Path, interval: int) -> None:
    src = log_path(golden)
    code, out, err = _cli("segment", "reindex", src, "--out", tmp_path, "--index-interval-bytes", str(interval),
                          "--json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["batches"] == golden["batch_count"]
    assert doc["index_interval_bytes"] == interval
    for kind in ("index", "timeindex"):
        written = tmp_path / f"{src.stem}.{kind}"
        assert doc[kind] == str(written)
        assert doc[f"{kind}_bytes"] == written.stat().st_size
        assert written.read_bytes() == index_path(golden, interval, kind).read_bytes(), kind
    assert not (tmp_path / src.name).exists()


def test_reindex_default_interval_and_text(tmp_path: Path) -> None:
    seg = by_topic("txn")
    src = log_path(seg)
    code, out, _ = _cli("segment", "reindex", src, "--out", tmp_path / "a")
    assert code == 0
    assert out.startswith(f"wrote {tmp_path / 'a' / src.stem}.index (")
    assert f"from {seg['batch_count']} batches" in out
    for kind in ("index", "timeindex"):
        assert (tmp_path / "a" / f"{src.stem}.{kind}").read_bytes() == index_path(seg, 4096, kind).read_bytes()


def test_reindex_corrupt_input_writes_nothing(tmp_path: Path) -> None:
    src, position, _ = _corrupt_copy(by_topic("compacted"), tmp_path / "src")
    code, _, err = _cli("segment", "reindex", src, "--out", tmp_path / "out")
    assert code == 1
    _assert_one_error_line(err, f"byte {position}")
    assert _entries(tmp_path / "out") == []


def test_reindex_decompression_limit_is_enforced(tmp_path: Path) -> None:
    code, _, err = _cli("segment", "reindex", log_path(by_topic("events-zstd")), "--out", tmp_path,
                        "--decompression-limit", "100")
    assert code == 1
    _assert_one_error_line(err, "decompression limit")


# --- help and version --------------------------------------------------------------------------

HELP_CASES: dict[str, tuple[list[str], list[str]]] = {
    "top": ([], ["segment", "demo", "--version", "Exit codes"]),
    "segment": (["segment"], ["dump", "verify", "rewrite", "reindex"]),
    "dump": (["segment", "dump"], ["--deep", "--json", "--base-offset", "--decompression-limit"]),
    "verify": (["segment", "verify"], ["--indexes", "--json", "--index-interval-bytes", "--base-offset",
                                       "--decompression-limit"]),
    "rewrite": (["segment", "rewrite"], ["--out", "--codec", "--level", "--force", "--index-interval-bytes",
                                         "--no-proof", "--no-deep-validation", "--json", "zstd"]),
    "reindex": (["segment", "reindex"], ["--out", "--index-interval-bytes", "--json"]),
    "demo": (["demo"], ["--out", "--codec", "--level", "--scale", "--spark-master", "--json"]),
    "demo-local": (["demo-local"], ["--out", "--codec", "--level", "--scale", "--json"]),
}


@pytest.mark.parametrize("case", list(HELP_CASES))
def test_help_exits_0_and_explains_options(case: str, tmp_path: Path) -> None:
    verb, options = HELP_CASES[case]
    proc = _run(*verb, "--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: tiering {' '.join(verb)}".rstrip())
    for option in options:
        assert option in proc.stdout, option


def test_version_subprocess(tmp_path: Path) -> None:
    proc = _run("--version", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout == f"tiering {__version__}\n"


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["segment", "rewrite", "--help"]],
                         ids=["version", "help", "rewrite-help"])
def test_main_help_and_version_return_0_on_given_stdout(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``main`` returns its exit code (it does not raise SystemExit) and writes to the stdout it is given."""
    out, err = io.StringIO(), io.StringIO()
    try:
        code: object = main(argv, stdout=out, stderr=err)
    except SystemExit as e:
        code = f"SystemExit({e.code})"
    assert code == 0
    assert out.getvalue()
    assert capsys.readouterr().out == ""


def test_console_script_contract(tmp_path: Path) -> None:
    assert CONSOLE_SCRIPT.exists(), f"{CONSOLE_SCRIPT} (pip install -e . installs it)"
    proc = subprocess.run([CONSOLE_SCRIPT, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert (proc.returncode, proc.stdout) == (0, f"tiering {__version__}\n")
    seg = by_topic("edge")
    proc = subprocess.run([CONSOLE_SCRIPT, "segment", "verify", "--json", log_path(seg)], capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["records_sha256"] == seg["records_sha256"]
    src, position, base = _corrupt_copy(seg, tmp_path / "src")
    proc = subprocess.run([CONSOLE_SCRIPT, "segment", "verify", src], capture_output=True, text=True, timeout=300,
                          check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    _assert_one_error_line(proc.stderr, str(src), f"byte {position}", f"batch base offset {base}")
    proc = subprocess.run([CONSOLE_SCRIPT, "segment", "verify", tmp_path / "missing.log"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "missing.log")


def test_module_rewrite_and_dump_subprocess(tmp_path: Path) -> None:
    seg = by_topic("events-lz4")
    proc = _run("segment", "rewrite", log_path(seg), "--out", tmp_path / "out", "--codec", "zstd", "--json",
                cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    with open(stats["outputs"]["log"], "rb") as written:
        assert read_back(written, base_offset=seg["base_offset"]).payload_xxh3 == stats["payload_xxh3"]
    proc = _run("segment", "dump", "--json", stats["outputs"]["log"], cwd=tmp_path)
    assert proc.returncode == 0
    docs = _json_lines(proc.stdout)
    volatile = {"codec", "size", "crc", "position"}
    assert [{k: v for k, v in d.items() if k not in volatile} for d in docs] == [
        {k: v for k, v in b.items() if k not in volatile} for b in _jsonl(seg)]
    assert {d["codec"] for d in docs} == {"zstd"}
    proc = _run("segment", "rewrite", log_path(seg), "--out", tmp_path / "bad", "--codec", "zstd", "--level", "99",
                cwd=tmp_path)
    assert proc.returncode == 2
    _assert_one_error_line(proc.stderr, "level")


def test_file_system_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    """The machine's side (a directory where a file was expected) is a clear line and exit 2, not a traceback."""
    seg = by_topic("edge")
    path = _copy_segment(seg, tmp_path)
    index = path.with_suffix(".index")
    index.mkdir()
    code, out, err = _cli("segment", "verify", "--indexes", "--json", path)
    assert code == 2
    assert err.count("\n") == 1
    assert str(index) in err
    assert json.loads(out.splitlines()[-1])["error"]["error"] == "IsADirectoryError"


@pytest.mark.parametrize("seg", V2_SEGMENTS, ids=segment_id)
def test_rewrite_with_rebatch_keeps_the_records_and_says_what_it_merged(seg: dict[str, Any], tmp_path: Path) -> None:
    """The output verifies (indexes equal a rebuild) with the records digest Kafka computed; the batch
    digest changes exactly when batches were merged; the table says the same as the JSON."""
    stats = _rewrite_json(log_path(seg), tmp_path / "j", "--codec", "zstd", "--rebatch")
    rb = stats["rebatch"]
    assert rb["records_sha256"] == seg["records_sha256"]
    assert rb["batches_in"] == seg["batch_count"]
    assert rb["batches_digest_changed"] == (rb["runs_merged"] > 0)
    code, out, _ = _cli("segment", "verify", "--indexes", "--json", stats["outputs"]["log"])
    assert code == 0
    doc = json.loads(out)
    assert doc["records_sha256"] == seg["records_sha256"]
    assert doc["batch_count"] == rb["batches_out"]
    assert doc["index_equals_rebuild"] == {"index": True, "timeindex": True}
    code, out, _ = _cli("segment", "rewrite", log_path(seg), "--out", tmp_path / "t", "--codec", "zstd", "--rebatch")
    assert code == 0
    assert f"{rb['batches_in']:,} → {rb['batches_out']:,} batches" in out


def test_partition_compact_keys_writes_a_whole_partition_directory(tmp_path: Path) -> None:
    """Latest value per key in the cleaned segment, the active one and the other files copied as they were,
    the table and the JSON agree; a missing directory is a usage error."""
    from tiering.kafka.builder import BatchSpec, build_batch
    from tiering.kafka.records import Record
    from tiering.kafka.segment import iter_decoded

    part = tmp_path / "events-0"
    part.mkdir()
    t0 = 1_790_000_000_000
    first = b"".join(build_batch(BatchSpec(o), [Record(o, t0 + o, b"k%d" % (o % 3), b"v%d" % o, ())])
                     for o in range(9))
    active = build_batch(BatchSpec(9), [Record(9, t0 + 9, b"k0", b"new", ())])
    (part / "00000000000000000000.log").write_bytes(first)
    (part / "00000000000000000009.log").write_bytes(active)
    (part / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    code, out, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "out", "--json", "--now-ms", t0)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["segments_cleaned"], doc["records_in"], doc["records_out"], doc["superseded_dropped"]) == (
        [0], 9, 3, 6)
    cleaned = (tmp_path / "out" / "00000000000000000000.log").read_bytes()
    assert [(r.offset, r.key, r.value) for b in iter_decoded(io.BytesIO(cleaned)) for r in b.records] == [
        (6, b"k0", b"v6"), (7, b"k1", b"v7"), (8, b"k2", b"v8")]
    for name in ("00000000000000000009.log", "leader-epoch-checkpoint"):
        assert (tmp_path / "out" / name).read_bytes() == (part / name).read_bytes()
    code, out, _ = _cli("partition", "compact-keys", part, "--out", tmp_path / "out2", "--now-ms", t0)
    assert code == 0
    assert "9 → 3 (3 keys)" in out
    code, _, err = _cli("partition", "compact-keys", tmp_path / "missing", "--out", tmp_path / "o3")
    assert code == 2
    assert "not a partition directory" in err
    code, _, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "out")  # holds the first output
    assert code == 2
    assert "must be new or empty" in err
    (part / "00000000000000000000.log.swap").write_bytes(b"")
    code, _, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "o4")
    assert code == 2
    assert "unfinished cleaning or swap" in err
    assert not (tmp_path / "o4").exists()
    (part / "00000000000000000000.log.swap").unlink()
    # A key map of 72 bytes: 3 slots, full at 2 keys (int(3 * 0.9)), as --max-keys 2: the pass ends at the
    # offset of the third key's first record, where a broker's cleaner with that buffer would end it.
    ends = []
    for n, bound in enumerate((["--key-map-bytes", "72"], ["--max-keys", "2"])):
        code, out, err = _cli("partition", "compact-keys", part, "--out", tmp_path / f"b{n}", "--now-ms", t0,
                              "--json", *bound)
        assert code == 0, err
        ends.append(json.loads(out)["end_offset"])
    assert ends == [2, 2]
    for bad, says in ((["--key-map-bytes", "23"], "at least 24 bytes"), (["--key-map-bytes", "1.5MiB"], "128MiB"),
                      (["--key-map-bytes", "1MiB", "--max-keys", "3"], "not allowed with")):
        code, _, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "b9", *bad)
        assert code == 2
        assert says in err


def test_every_entry_point_bounds_the_key_map_as_a_broker_s_default_cleaner() -> None:
    """The CLI's default --key-map-bytes (128 MiB, log.cleaner.dedupe.buffer.size's default), the run layer's
    default (the DAG's path) and the Spark job's, given options without max_keys: 5,033,164 keys, 0.9 of the
    buffer's 24-byte slots, where Kafka's SkimpyOffsetMap is full."""
    import argparse

    from tiering.cli.args import add_key_map_args, max_keys
    from tiering.kafka.keycompact import CleanOptions
    from tiering.run.keycompact import KeyCompactOptions
    from tiering.run.kinds import kind_from_json

    expected = int((128 * 1024 * 1024 // 24) * 0.9)
    parser = argparse.ArgumentParser()
    add_key_map_args(parser)
    assert max_keys(parser.parse_args([])) == expected
    assert KeyCompactOptions(topics="t").max_keys == expected
    assert CleanOptions(now_ms=0).max_keys == expected
    assert kind_from_json("compact-keys", {"topics": "t"}).options_json()["max_keys"] == expected


def test_partition_compact_keys_cleans_neighbours_into_one_segment_unless_told_not_to(tmp_path: Path) -> None:
    """Two small sealed segments within segment.bytes: cleaned into one, named by the first, as the broker's
    cleaner groups them; --no-merge keeps one each; the merged-away segment's files are not carried over."""
    from tiering.kafka.builder import BatchSpec, build_batch
    from tiering.kafka.records import Record

    part = tmp_path / "events-0"
    part.mkdir()
    t0 = 1_790_000_000_000
    for base, stop in ((0, 5), (5, 9), (9, 10)):
        batches = [build_batch(BatchSpec(o), [Record(o, t0 + o, b"k%d" % (o % 3), b"v%d" % o, ())])
                   for o in range(base, stop)]
        (part / f"{base:020d}.log").write_bytes(b"".join(batches))
    (part / "00000000000000000005.snapshot").write_bytes(b"producer state")
    code, out, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "merged", "--json", "--now-ms", t0)
    assert code == 0, err
    assert json.loads(out)["merged"] == [{"base_offset": 0, "sources": [0, 5]}]
    assert sorted(p.name for p in (tmp_path / "merged").glob("*.log")) == ["00000000000000000000.log",
                                                                          "00000000000000000009.log"]
    assert not (tmp_path / "merged" / "00000000000000000005.snapshot").exists()
    code, out, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "apart", "--json", "--now-ms", t0,
                          "--no-merge")
    assert code == 0, err
    assert json.loads(out)["merged"] == []
    assert len(list((tmp_path / "apart").glob("*.log"))) == 3
    code, out, err = _cli("partition", "compact-keys", part, "--out", tmp_path / "small", "--json", "--now-ms", t0,
                          "--segment-bytes", "100")  # neither source fits beside the other
    assert code == 0, err
    assert json.loads(out)["merged"] == []


def test_partition_merge_writes_a_partition_of_fewer_segments_and_says_so(tmp_path: Path) -> None:
    golden = Path(__file__).parent / "data" / "golden" / "logdir" / "orders-0"
    part = tmp_path / "orders-0"
    shutil.copytree(golden, part)
    (part / "00000000000000009999.log").write_bytes(b"")  # the active segment
    code, out, err = _cli("partition", "merge", part, "--out", tmp_path / "out", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["merged"] == [{"base_offset": 0, "sources": [0, 1662]}]
    assert (doc["segments_before"], doc["segments_after"], doc["files_before"], doc["files_after"]) == (3, 2, 7, 4)
    code, out, _ = _cli("partition", "merge", part, "--out", tmp_path / "out2", "--segment-bytes", "64MiB")
    assert code == 0
    assert "3 → 2 (1 merged segment," in out
    assert "67,108,864 bytes" in out
    code, _, err = _cli("partition", "merge", part, "--out", tmp_path / "out")
    assert code == 2
    assert "must be new or empty" in err
