"""Merged segments restore into a real Kafka 4.3 broker: fewer segments, every record served as before.

The source broker (conftest.py: Java, librdkafka and kafka-python producers; plain, idempotent,
transactional, compacted and log-append-time topics; 64 KiB segments) is stopped. Every user partition of a
copy of its data directory is merged by ``tiering partition merge`` (runs of neighbouring sealed segments
up to 1 MiB, Kafka's grouping rules) and a broker started on the copy: it loads the merged segments without
recovering or rebuilding anything, serves every record at both isolation levels as the source broker did,
answers offsetsForTimes and seeks alike, and Kafka's DumpLogSegments reads in each merged ``.log`` the
records of the segments it replaced, its indexes sane.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import Broker, error_lines, recovery_lines
from tests.kafka_broker.conftest import Source, note
from tests.kafka_broker.dumplog import dump, seg_name

pytestmark = pytest.mark.kafka

TARGET = 1 << 20  # the merged segments' bound (the source's segments are 64 KiB)


@dataclass
class Merged:
    broker: Broker  # running on the merged copy
    docs: dict[str, dict[str, object]]  # partition directory -> the CLI's JSON
    pristine: Path  # the data directory before any broker opened it
    layout: str  # "merged": the merged partition directories; "swap": the originals, each merge beside them
    expected: Path  # the merged partition directories, as the CLI wrote them


def _partition_dirs(data_dir: Path) -> list[Path]:
    return sorted(d for d in data_dir.iterdir() if d.is_dir() and "-" in d.name and not d.name.startswith("__"))


def _as_swap(partition: Path, merged: Path, doc: dict[str, object]) -> None:
    """Each merged segment's files put beside the originals with Kafka's ``.swap`` suffix, every original left
    in place: what a broker finds where its cleaner (or a copy of a bucket) stopped between writing a merged
    segment and removing what it replaces."""
    for group in doc["merged"]:  # type: ignore[attr-defined]
        for f in merged.glob(f"{group['base_offset']:020d}.*"):
            shutil.copyfile(f, partition / f"{f.name}.swap")


@pytest.fixture(scope="module", params=["merged", "swap"])
def merged(source: Source, tmp_path_factory: pytest.TempPathFactory,
           request: pytest.FixtureRequest) -> Iterator[Merged]:
    root = tmp_path_factory.mktemp(f"kafka-{request.param}")
    broker = source.broker.copy_to(root / "data", root / "logs")
    docs = {}
    for d in _partition_dirs(broker.data_dir):
        out = root / "out" / d.name
        done = subprocess.run([sys.executable, "-m", "tiering", "partition", "merge", str(d), "--out", str(out),
                               "--segment-bytes", str(TARGET), "--json"], capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        docs[d.name] = json.loads(done.stdout)
        if request.param == "merged":
            shutil.rmtree(d)
            shutil.copytree(out, d)
        else:
            _as_swap(d, out, docs[d.name])
    note(f"{sum(len(doc['merged']) for doc in docs.values())} merged segments in {len(docs)} partitions "
         f"({request.param})")
    pristine = root / "pristine"
    shutil.copytree(broker.data_dir, pristine)
    broker.extra["log.cleaner.enable"] = "false"  # the log stays exactly as merged while we read it
    broker.start()
    P.wait_leaders(broker.bootstrap, source.partitions)
    try:
        yield Merged(broker, docs, pristine, request.param, root / "out")
    finally:
        broker.stop()


def test_the_partitions_hold_fewer_segments(source: Source, merged: Merged) -> None:
    before = after = 0
    for d in _partition_dirs(source.broker.data_dir):
        logs = sorted(d.glob("*.log"))
        now = sorted((merged.expected / d.name).glob("*.log"))
        doc = merged.docs[d.name]
        assert (doc["segments_before"], doc["segments_after"]) == (len(logs), len(now)), d.name
        assert now[-1].name == logs[-1].name  # the active segment is never merged
        assert (merged.expected / d.name / now[-1].name).read_bytes() == logs[-1].read_bytes()
        sealed = logs[:-1]
        if not source.spec(d.name.rpartition("-")[0]).compacted and sum(f.stat().st_size for f in sealed) <= TARGET:
            # offsets without a gap, all within the bound: the sealed segments became one
            assert len(now) == min(2, len(logs)), (d.name, len(logs), len(now))
        before += len(logs)
        after += len(now)
    assert after < before
    print(f"\n{before} segments -> {after}")


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_every_record_comes_back(source: Source, merged: Merged, isolation: str) -> None:
    after = P.consume_all(merged.broker.bootstrap, source.partitions, isolation)
    for tp in source.partitions:
        assert after[tp] == source.views[isolation][tp], tp  # every field, timestamps and their type included
    assert sum(len(v) for v in after.values()) > 10_000


def _first_at_or_after(records: list[P.Consumed], timestamp: int) -> int:
    return min((r.offset for r in records if r.timestamp >= timestamp), default=-1)


def test_offsets_for_times_unchanged_but_where_the_broker_missed_a_cleaned_record(source: Source,
                                                                               merged: Merged) -> None:
    """The same answers, except one the source broker got wrong: in a compacted partition, the segment whose
    largest timestamp reaches the query may have lost every record that late to the cleaner, and the broker
    then answers "none" (-1) without looking at the next segment. Merged with its neighbours, that segment
    holds the record, and the answer is the first offset at or after the timestamp, as the records say."""
    after = P.offsets_for_times(merged.broker.bootstrap, source.time_queries)
    view = source.views["read_uncommitted"]
    fixed = 0
    for (topic, part, ts), was, now in zip(source.time_queries, source.time_answers, after, strict=True):
        if was == now:
            continue
        assert source.spec(topic).compacted, (topic, part, ts, was, now)
        assert was == -1, (topic, part, ts, was, now)
        assert now == _first_at_or_after(view[(topic, part)], ts), (topic, part, ts, now)
        fixed += 1
    print(f"\n{len(source.time_queries)} offsetsForTimes queries, {fixed} answered where the source broker said -1")


def test_random_seeks_unchanged(source: Source, merged: Merged) -> None:
    assert P.seek_read(merged.broker.bootstrap, source.seeks) == source.seek_answers


LOADED = re.compile(r"Completed load of Log\(dir=\S+/([^/,]+), .*logEndOffset=(\d+)\) with (\d+) segments")


def test_the_broker_loads_the_merged_segments_without_recovering_them(source: Source, merged: Merged) -> None:
    log = merged.broker.log_since_start()
    assert "Kafka Server started" in log, log[-2000:]
    assert [line for line in recovery_lines(log) if "__cluster_metadata" not in line] == []
    assert error_lines(log) == []
    loaded = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in LOADED.finditer(log)}
    for d in _partition_dirs(merged.expected):
        topic, _, part = d.name.rpartition("-")
        assert loaded[d.name] == (source.log_end[(topic, int(part))], len(list(d.glob("*.log")))), d.name


def test_kafkas_dump_log_segments_reads_the_sources_records_in_each_merged_segment(source: Source,
                                                                                    merged: Merged) -> None:
    files, sources = [], []
    for name, doc in merged.docs.items():
        for group in doc["merged"]:  # type: ignore[attr-defined]
            files += [merged.expected / name / f"{group['base_offset']:020d}{ext}"
                      for ext in (".log", ".index", ".timeindex")]
            sources += [source.broker.data_dir / name / f"{base:020d}.log" for base in group["sources"]]
    assert files
    ours, original = dump(files), dump(sources)
    for name, problems in ours.problems.items():  # DumpLogSegments lists a compacted log's offset gaps, no more
        assert source.spec(name.split("/")[0].rpartition("-")[0]).compacted, (name, problems)
        assert all(re.fullmatch(r"deep: -?\d+ is followed by \d+", p) for p in problems), (name, problems)
    assert {seg_name(f) for f in files if f.suffix != ".log"} <= ours.sane
    for name, doc in merged.docs.items():
        for group in doc["merged"]:  # type: ignore[attr-defined]
            log = f"{name}/{group['base_offset']:020d}.log"
            parts = [f"{name}/{base:020d}.log" for base in group["sources"]]
            assert ours.records[log] == sum(original.records[p] for p in parts) > 0, log
            assert ours.batches[log] == sum(original.batches[p] for p in parts), log


def test_a_broker_completes_a_merge_beside_the_originals_and_keeps_merged_segments_as_they_are(
        source: Source, merged: Merged) -> None:
    """Kafka's LogLoader, finding ``<base>.log.swap`` (and its indexes) beside the segments it replaces, deletes
    every other file whose offset lies in the swap segment's range and renames the swap files: the state a
    merge on S3 can pass through without a broker restoring the bucket at that instant seeing any offset
    twice or missing. Given the merged directories themselves, it loads them as they are. Either way it ends
    with exactly the merged segments; the tests above then hold them to the source broker's answers."""
    assert bool(list(merged.pristine.glob("*/*.swap"))) == (merged.layout == "swap")
    for d in _partition_dirs(merged.expected):
        live = merged.broker.data_dir / d.name
        assert not list(live.glob("*.swap")), d.name
        assert sorted(p.name for p in live.glob("*.log")) == sorted(p.name for p in d.glob("*.log")), d.name
        for log in d.glob("*.log"):
            assert (live / log.name).read_bytes() == log.read_bytes(), log
