"""A bucket caught in the middle of merges on S3 restores into a real Kafka 4.3 broker with every record.

The source broker's partitions (conftest.py: Java, librdkafka and kafka-python producers; plain, idempotent,
transactional, compacted and log-append-time topics; 64 KiB segments) are uploaded to a bucket (moto), and
merged there by ``tiering.run.merge`` up to 1 MiB, with every merge stopped right after its swap files went
in: the sources still in place, each merged segment beside them as ``.swap`` objects (the journal's state
``swapped``, where a crash leaves a merge that only rolls forward). A broker started on a copy of that
bucket must load the merged segments in place of their sources and serve every record at both isolation
levels as the source broker did. Then the merges are finished, rolled back, and every rollback stopped the
same way (the merged segment still in place, its sources beside it as ``.swap`` objects, the ``.cleaned``
marker gone): the broker must load the original segments, every record again.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from moto import mock_aws

from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import Broker, error_lines
from tests.kafka_broker.conftest import Source, note
from tiering.commit import regroup
from tiering.commit.operation import Context, SegmentResult
from tiering.kafka.codecs import Codec
from tiering.kafka.merge import Limits
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.vocabulary import Status
from tiering.run import engine
from tiering.run.merge import MergeOptions, Merging
from tiering.run.rollback import rollback
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.kafka

BUCKET = "restore"
PREFIX = "kafka"
LOADED = re.compile(r"Completed load of Log\(dir=\S+/([^/,]+), .*logEndOffset=(\d+)\) with (\d+) segments")


def _partition_dirs(data_dir: Path) -> list[Path]:
    return sorted(d for d in data_dir.iterdir() if d.is_dir() and "-" in d.name and not d.name.startswith("__"))


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = make_client()
        client.create_bucket(Bucket=BUCKET)
        yield S3Store(client, BUCKET)


def _stop_after_swap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every operation stops where a crash right after its swap files went in would leave it."""
    def stopped(ctx: Context, journal: Any, etag: str, lease: Any) -> list[SegmentResult]:
        return [SegmentResult(journal.directory, b, Status.STAGED, "stopped after the swap (test)")
                for b in sorted({s.base_offset for s in (*journal.sources, *journal.targets)})]
    monkeypatch.setattr(regroup, "_roll_forward", stopped)


def _restore(store: S3Store, broker: Broker, dirs: list[str]) -> None:
    """Each partition directory of the (stopped) broker replaced by the bucket's objects under it."""
    for name in dirs:
        d = broker.data_dir / name
        shutil.rmtree(d)
        d.mkdir()
        root = f"{PREFIX}/{name}/"
        for info in store.list(root):
            rest = info.key[len(root):]
            if "/" not in rest:
                (d / rest).write_bytes(store.get(info.key))


def _serve(source: Source, broker: Broker, what: str) -> dict[str, int]:
    """Start the broker on its directory, check every record at both isolation levels; the segments it loaded
    by partition."""
    broker.extra["log.cleaner.enable"] = "false"
    broker.start()
    try:
        P.wait_leaders(broker.bootstrap, source.partitions)
        for isolation in ("read_uncommitted", "read_committed"):
            after = P.consume_all(broker.bootstrap, source.partitions, isolation)
            for tp in source.partitions:
                assert after[tp] == source.views[isolation][tp], (what, isolation, tp)
        log = broker.log_since_start()
        assert error_lines(log) == [], what
        loaded = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in LOADED.finditer(log)}
    finally:
        broker.stop()
    for tp in source.partitions:
        assert loaded[f"{tp[0]}-{tp[1]}"][0] == source.log_end[tp], (what, tp)
    assert not list(broker.data_dir.glob("*/*.swap")), what
    return {name: segments for name, (_, segments) in loaded.items()}


def test_a_bucket_stopped_mid_merge_and_mid_rollback_restores_every_record(
        source: Source, store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = [d.name for d in _partition_dirs(source.broker.data_dir)]
    for name in dirs:
        for f in sorted((source.broker.data_dir / name).iterdir()):
            if f.is_file():
                store.put(f"{PREFIX}/{name}/{f.name}", f.read_bytes())
    originals = {name: len(list((source.broker.data_dir / name).glob("*.log"))) for name in dirs}
    ctx = Context(store, PREFIX, "merge-1", RewriteOptions(Codec.NONE))
    options = MergeOptions(Limits(1 << 20), min_age_minutes=0)

    with monkeypatch.context() as patch:
        _stop_after_swap(patch)
        stopped = engine.run(store, ctx, Merging(options))
    swaps = [i.key for i in store.list(f"{PREFIX}/") if i.key.endswith(".log.swap")]
    assert swaps
    assert all(r.status is not Status.FAILED for r in stopped.segments), [r.to_json() for r in stopped.segments]
    broker = source.broker.copy_to(tmp_path / "a" / "data", tmp_path / "a" / "logs")
    _restore(store, broker, dirs)
    merged = _serve(source, broker, "merges stopped after their swap")
    assert sum(merged[n] for n in dirs) < sum(originals.values())
    note(f"mid-merge bucket: {len(swaps)} merges as .swap objects; the broker loaded {sum(merged[n] for n in dirs)} "
         f"segments where there were {sum(originals.values())}")

    finished = engine.run(store, Context(store, PREFIX, "merge-2", RewriteOptions(Codec.NONE)), Merging(options))
    assert not [r for r in finished.segments if r.status is Status.FAILED]
    assert not [i.key for i in store.list(f"{PREFIX}/") if i.key.endswith(".swap")]
    with monkeypatch.context() as patch:
        _stop_after_swap(patch)
        rollback(store, Context(store, PREFIX, "rollback-1", RewriteOptions(Codec.NONE)), "merge-1")
    assert [i.key for i in store.list(f"{PREFIX}/") if i.key.endswith(".log.swap")]
    assert not [i.key for i in store.list(f"{PREFIX}/") if i.key.endswith(".cleaned")]
    broker = source.broker.copy_to(tmp_path / "b" / "data", tmp_path / "b" / "logs")
    _restore(store, broker, dirs)
    restored = _serve(source, broker, "rollbacks stopped after their swap")
    assert {n: restored[n] for n in dirs} == originals
