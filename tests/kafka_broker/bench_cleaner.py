"""Key compaction beside Kafka's own log cleaner, on the same partition, in one run.

    make bench-keycompact-kafka
    .venv/bin/python -m tests.kafka_broker.bench_cleaner --records 1200000 --keys 100000 --codecs none zstd

For each codec: the pinned broker (KRaft, the JVM options of bin/kafka-server-start.sh, one cleaner thread
with the default 128 MiB dedupe buffer) takes a changelog from Kafka's Java producer
(``tools/kafka/java/ChangelogProduce.java``: updates of skewed keys, ~180-byte JSON values, 3% tombstones)
while the topic's ``cleanup.policy`` is ``delete``; the partition is copied aside; the topic is turned
``compact`` and the cleaner makes one pass. Its time is the broker's own: the statistics it logs (MB of
log processed, seconds) and, to the millisecond, its log from "Beginning cleaning" to the statistics; its
CPU is the cleaner thread's (``/proc``). Then ``tiering partition compact-keys`` cleans the copy as a
whole process (start-up included), with the cleaner's clock (read back from the delete horizons it
stamped) and the topic's ``segment.bytes``; its files are compared with the cleaner's, segment by segment.

Prints a table and writes ``bench/out/bench_keycompact_kafka.json``. Needs Java 17 and the jars of
``scripts/fetch-kafka.sh``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.kafka_broker.broker import CLASSPATH, PRODUCTION_JVM_OPTS, Broker, jars_present, log4j_opts
from tests.kafka_broker.producers import compile_java
from tiering.kafka.reader import iter_batches

TOPIC = "bench.changelog"
RETENTION_MS = 86_400_000  # delete.retention.ms, Kafka's default
OUT = Path(__file__).resolve().parents[2] / "bench" / "out" / "bench_keycompact_kafka.json"
STATS = re.compile(r"cleaned log (\S+) \(dirty section = \[(\d+), (\d+)\]\)\s+([\d,.]+) MB of log processed in "
                   r"([\d,.]+) seconds")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", re.M)
OURS = """
import json, resource, sys, time
from tiering.cli import main
code = main(sys.argv[1:])
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"exit": code, "vmhwm_kib": hwm, "cpu": time.process_time()}), file=sys.stderr)
"""


def _when(line_start: str) -> float:
    return datetime.strptime(line_start, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _create_topic(broker: Broker, segment_bytes: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=30000)
    admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={"cleanup.policy": "delete",
                                                               "segment.bytes": str(segment_bytes)})])
    admin.close()


def _compact(broker: Broker) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in
               {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0",
                "delete.retention.ms": str(RETENTION_MS)}.items()]
    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})  # errors only on stderr
    for future in admin.incremental_alter_configs([ConfigResource("topic", TOPIC, incremental_configs=entries)]
                                                  ).values():
        future.result(30)


def _cleaner_cpu(pid: int) -> float:
    """CPU seconds of the broker's cleaner thread (its name is cut to 15 characters in /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").iterdir():
        if (task / "comm").read_text().strip().startswith("kafka-log-clean"):
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / tick
    raise RuntimeError("no log cleaner thread in the broker")


def _wait_pass(broker: Broker, timeout: float = 600) -> dict[str, Any]:
    """The cleaner's first pass over the topic, from the broker's log: its own figures and its log times."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = broker.log_since_start()
        found = STATS.search(log)
        if found and found.group(1) == f"{TOPIC}-0":
            begun = re.search(rf"^\[([^\]]+)\] INFO .*Beginning cleaning of log {re.escape(TOPIC)}-0", log, re.M)
            ended = [m for m in STAMP.finditer(log) if m.start() < found.start()][-1]
            assert broker.proc is not None
            return {"dirty_section": [int(found.group(2)), int(found.group(3))],
                    "mb_processed": float(found.group(4).replace(",", "")),
                    "stats_seconds": float(found.group(5).replace(",", "")),
                    "log_seconds": round(_when(ended.group(1)) - _when(begun.group(1)), 3) if begun else None,
                    "cleaner_cpu_seconds": _cleaner_cpu(broker.proc.pid)}
        time.sleep(0.2)
    raise RuntimeError(f"the cleaner made no pass in {timeout:.0f} s:\n{broker.tail()}")


def _clock(cleaned: Path, below: int) -> int | None:
    """The cleaner's clock: the delete horizon it stamped, less delete.retention.ms (None: it stamped none)."""
    for log in sorted(cleaned.glob("*.log")):
        if int(log.stem) >= below:
            break
        for raw in iter_batches(io.BytesIO(log.read_bytes())):
            if raw.header.delete_horizon_ms is not None:
                return raw.header.delete_horizon_ms - RETENTION_MS
    return None


def run_codec(codec: str, records: int, keys: int, segment_bytes: int, work: Path) -> dict[str, Any]:
    broker = Broker(work / "data", work / "logs", jvm_opts=list(PRODUCTION_JVM_OPTS),
                    extra={"log.cleaner.backoff.ms": "200", "log.cleaner.threads": "1"})
    broker.start()
    try:
        _create_topic(broker, segment_bytes)
        started = time.monotonic()
        done = subprocess.run(["java", "-Xmx512m", *log4j_opts(None), "-cp", f"{compile_java()}:{CLASSPATH}",
                               "ChangelogProduce", broker.bootstrap, TOPIC, codec, str(records), str(keys), "5"],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"the Java producer failed: {done.stderr[-2000:]}")
        produced = time.monotonic() - started
    finally:
        broker.stop()
    before = work / "before"
    shutil.copytree(broker.data_dir / f"{TOPIC}-0", before)
    logs = sorted(before.glob("*.log"))
    active = int(logs[-1].stem)
    source_bytes = sum(p.stat().st_size for p in logs[:-1])
    broker.start()
    try:
        _compact(broker)
        theirs = _wait_pass(broker)
    finally:
        broker.stop()
    cleaned = broker.data_dir / f"{TOPIC}-0"
    now = _clock(cleaned, active) or int(time.time() * 1000)
    ours_dir = work / "ours"
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", OURS, "partition", "compact-keys", str(before), "--out",
                          str(ours_dir), "--now-ms", str(now), "--delete-retention-ms", str(RETENTION_MS),
                          "--segment-bytes", str(segment_bytes), "--json"],
                         capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    tail = json.loads(run.stderr.strip().splitlines()[-1])
    if tail["exit"] != 0:
        raise RuntimeError(f"compact-keys exited {tail['exit']}: {run.stderr[-2000:]}")
    pairs = [(p, ours_dir / p.name) for p in sorted(cleaned.glob("*.log")) if int(p.stem) < active]
    identical = sum(o.exists() and o.read_bytes() == p.read_bytes() for p, o in pairs)
    mib = source_bytes / (1 << 20)
    return {"codec": codec, "records": records, "keys": keys, "produce_seconds": round(produced, 1),
            "source_bytes": source_bytes, "segments": len(logs) - 1, "kafka": theirs,
            "kafka_mib_per_s": round(theirs["mb_processed"] / (theirs["log_seconds"] or theirs["stats_seconds"]), 1),
            "ours": {"seconds": round(wall, 3), "cpu_seconds": round(tail["cpu"], 3),
                     "peak_rss_mib": round(tail["vmhwm_kib"] / 1024, 1), "mib_per_s": round(mib / wall, 1)},
            "cleaned_segments": len(pairs), "identical_segments": identical, "clock_ms": now}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_200_000)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--codecs", nargs="+", default=["none", "zstd"], choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--segment-mib", type=int, default=64, help="the topic's segment.bytes (default 64 MiB)")
    ap.add_argument("--json", type=Path, default=OUT)
    args = ap.parse_args(argv)
    if shutil.which("java") is None or not jars_present():
        print("bench_cleaner: needs Java 17+ and Kafka's jars in tools/kafka/lib: run scripts/fetch-kafka.sh",
              file=sys.stderr)
        return 2
    rows = []
    for codec in args.codecs:
        with tempfile.TemporaryDirectory(prefix=f"bench-cleaner-{codec}-") as tmp:
            print(f"{codec}: producing {args.records:,} records over {args.keys:,} keys, then one cleaner pass "
                  "and one of ours ...", file=sys.stderr, flush=True)
            rows.append(run_codec(codec, args.records, args.keys, args.segment_mib << 20, Path(tmp)))
    print(f"\n{'codec':>6} {'source MiB':>10} {'Kafka s':>8} {'Kafka CPU s':>11} {'Kafka MiB/s':>11} {'ours s':>7} "
          f"{'ours CPU s':>10} {'ours MiB/s':>10} {'ours/Kafka':>10} {'identical':>9} {'peak RSS MiB':>12}")
    for r in rows:
        k, o = r["kafka"], r["ours"]
        r["ratio"] = round(o["mib_per_s"] / r["kafka_mib_per_s"], 2)
        print(f"{r['codec']:>6} {r['source_bytes'] / (1 << 20):>10.1f} {k['log_seconds'] or k['stats_seconds']:>8} "
              f"{k['cleaner_cpu_seconds']:>11.2f} {r['kafka_mib_per_s']:>11} {o['seconds']:>7} {o['cpu_seconds']:>10} "
              f"{o['mib_per_s']:>10} {r['ratio']:>10} {r['identical_segments']:>4}/{r['cleaned_segments']:<4} "
              f"{o['peak_rss_mib']:>12}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"runs": rows, "machine": {"python": platform.python_version(),
                                                               "cpus": os.cpu_count()}}, indent=2))
    print(f"\nKafka: the broker's own figures (MB of log processed over its log's time, from 'Beginning cleaning' to"
          f" its statistics); ours: the whole command's wall time.\nJSON: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
