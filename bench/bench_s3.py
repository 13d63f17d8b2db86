"""S3 figures in one run: a scan of a large bucket, and rewrite throughput through S3 vs a local file.

    make bench-s3
    .venv/bin/python bench/bench_s3.py --objects 100000 --segment-mib 64 --repeat 3

1. **Scan.** A moto server on loopback (in this process) holds ``--objects`` segment objects: partitions
   of 100 segments, each with ``.log``, ``.index``, ``.timeindex`` and ``.snapshot`` (tiny bodies: a
   scan reads listings only). ``tiering s3 scan --json`` runs as users run it, in its own process; its
   wall time, CPU time (``wait4``) and peak RSS (VmHWM, polled) are reported. moto answers every
   prefixed listing by walking all keys of the bucket, so on a large bucket the server dominates the
   wall time: the CPU seconds of the scanner process are the figure that belongs to this project.
2. **Rewrite through S3.** One generated segment (snappy JSON events) is compacted to zstd level 3 by
   the full commit protocol (GET, rewrite, stage and verify, back up, swap, indexes) against a moto
   server in another process, once in each verification mode (``read-back``: the staged ``.log``
   downloaded and decoded again; ``checksum``: S3's CRC-32C of what it stored compared); the baseline is
   ``rewrite_file`` of the same bytes on the local disk in the same run. Reported as the ratio of
   throughputs (S3 / local), best of ``--repeat``, with the requests one compaction made and the GETs of
   its staged ``.log``.

Prints a table and writes ``bench/out/bench_s3.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_rewrite import _vm_hwm_kib  # same directory: the script's own path is on sys.path
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

from tiering.commit.protocol import Context
from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.journal import Verify
from tiering.local import rewrite_file
from tiering.plan.scan import ScanOptions, scan
from tiering.run.compact import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.store import S3Store, make_client

MIB = 1024 * 1024
OUT_DIR = Path(__file__).parent / "out"
SEGMENTS_PER_PARTITION = 100
FILES_PER_SEGMENT = (".log", ".index", ".timeindex", ".snapshot")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def moto_process(bucket: str) -> Iterator[tuple[S3Store, str, int]]:
    """A moto server in its own process on a free loopback port, with ``bucket`` created: (store, endpoint, pid)."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = make_client(endpoint_url=endpoint)
        for _ in range(100):
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:  # the server is still starting
                time.sleep(0.1)
        yield S3Store(client, bucket), endpoint, server.pid
    finally:
        server.terminate()
        server.wait()


def _child(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd``; wall seconds, CPU seconds and peak RSS of that process alone."""
    started = time.perf_counter()
    peak_kib = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        while True:
            peak_kib = max(peak_kib, _vm_hwm_kib(proc.pid) or 0)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[3:5]} failed ({proc.returncode}): {err.read().decode()[-2000:]}")
        out.seek(0)
        doc = json.loads(out.read())
    return {"seconds": round(seconds, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mib": round(max(peak_kib, usage.ru_maxrss) / 1024, 1), "doc": doc}


def bench_scan(objects: int) -> dict[str, Any]:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        make_client(endpoint_url=endpoint).create_bucket(Bucket="bench")
        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]  # seeding through the backend: not what is measured
        per_partition = SEGMENTS_PER_PARTITION * len(FILES_PER_SEGMENT)
        partitions = max(1, objects // per_partition)
        for p in range(partitions):
            for s in range(SEGMENTS_PER_PARTITION):
                for suffix in FILES_PER_SEGMENT:
                    backend.put_object("bench", f"kafka/topic.{p % 20}-{p}/{s * 1000:020d}{suffix}", b"\0" * 16)
        print(f"  seeded {partitions * per_partition:,} objects in {partitions} partitions", file=sys.stderr)
        run = _child([sys.executable, "-m", "tiering", "s3", "scan", "--bucket", "bench", "--prefix", "kafka",
                      "--min-age-minutes", "0", "--json", "--endpoint-url", endpoint])
    finally:
        server.stop()
    plan = run.pop("doc")
    return {**run, "objects": plan["objects_listed"], "segments": plan["totals"]["segments"],
            "partitions": partitions, "list_requests": partitions + 1,
            "objects_per_second": round(plan["objects_listed"] / run["seconds"])}


def bench_rewrite(segment_mib: int, repeat: int) -> dict[str, Any]:
    """The local rewrite, and the compaction through S3 in each verification mode, best of ``repeat``; the
    requests of one compaction and the GETs of its staged ``.log``."""
    modes = (Verify.READ_BACK, Verify.CHECKSUM)
    with moto_process("bench") as (store, _, _):
        staged_gets: list[str] = []
        store.client.meta.events.register(
            "before-call.s3.GetObject",
            lambda params, **_: staged_gets.append(params["url_path"]) if "/_tiering/staging/" in params[
                "url_path"] and params["url_path"].endswith(".log") else None)
        generated = generate_partition(segments=2, kind="json", codec=Codec.SNAPPY, segment_bytes=segment_mib * MIB)
        segment = generated[0]
        options = RewriteOptions(Codec.ZSTD, 3)
        local_best = float("inf")
        best = dict.fromkeys(modes, float("inf"))
        requests: dict[Verify, dict[str, int]] = {}
        gets: dict[Verify, int] = {}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{segment.base_offset:020d}.log"
            path.write_bytes(segment.log)
            for round_no in range(repeat):
                started = time.perf_counter()
                result, _ = rewrite_file(path, Path(tmp) / f"out{round_no}", options)
                local_best = min(local_best, time.perf_counter() - started)
                for mode in modes:
                    topic = f"round{round_no}-{mode.value}"
                    upload_partition(store, "kafka", topic, 0, generated)
                    plan = scan(store, "kafka", ScanOptions("zstd", 3, topics=topic, min_age_minutes=0))
                    before, staged_gets[:] = Counter(store.requests), []
                    started = time.perf_counter()
                    run = compact(store, plan, Context(store, "kafka", f"bench-{topic}", options, work_dir=tmp,
                                                       verify=mode), CompactOptions())
                    best[mode] = min(best[mode], time.perf_counter() - started)
                    assert [s.status for s in run.segments] == ["compacted"], run.to_json()
                    requests[mode] = dict(sorted((Counter(store.requests) - before).items()))
                    gets[mode] = len(staged_gets)
                print(f"  round {round_no + 1}/{repeat}: local {local_best:.2f} s, S3 "
                      + ", ".join(f"{m.value} {best[m]:.2f} s" for m in modes), file=sys.stderr)
    size = len(segment.log)
    return {"segment_bytes": size, "bytes_out": result.stats.bytes_out,
            "local_seconds": round(local_best, 3), "local_mib_per_s": round(size / MIB / local_best, 1),
            "modes": {m.value: {"s3_seconds": round(best[m], 3), "s3_mib_per_s": round(size / MIB / best[m], 1),
                                "ratio_s3_to_local": round(local_best / best[m], 3),
                                "requests": sum(requests[m].values()), "requests_by_operation": requests[m],
                                "staged_log_gets": gets[m]} for m in modes}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="objects in the scanned bucket")
    parser.add_argument("--segment-mib", type=int, default=64, help="size of the segment rewritten through S3")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the rewrite comparison (best is kept)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_s3.json")
    args = parser.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto accepts any; never a real account here
        os.environ[name] = "bench"
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    print(f"scan of {args.objects:,} objects ...", file=sys.stderr)
    scan_doc = bench_scan(args.objects)
    print(f"rewrite of a {args.segment_mib} MiB segment through S3 and locally ...", file=sys.stderr)
    rewrite_doc = bench_rewrite(args.segment_mib, args.repeat)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "scan": scan_doc, "rewrite": rewrite_doc}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    s, r = scan_doc, rewrite_doc
    print(f"\n{'measure':<44} {'value':>14}")
    for name, value in (
        (f"scan: objects ({s['partitions']} partitions)", f"{s['objects']:,}"),
        ("scan: wall seconds (moto server included)", f"{s['seconds']:.1f}"),
        ("scan: CPU seconds of the scanner process", f"{s['cpu_seconds']:.1f}"),
        ("scan: peak RSS of the scanner process", f"{s['peak_rss_mib']:.0f} MiB"),
        (f"rewrite {r['segment_bytes'] / MIB:.0f} MiB: local file", f"{r['local_mib_per_s']:.1f} MiB/s"),
        *((f"rewrite: through S3, verify {mode}", f"{m['s3_mib_per_s']:.1f} MiB/s") for mode, m in r["modes"].items()),
        *((f"rewrite: ratio S3 / local, verify {mode}", f"{m['ratio_s3_to_local']:.2f}")
          for mode, m in r["modes"].items()),
        *((f"requests a compaction, verify {mode}", f"{m['requests']}") for mode, m in r["modes"].items()),
        *((f"GETs of the staged .log, verify {mode}", f"{m['staged_log_gets']}") for mode, m in r["modes"].items()),
    ):
        print(f"{name:<44} {value:>14}")
    print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
