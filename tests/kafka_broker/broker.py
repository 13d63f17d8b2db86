"""A real Apache Kafka broker (KRaft, one node that is both broker and controller) in its own JVM.

The jars come from ``scripts/fetch-kafka.sh`` (tools/kafka/lib, pinned by tools/kafka/pom.xml). The broker
listens on free loopback ports, keeps its data in ``data_dir`` and its log in ``logs_dir/server.log``. It
can be stopped (SIGTERM, then SIGKILL) and started again on the same data directory or on a copy of it:
the cluster id and node id live in ``meta.properties`` and the controller quorum is static
(``controller.quorum.voters``), so a new pair of ports on every start is fine.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KAFKA_DIR = ROOT / "tools" / "kafka"
LIB = KAFKA_DIR / "lib"
CLASSPATH = str(LIB / "*")
LOG4J = KAFKA_DIR / "log4j2.yaml"
NODE_ID = 1

JVM_OPTS = ["-Xmx512m", "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto",
            "-Djava.awt.headless=true"]
# What bin/kafka-server-start.sh and kafka-run-class.sh give a broker (Kafka 4.3): for timing the broker's own
# work (bench_cleaner.py), where the tests' options above (a quick start, no C2 compiler) would slow it.
PRODUCTION_JVM_OPTS = ["-Xmx1G", "-Xms1G", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                       "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                       "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true"]

# What Kafka 4.3 logs when it does not trust a segment or its indexes at load time (LogLoader, LogSegment
# and the index classes of kafka-storage), plus the generic signs of a damaged log. None of these may
# appear when the broker opens segments we rewrote.
RECOVERY_MARKERS = (
    "Found a corrupted index file",             # LogLoader: CorruptIndexException from the sanity check
    "Could not find offset index file",         # LogLoader: missing .index
    "recovering segment and rebuilding index",  # LogLoader: both of the above
    "Recovering unflushed segment",             # LogLoader: recovery of segments past the recovery point
    "Found invalid messages in log segment",    # LogSegment.recover
    "Truncated",                                # LogSegment: "Truncated {} invalid bytes at the end ..."
    "Corruption found in segment",              # LogLoader
    "Found invalid offset during recovery",     # LogLoader
    "CorruptRecordException",
    "InvalidRecordException",
    "CorruptIndexException",
    "Deleting segments as part of log recovery",
    "Deleting all segments because logEndOffset",
)


def jars_present() -> bool:
    return any(LIB.glob("kafka_2.13-*.jar")) and any(LIB.glob("kafka-tools-*.jar"))


def missing() -> str | None:
    """What a test marked ``kafka`` needs and this machine lacks (None: nothing)."""
    if shutil.which("java") is None or not jars_present():
        return "needs java and Kafka's jars: run scripts/fetch-kafka.sh"
    if importlib.util.find_spec("confluent_kafka") is None:
        return "needs confluent-kafka (librdkafka) in the venv"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def java(main: str, args: Sequence[str], *, logs_dir: Path | None = None, timeout: float = 300,
         heap: str = "-Xmx512m") -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's main classes to completion (its output captured)."""
    cmd = ["java", *[o if not o.startswith("-Xmx") else heap for o in JVM_OPTS], *log4j_opts(logs_dir),
           "-cp", CLASSPATH, main, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def log4j_opts(logs_dir: Path | None) -> list[str]:
    if logs_dir is None:  # a tool's or a client's log: git-ignored, overwritten by the next
        logs_dir = KAFKA_DIR / "build" / "tool-logs"
    return ["-Dlog4j2.configurationFile=" + str(LOG4J), "-Dkafka.logs.dir=" + str(logs_dir)]


def _cluster_id() -> str:
    """A random cluster id as Kafka's ``Uuid.randomUuid()`` makes one: base64url, never starting with "-" (a
    command line would read it as an option)."""
    import base64

    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class Broker:
    """One KRaft node. ``start()`` formats ``data_dir`` first when it holds no ``meta.properties``."""

    data_dir: Path
    logs_dir: Path
    cluster_id: str = field(default_factory=_cluster_id)
    node_id: int = NODE_ID
    extra: dict[str, str] = field(default_factory=dict)
    jvm_opts: list[str] = field(default_factory=lambda: list(JVM_OPTS))
    port: int = 0
    controller_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    def properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": f"{self.node_id}@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "2",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "log.cleaner.threads": "1",
            "log.cleaner.backoff.ms": "500",
            "log.cleaner.dedupe.buffer.size": str(8 * 1024 * 1024),
            "log.retention.ms": "-1",  # fixtures may carry old timestamps: never delete by age
            "log.retention.check.interval.ms": "3600000",
        }
        props.update(self.extra)
        return props

    def _write_config(self) -> Path:
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path = self.logs_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        return path

    def format(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self._write_config()
        done = java("kafka.tools.StorageTool", ["format", "--config", str(config), f"--cluster-id={self.cluster_id}",
                                                "--ignore-formatted"], logs_dir=self.logs_dir, heap="-Xmx256m")
        if done.returncode != 0:
            raise RuntimeError(f"kafka-storage format failed ({done.returncode}): {done.stdout}{done.stderr}")

    def start(self, timeout: float = 120) -> Broker:
        self.port, self.controller_port = free_port(), free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        if not (self.data_dir / "meta.properties").exists():
            self.format()
        config = self._write_config()
        self._mark = self.server_log.stat().st_size if self.server_log.exists() else 0
        stdout = (self.logs_dir / "stdout.log").open("ab")
        self.proc = subprocess.Popen(["java", *self.jvm_opts, *log4j_opts(self.logs_dir), "-cp", CLASSPATH,
                                      "kafka.Kafka", str(config)], stdout=stdout, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        stdout.close()
        self._wait_ready(timeout)
        return self

    def log_since_start(self) -> str:
        """The server log written since the last start()."""
        with self.server_log.open("rb") as f:
            f.seek(self._mark)
            return f.read().decode("utf-8", "replace")

    def _wait_ready(self, timeout: float) -> None:
        from kafka import KafkaAdminClient  # kafka-python: the metadata request must be answered

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}: {self.tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=5000,
                                         client_id="readiness")
                try:
                    brokers = admin.describe_cluster()["brokers"]
                    if brokers:
                        return
                finally:
                    admin.close()
            except Exception as e:
                last = e
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"broker not ready after {timeout}s ({last}): {self.tail()}")

    def tail(self, n: int = 40) -> str:
        text = ""
        for name in ("server.log", "stdout.log"):
            p = self.logs_dir / name
            if p.exists():
                text += f"\n--- {name}\n" + "\n".join(p.read_text(errors="replace").splitlines()[-n:])
        return text

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (a controlled shutdown: segments flushed, clean-shutdown marker written), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def copy_to(self, data_dir: Path, logs_dir: Path) -> Broker:
        """A stopped broker's data directory copied, for a broker with the same cluster id and node id."""
        assert self.proc is None or self.proc.poll() is not None, "stop the broker first"
        shutil.copytree(self.data_dir, data_dir)
        return Broker(data_dir, logs_dir, cluster_id=self.cluster_id, node_id=self.node_id,
                      extra=dict(self.extra))


def error_lines(log: str) -> list[str]:
    """The ``ERROR`` lines of a server log, but for one start-up race the broker recovers from by itself: in
    combined mode the controller sends its own registration before its quorum controller has taken the
    leadership it was just elected to, gets ``NotControllerException`` ("The active controller appears to be
    node 1") and sends it again; that line is left out only when the log then says the registration was
    persisted."""
    lines = log.splitlines()
    registered = any("Our registration has been persisted to the metadata log" in line for line in lines)
    out = []
    for i, line in enumerate(lines):
        if " ERROR " not in line:
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        if (registered and "[ControllerApis " in line and "apiKey=CONTROLLER_REGISTRATION" in line
                and "NotControllerException" in following):
            continue
        out.append(line)
    return out


def recovery_lines(log: str, names: Sequence[str] = ()) -> list[str]:
    """Lines of a server log that show Kafka recovering, rebuilding or distrusting a segment or an index
    (restricted to lines naming one of ``names`` when given)."""
    out = []
    for line in log.splitlines():
        if any(m in line for m in RECOVERY_MARKERS) and (not names or any(n in line for n in names)):
            out.append(line)
    return out
