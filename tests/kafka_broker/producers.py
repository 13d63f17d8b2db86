"""Real producers fill a test broker: Kafka's Java client, librdkafka (confluent-kafka) and kafka-python.

Each records what the broker acknowledged (topic, partition, offset, timestamp, key, value, headers, and
whether its transaction was aborted): that is the expected result the restore tests compare against.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.kafka_broker.broker import CLASSPATH, KAFKA_DIR, Broker, log4j_opts

CODECS = ("gzip", "snappy", "lz4", "zstd", "none")
JAVA_SRC = KAFKA_DIR / "java"
JAVA_BUILD = KAFKA_DIR / "build" / "classes"
# log.segment.bytes may not go below 1 MiB in Kafka 4; the topic-level internal.segment.bytes may
SEGMENT_BYTES = 64 * 1024
WORDS = ("click", "view", "cart", "order", "user", "session", "page", "home", "search", "kafka", "segment",
         "broker", "tiering", "zstd", "latency", "region", "eu-west-1", "us-east-1")


@dataclass(frozen=True)
class Produced:
    topic: str
    partition: int
    offset: int
    timestamp: int
    key: str | None  # hex
    value: str | None  # hex
    headers: tuple[tuple[str, str | None], ...]
    aborted: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["headers"] = [list(h) for h in self.headers]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Produced:
        return cls(**{**d, "headers": tuple((k, v) for k, v in d["headers"])})


@dataclass(frozen=True)
class TopicSpec:
    name: str
    client: str  # java | confluent | kafka-python
    codec: str
    count: int
    partitions: int = 2
    mode: str = "plain"  # plain | idempotent | txn | tiny | compact | log-append-time
    batch_bytes: int = 65536  # the producers' batch size
    configs: tuple[tuple[str, str], ...] = ()

    @property
    def compacted(self) -> bool:
        return self.mode == "compact"


def dataset(scale: float = 1.0) -> list[TopicSpec]:
    """The topics of the restore test (~40k records, ~6 MiB on disk, 64 KiB segments)."""
    n = lambda c: max(50, int(c * scale))  # noqa: E731
    specs = [TopicSpec(f"java.{c}", "java", c, n(2500)) for c in CODECS]
    specs += [TopicSpec(f"ck.{c}", "confluent", c, n(2000), partitions=1) for c in CODECS]
    specs += [TopicSpec(f"kp.{c}", "kafka-python", c, n(1500), partitions=1) for c in CODECS]
    specs += [
        TopicSpec("java.txn", "java", "lz4", n(1500), mode="txn"),
        TopicSpec("ck.idempotent", "confluent", "zstd", n(2000), partitions=1, mode="idempotent"),
        TopicSpec("ck.tiny", "confluent", "snappy", n(800), partitions=1, mode="tiny"),
        TopicSpec("kp.logappendtime", "kafka-python", "lz4", n(2500), partitions=1, mode="log-append-time",
                  configs=(("message.timestamp.type", "LogAppendTime"),)),
        TopicSpec("kp.compacted", "kafka-python", "snappy", n(4000), partitions=1, mode="compact",
                  configs=(("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.01"),
                           ("min.compaction.lag.ms", "0"))),
    ]
    return specs


def create_topics(broker: Broker, specs: Iterable[TopicSpec], segment_bytes: int = SEGMENT_BYTES) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
    try:
        size = {"internal.segment.bytes": str(segment_bytes)}
        admin.create_topics([NewTopic(s.name, s.partitions, 1, topic_configs={**size, **dict(s.configs)})
                             for s in specs])
    finally:
        admin.close()


def produce_all(broker: Broker, specs: list[TopicSpec], seed: int = 7,
                segment_bytes: int = SEGMENT_BYTES) -> list[Produced]:
    create_topics(broker, specs, segment_bytes)
    out: list[Produced] = []
    java_specs = [s for s in specs if s.client == "java"]
    procs = [(s, _java_start(broker, s, seed + i)) for i, s in enumerate(java_specs)] if java_specs else []
    try:
        for i, s in enumerate(specs):
            if s.client == "confluent":
                out += produce_confluent(broker.bootstrap, s, seed + 100 + i)
            elif s.client == "kafka-python":
                out += produce_kafka_python(broker.bootstrap, s, seed + 200 + i)
    except BaseException:
        for _, proc in procs:
            proc.kill()
            proc.wait()
        raise
    for s, proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"java producer for {s.name} failed ({proc.returncode}): {stderr[-3000:]}")
        out += parse_java(stdout)
    return out


# ---------------------------------------------------------------------------------------------- values


def _value(src: str, codec: str, i: int, rnd: random.Random) -> bytes:
    msg = " ".join(rnd.choice(WORDS) for _ in range(8 + rnd.randrange(40)))
    token = f"{rnd.getrandbits(64):016x}"  # some entropy: codecs do not squeeze a topic into one segment
    return (f'{{"src":"{src}","i":{i},"codec":"{codec}","n":{rnd.randrange(10**6)},"id":"{token}",'
            f'"msg":"{msg}"}}').encode()


def _record(src: str, s: TopicSpec, i: int, rnd: random.Random) -> tuple[bytes | None, bytes | None,
                                                                         list[tuple[str, bytes | None]]]:
    if s.compacted:  # 60 keys overwritten again and again, every tenth write a tombstone
        key = f"k{rnd.randrange(60):03d}".encode()
        return key, None if i % 10 == 9 else _value(src, s.codec, i, rnd), [("seq", str(i).encode())]
    key = None if i % 7 == 3 else f"user-{rnd.randrange(500)}".encode()
    value = None if i % 11 == 5 else _value(src, s.codec, i, rnd)
    if key is None and value is None and src == "kafka-python":  # it refuses a record with neither
        key = b"nokey"
    headers: list[tuple[str, bytes | None]] = []
    if i % 3 == 0:
        headers.append(("trace", f"t-{i}".encode()))
        if i % 9 == 0:
            headers.append(("empty", b""))
        if i % 27 == 0 and src != "kafka-python":  # kafka-python 3 refuses a None header value
            headers.append(("nullh", None))
    return key, value, headers


def _hex(b: bytes | None) -> str | None:
    return None if b is None else b.hex()


def _produced(topic: str, partition: int, offset: int, ts: int, key: bytes | None, value: bytes | None,
              headers: list[tuple[str, bytes | None]], aborted: bool = False) -> Produced:
    return Produced(topic, partition, offset, ts, _hex(key), _hex(value),
                    tuple((k, _hex(v)) for k, v in headers), aborted)


# ---------------------------------------------------------------------------------------------- clients


def compile_java() -> Path:
    """javac the Java producer into tools/kafka/build/classes (once per source change)."""
    src = sorted(JAVA_SRC.glob("*.java"))
    stamp = JAVA_BUILD / ".built"
    newest = max(p.stat().st_mtime for p in src)
    if not stamp.exists() or stamp.stat().st_mtime < newest:
        JAVA_BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["javac", "-nowarn", "-cp", CLASSPATH, "-d", str(JAVA_BUILD), *map(str, src)], check=True,
                       capture_output=True, text=True)
        stamp.touch()
    return JAVA_BUILD


def _java_start(broker: Broker, s: TopicSpec, seed: int) -> subprocess.Popen[str]:
    classes = compile_java()
    mode = "txn" if s.mode == "txn" else "plain"
    return subprocess.Popen(["java", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", *log4j_opts(None),
                             "-cp", f"{classes}:{CLASSPATH}", "TieringProduce", broker.bootstrap, s.name, s.codec,
                             str(s.count), str(seed), mode, str(s.batch_bytes), "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def parse_java(stdout: str) -> list[Produced]:
    out = []
    for line in stdout.splitlines():
        topic, part, off, ts, aborted, key, value, headers = line.split("\t")
        hs: tuple[tuple[str, str | None], ...] = ()
        if headers != "-":
            hs = tuple((k, None if v == "-" else v) for k, v in (h.split("=", 1) for h in headers.split(",")))
        out.append(Produced(topic, int(part), int(off), int(ts), None if key == "-" else key,
                            None if value == "-" else value, hs, aborted == "1"))
    return out


def produce_confluent(bootstrap: str, s: TopicSpec, seed: int) -> list[Produced]:
    from confluent_kafka import Producer

    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "compression.type": s.codec, "acks": "all",
                            "linger.ms": 20, "batch.size": s.batch_bytes, "enable.idempotence": s.mode == "idempotent"}
    if s.mode == "tiny":  # one record per batch
        conf.update({"linger.ms": 0, "batch.num.messages": 1})
    producer = Producer(conf)
    rnd = random.Random(seed)
    out: list[Produced] = []

    def ack(err: Any, msg: Any, key: bytes | None, value: bytes | None,
            headers: list[tuple[str, bytes | None]]) -> None:
        if err is not None:
            raise RuntimeError(str(err))
        out.append(_produced(msg.topic(), msg.partition(), msg.offset(), msg.timestamp()[1], key, value, headers))

    for i in range(s.count):
        key, value, headers = _record("confluent", s, i, rnd)
        producer.produce(s.name, value=value, key=key, headers=headers or None,
                         on_delivery=lambda e, m, k=key, v=value, h=headers: ack(e, m, k, v, h))
        producer.poll(0)
        if s.mode == "tiny":
            producer.flush()
    assert producer.flush(60) == 0
    return sorted(out, key=lambda p: (p.partition, p.offset))


def produce_kafka_python(bootstrap: str, s: TopicSpec, seed: int) -> list[Produced]:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, compression_type=None if s.codec == "none" else s.codec,
                             acks="all", linger_ms=20, batch_size=s.batch_bytes)
    rnd = random.Random(seed)
    now = int(time.time() * 1000)
    pending = []
    for i in range(s.count):
        key, value, headers = _record("kafka-python", s, i, rnd)
        # CreateTime topics get explicit timestamps a day old, not in order (jitter of +-5 s), to exercise the
        # time index; the LogAppendTime topic lets the broker decide.
        ts = None if s.mode == "log-append-time" else now - 86_400_000 + i * 37 + rnd.randrange(-5000, 5000)
        fut = producer.send(s.name, value=value, key=key, headers=headers, timestamp_ms=ts,
                            partition=None if s.partitions > 1 else 0)
        pending.append((fut, key, value, headers))
    producer.flush(60)
    out = []
    for fut, key, value, headers in pending:
        md = fut.get(30)
        out.append(_produced(md.topic, md.partition, md.offset, md.timestamp, key, value, headers))
    producer.close()
    return sorted(out, key=lambda p: (p.partition, p.offset))


# ---------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Consumed:
    offset: int
    timestamp_type: int  # 1 CreateTime, 2 LogAppendTime
    timestamp: int
    key: str | None
    value: str | None
    headers: tuple[tuple[str, str | None], ...]


def _consumed(msg: Any) -> Consumed:
    ttype, ts = msg.timestamp()
    return Consumed(msg.offset(), ttype, ts, _hex(msg.key()), _hex(msg.value()),
                    tuple((k, _hex(v)) for k, v in (msg.headers() or ())))


def _consumer(bootstrap: str, isolation: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"tiering-check-{isolation}",
                     "enable.auto.commit": False, "isolation.level": isolation, "auto.offset.reset": "earliest",
                     "fetch.max.bytes": 4 * 1024 * 1024, "check.crcs": True})


def consume_all(bootstrap: str, partitions: list[tuple[str, int]], isolation: str,
                timeout: float = 120) -> dict[tuple[str, int], list[Consumed]]:
    """Every record of every partition, from the beginning up to the end offset, with librdkafka."""
    from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

    c = _consumer(bootstrap, isolation)
    try:
        ends = {}
        for t, p in partitions:
            ends[(t, p)] = c.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
        out: dict[tuple[str, int], list[Consumed]] = {tp: [] for tp in partitions}
        c.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in partitions])
        deadline = time.monotonic() + timeout
        done: set[tuple[str, int]] = {tp for tp, hi in ends.items() if hi == 0}
        while len(done) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {sum(map(len, out.values()))} records; partitions not finished: "
                                   f"{sorted(set(partitions) - done)}")
            for msg in c.consume(num_messages=5000, timeout=0.5):
                if msg.error():
                    raise KafkaException(msg.error())
                out[(msg.topic(), msg.partition())].append(_consumed(msg))
            for tp in set(partitions) - done:
                pos = c.position([TopicPartition(*tp)])[0].offset
                if pos >= ends[tp]:
                    done.add(tp)
        return out
    finally:
        c.close()


def _rounds(queries: list[tuple[str, int, int]]) -> list[list[int]]:
    """Indexes of ``queries`` in rounds holding each partition at most once (a request names it once)."""
    rounds: list[list[int]] = []
    seen: dict[tuple[str, int], int] = {}
    for i, (t, p, _) in enumerate(queries):
        k = seen.get((t, p), 0)
        seen[(t, p)] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds


def offsets_for_times(bootstrap: str, queries: list[tuple[str, int, int]]) -> list[int]:
    """The broker's ListOffsets answer (the time index at work) for each (topic, partition, timestamp)."""
    from confluent_kafka import TopicPartition

    c = _consumer(bootstrap, "read_uncommitted")
    out = [-2] * len(queries)
    try:
        for rnd in _rounds(queries):
            res = c.offsets_for_times([TopicPartition(*queries[i]) for i in rnd], timeout=60)
            for i, r in zip(rnd, res, strict=True):
                out[i] = r.offset
        return out
    finally:
        c.close()


def seek_read(bootstrap: str, seeks: list[tuple[str, int, int]], isolation: str = "read_uncommitted") -> list[Consumed]:
    """For each (topic, partition, offset): the first record at or after that offset, read after a seek there
    (all partitions at once, one seek per partition a round)."""
    from confluent_kafka import TopicPartition

    c = _consumer(bootstrap, isolation)
    out: list[Consumed | None] = [None] * len(seeks)
    try:
        for rnd in _rounds(seeks):
            want = {(seeks[i][0], seeks[i][1]): i for i in rnd}
            tps = [TopicPartition(*seeks[i]) for i in rnd]
            c.assign(tps)
            deadline = time.monotonic() + 60
            while want:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing read after seeks to {sorted(want)}")
                for msg in c.consume(num_messages=1000, timeout=0.5):
                    if msg.error():
                        continue
                    i = want.pop((msg.topic(), msg.partition()), None)
                    if i is not None:
                        out[i] = _consumed(msg)
                        c.pause([TopicPartition(msg.topic(), msg.partition())])
            c.resume(tps)  # librdkafka keeps a partition paused across assignments
            c.unassign()
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]
    finally:
        c.close()


def wait_leaders(bootstrap: str, partitions: list[tuple[str, int]], timeout: float = 60) -> None:
    """Until every partition has a leader (a restarted broker serves its partitions a moment after it is up)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tiering-leaders"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                for tp in partitions:
                    c.get_watermark_offsets(TopicPartition(*tp), timeout=10)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def wait_compacted(broker: Broker, topics: list[str], timeout: float = 60) -> None:
    """Until the log cleaner has cleaned every partition of each compacted topic up to its active segment
    (cleaner-offset-checkpoint's offset has reached the active segment's base offset): nothing is left for
    it to clean, so the log stays as it is while the source's views are read and until the broker stops.
    A first pass can run while the records are still produced; the next one would remove records a view
    read before it."""
    deadline = time.monotonic() + timeout
    ck = broker.data_dir / "cleaner-offset-checkpoint"
    while time.monotonic() < deadline:
        text = ck.read_text() if ck.exists() else ""
        cleaned = {(t, int(p)): int(o) for t, p, o in (line.split() for line in text.splitlines()[2:] if line.strip())}
        parts = [(t, int(d.name.rsplit("-", 1)[1]), d) for t in topics
                 for d in broker.data_dir.glob(f"{t}-*") if d.name.rsplit("-", 1)[0] == t]
        if parts and all(cleaned.get((t, p), 0) >= max(int(f.stem) for f in d.glob("*.log")) for t, p, d in parts):
            return
        time.sleep(0.5)
    raise TimeoutError(f"the log cleaner did not clean {topics} in {timeout}s")
