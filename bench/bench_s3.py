"""S3 figures in one run: a scan of a large bucket, and rewrite throughput through S3 vs a local file.

    make bench-s3
    .venv/bin/python bench/bench_s3.py --objects 100000 --segment-mib 64 256 1024 --repeat 2

1. **Scan.** A moto server on loopback (in this process) holds ``--objects`` segment objects: partitions
   of 100 segments, each with ``.log``, ``.index``, ``.timeindex`` and ``.snapshot`` (tiny bodies: a
   scan reads listings only). ``tiering s3 scan --json`` runs as users run it, in its own process; its
   wall time, CPU time (``wait4``) and peak RSS (VmHWM, polled: it is reset at exec) are reported. moto answers every
   prefixed listing by walking all keys of the bucket, so on a large bucket the server dominates the
   wall time: the CPU seconds of the scanner process are the figure that belongs to this project.
2. **Compaction through S3.** For each ``--segment-mib`` (default 64, 256 and 1024), one generated segment
   (snappy JSON events) is compacted to zstd level 3 by the full commit protocol against a moto server in
   another process, in three configurations (verify + swap): ``read-back + put`` (the staged ``.log``
   read back, then downloaded again and PUT over the original: the path before checksums and the
   server-side swap, and the one for stores with neither), ``checksum + put`` and ``checksum + copy`` (S3's
   CRC-32C of what it stored, then a server-side CopyObject). Each compaction runs in its own process
   (``bench/s3_compaction.py``, the orchestrator the CLI uses) with an empty work directory as TMPDIR;
   reported: wall and CPU seconds, the ratios to ``rewrite_file`` of the same bytes on the local disk in
   the same run (best of ``--repeat``), the moto server's CPU seconds meanwhile, the compaction's requests,
   its GETs of staged objects, its peak RSS (its own VmHWM) and the most bytes of files under the work
   directory it held open (a spool is unlinked at once: counted through ``/proc/<pid>/fd``).

Prints a table and writes ``bench/out/bench_s3.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench_rewrite import _vm_hwm_kib  # same directory: the script's own path is on sys.path
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.journal import Swap, Verify
from tiering.local import rewrite_file
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
            # VmHWM polled (reset at exec); not wait4's ru_maxrss, which counts the parent's pages the child
            # was forked with
            "peak_rss_mib": round(peak_kib / 1024, 1), "doc": doc}


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


# (verify, swap): how a staged .log is accepted and how it is put in place. The first is the path before
# checksums and the server-side swap (and the one for stores with neither).
CONFIGS: tuple[tuple[Verify, Swap], ...] = (
    (Verify.READ_BACK, Swap.PUT), (Verify.CHECKSUM, Swap.PUT), (Verify.CHECKSUM, Swap.COPY))


def _label(verify: Verify, swap: Swap) -> str:
    return f"{verify.value} + {swap.value}"


def _cpu_seconds() -> float:
    """CPU seconds of this process so far (every thread's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_seconds(pid: int) -> float:
    """CPU seconds of another process so far (utime + stime of /proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _open_bytes(pid: int, work_dir: Path) -> int:
    """The bytes of the files under ``work_dir`` process ``pid`` has open, unlinked ones included (a spool is
    a temporary file: deleted from the directory at once, still on disk)."""
    total = 0
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd).startswith(str(work_dir)):
                    total += os.stat(fd).st_size
    return total


def _compaction(endpoint: str, topic: str, verify: Verify, swap: Swap, work_dir: Path) -> dict[str, Any]:
    """bench/s3_compaction.py in its own process (TMPDIR and --work-dir an empty directory): its JSON (with its
    peak RSS), and the most bytes of files under the work directory it held open while it ran."""
    cmd = [sys.executable, str(Path(__file__).parent / "s3_compaction.py"), "--endpoint", endpoint,
           "--bucket", "bench", "--prefix", "kafka", "--topic", topic, "--verify", verify.value,
           "--swap", swap.value, "--work-dir", str(work_dir)]
    spooled = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env={**os.environ, "TMPDIR": str(work_dir)})
        while True:
            spooled = max(spooled, _open_bytes(proc.pid, work_dir))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"compaction failed: {err.read().decode()[-2000:]}")
        out.seek(0)
        doc: dict[str, Any] = json.loads(out.read())
    if [s["status"] for s in doc["segments"]] != ["compacted"]:
        raise RuntimeError(f"compaction did not compact the segment: {doc['segments']}")
    return {**doc, "peak_rss_mib": round(doc["peak_rss_kib"] / 1024, 1), "work_dir_max_bytes": spooled}


def _drop(store: S3Store, prefix: str) -> None:
    """Delete everything under ``prefix`` (moto holds objects in memory: a GiB a round adds up)."""
    keys = [(o.key, o.etag) for o in store.list(prefix)]
    store.delete_many(keys)


def bench_rewrite(segment_mib: list[int], repeat: int) -> list[dict[str, Any]]:
    """For each size: the local rewrite, and one compaction through S3 in each of :data:`CONFIGS`, each in its
    own process, best of ``repeat``; the requests of one compaction, the GETs of staged objects, the peak
    RSS of the compaction process and the most its work directory held."""
    rows = []
    with moto_process("bench") as (store, endpoint, moto_pid), tempfile.TemporaryDirectory() as tmp:
        for mib in segment_mib:
            generated = generate_partition(segments=2, kind="json", codec=Codec.SNAPPY, segment_bytes=mib * MIB)
            segment = generated[0]
            options = RewriteOptions(Codec.ZSTD, 3)
            path = Path(tmp) / f"{segment.base_offset:020d}.log"
            path.write_bytes(segment.log)
            local_best = local_cpu = float("inf")
            runs: dict[tuple[Verify, Swap], dict[str, Any]] = {}
            for round_no in range(repeat):
                started, cpu = time.perf_counter(), _cpu_seconds()
                result, _ = rewrite_file(path, Path(tmp) / "out.log", options)
                local_best = min(local_best, time.perf_counter() - started)
                local_cpu = min(local_cpu, _cpu_seconds() - cpu)
                for verify, swap in CONFIGS:
                    topic = f"s{mib}-r{round_no}-{verify.value}-{swap.value}"
                    upload_partition(store, "kafka", topic, 0, generated)
                    work = Path(tmp) / f"work-{topic}"
                    work.mkdir()
                    moto_cpu = _proc_cpu_seconds(moto_pid)
                    doc = _compaction(endpoint, topic, verify, swap, work)
                    doc["moto_cpu_seconds"] = _proc_cpu_seconds(moto_pid) - moto_cpu
                    _drop(store, f"kafka/{topic}-0/")
                    _drop(store, "kafka/_tiering/")
                    best = runs.get((verify, swap))
                    if best is None or doc["seconds"] < best["seconds"]:
                        runs[verify, swap] = doc
                print(f"  {mib} MiB round {round_no + 1}/{repeat}: local {local_best:.2f} s, "
                      + ", ".join(f"{_label(*c)} {runs[c]['seconds']:.2f} s" for c in CONFIGS), file=sys.stderr)
            shutil.rmtree(Path(tmp) / "out.log", ignore_errors=True)
            path.unlink()
            size = len(segment.log)
            rows.append({
                "segment_mib": mib, "segment_bytes": size, "bytes_out": result.stats.bytes_out,
                "local_seconds": round(local_best, 3), "local_mib_per_s": round(size / MIB / local_best, 1),
                "local_cpu_seconds": round(local_cpu, 3),
                "configs": {_label(*c): {
                    "verify": c[0].value, "swap": c[1].value, "s3_seconds": round(d["seconds"], 3),
                    "s3_mib_per_s": round(size / MIB / d["seconds"], 1),
                    "ratio_s3_to_local": round(local_best / d["seconds"], 3),
                    "cpu_seconds": round(d["cpu_seconds"], 3),
                    "cpu_ratio_s3_to_local": round(local_cpu / d["cpu_seconds"], 3),
                    "moto_cpu_seconds": round(d["moto_cpu_seconds"], 3),
                    "requests": sum(d["requests"].values()), "requests_by_operation": d["requests"],
                    "staged_gets": d["staged_gets"], "staged_log_gets": d["staged_log_gets"],
                    "peak_rss_mib": d["peak_rss_mib"], "work_dir_max_bytes": d["work_dir_max_bytes"]}
                    for c in CONFIGS for d in [runs[c]]}})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="objects in the scanned bucket")
    parser.add_argument("--segment-mib", type=int, nargs="+", default=[64, 256, 1024],
                        help="sizes of the segments compacted through S3 (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of the rewrite comparison (best is kept)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_s3.json")
    args = parser.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # moto accepts any; never a real account here
        os.environ[name] = "bench"
    os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    print(f"scan of {args.objects:,} objects ...", file=sys.stderr)
    scan_doc = bench_scan(args.objects)
    print(f"compaction of {args.segment_mib} MiB segments through S3 and locally ...", file=sys.stderr)
    rewrite_doc = bench_rewrite(args.segment_mib, args.repeat)
    doc = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
           "scan": scan_doc, "rewrite": rewrite_doc}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    s = scan_doc
    print(f"\n{'scan':<44} {'value':>14}")
    for name, value in (
        (f"objects ({s['partitions']} partitions)", f"{s['objects']:,}"),
        ("wall seconds (moto server included)", f"{s['seconds']:.1f}"),
        ("CPU seconds of the scanner process", f"{s['cpu_seconds']:.1f}"),
        ("peak RSS of the scanner process", f"{s['peak_rss_mib']:.0f} MiB"),
    ):
        print(f"{name:<44} {value:>14}")
    print(f"\n{'segment':>8} {'verify + swap':<20} {'MiB/s':>7} {'local':>7} {'ratio':>6} {'CPU ratio':>9} "
          f"{'requests':>8} {'staged GETs':>11} {'peak RSS':>9} {'on disk':>8}")
    for row in rewrite_doc:
        for label, c in row["configs"].items():
            print(f"{row['segment_mib']:>4} MiB {label:<20} {c['s3_mib_per_s']:>7.1f} {row['local_mib_per_s']:>7.1f} "
                  f"{c['ratio_s3_to_local']:>6.2f} {c['cpu_ratio_s3_to_local']:>9.2f} {c['requests']:>8} "
                  f"{c['staged_gets']:>11} {c['peak_rss_mib']:>5.0f} MiB {c['work_dir_max_bytes'] / MIB:>4.0f} MiB")
    copy = _label(Verify.CHECKSUM, Swap.COPY)
    if len(rewrite_doc) > 1:
        low, high = rewrite_doc[0], rewrite_doc[-1]
        growth = high["configs"][copy]["peak_rss_mib"] / low["configs"][copy]["peak_rss_mib"]
        doc["rss_growth"] = {"config": copy, "from_mib": low["segment_mib"], "to_mib": high["segment_mib"],
                             "ratio": round(growth, 3)}
        args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\npeak RSS at {high['segment_mib']} MiB / at {low['segment_mib']} MiB ({copy}): {growth:.2f}")
    print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
