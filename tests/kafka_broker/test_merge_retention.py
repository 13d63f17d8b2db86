"""Time-based retention of merged segments on a real Kafka 4.3 broker: a segment goes when its NEWEST record
is older than ``retention.ms`` (``UnifiedLog.deleteRetentionMsBreachedSegments``), so a merged segment keeps
its oldest records until its newest expires.

A broker writes one partition in three eras of record timestamps (ten days old, five days old, one day
old) and a last few records of now, in 16 KiB segments. Two copies of its directory are restored: as
written, and with the sealed segments merged into one (``tiering partition merge``). With ``retention.ms``
of seven days, the broker on the copy as written deletes the segments of the oldest era; the broker on the
merged copy deletes nothing (the merged segment's newest record is a day old). With twelve hours, it
deletes the merged segment whole.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kafka_broker.broker import Broker
from tests.kafka_broker.conftest import note

pytestmark = pytest.mark.kafka

TOPIC = "retained.events"
SEGMENT_BYTES = 16384
DAY_MS = 86_400_000
ERAS = (10, 5, 1)  # days before now of each era's records
PER_ERA = 400


def _produce(bootstrap: str, now_ms: int) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 2000,
                         "compression.type": "none"})
    for days in ERAS:
        for i in range(PER_ERA):
            producer.produce(TOPIC, value=b'{"era": %d, "i": %d, "pad": "%s"}' % (days, i, b"x" * 40),
                             timestamp=now_ms - days * DAY_MS + i)
        producer.flush(30)
    for i in range(20):  # the active segment's records: now
        producer.produce(TOPIC, value=b'{"now": %d}' % i)
    producer.flush(30)


def _set_retention(bootstrap: str, ms: int) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=[entry])]
                                                  ).values():
        future.result(30)


def _earliest(bootstrap: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "retention-probe"})
    try:
        low, _ = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=30)
        return int(low)
    finally:
        consumer.close()


def _earliest_after(broker: Broker, retention_ms: int, wait_s: float = 20.0) -> int:
    """The partition's earliest offset once ``retention.ms`` is set: as soon as retention (checked every
    second) moves it, else after ``wait_s`` seconds."""
    _set_retention(broker.bootstrap, retention_ms)
    start = _earliest(broker.bootstrap)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.5)
        if _earliest(broker.bootstrap) != start:
            time.sleep(2)  # retention deletes every expired segment in one look: let it finish
            return _earliest(broker.bootstrap)
    return start


def _logs(directory: Path) -> list[int]:
    return sorted(int(p.name[:20]) for p in directory.glob("*.log"))


def test_a_merged_segment_is_deleted_when_its_newest_record_expires(tmp_path: Path) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    retention_checks = {"log.retention.check.interval.ms": "1000", "log.segment.delete.delay.ms": "0",
                        "log.initial.task.delay.ms": "0"}
    broker = Broker(tmp_path / "source", tmp_path / "source-logs", extra=retention_checks)
    broker.start()
    now_ms = int(time.time() * 1000)
    try:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
        admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={"internal.segment.bytes": str(SEGMENT_BYTES)})])
        admin.close()
        _produce(broker.bootstrap, now_ms)
    finally:
        broker.stop()
    partition = broker.data_dir / f"{TOPIC}-0"
    bases = _logs(partition)
    assert len(bases) >= 6, bases

    merged = tmp_path / "merged"
    done = subprocess.run([sys.executable, "-m", "tiering", "partition", "merge", str(partition), "--out",
                           str(merged), "--segment-bytes", str(1 << 30), "--json"], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert [g["sources"] for g in doc["merged"]] == [bases[:-1]]  # every sealed segment, one group

    as_written = broker.copy_to(tmp_path / "as-written", tmp_path / "as-written-logs")
    as_written.start()
    try:
        kept_as_written = _earliest_after(as_written, 7 * DAY_MS)
    finally:
        as_written.stop()
    oldest_gone = [b for b in bases if b < kept_as_written]
    assert oldest_gone, "the copy as written lost nothing to a 7-day retention"
    assert kept_as_written < bases[-1]  # the eras of 5 and 1 days stay

    restored = broker.copy_to(tmp_path / "restored", tmp_path / "restored-logs")
    shutil.rmtree(restored.data_dir / f"{TOPIC}-0")
    shutil.copytree(merged, restored.data_dir / f"{TOPIC}-0")
    restored.start()
    try:
        kept_merged = _earliest_after(restored, 7 * DAY_MS, wait_s=8.0)  # 8 looks of retention
        assert kept_merged == 0  # its oldest records are 10 days old, its newest a day: the segment stays
        assert _logs(restored.data_dir / f"{TOPIC}-0")[0] == bases[0]
        after_half_day = _earliest_after(restored, DAY_MS // 2)
    finally:
        restored.stop()
    assert after_half_day == bases[-1]  # the merged segment went whole; the active one stays
    note(f"retention: {len(bases)} segments; 7 days removed {len(oldest_gone)} segments as written (earliest "
         f"offset {kept_as_written}), none merged (earliest 0); 12 hours removed the merged segment whole")
