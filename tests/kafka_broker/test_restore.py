"""The headline: segments our CLI rewrote on S3 restore into a real Kafka 4.3 broker, and every consumer
gets every record.

The source broker (conftest.py) was filled by Kafka's Java client, librdkafka and kafka-python, then
stopped. Its partition folders go to a moto S3 server as a logdir tree; ``python -m tiering s3 compact``
recompresses every sealed segment to zstd there; the result is copied over a fresh copy of the broker's
data directory (same cluster id and node id, its __cluster_metadata log kept, the active segments as they
were) and a broker started on it serves the records again, compared with what was produced and with what
the source broker served. Kafka's own DumpLogSegments checks every file the pipeline wrote, and a broker
forced to recover (unclean shutdown, recovery point 0) re-validates every batch and rebuilds the indexes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import Broker, error_lines, recovery_lines
from tests.kafka_broker.conftest import Source, note
from tests.kafka_broker.dumplog import DumpResult, dump, seg_name
from tiering.demo.s3 import moto_server
from tiering.kafka.batch import V2_HEADER_SIZE
from tiering.kafka.reader import iter_batches

logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per S3 request in failure reports

# The DAG's paths run Airflow (dag.test()) and Spark local[2]: the module's parametrized fixture takes all three.
pytestmark = [pytest.mark.kafka, pytest.mark.airflow, pytest.mark.spark]

BUCKET, PREFIX = "kafka-restore", "cluster-a/logs"  # one bucket per run: moto's backend outlives its server
SEGMENT_FILES = (".log", ".index", ".timeindex")
NOT_UPLOADED = (".deleted", ".cleaned", ".swap", ".tmp")


@dataclass
class Restored:
    broker: Broker  # running on the restored copy
    run: dict[str, Any]  # the CLI's JSON
    cli_stderr: str
    rewritten: list[Path]  # files of the restored copy that differ from the source broker's
    pristine: Path  # the restored data directory before any broker opened it
    uploaded: int


def _env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def _partition_dirs(data_dir: Path) -> list[Path]:
    """Partition folders of the user topics (not __cluster_metadata, __consumer_offsets, ...)."""
    return sorted(d for d in data_dir.iterdir() if d.is_dir() and "-" in d.name and not d.name.startswith("__"))


def upload(client: Any, bucket: str, data_dir: Path) -> int:
    n = 0
    for d in _partition_dirs(data_dir):
        for f in sorted(d.iterdir()):
            if f.is_file() and not f.name.endswith(NOT_UPLOADED):
                client.put_object(Bucket=bucket, Key=f"{PREFIX}/{d.name}/{f.name}", Body=f.read_bytes())
                n += 1
    return n


def download(client: Any, bucket: str, data_dir: Path) -> list[Path]:
    """Mirror the tree's segment files over ``data_dir`` (a file no longer on S3 is removed: Kafka would then
    rebuild it, which the server-log test catches); returns the files whose bytes changed."""
    changed = []
    remote = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=PREFIX + "/"):
        for obj in page.get("Contents", []):
            rel = obj["Key"][len(PREFIX) + 1:]
            if rel.startswith("_tiering/") or rel.count("/") != 1 or not rel.endswith(SEGMENT_FILES):
                continue
            remote.add(rel)
            target = data_dir / rel
            body = client.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
            if not target.exists() or target.read_bytes() != body:
                target.write_bytes(body)
                changed.append(target)
    for d in _partition_dirs(data_dir):
        for f in d.iterdir():
            if f.name.endswith(SEGMENT_FILES) and f"{d.name}/{f.name}" not in remote:
                f.unlink()
                changed.append(f)
    return sorted(changed)


def _compact_with_the_cli(endpoint: str, bucket: str, root: Path) -> tuple[dict[str, Any], str]:
    done = subprocess.run([sys.executable, "-m", "tiering", "s3", "compact", "--bucket", bucket, "--prefix",
                           PREFIX, "--codec", "zstd", "--min-age-minutes", "0", "--json", "--no-report",
                           "--work-dir", str(root)], capture_output=True, text=True, env=_env(endpoint), timeout=600,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:] + done.stdout[-4000:]
    run: dict[str, Any] = json.loads(done.stdout)
    return run, done.stderr


def _compact_with_the_dag(endpoint: str, bucket: str, root: Path, *params: str) -> tuple[dict[str, Any], str]:
    """The Airflow DAG kafka_segment_compaction (dag.test(), Spark local[2]) in its own process."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("dag_run.py")), str(root), endpoint, bucket,
                           PREFIX, *params], capture_output=True, text=True, env=_env(endpoint), timeout=900,
                          check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["state"] == "success", done.stderr[-4000:]
    run: dict[str, Any] = out["document"]
    return run, done.stderr


def _rebatch_with_the_dag(endpoint: str, bucket: str, root: Path) -> tuple[dict[str, Any], str]:
    """The DAG with its param ``rebatch``: runs of small batches merged, then recompressed, in the Spark job."""
    return _compact_with_the_dag(endpoint, bucket, root, json.dumps({"rebatch": True}))


# TIERING_KAFKA_PATHS=cli skips the Airflow/Spark runs; "rebatch" runs the DAG with its param rebatch before
# the same restore checks.
PATHS = [p for p in os.environ.get("TIERING_KAFKA_PATHS", "cli,dag,rebatch").split(",") if p]


def _through_s3(source: Source, root: Path, path: str) -> tuple[dict[str, Any], str, Broker, list[Path], int]:
    """The source's partitions uploaded to moto, compacted by the CLI or the DAG, downloaded over a copy of
    the source's data directory: (run document, stderr, the copy's broker, files changed, objects uploaded)."""
    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        bucket = f"{BUCKET}-{path}"
        client.create_bucket(Bucket=bucket)
        uploaded = upload(client, bucket, source.broker.data_dir)
        note(f"{uploaded} objects uploaded to moto")
        compact = {"cli": _compact_with_the_cli, "dag": _compact_with_the_dag, "rebatch": _rebatch_with_the_dag}[path]
        run, stderr = compact(endpoint, bucket, root)
        note(f"compacted by the {path}")
        broker = source.broker.copy_to(root / "data", root / "logs")
        rewritten = download(client, bucket, broker.data_dir)
        note(f"{len(rewritten)} rewritten files downloaded")
    return run, stderr, broker, rewritten, uploaded


@pytest.fixture(scope="module", params=PATHS)
def restored(source: Source, tmp_path_factory: pytest.TempPathFactory,
             request: pytest.FixtureRequest) -> Iterator[Restored]:
    """The source broker's partitions compacted on S3 by ``tiering s3 compact`` (cli), by the Airflow DAG
    with Spark (dag), or by the DAG with re-batching (rebatch), restored into a copy of its data directory, a
    broker running on it."""
    root = tmp_path_factory.mktemp(f"kafka-restored-{request.param}")
    run, stderr, broker, rewritten, uploaded = _through_s3(source, root, request.param)
    if request.param == "rebatch":
        merged = sum(rb["batches_in"] - rb["batches_out"] for s in run["segments"]
                     if (rb := (s.get("stats") or {}).get("rebatch")))
        note(f"{merged} batches fewer after re-batching")
        assert merged > 0
    pristine = root / "pristine"
    shutil.copytree(broker.data_dir, pristine)
    broker.extra["log.cleaner.enable"] = "false"  # the log stays exactly as restored while we read it
    broker.start()
    P.wait_leaders(broker.bootstrap, source.partitions)
    note("restored broker started")
    try:
        yield Restored(broker, run, stderr, rewritten, pristine, uploaded)
    finally:
        broker.stop()


def test_every_sealed_segment_was_compacted(source: Source, restored: Restored) -> None:
    statuses = Counter(s["status"] for s in restored.run["segments"])
    assert statuses["compacted"] > 0, restored.run["segments"][:3]
    assert set(statuses) <= {"compacted", "skipped"}, statuses  # skipped: "no savings" (already zstd)
    # every sealed segment is in the run (an empty one, which Kafka's cleaner leaves behind, is not planned)
    sealed = {(d.name, f.stem) for d in _partition_dirs(source.broker.data_dir) for f in d.glob("*.log")
              if f.stat().st_size > 0}
    sealed -= {(d.name, max(f.stem for f in d.glob("*.log"))) for d in _partition_dirs(source.broker.data_dir)}
    listed = {(s["directory"], f'{s["base_offset"]:020d}') for s in restored.run["segments"]}
    assert listed == sealed, (sorted(sealed - listed), sorted(listed - sealed))
    logs = [p for p in restored.rewritten if p.suffix == ".log"]
    assert len(logs) == statuses["compacted"]
    # the active segment (highest base offset) of every partition is as the broker left it
    for d in _partition_dirs(source.broker.data_dir):
        active = max(d.glob("*.log"))
        assert (restored.broker.data_dir / d.name / active.name).read_bytes() == active.read_bytes()
    before = sum(f.stat().st_size for f in source.broker.data_dir.glob("*/*.log"))
    after = sum(f.stat().st_size for f in restored.broker.data_dir.glob("*/*.log"))
    print(f"\n{len(restored.run['segments'])} sealed segments, {dict(statuses)}; "
          f".log bytes {before:,} -> {after:,}")


def test_log_end_offsets_unchanged(source: Source, restored: Restored) -> None:
    assert _watermarks(restored.broker.bootstrap, source.partitions) == source.log_end


def _watermarks(bootstrap: str, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tiering-ends"})
    try:
        return {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[1] for tp in partitions}
    finally:
        c.close()


def _check_against_produced(source: Source, view: dict[tuple[str, int], list[P.Consumed]], committed: bool) -> int:
    n = 0
    for tp in source.partitions:
        spec = source.spec(tp[0])
        got = view[tp]
        expected = [p for p in source.expected(tp) if not (committed and p.aborted)]
        if spec.compacted:  # the cleaner removed some: what is left is what was produced at those offsets
            by_offset = {p.offset: p for p in expected}
            for r in got:
                p = by_offset[r.offset]
                assert (r.key, r.value, r.headers, r.timestamp) == (p.key, p.value, p.headers, p.timestamp), tp
            last = {p.key: p for p in expected}
            assert {r.key: r.offset for r in got} == {k: p.offset for k, p in last.items()}, tp
        else:
            assert [r.offset for r in got] == [p.offset for p in expected], tp
            for r, p in zip(got, expected, strict=True):
                assert (r.key, r.value, r.headers) == (p.key, p.value, p.headers), (tp, r.offset)
                if spec.mode == "log-append-time":
                    assert r.timestamp_type == 2, (tp, r.offset)
                else:
                    assert (r.timestamp_type, r.timestamp) == (1, p.timestamp), (tp, r.offset)
        n += len(got)
    return n


@pytest.mark.parametrize("isolation", ["read_uncommitted", "read_committed"])
def test_every_record_comes_back(source: Source, restored: Restored, isolation: str) -> None:
    after = P.consume_all(restored.broker.bootstrap, source.partitions, isolation)
    before = source.views[isolation]
    for tp in source.partitions:
        assert after[tp] == before[tp], tp  # every field, timestamps and their type included
    n = _check_against_produced(source, after, committed=isolation == "read_committed")
    aborted = sum(p.aborted for p in source.produced)
    produced = len(source.produced)
    print(f"\n{isolation}: {produced:,} produced ({aborted} aborted), {n:,} consumed after the restore")
    if isolation == "read_committed":
        assert aborted > 0


def test_the_source_broker_served_what_was_produced(source: Source) -> None:
    """The reference itself: before any rewrite the broker served exactly what the producers wrote."""
    for iso in ("read_uncommitted", "read_committed"):
        _check_against_produced(source, source.views[iso], committed=iso == "read_committed")


def test_offsets_for_times_unchanged(source: Source, restored: Restored) -> None:
    after = P.offsets_for_times(restored.broker.bootstrap, source.time_queries)
    diffs = [(q, a, b) for q, a, b in zip(source.time_queries, source.time_answers, after, strict=True) if a != b]
    assert not diffs, diffs[:10]
    assert len(source.time_queries) > 500


def test_random_seeks_inside_batches(source: Source, restored: Restored) -> None:
    after = P.seek_read(restored.broker.bootstrap, source.seeks)
    assert after == source.seek_answers
    bases = _batch_bases(restored.broker.data_dir)
    inside = [s for s in source.seeks if s[2] not in bases[(s[0], s[1])]]
    assert len(inside) > len(source.seeks) // 2, "most seeks land inside a batch"


def _batch_bases(data_dir: Path) -> dict[tuple[str, int], set[int]]:
    from tiering.kafka.reader import iter_batches

    out: dict[tuple[str, int], set[int]] = {}
    for d in _partition_dirs(data_dir):
        topic, _, part = d.name.rpartition("-")
        bases = out.setdefault((topic, int(part)), set())
        for f in d.glob("*.log"):
            with f.open("rb") as fh:
                bases.update(b.header.offset for b in iter_batches(fh, verify_crc=False))
    return out


LOADED = re.compile(r"Completed load of Log\(dir=\S+/([^/,]+), .*logEndOffset=(\d+)\) with (\d+) segments")


def test_no_index_rebuild_or_corruption_in_the_server_log(source: Source, restored: Restored) -> None:
    log = restored.broker.log_since_start()
    assert "Kafka Server started" in log, log[-2000:]
    # __cluster_metadata (KRaft's own log, untouched) always has its last segment "recovered" at start-up
    ours = [line for line in recovery_lines(log) if "__cluster_metadata" not in line]
    assert ours == []
    assert error_lines(log) == []
    loaded = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in LOADED.finditer(log)}
    for d in _partition_dirs(source.broker.data_dir):
        topic, _, part = d.name.rpartition("-")
        assert loaded[d.name] == (source.log_end[(topic, int(part))], len(list(d.glob("*.log")))), d.name


def _originals(source: Source, rewritten: list[Path]) -> list[Path]:
    return [source.broker.data_dir / p.parent.name / p.name for p in rewritten]


@pytest.fixture(scope="module")
def dumped(source: Source, restored: Restored) -> tuple[DumpResult, DumpResult, list[Path]]:
    # every file of every segment the pipeline rewrote (its indexes are written anew even when equal)
    logs = [restored.pristine / q.parent.name / q.name for q in restored.rewritten if q.suffix == ".log"]
    files = [f.with_suffix(ext) for f in logs for ext in SEGMENT_FILES]
    return dump(files), dump(_originals(source, files)), files


def test_kafkas_dump_log_segments_finds_nothing_new(dumped: tuple[DumpResult, DumpResult, list[Path]]) -> None:
    ours, original, files = dumped
    assert ours.new_problems(original) == {}
    logs = [seg_name(f) for f in files if f.suffix == ".log"]
    assert logs
    assert all(ours.batches[n] > 0 for n in logs)
    # deep iteration: the same records (control records included) in each rewritten .log as in its original
    assert {n: ours.records[n] for n in logs} == {n: original.records[n] for n in logs}
    indexes = [seg_name(f) for f in files if f.suffix != ".log"]
    assert set(indexes) <= ours.sane
    print(f"\nDumpLogSegments: {len(logs)} .log ({sum(ours.batches[n] for n in logs):,} batches, "
          f"{sum(ours.records[n] for n in logs):,} records), {len(indexes)} index files checked")


def _records_byte_near_middle(log: Path) -> int:
    """A byte inside the records of the batch nearest the file's middle (a blind middle byte may land in
    ``baseOffset`` or ``partitionLeaderEpoch``, which the CRC does not cover)."""
    middle, position = log.stat().st_size // 2, 0
    with log.open("rb") as f:
        for raw in iter_batches(f):
            end = position + len(raw.data)
            if end > middle and len(raw.data) > V2_HEADER_SIZE:
                return (position + V2_HEADER_SIZE + end) // 2
            position = end
    raise AssertionError(f"{log}: no batch with records past byte {middle}")


def test_a_corrupted_copy_is_caught(dumped: tuple[DumpResult, DumpResult, list[Path]], tmp_path: Path) -> None:
    _, _, files = dumped
    ours_before = dumped[0]
    log = next(f for f in files if f.suffix == ".log" and f.with_suffix(".index").stat().st_size >= 16
               and f.with_suffix(".index") in files)
    copies = []
    for copy in ("bad-log", "bad-index"):  # two copies: a broken .log would break its index check too
        part = tmp_path / copy / log.parent.name
        part.mkdir(parents=True)
        for ext in SEGMENT_FILES:
            shutil.copy(log.with_suffix(ext), part / (log.stem + ext))
        copies.append(part)
    bad_log = copies[0] / log.name
    data = bytearray(bad_log.read_bytes())
    data[_records_byte_near_middle(bad_log)] ^= 0x5A  # the CRC covers it: that batch no longer holds
    bad_log.write_bytes(bytes(data))
    idx = copies[1] / (log.stem + ".index")
    entries = bytearray(idx.read_bytes())
    entries[0:4] = (int.from_bytes(entries[0:4], "big") + 1).to_bytes(4, "big")  # first entry's offset + 1
    idx.write_bytes(bytes(entries))

    result = dump([bad_log, idx, copies[1] / (log.stem + ".timeindex")])
    new = result.new_problems(ours_before)
    name = seg_name(bad_log)
    assert name in new, new
    assert any("isvalid: false" in line.lower() or "Error" in line for line in new[name]), new
    assert seg_name(idx) in new, new
    assert any("Index offset" in line or "Mismatches" in line for line in new[seg_name(idx)]), new
    print(f"\ncorrupted copy: {name}: {sorted(new[name])[0][:160]}...; {seg_name(idx)}: {sorted(new[seg_name(idx)])}")

    done = subprocess.run([sys.executable, "-m", "tiering", "segment", "verify", str(bad_log), "--indexes"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert log.name in done.stderr + done.stdout


def test_a_broker_forced_to_recover_accepts_every_rewritten_segment(source: Source, restored: Restored,
                                                                     tmp_path: Path) -> None:
    """Unclean shutdown and recovery points at 0: Kafka's LogSegment.recover() re-reads every batch of every
    segment (CRC, offsets, sizes) and rebuilds the indexes; none is truncated and the records are the same."""
    data = tmp_path / "data"
    shutil.copytree(restored.pristine, data)
    for marker in data.glob("*cleanshutdown*"):
        marker.unlink()
    ck = data / "recovery-point-offset-checkpoint"
    lines = ck.read_text().splitlines()
    ck.write_text("\n".join(lines[:2] + [" ".join([*line.split()[:2], "0"]) for line in lines[2:]]) + "\n")
    broker = Broker(data, tmp_path / "logs", cluster_id=source.broker.cluster_id,
                    extra={"log.cleaner.enable": "false"})
    broker.start()
    try:
        P.wait_leaders(broker.bootstrap, source.partitions)
        log = broker.log_since_start()
        recovered = set(re.findall(r"partition=(\S+), dir=.*Recovering unflushed segment (\d+)\.", log))
        ours = {(p.parent.name, str(int(p.stem))) for p in restored.rewritten if p.suffix == ".log"}
        assert ours <= recovered, sorted(ours - recovered)[:5]  # Kafka re-read every segment we rewrote
        bad = [line for line in recovery_lines(log) if "Recovering unflushed segment" not in line
               and "rebuilding index" not in line and "Could not find offset index" not in line]
        assert bad == []
        after = P.consume_all(broker.bootstrap, source.partitions, "read_committed")
        for tp in source.partitions:
            assert after[tp] == source.views["read_committed"][tp], tp
    finally:
        broker.stop()
    # Kafka's rebuilt indexes (LogSegment.recover) equal the ones the pipeline wrote, byte for byte
    same, differ = Counter[str](), []
    for p in (q for q in restored.rewritten if q.suffix == ".log"):
        for ext in (".index", ".timeindex"):
            ours = restored.pristine / p.parent.name / (p.stem + ext)
            if (data / p.parent.name / ours.name).read_bytes() == ours.read_bytes():
                same[ext] += 1
            else:
                differ.append(seg_name(ours))
    assert differ == []
    assert same[".index"] == same[".timeindex"] == len([p for p in restored.rewritten if p.suffix == ".log"]) > 0
