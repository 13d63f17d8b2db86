"""Kafka's own DumpLogSegments on re-batched segments: the segments a real broker wrote (tests/data/broker) and a
segment of one record a batch, rewritten with ``tiering segment rewrite --rebatch``; Kafka finds nothing in
the outputs (every batch valid, every record decoded, indexes verified and sane) that it does not find in the
originals, and dumps as many records from fewer batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kafka.passes import digest_of
from tests.kafka_broker.dumplog import dump
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.index import build_indexes
from tiering.kafka.records import Record
from tiering.kafka.segment import verify_segment

BROKER = Path(__file__).resolve().parents[1] / "data" / "broker"


def _one_record_batches(directory: Path) -> Path:
    """A partition directory holding a segment of 2,000 one-record JSON batches of a plain producer."""
    directory.mkdir(parents=True)
    log = directory / f"{0:020d}.log"
    data = b"".join(build_batch(BatchSpec(i, Codec.SNAPPY), [Record(
        i, 1_700_000_000_000 + i, b"user-%d" % (i % 37),
        json.dumps({"id": i, "event": "click", "page": f"/p/{i % 11}"}).encode())]) for i in range(2000))
    log.write_bytes(data)
    with log.open("rb") as f:
        summary = verify_segment(f, segment_base=0, digests=False)
    indexes = build_indexes(0, summary.batches)
    log.with_suffix(".index").write_bytes(indexes.offset_index)
    log.with_suffix(".timeindex").write_bytes(indexes.time_index)
    return log


@pytest.mark.kafka
def test_kafka_finds_nothing_new_in_re_batched_segments(tmp_path: Path) -> None:
    originals = [*sorted(BROKER.glob("*/*.log")), _one_record_batches(tmp_path / "orig" / "fx.tiny-0")]
    outputs: list[Path] = []
    docs = {}
    for log in originals:
        out_dir = tmp_path / "out" / log.parent.name
        done = subprocess.run([sys.executable, "-m", "tiering", "segment", "rewrite", str(log), "--out", str(out_dir),
                               "--codec", "zstd", "--rebatch", "--json"], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        doc = json.loads(done.stdout)
        with log.open("rb") as f:
            assert doc["rebatch"]["records_sha256"] == digest_of(f, path=str(log))[0]  # the source's, as read alone
        docs[log.parent.name] = doc
        outputs += [out_dir / log.name, out_dir / log.with_suffix(".index").name,
                    out_dir / log.with_suffix(".timeindex").name]
    before = dump([p for log in originals for p in (log, log.with_suffix(".index"), log.with_suffix(".timeindex"))
                   if p.exists()])
    after = dump(outputs)
    assert after.new_problems(before) == {}, after.output[-3000:]
    for name in before.records:
        assert after.records[name] == before.records[name] > 0, name
        assert after.batches[name] <= before.batches[name], name
    tiny = "fx.tiny-0/00000000000000000000.log"
    assert (before.batches[tiny], after.batches[tiny]) == (2000, docs["fx.tiny-0"]["rebatch"]["batches_out"])
    assert after.batches[tiny] < 100
