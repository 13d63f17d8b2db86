"""Regenerate tests/data/broker: segments a real Kafka 4.3 broker wrote, with a manifest of what was produced.

    .venv/bin/python -m tests.kafka_broker.make_fixtures      # needs java and scripts/fetch-kafka.sh

One topic per (producer, codec): Kafka's Java client and librdkafka (confluent-kafka), each of gzip,
snappy, lz4, zstd and none, plus a Java transactional topic (commit and abort markers). Small segments
(16 KiB): the first sealed segment of each partition is kept with its .index and .timeindex, exactly as
the broker left them after a clean shutdown. MANIFEST.json lists, for each, the records the producer was
acknowledged for inside the segment's offset range and what Kafka's DumpLogSegments counted in it;
tests/kafka_broker/test_fixtures.py (no JVM) holds our reader and rewriter to them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.kafka_broker import producers as P
from tests.kafka_broker.broker import ROOT, Broker
from tests.kafka_broker.dumplog import dump, seg_name

OUT = ROOT / "tests" / "data" / "broker"
SEGMENT_BYTES = 16 * 1024


def specs() -> list[P.TopicSpec]:
    out = [P.TopicSpec(f"fx.java.{c}", "java", c, 400, partitions=1, batch_bytes=4096) for c in P.CODECS]
    out += [P.TopicSpec(f"fx.ck.{c}", "confluent", c, 400, partitions=1, batch_bytes=4096) for c in P.CODECS]
    out.append(P.TopicSpec("fx.java.txn", "java", "gzip", 300, partitions=1, mode="txn", batch_bytes=4096))
    return out


def _text(p: P.Produced) -> list[Any]:
    """One produced record, compactly: the producers write ASCII keys, values and headers."""
    t = lambda h: None if h is None else bytes.fromhex(h).decode()  # noqa: E731
    return [p.offset, p.timestamp, t(p.key), t(p.value), [[k, t(v)] for k, v in p.headers], p.aborted]


def _dumps(manifest: dict[str, Any]) -> str:
    """JSON with one line per record (small, and diffs stay readable)."""
    segs = []
    for d in manifest["segments"]:
        head = json.dumps({k: v for k, v in d.items() if k != "records"})[:-1]
        recs = ",\n".join("    " + json.dumps(r) for r in d["records"])
        segs.append(f'  {head}, "records": [\n{recs}\n  ]}}')
    top = json.dumps({k: v for k, v in manifest.items() if k != "segments"}, indent=1)[:-2]
    return top + ',\n "segments": [\n' + ",\n".join(segs) + "\n ]\n}\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="kafka-fixtures-"))
    broker = Broker(work / "data", work / "logs")
    topics = specs()
    broker.start()
    try:
        produced = P.produce_all(broker, topics, seed=2026, segment_bytes=SEGMENT_BYTES)
    finally:
        broker.stop()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    segments: list[dict[str, Any]] = []
    for s in topics:
        part = broker.data_dir / f"{s.name}-0"
        logs = sorted(part.glob("*.log"))
        assert len(logs) >= 2, f"{s.name}: no sealed segment (produce more)"
        log, nxt = logs[0], int(logs[1].stem)
        base = int(log.stem)
        dest = args.out / part.name
        dest.mkdir()
        files = {}
        for ext in (".log", ".index", ".timeindex"):
            shutil.copy(log.with_suffix(ext), dest / (log.stem + ext))
            data = (dest / (log.stem + ext)).read_bytes()
            files[ext[1:]] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        records = [_text(p) for p in produced if p.topic == s.name and base <= p.offset < nxt]
        segments.append({"topic": s.name, "partition": 0, "directory": part.name, "base_offset": base,
                         "next_segment_base": nxt, "producer": s.client, "codec": s.codec, "mode": s.mode,
                         "files": files, "records": records})
    kafka = dump([args.out / d["directory"] / f"{d['base_offset']:020d}{ext}" for d in segments
                  for ext in (".log", ".index", ".timeindex")])
    for d in segments:
        name = seg_name(args.out / d["directory"] / f"{d['base_offset']:020d}.log")
        d["kafka_dump"] = {"batches": kafka.batches[name], "records": kafka.records[name]}
    manifest = {"kind": "tiering.broker-fixtures", "kafka": "4.3.1", "segment_bytes": SEGMENT_BYTES,
                "regenerate": "python -m tests.kafka_broker.make_fixtures",
                "records": "[offset, timestamp, key, value, headers [[key, value], ...], aborted]; keys and values as "
                           "UTF-8 text (null: absent)", "segments": segments}
    (args.out / "MANIFEST.json").write_text(_dumps(manifest))
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{len(segments)} segments, {sum(len(d['records']) for d in segments)} records, {total:,} bytes "
          f"in {args.out}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
