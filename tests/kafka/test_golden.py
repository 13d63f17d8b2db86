"""Every segment Kafka's own Java code wrote (tests/data/golden): read, digest, index, rewrite.

The MANIFEST's counts and digests, the ``batches/*.jsonl`` views and the index files all come from
Kafka, so these tests hold our reader, index rebuild and rewriter to an independent reference.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from tests.golden import GOLDEN, SEGMENTS, index_path, log_path
from tiering.kafka.codecs import Codec, compress
from tiering.kafka.index import build_indexes
from tiering.kafka.reader import iter_batches
from tiering.kafka.rewrite import RewriteOptions, read_back, rewrite_segment
from tiering.kafka.segment import check_indexes, iter_decoded, payload_of, records_section, verify_segment


def _verify(data: bytes, base: int) -> Any:
    return verify_segment(io.BytesIO(data), segment_base=base)


def test_manifest_files_are_the_ones_described() -> None:
    for seg in SEGMENTS:
        data = log_path(seg).read_bytes()
        assert len(data) == seg["size_bytes"]
        assert hashlib.sha256(data).hexdigest() == seg["sha256"]


def test_verify_matches_manifest(golden: dict[str, Any]) -> None:
    summary = _verify(log_path(golden).read_bytes(), golden["base_offset"])
    assert summary.records_sha256 == golden["records_sha256"]
    assert summary.batches_sha256 == golden["batches_sha256"]
    assert summary.batch_count == golden["batch_count"]
    assert summary.record_count == golden["record_count"]
    assert summary.control_batch_count == golden["control_batch_count"]
    assert summary.empty_batch_count == golden["empty_batch_count"]
    assert summary.first_offset == golden["first_offset"]
    assert summary.last_offset == golden["last_offset"]
    assert summary.max_timestamp == golden["max_timestamp"]
    assert sorted(summary.magics) == golden["magics"]
    assert set(summary.codecs) == set(golden["codecs"])


def test_fast_path_agrees_with_digest_path(golden: dict[str, Any]) -> None:
    """Verification without digests (compiled walker for v2) reaches the same counts."""
    data = log_path(golden).read_bytes()
    fast = verify_segment(io.BytesIO(data), segment_base=golden["base_offset"], digests=False)
    assert fast.record_count == golden["record_count"]
    assert fast.batch_count == golden["batch_count"]
    assert fast.last_offset == golden["last_offset"]


def test_batches_equal_kafkas_view(golden: dict[str, Any]) -> None:
    """Every batch as Kafka's reader printed it (batches/*.jsonl), field by field."""
    expected = [json.loads(line) for line in (GOLDEN / golden["batches_jsonl"]).read_text().splitlines()]
    with log_path(golden).open("rb") as f:
        got = [b.to_json() for b in iter_decoded(f)]
    assert len(got) == len(expected)
    for ours, kafkas in zip(got, expected, strict=True):
        assert ours == kafkas


@pytest.mark.parametrize("interval", [4096, 1024])
def test_rebuilt_indexes_equal_kafkas(golden: dict[str, Any], interval: int) -> None:
    summary = _verify(log_path(golden).read_bytes(), golden["base_offset"])
    rebuilt = build_indexes(golden["base_offset"], summary.batches, interval)
    assert rebuilt.offset_index == index_path(golden, interval, "index").read_bytes()
    assert rebuilt.time_index == index_path(golden, interval, "timeindex").read_bytes()


def test_original_indexes_are_valid(golden: dict[str, Any]) -> None:
    path = log_path(golden)
    summary = _verify(path.read_bytes(), golden["base_offset"])
    check_indexes(summary, golden["base_offset"], path.with_suffix(".index").read_bytes(),
                  path.with_suffix(".timeindex").read_bytes())
    assert summary.index_problems == []
    assert summary.index_equals_rebuild == {"index": True, "timeindex": True}


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.label)
def test_rewrite_keeps_digests_and_reindexes(golden: dict[str, Any], codec: Codec) -> None:
    base = golden["base_offset"]
    out = io.BytesIO()
    result = rewrite_segment(io.BytesIO(log_path(golden).read_bytes()), out, base_offset=base,
                             options=RewriteOptions(codec=codec, force=True))
    stats = result.stats
    assert stats.batches == golden["batch_count"]
    assert stats.records == golden["record_count"]
    assert read_back(io.BytesIO(out.getvalue()), base_offset=base).payload_xxh3 == stats.payload_xxh3
    assert stats.bytes_out == len(out.getvalue())
    summary = _verify(out.getvalue(), base)
    assert summary.records_sha256 == golden["records_sha256"]
    assert summary.batches_sha256 == golden["batches_sha256"]
    rebuilt = build_indexes(base, summary.batches)
    assert result.indexes == rebuilt
    # Only what may change changed: every batch view but codec/size/crc/position is the same.
    with log_path(golden).open("rb") as before_f:
        before = [b.to_json() for b in iter_decoded(before_f)]
    after = [b.to_json() for b in iter_decoded(io.BytesIO(out.getvalue()))]
    volatile = {"codec", "size", "crc", "position"}
    assert [{k: v for k, v in b.items() if k not in volatile} for b in before] == [
        {k: v for k, v in b.items() if k not in volatile} for b in after]
    # Control batches never change, and nothing is ever compressed in a control batch.
    for b, a in zip(before, after, strict=True):
        if b["is_control"]:
            assert a | {"position": b["position"]} == b
        if b["magic"] < 2 and codec is Codec.ZSTD:
            assert a["codec"] == b["codec"]  # zstd needs v2: legacy batches keep their codec


def test_rewrite_to_zstd_shrinks_weakly_compressed_segments(tmp_path: Path) -> None:
    seg = next(s for s in SEGMENTS if s["topic"] == "events-snappy")
    out = io.BytesIO()
    result = rewrite_segment(io.BytesIO(log_path(seg).read_bytes()), out, base_offset=0,
                             options=RewriteOptions(codec=Codec.ZSTD))
    assert result.stats.batches_rewritten == seg["batch_count"]
    assert result.stats.bytes_out < 0.8 * result.stats.bytes_in
    assert result.stats.codecs_after == {"zstd": seg["batch_count"]}


@pytest.mark.parametrize("path", [GOLDEN / "logdir/events-gzip-0/00000000000000000000.log",
                                  GOLDEN.parent / "broker/fx.java.gzip-0/00000000000000000000.log"],
                         ids=["golden", "broker"])
def test_gzip_batches_we_compress_are_the_ones_java_wrote(path: Path) -> None:
    """Each gzip batch Kafka's Java producer wrote, its records compressed again by us at Kafka's default
    level: the same payload, byte for byte (java.util.zip's header, zlib's deflate)."""
    batches = [b for b in iter_batches(io.BytesIO(path.read_bytes())) if b.header.codec is Codec.GZIP]
    assert len(batches) >= 10
    for b in batches:
        written = bytes(records_section(b.data))
        assert compress(Codec.GZIP, payload_of(b), level=6) == written, b.header.base_offset
