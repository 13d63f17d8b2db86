"""tiering.local: segment files on a local disk (what the CLI's segment verbs run).

The publish order is the point: a new ``.log`` must never sit beside an index of an older generation
(a broker trusts a present index), a failed rewrite leaves nothing, and stale files survive a failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import tiering.local
from tests.golden import by_topic, index_path, log_path
from tiering.errors import ConfigError, CorruptBatchError, InvalidDataError
from tiering.kafka.codecs import Codec
from tiering.kafka.index import build_indexes
from tiering.kafka.rewrite import RewriteOptions
from tiering.local import base_offset_of, open_segment, reindex_file, rewrite_file, verify_file

BASE = "00000000000000000000"
STALE_INDEX = b"\x00\x00\x00\x07\x00\x00\x10\x00" * 3
STALE_TIME_INDEX = b"\x00\x00\x01\x8f\x00\x00\x00\x00\x00\x00\x00\x07" * 2
ZSTD = RewriteOptions(codec=Codec.ZSTD)


def _copy(seg: dict[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    dst = directory / log_path(seg).name
    shutil.copyfile(log_path(seg), dst)
    return dst


def _corrupt(seg: dict[str, Any], directory: Path) -> Path:
    """A copy with one byte flipped two thirds of the way in (so the rewrite has written output by then)."""
    path = _copy(seg, directory)
    data = bytearray(path.read_bytes())
    data[len(data) * 2 // 3] ^= 0xFF
    path.write_bytes(data)
    return path


def _stale_dir(directory: Path, *, log: bytes | None = None) -> dict[str, bytes]:
    """Pre-populate ``directory`` with an older generation's index files (and .log); returns what is there."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{BASE}.index").write_bytes(STALE_INDEX)
    (directory / f"{BASE}.timeindex").write_bytes(STALE_TIME_INDEX)
    if log is not None:
        (directory / f"{BASE}.log").write_bytes(log)
    return _contents(directory)


def _contents(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` (hidden temporary files included) with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# --- publish order -------------------------------------------------------------------------------


def test_failed_rewrite_leaves_stale_indexes_untouched_and_no_log(tmp_path: Path) -> None:
    src = _corrupt(by_topic("events-gzip"), tmp_path / "src")
    out_dir = tmp_path / "out"
    before = _stale_dir(out_dir)
    with pytest.raises(CorruptBatchError) as info:
        rewrite_file(src, out_dir, ZSTD)
    assert info.value.path == str(src)
    assert info.value.position is not None
    assert info.value.base_offset is not None
    assert _contents(out_dir) == before
    assert not (out_dir / f"{BASE}.log").exists()


def test_failed_rewrite_keeps_an_older_complete_generation(tmp_path: Path) -> None:
    seg = by_topic("events-snappy")
    out_dir = tmp_path / "out"
    first, _ = rewrite_file(log_path(seg), out_dir, RewriteOptions(codec=Codec.LZ4, index_interval_bytes=1024))
    before = _contents(out_dir)
    src = _corrupt(seg, tmp_path / "src")
    with pytest.raises(InvalidDataError):
        rewrite_file(src, out_dir, ZSTD)
    assert _contents(out_dir) == before
    assert verify_file(out_dir / f"{BASE}.log", indexes=True, index_interval_bytes=1024).index_equals_rebuild == {
        "index": True, "timeindex": True}
    assert first.stats.batches == seg["batch_count"]


def test_successful_rewrite_replaces_stale_indexes(tmp_path: Path) -> None:
    seg = by_topic("events-snappy")
    out_dir = tmp_path / "out"
    _stale_dir(out_dir, log=b"an older generation")
    result, written = rewrite_file(log_path(seg), out_dir, ZSTD)
    assert written.log == out_dir / f"{BASE}.log"
    assert sorted(_contents(out_dir)) == [f"{BASE}.index", f"{BASE}.log", f"{BASE}.timeindex"]
    assert written.index.read_bytes() == result.indexes.offset_index != STALE_INDEX
    assert written.time_index.read_bytes() == result.indexes.time_index != STALE_TIME_INDEX
    summary = verify_file(written.log, indexes=True)
    assert summary.records_sha256 == seg["records_sha256"]
    assert summary.batches_sha256 == seg["batches_sha256"]
    assert summary.index_problems == []
    assert summary.index_equals_rebuild == {"index": True, "timeindex": True}


def _record_steps(monkeypatch: pytest.MonkeyPatch, out_dir: Path,
                  fail: Callable[[str, Path], bool] = lambda _op, _target: False) -> list[tuple[str, dict[str, bytes]]]:
    """Snapshot ``out_dir`` after every rename and unlink of a file in it; ``fail`` makes one of them raise."""
    steps: list[tuple[str, dict[str, bytes]]] = []
    real_replace, real_unlink = Path.replace, Path.unlink

    def replace(self: Path, target: Any) -> Path:
        target = Path(target)
        if fail("replace", target):
            raise OSError(f"simulated crash before renaming {self.name} to {target.name}")
        result = real_replace(self, target)
        if target.parent == out_dir:
            steps.append((f"replace {target.name}", _contents(out_dir)))
        return result

    def unlink(self: Path, missing_ok: bool = False) -> None:
        real_unlink(self, missing_ok=missing_ok)
        if self.parent == out_dir:
            steps.append((f"unlink {self.name}", _contents(out_dir)))

    monkeypatch.setattr(Path, "replace", replace)
    monkeypatch.setattr(Path, "unlink", unlink)
    return steps


def test_new_log_never_sits_beside_an_old_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At every step of publishing, a present .index/.timeindex belongs to the .log beside it."""
    seg = by_topic("events-gzip")
    out_dir = tmp_path / "out"
    old, _ = rewrite_file(log_path(seg), out_dir, RewriteOptions(codec=Codec.LZ4, index_interval_bytes=1024))
    old_log = (out_dir / f"{BASE}.log").read_bytes()
    steps = _record_steps(monkeypatch, out_dir)
    new, _ = rewrite_file(log_path(seg), out_dir, ZSTD)
    monkeypatch.undo()
    new_log = (out_dir / f"{BASE}.log").read_bytes()
    assert new_log != old_log
    assert old.indexes.offset_index != new.indexes.offset_index
    generations = {old_log: old.indexes, new_log: new.indexes}
    assert [name for name, _ in steps if not name.startswith("unlink .")][-3:] == [
        f"replace {BASE}.log", f"replace {BASE}.index", f"replace {BASE}.timeindex"]
    for name, files in steps:
        indexes = generations[files[f"{BASE}.log"]]
        assert files.get(f"{BASE}.index", indexes.offset_index) == indexes.offset_index, name
        assert files.get(f"{BASE}.timeindex", indexes.time_index) == indexes.time_index, name
    assert _contents(out_dir) == {f"{BASE}.index": new.indexes.offset_index, f"{BASE}.log": new_log,
                                  f"{BASE}.timeindex": new.indexes.time_index}


def test_crash_after_log_published_leaves_log_without_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Interrupted between the .log and its indexes: a new .log with NO index (a broker rebuilds it)."""
    out_dir = tmp_path / "out"
    _stale_dir(out_dir, log=b"an older generation")
    _record_steps(monkeypatch, out_dir, fail=lambda op, target: op == "replace" and target.suffix == ".index")
    with pytest.raises(OSError, match="simulated crash"):
        rewrite_file(log_path(by_topic("events-lz4")), out_dir, ZSTD)
    monkeypatch.undo()
    assert (out_dir / f"{BASE}.log").read_bytes() != b"an older generation"
    assert not (out_dir / f"{BASE}.index").exists()
    assert not (out_dir / f"{BASE}.timeindex").exists()


def test_failure_while_writing_indexes_leaves_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out_dir = tmp_path / "out"
    before = _stale_dir(out_dir, log=b"an older generation")
    real_write_temp = tiering.local._write_temp

    def write_temp(directory: Path, name: str, data: bytes) -> Path:
        if name.endswith(".timeindex"):
            raise OSError("simulated: no space left on device")
        return real_write_temp(directory, name, data)

    monkeypatch.setattr(tiering.local, "_write_temp", write_temp)
    with pytest.raises(OSError, match="no space left"):
        rewrite_file(log_path(by_topic("events-lz4")), out_dir, ZSTD)
    assert _contents(out_dir) == before


# --- base offsets and the source directory ---------------------------------------------------------


@pytest.mark.parametrize("name", ["segment.log", "123.log", f"{BASE}.index", f"{BASE}.timeindex", f"{BASE}.LOG",
                                  f"{BASE}0.log", f"{BASE}.log.deleted", f"{BASE}.log.tmp", "-0000000000000000001.log"])
def test_base_offset_of_bad_names_are_config_errors(name: str) -> None:
    with pytest.raises(ConfigError, match="--base-offset") as info:
        base_offset_of(Path("/data") / name)
    assert info.value.path == f"/data/{name}"
    assert info.value.found == name


def test_base_offset_of_negative_override_is_config_error() -> None:
    with pytest.raises(ConfigError, match="negative") as info:
        base_offset_of(Path(f"{BASE}.log"), -1)
    assert info.value.found == -1


@pytest.mark.parametrize(("name", "override", "expected"), [
    (f"{BASE}.log", None, 0),
    ("00000000000001000000.log", None, 1_000_000),
    ("09223372036854775807.log", None, 9_223_372_036_854_775_807),
    ("segment.log", 42, 42),
    ("00000000000001000000.log", 7, 7),
])
def test_base_offset_of_valid(name: str, override: int | None, expected: int) -> None:
    assert base_offset_of(Path(name), override) == expected


def test_file_operations_reject_unnamed_segments_before_touching_out_dir(tmp_path: Path) -> None:
    src = tmp_path / "copy.log"
    shutil.copyfile(log_path(by_topic("edge")), src)
    out_dir = tmp_path / "out"
    with pytest.raises(ConfigError):
        verify_file(src)
    with pytest.raises(ConfigError):
        rewrite_file(src, out_dir, ZSTD)
    with pytest.raises(ConfigError):
        reindex_file(src, out_dir)
    assert not out_dir.exists()
    result, written = rewrite_file(src, out_dir, ZSTD, base_offset=0)
    assert written.log == out_dir / f"{BASE}.log"
    assert result.stats.records == by_topic("edge")["record_count"]


@pytest.mark.parametrize("spelling", ["same", "trailing-dot", "dotdot", "symlink"])
def test_rewrite_into_source_dir_refused(tmp_path: Path, spelling: str) -> None:
    seg = by_topic("events-snappy")
    src_dir = tmp_path / "src"
    src = _copy(seg, src_dir)
    for suffix in (".index", ".timeindex"):
        shutil.copyfile(log_path(seg).with_suffix(suffix), src.with_suffix(suffix))
    before = _contents(src_dir)
    if spelling == "symlink":
        (tmp_path / "alias").symlink_to(src_dir, target_is_directory=True)
    out_dir = {"same": src_dir, "trailing-dot": src_dir / ".", "dotdot": src_dir / ".." / "src",
               "symlink": tmp_path / "alias"}[spelling]
    with pytest.raises(ConfigError, match="overwrite the input"):
        rewrite_file(src, out_dir, ZSTD)
    assert _contents(src_dir) == before


def test_rewrite_from_a_relative_path_into_its_own_dir_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seg = by_topic("edge")
    src = _copy(seg, tmp_path / "src")
    before = _contents(src.parent)
    monkeypatch.chdir(src.parent)
    with pytest.raises(ConfigError):
        rewrite_file(Path(src.name), Path(), ZSTD)
    assert _contents(src.parent) == before


# --- open, verify, reindex -------------------------------------------------------------------------


def test_open_segment_missing_or_directory_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot open"), open_segment(tmp_path / f"{BASE}.log"):
        pass
    (tmp_path / f"{BASE}.log").mkdir()
    with pytest.raises(ConfigError, match="cannot open"), open_segment(tmp_path / f"{BASE}.log"):
        pass


def test_verify_file_judges_indexes_beside_the_log(tmp_path: Path) -> None:
    seg = by_topic("orders")
    assert verify_file(log_path(seg)).index_equals_rebuild == {}
    summary = verify_file(log_path(seg), indexes=True)
    assert summary.index_equals_rebuild == {"index": True, "timeindex": True}
    src = _copy(seg, tmp_path)
    summary = verify_file(src, indexes=True)
    assert summary.index_missing == ["index", "timeindex"]
    assert summary.index_problems == []


def test_reindex_file_into_source_dir_is_allowed(tmp_path: Path) -> None:
    """Re-indexing in place is how a logdir gets its indexes (the demo does it); the .log is untouched."""
    seg = by_topic("txn")
    src = _copy(seg, tmp_path)
    summary, written = reindex_file(src, tmp_path, index_interval_bytes=1024)
    assert written.log is None
    assert summary.batch_count == seg["batch_count"]
    assert written.index.read_bytes() == index_path(seg, 1024, "index").read_bytes()
    assert written.time_index.read_bytes() == index_path(seg, 1024, "timeindex").read_bytes()
    assert src.read_bytes() == log_path(seg).read_bytes()
    assert sorted(_contents(tmp_path)) == [f"{BASE}.index", f"{BASE}.log", f"{BASE}.timeindex"]


def test_reindex_file_negative_interval_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        reindex_file(log_path(by_topic("edge")), tmp_path / "out", index_interval_bytes=-1)
    assert not (tmp_path / "out").exists()


def test_rewrite_file_indexes_equal_a_rebuild_of_the_output(tmp_path: Path) -> None:
    seg = by_topic("mixed")
    result, written = rewrite_file(log_path(seg), tmp_path, RewriteOptions(codec=Codec.GZIP, index_interval_bytes=0))
    assert written.log is not None
    summary = verify_file(written.log, indexes=True, index_interval_bytes=0)
    assert result.indexes == build_indexes(seg["base_offset"], summary.batches, 0)
    assert summary.index_equals_rebuild == {"index": True, "timeindex": True}
    assert verify_file(written.log).batches == []  # without index checks nothing is kept per batch
    assert written.log.name == "00000000000001000000.log"
