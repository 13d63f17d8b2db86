"""``make demo-kafka``: the restore story of test_restore.py on a real Kafka 4.3 broker, for a person to watch.

A broker is filled by Kafka's Java producer (uncompressed; lz4 transactions, every third aborted) and by
librdkafka (lz4), consumed under both isolation levels and stopped; its partition folders go to a moto S3
server, ``python -m tiering s3 compact --codec zstd`` rewrites them there, the result is downloaded into a
fresh copy of the data directory, a broker restarts on it and is consumed again. Prints a table per
partition (or ``--json``); exit 0 only if every partition serves exactly what it served before.

    .venv/bin/python -m tests.kafka_broker.demo [--json] [--keep DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3

from tests.kafka_broker import producers as P
from tests.kafka_broker import test_restore as R
from tests.kafka_broker.broker import Broker, jars_present
from tests.kafka_broker.conftest import Source, note
from tiering.demo.s3 import moto_server

TP = tuple[str, int]
ISOLATIONS = ("read_uncommitted", "read_committed")
TOPICS = ("java.none", "ck.lz4", "java.txn")  # from the restore test's dataset(): ~6,000 records, 5 partitions


def _log_bytes(data_dir: Path, tp: TP) -> int:
    return sum(f.stat().st_size for f in (data_dir / f"{tp[0]}-{tp[1]}").glob("*.log"))


def _matches_producers(src: Source, views: dict[str, dict[TP, list[P.Consumed]]]) -> dict[TP, bool]:
    """Per partition: both views hold exactly what the producers wrote (test_restore's own check)."""
    out = {}
    for tp in src.partitions:
        one = Source(src.broker, src.specs, src.produced, [tp], src.views, [], [], [], [])
        try:
            for iso in ISOLATIONS:
                R._check_against_produced(one, views[iso], committed=iso == "read_committed")
            out[tp] = True
        except (AssertionError, KeyError):
            out[tp] = False
    return out


def run(root: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    specs = [s for s in P.dataset() if s.name in TOPICS]
    partitions = sorted({(s.name, p) for s in specs for p in range(s.partitions)})
    source = Broker(root / "source" / "data", root / "source" / "logs")
    source.start()
    note(f"source broker up on {source.bootstrap} (data in {source.data_dir})")
    try:
        produced = P.produce_all(source, specs)
        note(f"{len(produced):,} records produced into {len(partitions)} partitions ({', '.join(TOPICS)})")
        before = {iso: P.consume_all(source.bootstrap, partitions, iso) for iso in ISOLATIONS}
        note("consumed under read_uncommitted and read_committed; stopping the broker")
    finally:
        source.stop()
    src = Source(source, specs, produced, partitions, before, [], [], [], [])

    with moto_server() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket=R.BUCKET)
        note(f"{R.upload(client, R.BUCKET, source.data_dir)} objects uploaded to moto S3 at {endpoint}")
        note(f"running: AWS_ENDPOINT_URL={endpoint} python -m tiering s3 compact "
             f"--bucket {R.BUCKET} --prefix {R.PREFIX} --codec zstd --min-age-minutes 0 --json --no-report")
        cli, _ = R._compact_with_the_cli(endpoint, R.BUCKET, root)
        restored = source.copy_to(root / "restored" / "data", root / "restored" / "logs")
        changed = R.download(client, R.BUCKET, restored.data_dir)
        note(f"{len(changed)} rewritten files downloaded into a fresh copy of the data directory")
    restored.start()
    try:
        P.wait_leaders(restored.bootstrap, partitions)
        note(f"restored broker up on {restored.bootstrap}; consuming again")
        after = {iso: P.consume_all(restored.bootstrap, partitions, iso) for iso in ISOLATIONS}
    finally:
        restored.stop()

    ok_before, ok_after = _matches_producers(src, before), _matches_producers(src, after)
    rows = []
    for tp in partitions:
        segs = [s for s in cli["segments"] if s["directory"] == f"{tp[0]}-{tp[1]}"]
        mine = [p for p in produced if (p.topic, p.partition) == tp]
        same = all(after[iso][tp] == before[iso][tp] for iso in ISOLATIONS) and ok_before[tp] and ok_after[tp]
        rows.append({"topic": tp[0], "partition": tp[1], "client": src.spec(tp[0]).client,
                     "codec": src.spec(tp[0]).codec, "segments_sealed": len(segs),
                     "segments_compacted": sum(s["status"] == "compacted" for s in segs),
                     "log_bytes_before": _log_bytes(source.data_dir, tp),
                     "log_bytes_after": _log_bytes(restored.data_dir, tp),
                     "produced": len(mine), "aborted": sum(p.aborted for p in mine),
                     **{iso: {"before": len(before[iso][tp]), "after": len(after[iso][tp])} for iso in ISOLATIONS},
                     "identical": same})
    return {"identical": all(r["identical"] for r in rows), "partitions": rows,
            "seconds": round(time.monotonic() - t0, 1), "work_dir": str(root)}


def verdict(doc: dict[str, Any]) -> str:
    rows = doc["partitions"]
    n, segs = len(rows), sum(r["segments_compacted"] for r in rows)
    b, a = sum(r["log_bytes_before"] for r in rows), sum(r["log_bytes_after"] for r in rows)
    recs = sum(r["read_uncommitted"]["after"] for r in rows)
    if doc["identical"]:
        return (f"PASS: {segs} segments recompressed to zstd ({b:,} -> {a:,} .log bytes, {a / b:.0%}); the restored "
                f"broker served all {recs:,} records of {n} partitions exactly as before, under both isolation levels")
    bad = ", ".join(f"{r['topic']}-{r['partition']}" for r in rows if not r["identical"])
    return f"FAIL: the restored broker did not serve the same records for {bad}"


def show(doc: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    t = Table(title="Kafka 4.3 broker -> S3 -> tiering s3 compact (zstd) -> restored broker", title_justify="left",
              box=box.SIMPLE_HEAD)
    for col in ("partition", "producer", "segments\ncompacted", ".log bytes\nbefore -> after", "records\nproduced",
                "read_uncommitted\nbefore / after", "read_committed\nbefore / after", "identical"):
        t.add_column(col, justify="left" if col in ("partition", "producer") else "right", no_wrap=True)
    for r in doc["partitions"]:
        ru, rc = r["read_uncommitted"], r["read_committed"]
        t.add_row(f"{r['topic']}-{r['partition']}", f"{r['client']} {r['codec']}",
                  f"{r['segments_compacted']} of {r['segments_sealed']}",
                  f"{r['log_bytes_before']:,} -> {r['log_bytes_after']:,}",
                  f"{r['produced']:,}" + (f" ({r['aborted']} aborted)" if r["aborted"] else ""),
                  f"{ru['before']:,} / {ru['after']:,}", f"{rc['before']:,} / {rc['after']:,}",
                  "[green]yes[/]" if r["identical"] else "[bold red]NO[/]")
    console = Console(width=None if sys.stdout.isatty() else 132)  # a pipe or a log file: no wrapping
    console.print(t)
    console.print(("[bold green]" if doc["identical"] else "[bold red]") + verdict(doc) + "[/]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.kafka_broker.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    ap.add_argument("--keep", metavar="DIR", type=Path, help="work in DIR (must not exist) and keep it: data, logs")
    args = ap.parse_args(argv)
    if shutil.which("java") is None or not jars_present() or importlib.util.find_spec("confluent_kafka") is None:
        print("demo-kafka: needs Java 17+ and Kafka's jars in tools/kafka/lib: run make kafka-jars", file=sys.stderr)
        return 2
    if args.keep is not None and args.keep.exists():
        print(f"demo-kafka: --keep {args.keep} already exists", file=sys.stderr)
        return 2
    root = args.keep or Path(tempfile.mkdtemp(prefix="demo-kafka-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        doc = run(root)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        show(doc)
    return 0 if doc["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
