"""Key compaction against Kafka's own log cleaner, on the same bytes.

A real broker writes a changelog-like topic (many updates per key, tombstones, records without a key, a
plain producer, an idempotent one, a transactional one that commits and aborts) while the topic's
``cleanup.policy`` is ``delete``; the partition's files are copied aside; then the topic is switched to
``compact`` and the broker's cleaner runs one pass. ``tiering.kafka.keycompact`` cleans the copy; both
results must hold the same batches (offsets, producer fields, markers, horizons set or not, records with
offset, timestamp, key, value and headers) and the same ``.txnindex`` entries; at the cleaner's clock (read
back from the delete horizon it stamped), the same bytes, segment by segment, with the same indexes.
A second topic of gzip records: the batches the cleaner rebuilds (java.util.zip) are ours byte for byte.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.kafka.passes import compact_partition
from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import Broker
from tests.kafka_broker.conftest import note
from tiering.kafka.batch import V2_HEADER_SIZE
from tiering.kafka.index import parse_txn_index
from tiering.kafka.keycompact import CleanOptions, CleanStats, Segment, keys_in_map
from tiering.kafka.merge import Limits
from tiering.kafka.reader import iter_batches
from tiering.kafka.segment import iter_decoded

pytestmark = pytest.mark.kafka

TOPIC = "kc.changelog"
SEGMENT_BYTES = 16384  # the topics' segment.bytes: what the cleaner groups neighbours by
KEYS = 60


def _produce(bootstrap: str) -> dict[str, int]:
    """Plain, idempotent and transactional producers taking turns; returns what each wrote."""
    from confluent_kafka import Producer

    base = {"bootstrap.servers": bootstrap, "compression.type": "none", "linger.ms": 2, "batch.size": 1500}
    plain = Producer({**base, "enable.idempotence": False, "acks": "1"})
    idem = Producer({**base, "enable.idempotence": True})
    txn = Producer({**base, "transactional.id": "kc-txn"})
    txn.init_transactions(30)
    rnd = random.Random(11)
    counts = dict.fromkeys(("plain", "no_key", "idempotent", "tombstones", "committed", "aborted"), 0)

    def record(i: int) -> tuple[bytes, bytes | None]:
        key = b"key-%03d" % rnd.randrange(KEYS)
        if rnd.random() < 0.08:
            counts["tombstones"] += 1
            return key, None
        return key, b'{"i": %d, "v": "%s"}' % (i, b"x" * rnd.randrange(20, 120))

    for round_ in range(24):
        for i in range(40):
            key, value = record(round_ * 1000 + i)
            if rnd.random() < 0.05:
                plain.produce(TOPIC, value=value or b"no key", key=None)
                counts["no_key"] += 1
            else:
                plain.produce(TOPIC, value=value, key=key, headers=[("h", b"%d" % i)] if i % 7 == 0 else None)
                counts["plain"] += 1
        plain.flush(30)
        for i in range(60):
            key, value = record(round_ * 1000 + 100 + i)
            idem.produce(TOPIC, value=value, key=key)
            counts["idempotent"] += 1
        idem.flush(30)
        txn.begin_transaction()
        for i in range(25):
            key, value = record(round_ * 1000 + 500 + i)
            txn.produce(TOPIC, value=value, key=key)
        txn.flush(30)
        if round_ % 3 == 2:
            txn.abort_transaction(30)
            counts["aborted"] += 25
        else:
            txn.commit_transaction(30)
            counts["committed"] += 25
    # The idempotent producer's last batch, superseded: the cleaner keeps it as a header without records (the
    # producer's state). Tombstones that stay their keys' latest. Each sealed by a segment's worth after it.
    idem.produce(TOPIC, value=b"the idempotent producer's last", key=b"key-000")
    idem.flush(30)

    def fill() -> None:
        for i in range(240):
            plain.produce(TOPIC, value=b"%d:" % i + b"y" * 100, key=b"key-%03d" % (i % 30))
        plain.flush(30)

    fill()
    for k in range(40, 45):
        plain.produce(TOPIC, value=None, key=b"key-%03d" % k)
        counts["tombstones"] += 1
    fill()
    return counts


GZIP_OS_AT = 9  # the gzip header's OS byte (RFC 1952): 255 from java.util.zip on Java 17+, 3 from zlib


def _clean_once(broker: Broker, through: int, then: Callable[[], None] | None = None) -> int:
    """The broker restarted with the topic turned compacted (dirty ratio 0, delete.retention.ms 0) until its
    cleaner has cleaned up to ``through``; ``then`` runs before it stops. What _wait_cleaned returned."""
    broker.start()
    try:
        _set_configs(broker.bootstrap, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0",
                                        "delete.retention.ms": "0"})
        cleaned = _wait_cleaned(broker, through)
        if then is not None:
            then()
        return cleaned
    finally:
        broker.stop()


def _set_configs(bootstrap: str, configs: dict[str, str]) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    for future in admin.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=entries)]
                                                  ).values():
        future.result(30)


def _cleaner_checkpoint(data_dir: Path) -> int:
    path = data_dir / "cleaner-offset-checkpoint"
    for line in (path.read_text().splitlines()[2:] if path.exists() else []):
        topic, _, offset = line.split()
        if topic == TOPIC:
            return int(offset)
    return 0


def _segments(directory: Path) -> list[Segment]:
    out = []
    for log in sorted(directory.glob("*.log")):
        txn = log.with_suffix(".txnindex")
        aborted = tuple(parse_txn_index(txn.read_bytes(), path=str(txn))) if txn.exists() else ()
        sizes = [f.stat().st_size if f.exists() else 0 for f in (log, log.with_suffix(".index"),
                                                                  log.with_suffix(".timeindex"))]
        out.append(Segment(int(log.stem), lambda p=log: open(p, "rb"), aborted, str(log), *sizes))  # noqa: SIM115
    return out


def _view(log: bytes) -> list[tuple[Any, ...]]:
    """Every batch's header fields (the delete horizon: set or not) and its records."""
    return [(b.header.offset, b.header.last_offset, b.header.producer_id, b.header.producer_epoch,
             b.header.base_sequence, b.header.is_transactional, b.header.is_control,
             b.header.delete_horizon_ms is not None, b.header.timestamp_type, b.header.partition_leader_epoch,
             b.header.max_timestamp, [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in b.records])
            for b in iter_decoded(io.BytesIO(log))]


def _more(bootstrap: str) -> None:
    """The second round: tombstones for keys that had values, updates, then two segments' worth."""
    from confluent_kafka import Producer

    plain = Producer({"bootstrap.servers": bootstrap, "compression.type": "none", "linger.ms": 2,
                      "batch.size": 1500, "enable.idempotence": False, "acks": "1"})
    for k in range(30, 36):
        plain.produce(TOPIC, value=None, key=b"key-%03d" % k)
    for i in range(480):
        plain.produce(TOPIC, value=b"round 2: %d " % i + b"z" * 90, key=b"key-%03d" % (i % 12))
    plain.flush(30)


def _wait_cleaned(broker: Broker, upto: int) -> int:
    """Until the cleaner's checkpoint reaches ``upto``; the time then (ms)."""
    deadline = time.monotonic() + 120
    while _cleaner_checkpoint(broker.data_dir) < upto:
        assert time.monotonic() < deadline, broker.tail()
        time.sleep(0.3)
    return int(time.time() * 1000)


def _files(directory: Path, below: int) -> dict[int, Path]:
    return {int(p.stem): p for p in sorted(directory.glob("*.log")) if int(p.stem) < below}


def _check_pass(segments: list[Segment], theirs: dict[int, Path], pass_time: int, retention: int, *,
                segment_bytes: int, first_dirty: int = 0) -> CleanStats:
    """Our pass over ``segments`` at ``pass_time`` against the cleaner's output ``theirs``, file by file with the
    indexes: the neighbours the cleaner merged (the topic's ``segment_bytes``) are merged here too."""
    stats = CleanStats()
    options = CleanOptions(now_ms=pass_time, delete_retention_ms=retention, first_dirty_offset=first_dirty,
                           merge=Limits(segment_bytes))
    facts, ours = compact_partition(segments, options, stats)
    note(f"key compaction: {stats.to_json()}; {sum(len(s.sources) > 1 for s in ours)} merged segments")
    assert facts.upper == segments[-1].base_offset
    kafka_log = b"".join(p.read_bytes() for p in theirs.values())
    our_log = b"".join(s.log for s in ours)
    assert _view(our_log) == _view(kafka_log)  # a readable diff first
    kafka_txn = [e for p in theirs.values() if p.with_suffix(".txnindex").exists()
                 for e in parse_txn_index(p.with_suffix(".txnindex").read_bytes())]
    assert [e for s in ours for e in parse_txn_index(s.txn_index)] == kafka_txn
    assert our_log == kafka_log  # at the same clock, the same bytes
    assert sorted(theirs) == [s.base_offset for s in ours]  # the same segments, merged ones included
    for s in ours:
        path = theirs[s.base_offset]
        assert s.log == path.read_bytes(), path.name
        assert s.indexes.offset_index == path.with_suffix(".index").read_bytes(), path.name
        assert s.indexes.time_index == path.with_suffix(".timeindex").read_bytes(), path.name
        txn = path.with_suffix(".txnindex")
        assert s.txn_index == (txn.read_bytes() if txn.exists() else b""), path.name
    return stats


def _source_records(segments: list[Segment]) -> tuple[dict[int, tuple[str | None, str | None]], set[int]]:
    """Every data record of the segments as (key, value) in hex (as the consumer helper gives them), and the
    offsets of the records of aborted transactions (their batches between the first offset and the ABORT
    marker of a ``.txnindex`` entry)."""
    records: dict[int, tuple[str | None, str | None]] = {}
    aborted: set[int] = set()
    entries = [e for s in segments for e in s.aborted]
    for seg in segments:
        with seg.open() as f:
            for b in iter_decoded(f):
                h = b.header
                if h.is_control:
                    continue
                lost = h.is_transactional and any(e.producer_id == h.producer_id and
                                                  e.first_offset <= h.offset <= e.last_offset for e in entries)
                for r in b.records:
                    records[r.offset] = (None if r.key is None else r.key.hex(),
                                         None if r.value is None else r.value.hex())
                    if lost:
                        aborted.add(r.offset)
    return records, aborted


def _latest(records: dict[int, tuple[str | None, str | None]]) -> dict[str | None, str | None]:
    """Each key's value at its highest offset (None: a tombstone)."""
    return {k: v for _, (k, v) in sorted(records.items())}


def _horizons(paths: dict[int, Path]) -> set[int]:
    return {h for p in paths.values() for raw in iter_batches(io.BytesIO(p.read_bytes()))
            if (h := raw.header.delete_horizon_ms) is not None}


def _check_s3_path(passes: list[tuple[list[Path], dict[int, Path], int]]) -> None:
    """``tiering s3 compact-keys``'s runs in one bucket (moto in-process), merging as the topic's segment.bytes
    says: for each pass, ``files`` uploaded (over what is there), then a run at the cleaner's clock; every
    final .log, .index and .timeindex equals the cleaner's file ``theirs``, merged ones included, the
    .txnindex entries too, and the segments the cleaner merged away are gone."""
    import os
    import re

    from moto import mock_aws

    from tiering.commit.operation import Context
    from tiering.kafka.codecs import Codec
    from tiering.kafka.rewrite import RewriteOptions
    from tiering.run import engine
    from tiering.run.keycompact import KeyCompaction, KeyCompactOptions
    from tiering.storage.objects import ObjectNotFound
    from tiering.storage.s3 import S3Store, make_client

    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    os.environ.pop("AWS_ENDPOINT_URL", None)
    try:
        with mock_aws():
            client = make_client()
            client.create_bucket(Bucket="archive", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
            store = S3Store(client, "archive")
            for n, (files, theirs, pass_time) in enumerate(passes, 1):
                for path in files:
                    store.put(f"kafka/{TOPIC}-0/{path.name}", path.read_bytes())
                options = KeyCompactOptions(now_ms=pass_time, delete_retention_ms=0, topics=re.escape(TOPIC),
                                            merge=Limits(SEGMENT_BYTES), min_age_minutes=0)
                run = engine.run(store, Context(store, "kafka", f"keys-{n}", RewriteOptions(Codec.NONE)),
                                 KeyCompaction(options))
                assert run.exit_code() == 0, [r.to_json() for r in run.segments]
                logs = {int(i.key.rsplit("/", 1)[1][:20]) for i in store.list(f"kafka/{TOPIC}-0/")
                        if i.key.endswith(".log")}
                merged = run.counts.get("merged", 0)
                for base, path in theirs.items():
                    for suffix in (".log", ".index", ".timeindex"):
                        key = f"kafka/{TOPIC}-0/{base:020d}{suffix}"
                        assert store.get(key) == path.with_suffix(suffix).read_bytes(), (n, key)
                    try:
                        ours = parse_txn_index(store.get(f"kafka/{TOPIC}-0/{base:020d}.txnindex"))
                    except ObjectNotFound:
                        ours = []
                    txn = path.with_suffix(".txnindex")
                    assert ours == (parse_txn_index(txn.read_bytes()) if txn.exists() else []), (n, base)
                below = max(theirs) + 1
                assert sorted(b for b in logs if b < below) == sorted(theirs), n  # merged-away segments gone
                note(f"key compaction: S3 pass {n} left {len(theirs)} cleaned segments equal to the cleaner's files "
                     f"({merged} segments merged, {run.counts.get('compacted', 0)} cleaned one for one)")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _broker_with_topic(tmp_path: Path, topic_configs: dict[str, str], **extra: str) -> Broker:
    """A started broker (its cleaner backing off 200 ms between looks) holding TOPIC, one partition."""
    from kafka.admin import KafkaAdminClient, NewTopic

    broker = Broker(tmp_path / "data", tmp_path / "logs", extra={"log.cleaner.backoff.ms": "200", **extra})
    broker.start()
    try:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
        admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs=topic_configs)])
        admin.close()
    except BaseException:
        broker.stop()
        raise
    return broker


def _copied_aside(broker: Broker, to: Path, at_least: int) -> list[Segment]:
    """The partition's files as the (stopped) broker left them, copied to ``to``: at least ``at_least``
    segments."""
    shutil.copytree(broker.data_dir / f"{TOPIC}-0", to)
    segments = _segments(to)
    assert len(segments) >= at_least, [s.name for s in segments]
    return segments


def test_key_compaction_equals_kafka_s_log_cleaner_over_two_passes(tmp_path: Path) -> None:
    """Pass 1 with delete.retention.ms 0: tombstones and markers are stamped with the pass's own time, which
    gives the cleaner's clock. Pass 2, over the cleaner's output and a second round of records: the stamped
    tombstones go, markers whose data is gone are stamped."""
    broker = _broker_with_topic(tmp_path, {"internal.segment.bytes": str(SEGMENT_BYTES)})
    try:
        note(f"key compaction: produced {_produce(broker.bootstrap)}")
    finally:
        broker.stop()
    partition = broker.data_dir / f"{TOPIC}-0"
    first = _copied_aside(broker, tmp_path / "round1", 6)

    switched = int(time.time() * 1000)

    def then_pause_and_write_more() -> None:
        _set_configs(broker.bootstrap, {"min.cleanable.dirty.ratio": "1"})  # no pass while round 2 is written
        _more(broker.bootstrap)

    cleaned = _clean_once(broker, first[-1].base_offset, then=then_pause_and_write_more)
    shutil.copytree(partition, tmp_path / "round2")
    second = _segments(tmp_path / "round2")
    assert second[-1].base_offset > first[-1].base_offset + 2

    broker.start()
    try:
        _set_configs(broker.bootstrap, {"min.cleanable.dirty.ratio": "0"})
        cleaned2 = _wait_cleaned(broker, second[-1].base_offset)
    finally:
        broker.stop()

    pass1_out = _files(tmp_path / "round2", first[-1].base_offset)  # the cleaner's pass 1, as round 2 found it
    (pass1,) = _horizons(pass1_out)  # stamped at the pass's time + 0
    assert switched <= pass1 <= cleaned
    stats = _check_pass(first, pass1_out, pass1, 0, segment_bytes=SEGMENT_BYTES)
    # The command line on the same files: a whole partition directory, the cleaned files equal to the cleaner's.
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, "-m", "tiering", "partition", "compact-keys", str(tmp_path / "round1"),
                           "--out", str(out), "--now-ms", str(pass1), "--delete-retention-ms", "0",
                           "--segment-bytes", str(SEGMENT_BYTES), "--json"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["segments_cleaned"] == sorted(pass1_out)
    suffixes = (".log", ".index", ".timeindex", ".txnindex")
    for path in pass1_out.values():
        for suffix in suffixes[:3]:
            assert (out / path.with_suffix(suffix).name).read_bytes() == path.with_suffix(suffix).read_bytes()
    cleaned_names = {path.with_suffix(suffix).name for path in pass1_out.values() for suffix in suffixes}
    rest = [p for p in (tmp_path / "round1").iterdir() if p.is_file() and p.name not in cleaned_names]
    assert rest
    for path in rest:
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name  # the rest, as it was
    assert stats.aborted_records_dropped > 0
    assert stats.no_key_dropped > 0
    assert stats.superseded_dropped > 0
    assert stats.tombstones_stamped > 0
    assert stats.batches_emptied > 0

    pass2_out = _files(partition, second[-1].base_offset)
    new = _horizons(pass2_out) - {pass1}
    pass2 = new.pop() if new else cleaned2  # no new stamp: any time after pass 1's horizons gives this output
    assert pass1 < pass2 <= cleaned2
    # The cleaner's checkpoint after pass 1 (where its key map starts now) is the end of pass 1's range.
    stats = _check_pass(second, pass2_out, pass2, 0, segment_bytes=SEGMENT_BYTES, first_dirty=first[-1].base_offset)
    assert len(pass2_out) < len(second) - 1  # the cleaner merged neighbours this time, and so did we
    assert stats.tombstones_dropped > 0
    # The same two passes on S3: round 1 uploaded and cleaned, then round 2's newer segments (from where pass
    # 1 ended) uploaded over it and cleaned: the whole partition equals the cleaner's, merged segments included.
    dirty = [p for p in (tmp_path / "round2").iterdir() if p.suffix in (".log", ".index", ".timeindex", ".txnindex")
             and int(p.stem) >= first[-1].base_offset]
    _check_s3_path([([p for p in (tmp_path / "round1").iterdir() if p.is_file()], pass1_out, pass1),
                    (dirty, pass2_out, pass2)])

    # A broker restored on our pass-1 directory serves each key's latest value (tombstones included) and no
    # record of an aborted transaction, read_committed from offset 0.
    restored = Broker(tmp_path / "restored", tmp_path / "restored-logs", cluster_id=broker.cluster_id,
                      node_id=broker.node_id, extra={"log.cleaner.enable": "false"})
    shutil.copytree(broker.data_dir, restored.data_dir)
    shutil.rmtree(restored.data_dir / f"{TOPIC}-0")
    shutil.copytree(out, restored.data_dir / f"{TOPIC}-0")
    restored.start()
    try:
        consumed = P.consume_all(restored.bootstrap, [(TOPIC, 0)], "read_committed")[(TOPIC, 0)]
    finally:
        restored.stop()
    source, aborted = _source_records(first)
    served = {c.offset: (c.key, c.value) for c in consumed}
    assert not set(served) & aborted
    assert all(source[o] == kv for o, kv in served.items())  # every record served is the source's, unchanged
    assert _latest(served) == _latest({o: kv for o, kv in source.items() if o not in aborted and kv[0] is not None})


def test_gzip_batches_the_cleaner_rebuilds_are_ours_byte_for_byte(tmp_path: Path) -> None:
    """gzip records (librdkafka's gzip, OS byte 3): the cleaner rebuilds every batch that loses records with
    java.util.zip (XFL 0, OS 255) at gzip's default level, and so do we; at the cleaner's clock the cleaned
    log is the same bytes as ours (segments merged by the cleaner compared as one log)."""
    from confluent_kafka import Producer

    broker = _broker_with_topic(tmp_path, {"internal.segment.bytes": str(SEGMENT_BYTES)})
    try:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "gzip", "linger.ms": 2,
                             "batch.size": 3000, "enable.idempotence": False, "acks": "1"})
        rnd = random.Random(5)
        for i in range(3000):
            key = b"key-%03d" % rnd.randrange(KEYS)
            value = None if rnd.random() < 0.05 else b'{"i": %d, "v": "%s"}' % (i, b"g" * rnd.randrange(10, 90))
            producer.produce(TOPIC, value=value, key=key)
            if i % 250 == 249:
                producer.flush(30)
        producer.flush(30)
    finally:
        broker.stop()
    partition = broker.data_dir / f"{TOPIC}-0"
    segments = _copied_aside(broker, tmp_path / "before", 4)
    _clean_once(broker, segments[-1].base_offset)
    theirs = _files(partition, segments[-1].base_offset)
    (pass_time,) = _horizons(theirs)  # the tombstones the pass kept, stamped at its own time
    rebuilt = [b for p in theirs.values() for b in iter_batches(io.BytesIO(p.read_bytes()))
               if b.header.codec.label == "gzip" and b.data[V2_HEADER_SIZE + GZIP_OS_AT] == 0xFF]
    assert rebuilt, "the cleaner rebuilt no gzip batch"
    stats = _check_pass(segments, theirs, pass_time, 0, segment_bytes=SEGMENT_BYTES)
    assert stats.superseded_dropped > 0
    note(f"key compaction, gzip: {len(rebuilt)} batches rebuilt by the cleaner, the cleaned log ours byte for byte")


def _dirty_sections(broker: Broker) -> list[tuple[int, int]]:
    """Each pass of the cleaner over the topic, as its log states it: (first dirty offset, end offset)."""
    text = (broker.logs_dir / "server.log").read_text(errors="replace")
    return [(int(a), int(b)) for a, b in re.findall(rf"cleaned log {re.escape(TOPIC)}-0 \(dirty section = \[(\d+), "
                                                    r"(\d+)\]\)", text)]


def test_a_key_map_of_the_broker_s_size_ends_a_pass_where_the_cleaner_s_does(tmp_path: Path) -> None:
    """The broker's dedupe buffer at its minimum (just over 1 MiB a cleaner thread) maps 39,378 keys; a
    partition with more distinct keys below its active segment takes the cleaner two passes. Our pass over
    the same files with ``keys_in_map`` of the same buffer ends at the offset the cleaner's first pass ended
    at, and a pass from there ends where its second did."""
    buffer = 1024 * 1024 + 24 * 64
    capacity = keys_in_map(buffer)
    assert capacity == int((buffer // 24) * 0.9)
    from confluent_kafka import Producer

    broker = _broker_with_topic(tmp_path, {"internal.segment.bytes": str(256 * 1024)},
                                **{"log.cleaner.dedupe.buffer.size": str(buffer)})
    try:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "none", "linger.ms": 5,
                             "enable.idempotence": False, "acks": "1"})
        rnd = random.Random(3)
        for i in range(capacity * 2):  # about 1.6 keys for each the map holds, most below the active segment
            key = i if i % 5 else rnd.randrange(i + 1)  # new keys, and updates of earlier ones
            producer.produce(TOPIC, key=b"k%06d" % key, value=b"%d" % i)
            if i % 10_000 == 0:
                producer.flush(30)
        producer.flush(30)
    finally:
        broker.stop()
    segments = _copied_aside(broker, tmp_path / "before", 3)
    broker.start()
    try:
        _set_configs(broker.bootstrap, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
        deadline = time.monotonic() + 120
        while len(_dirty_sections(broker)) < 2:
            passes = _dirty_sections(broker)
            assert not passes or passes[0][1] < segments[-1].base_offset, f"one pass was enough: {passes}"
            assert time.monotonic() < deadline, broker.tail()
            time.sleep(0.3)
    finally:
        broker.stop()
    (start1, end1), (start2, end2) = _dirty_sections(broker)[:2]
    assert (start1, start2) == (0, end1)
    assert end1 < segments[-1].base_offset  # the map filled up: the first pass ended early
    now = int(time.time() * 1000)
    facts, _ = compact_partition(segments, CleanOptions(now_ms=now, max_keys=capacity), CleanStats())
    assert len(facts.key_map) == capacity
    assert facts.end_offset == end1
    again, _ = compact_partition(segments, CleanOptions(now_ms=now, max_keys=capacity, first_dirty_offset=end1),
                                 CleanStats())
    assert again.end_offset == end2
    note(f"key compaction: a {buffer:,}-byte key map ({capacity:,} keys) ended the first pass at {end1:,}, "
         f"the second at {end2:,}, as the broker's cleaner did")
