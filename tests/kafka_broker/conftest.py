"""The session's source broker: a real Kafka 4.3 node filled by real producers, then stopped.

``source`` holds what was produced and what the broker served before any rewrite (records under both
isolation levels, ListOffsets answers by timestamp, records found after seeks): the restore tests compare
the broker restarted on our rewritten segments with it.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field

import pytest

from tests import needs
from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import Broker, missing

TP = tuple[str, int]
_T0 = time.monotonic()


def note(msg: str) -> None:
    """A progress line with the seconds since the session started (shown with -s)."""
    print(f"[kafka-broker {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr)


@dataclass
class Source:
    broker: Broker  # stopped
    specs: list[P.TopicSpec]
    produced: list[P.Produced]
    partitions: list[TP]
    views: dict[str, dict[TP, list[P.Consumed]]]  # isolation level -> partition -> records
    time_queries: list[tuple[str, int, int]]
    time_answers: list[int]
    seeks: list[tuple[str, int, int]]
    seek_answers: list[P.Consumed]
    log_end: dict[TP, int] = field(default_factory=dict)

    def spec(self, topic: str) -> P.TopicSpec:
        return next(s for s in self.specs if s.name == topic)

    def expected(self, tp: TP) -> list[P.Produced]:
        return sorted((p for p in self.produced if (p.topic, p.partition) == tp), key=lambda p: p.offset)


def _time_queries(rnd: random.Random, view: dict[TP, list[P.Consumed]]) -> list[tuple[str, int, int]]:
    out = []
    for (t, p), recs in sorted(view.items()):
        stamps = sorted({r.timestamp for r in recs})
        if not stamps:
            continue
        picks = {stamps[0] - 1, stamps[0], stamps[-1], stamps[-1] + 1, *rnd.sample(stamps, min(40, len(stamps)))}
        picks |= {s + 1 for s in rnd.sample(stamps, min(10, len(stamps)))}
        out += [(t, p, ts) for ts in sorted(picks)]
    return out


def _seeks(rnd: random.Random, view: dict[TP, list[P.Consumed]]) -> list[tuple[str, int, int]]:
    out = []
    for (t, p), recs in sorted(view.items()):
        if recs:
            last = recs[-1].offset
            out += [(t, p, o) for o in sorted({0, last, *(rnd.randrange(last + 1) for _ in range(12))})]
    return out


@pytest.fixture(scope="session")
def source(tmp_path_factory: pytest.TempPathFactory) -> Source:
    if reason := missing():
        needs.missing(needs.KAFKA, reason)
    root = tmp_path_factory.mktemp("kafka-source")
    broker = Broker(root / "data", root / "logs")
    broker.start()
    note(f"source broker up on {broker.bootstrap}")
    try:
        specs = P.dataset()
        produced = P.produce_all(broker, specs)
        note(f"{len(produced)} records produced")
        P.wait_compacted(broker, [s.name for s in specs if s.compacted])
        partitions = sorted({(s.name, p) for s in specs for p in range(s.partitions)})
        views = {iso: P.consume_all(broker.bootstrap, partitions, iso)
                 for iso in ("read_uncommitted", "read_committed")}
        note("consumed (both isolation levels)")
        rnd = random.Random(11)
        time_queries = _time_queries(rnd, views["read_uncommitted"])
        time_answers = P.offsets_for_times(broker.bootstrap, time_queries)
        seeks = _seeks(rnd, views["read_uncommitted"])
        seek_answers = P.seek_read(broker.bootstrap, seeks)
        log_end = _log_end(broker.bootstrap, partitions)
        note(f"{len(partitions)} partitions; {len(time_queries)} offsetsForTimes queries, {len(seeks)} seeks recorded")
    finally:
        broker.stop()
    return Source(broker, specs, produced, partitions, views, time_queries, time_answers, seeks, seek_answers,
                 log_end)


def _log_end(bootstrap: str, partitions: list[TP]) -> dict[TP, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tiering-ends"})
    try:
        return {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[1] for tp in partitions}
    finally:
        c.close()
