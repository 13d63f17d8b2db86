"""S3 figures in one run: a scan of a large bucket, and compaction through S3 against the local rewrite.

    make bench-s3                                   # moto (scan, then 64, 256 and 1024 MiB segments)
    make bench-s3 BENCH_ARGS="--store seaweedfs --segment-mib 256 1024"
    make bench-s3 BENCH_ARGS="--store seaweedfs --segment-mib 256 --baseline HEAD~1"   # before and after a change
    .venv/bin/python bench/bench_s3.py --endpoint https://s3.example.net --bucket my-bench --segment-mib 256

1. **Scan** (moto only). A moto server on loopback (in this process) holds ``--objects`` segment objects:
   partitions of 100 segments, each with ``.log``, ``.index``, ``.timeindex`` and ``.snapshot`` (tiny
   bodies: a scan reads listings only). ``tiering s3 scan --json`` runs as users run it, in its own process;
   its wall time, CPU time (``wait4``) and peak RSS (VmHWM, polled: it is reset at exec) are reported. moto
   answers every prefixed listing by walking all keys of the bucket, so on a large bucket the server
   dominates the wall time: the CPU seconds of the scanner process are the figure that belongs to this
   project.
2. **Compaction through S3.** For each ``--segment-mib``, one generated segment (snappy JSON events) is
   compacted to zstd level 3 by the full commit protocol against the store of ``--store`` (a moto server or
   SeaweedFS's ``weed mini``, started here on loopback in a process of its own) or ``--endpoint``, in three
   configurations (verify + swap): ``read-back + put`` (the staged ``.log`` read back, then downloaded again
   and PUT over the original: the path for stores without checksums or conditional copies),
   ``checksum + put``, and ``checksum + auto`` (the CLI's default: the probe chooses a server-side copy where
   the store honours a copy's ``If-Match``, a PUT otherwise; the table says which). Each round runs the local
   rewrite (``tiering segment rewrite``'s function) and each compaction in processes of their own
   (``bench/s3_compaction.py``), a compaction with an empty work directory as TMPDIR; rounds interleave, and
   the least wall and CPU time of each are kept. Reported: wall and CPU seconds of the work alone (not the
   interpreter's start; the CPU's part in the kernel beside it), the ratios to the local rewrite's, the
   server's CPU seconds meanwhile, the requests, the bytes of object bodies sent and received, the GETs of
   staged objects, the peak RSS (the process's own VmHWM) and the most bytes of files under the work
   directory it held open (a spool is unlinked at once: counted through ``/proc/<pid>/fd``). ``--baseline REV``
   adds the default configuration run by the package as it was at a git revision (with this checkout's
   compiled modules), in the same rounds.

Prints a table and writes ``bench/out/bench_s3.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.s3.seaweedfs

from bench_rewrite import _vm_hwm_kib  # same directory: the script's own path is on sys.path
from bench_scan import export_tree
from moto.core.models import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

from tests.s3 import seaweedfs
from tiering.commit.operation import AUTO_SWAP
from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.lifecycle.vocabulary import Swap, Verify
from tiering.storage.objects import redact_url
from tiering.storage.s3 import S3Store, make_client

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


@dataclass(frozen=True)
class Config:
    """A compaction measured: its verification and swap, and the package it runs (``tree``: a git revision's,
    exported by ``--baseline``; None: this checkout's)."""

    verify: Verify
    swap: str
    rev: str | None = None
    tree: str | None = None

    @property
    def label(self) -> str:
        return f"{self.verify.value} + {self.swap}" + (f" @{self.rev}" if self.rev else "")


# (verify, swap): how a staged .log is accepted and how it is put in place. The first is the path before
# checksums and the server-side swap (and the one for stores with neither); the last lets the probe choose,
# as the CLI does by default (a server-side copy where the store honours a copy's If-Match).
CONFIGS: tuple[Config, ...] = (Config(Verify.READ_BACK, Swap.PUT.value), Config(Verify.CHECKSUM, Swap.PUT.value),
                               Config(Verify.CHECKSUM, AUTO_SWAP))
DEFAULT_CONFIG: Final = CONFIGS[-1].label
STORES: Final = ("moto", "seaweedfs")
CPU_TARGET: Final = 1.10  # the compaction's CPU over the local rewrite's (docs/benchmarks.md)


def bench_requests(server: Server, n: int) -> dict[str, float]:
    """The client's CPU milliseconds per request, by operation, measured by ``bench/s3_compaction.py
    --requests`` in a process of its own (this one has moto's hooks in every botocore client)."""
    with _bucket(server, f"{server.store.bucket}-requests") as store, tempfile.TemporaryFile() as out:
        subprocess.run([sys.executable, str(Path(__file__).parent / "s3_compaction.py"), "--endpoint",
                        server.endpoint, "--bucket", store.bucket, "--requests", str(n)],
                       stdout=out, env=server.env, check=True)
        out.seek(0)
        ms: dict[str, float] = json.loads(out.read())
    return ms


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


@dataclass(frozen=True)
class Server:
    """The S3 store the compactions run against: a moto or SeaweedFS server this benchmark started, or an
    endpoint given to it."""

    kind: str  # moto, seaweedfs, endpoint
    store: S3Store
    endpoint: str
    pid: int | None  # the server's process, whose CPU seconds are read; None for an endpoint given
    env: dict[str, str]  # the environment of a compaction process (its credentials)

    def cpu_seconds(self) -> float | None:
        return None if self.pid is None else _proc_cpu_seconds(self.pid)


def _client(endpoint: str, bucket: str) -> S3Store:
    """A store for ``bucket`` at ``endpoint``, the bucket created if it is not there (a server still starting
    is waited for)."""
    client = make_client(endpoint_url=endpoint)
    for attempt in range(100):
        try:
            client.head_bucket(Bucket=bucket)
            break
        except Exception:  # absent, or the server is still starting
            with contextlib.suppress(Exception):
                client.create_bucket(Bucket=bucket)
                break
            if attempt == 99:
                raise
            time.sleep(0.1)
    return S3Store(client, bucket)


@contextlib.contextmanager
def s3_server(kind: str, endpoint: str | None, bucket: str, tmp: Path) -> Iterator[Server]:
    """The store of ``--store`` (``--endpoint``: that one, with the credentials of the environment)."""
    if endpoint is not None:
        yield Server("endpoint", _client(endpoint, bucket), endpoint, None, dict(os.environ))
        return
    if kind == "seaweedfs":
        weed = seaweedfs.binary()
        if not os.access(weed, os.X_OK):
            raise SystemExit(f"--store seaweedfs needs SeaweedFS at {weed}: run scripts/fetch-seaweedfs.sh "
                             "(make seaweedfs)")
        with seaweedfs.weed_mini(tmp / "seaweedfs") as sw:
            env = {**os.environ, "AWS_ACCESS_KEY_ID": sw.access_key, "AWS_SECRET_ACCESS_KEY": sw.secret_key}
            with _environ(env):
                yield Server(kind, _client(sw.endpoint, bucket), sw.endpoint, sw.pid, env)
        return
    with moto_process(bucket) as (store, url, pid):
        yield Server(kind, store, url, pid, dict(os.environ))


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _measured(cmd: list[str], env: dict[str, str], work_dir: Path | None = None) -> dict[str, Any]:
    """bench/s3_compaction.py in its own process: its JSON, and (with ``work_dir``, its TMPDIR) the most bytes
    of files under the work directory it held open while it ran."""
    spooled = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).parent / "s3_compaction.py"), *cmd],
                                stdout=out, stderr=err, env={**env, **({"TMPDIR": str(work_dir)} if work_dir else {})})
        while True:
            if work_dir is not None:
                spooled = max(spooled, _open_bytes(proc.pid, work_dir))
            pid, status, _ = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(0.05)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise RuntimeError(f"{cmd[:2]} failed: {err.read().decode()[-2000:]}")
        out.seek(0)
        doc: dict[str, Any] = json.loads(out.read())
    return {**doc, "peak_rss_mib": round(doc["peak_rss_kib"] / 1024, 1), "work_dir_max_bytes": spooled}


def _compaction(server: Server, store: S3Store, topic: str, config: Config, work_dir: Path) -> dict[str, Any]:
    env = server.env if config.tree is None else {**server.env, "PYTHONPATH": config.tree}
    doc = _measured(["--endpoint", server.endpoint, "--bucket", store.bucket, "--prefix", "kafka", "--topic", topic,
                     "--verify", config.verify.value, "--swap", config.swap, "--work-dir", str(work_dir)],
                    env, work_dir)
    if [s["status"] for s in doc["segments"]] != ["compacted"]:
        raise RuntimeError(f"compaction did not compact the segment: {doc['segments']}")
    return doc


@contextlib.contextmanager
def _bucket(server: Server, name: str) -> Iterator[S3Store]:
    """A bucket for one compaction, emptied afterwards: on a server started here, a bucket of its own,
    deleted with what it holds (moto keeps objects in memory, and SeaweedFS frees a deleted object's disk
    space only when it vacuums, a bucket's at once); at an endpoint given, the one bucket, emptied."""
    if server.kind == "endpoint":
        yield server.store
        seaweedfs.empty(server.store, "kafka/")
        return
    store = _client(server.endpoint, name)
    try:
        yield store
    finally:
        seaweedfs.empty(store, delete_bucket=True)


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the least wall time, with the least CPU of any round beside it (rounds interleave, so
    the least of each is the figure least disturbed by the rest of the machine)."""
    best = dict(min(runs, key=lambda d: d["seconds"]))
    least_cpu = min(runs, key=lambda d: d["cpu_seconds"])
    best["cpu_seconds"], best["system_seconds"] = least_cpu["cpu_seconds"], least_cpu["system_seconds"]
    if all(d.get("server_cpu_seconds") is not None for d in runs):
        best["server_cpu_seconds"] = min(d["server_cpu_seconds"] for d in runs)
    return best


def bench_rewrite(server: Server, segment_mib: list[int], repeat: int, tmp: Path,
                  baseline: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """For each size, ``repeat`` interleaved rounds of: the local rewrite, then one compaction through S3 in
    each of :data:`CONFIGS` (and, with ``baseline``, a git revision and its exported package, the default
    configuration with that package), each in its own process."""
    configs = list(CONFIGS)
    if baseline is not None:
        configs.append(Config(Verify.CHECKSUM, AUTO_SWAP, *baseline))
    rows = []
    for mib in segment_mib:
        generated = generate_partition(segments=2, kind="json", codec=Codec.SNAPPY, segment_bytes=mib * MIB)
        segment = generated[0]
        path = tmp / f"{segment.base_offset:020d}.log"
        path.write_bytes(segment.log)
        locals_: list[dict[str, Any]] = []
        runs: dict[str, list[dict[str, Any]]] = {c.label: [] for c in configs}
        for round_no in range(repeat):
            out_dir = tmp / "local-out"
            locals_.append(_measured(["--local-file", str(path), "--out-dir", str(out_dir)], server.env))
            shutil.rmtree(out_dir, ignore_errors=True)
            for n, config in enumerate(configs):
                topic = f"s{mib}-r{round_no}-{n}-{config.verify.value}-{config.swap}"
                with _bucket(server, f"{server.store.bucket}-{mib}-{round_no}-{n}") as store:
                    upload_partition(store, "kafka", topic, 0, generated)
                    work = tmp / f"work-{topic}"
                    work.mkdir()
                    server_cpu = server.cpu_seconds()
                    doc = _compaction(server, store, topic, config, work)
                    after = server.cpu_seconds()
                doc["server_cpu_seconds"] = None if server_cpu is None or after is None else after - server_cpu
                runs[config.label].append(doc)
            print(f"  {mib} MiB round {round_no + 1}/{repeat}: local {locals_[-1]['seconds']:.2f} s, "
                  + ", ".join(f"{label} {r[-1]['seconds']:.2f} s" for label, r in runs.items()), file=sys.stderr)
        path.unlink()
        size = len(segment.log)
        loc = _best(locals_)
        measured = {}
        for config in configs:
            docs = runs[config.label]
            d = _best(docs)
            segments = d["segments"]
            measured[config.label] = {
                "verify": config.verify.value, "swap_asked": config.swap, "swap": d["swap"], "revision": config.rev,
                "s3_seconds": round(d["seconds"], 3), "s3_mib_per_s": round(size / MIB / d["seconds"], 1),
                "ratio_s3_to_local": round(loc["seconds"] / d["seconds"], 3),
                "cpu_seconds": round(d["cpu_seconds"], 3), "system_seconds": round(d["system_seconds"], 3),
                "cpu_x_local": round(d["cpu_seconds"] / loc["cpu_seconds"], 3),
                "cpu_x_local_by_round": [round(r["cpu_seconds"] / lr["cpu_seconds"], 3)
                                         for r, lr in zip(docs, locals_, strict=True)],
                "server_cpu_seconds": (round(d["server_cpu_seconds"], 3)
                                       if d.get("server_cpu_seconds") is not None else None),
                "requests": sum(d["requests"].values()), "requests_by_operation": d["requests"],
                "bytes_sent": d["bytes_sent"], "bytes_received": d["bytes_received"],
                "new_log_bytes": segments[0]["bytes_after"],
                "staged_gets": d["staged_gets"], "staged_log_gets": d["staged_log_gets"],
                "peak_rss_mib": d["peak_rss_mib"], "work_dir_max_bytes": d["work_dir_max_bytes"]}
        rows.append({"segment_mib": mib, "segment_bytes": size, "bytes_out": loc["bytes_out"],
                     "local_seconds": round(loc["seconds"], 3),
                     "local_mib_per_s": round(size / MIB / loc["seconds"], 1),
                     "local_cpu_seconds": round(loc["cpu_seconds"], 3),
                     "local_system_seconds": round(loc["system_seconds"], 3), "local_peak_rss_mib": loc["peak_rss_mib"],
                     "configs": measured})
    return rows


def _print_rewrite(rows: list[dict[str, Any]], server: Server) -> None:
    def used(label: str, c: dict[str, Any]) -> str:
        return f"{label} ({c['swap']})" if c["swap_asked"] == AUTO_SWAP else label

    w = max([26, *(len(used(label, c)) for row in rows for label, c in row["configs"].items())])
    print(f"\n{'segment':>8} {'verify + swap (used)':<{w}} {'MiB/s':>6} {'/local':>6} {'CPU s':>6} {'xlocal':>6} "
          f"{'server':>6} {'reqs':>5} {'MiB up':>7} {'MiB down':>8} {'staged':>6} {'RSS':>8} {'disk':>8}")
    for row in rows:
        print(f"{row['segment_mib']:>4} MiB {'local rewrite':<{w}} {row['local_mib_per_s']:>6.1f} {'':>6} "
              f"{row['local_cpu_seconds']:>6.2f} {'1.00':>6} {'':>6} {'':>5} {'':>7} {'':>8} {'':>6} "
              f"{row['local_peak_rss_mib']:>4.0f} MiB {'':>8}")
        for label, c in row["configs"].items():
            server_cpu = f"{c['server_cpu_seconds']:>6.2f}" if c["server_cpu_seconds"] is not None else f"{'n/a':>6}"
            print(f"{row['segment_mib']:>4} MiB {used(label, c):<{w}} {c['s3_mib_per_s']:>6.1f} "
                  f"{c['ratio_s3_to_local']:>6.2f} {c['cpu_seconds']:>6.2f} {c['cpu_x_local']:>6.2f} {server_cpu} "
                  f"{c['requests']:>5} "
                  f"{c['bytes_sent'] / MIB:>7.1f} {c['bytes_received'] / MIB:>8.1f} {c['staged_gets']:>6} "
                  f"{c['peak_rss_mib']:>4.0f} MiB {c['work_dir_max_bytes'] / MIB:>4.0f} MiB")
    print(f"\nMiB/s: the segment's bytes over the wall time; /local: that time over the local rewrite's (wall). "
          f"CPU s: the client's CPU seconds, every thread's;\nxlocal: over the local rewrite's (least of the "
          f"rounds each); server: the {server.kind} server's CPU seconds meanwhile. MiB up / down: object bodies "
          "sent and received.\nstaged: GETs of staged objects. RSS: the process's peak. disk: the most it held "
          "in files of its work directory.")
    for row in rows:
        for c in row["configs"].values():
            if c["revision"] is not None:
                print(f"{row['segment_mib']} MiB, the same at {c['revision']} ({c['swap']}): client CPU "
                      f"{c['cpu_x_local']:.2f}x the local rewrite's (by round: "
                      f"{', '.join(f'{x:.2f}' for x in c['cpu_x_local_by_round'])}); {c['requests']} requests")
        c = row["configs"][DEFAULT_CONFIG]
        verdict = "within" if c["cpu_x_local"] <= CPU_TARGET else "ABOVE"
        print(f"{row['segment_mib']} MiB, {DEFAULT_CONFIG} ({c['swap']}): client CPU {c['cpu_x_local']:.2f}x the local "
              f"rewrite's ({verdict} the {CPU_TARGET:.2f}x target; by round: "
              f"{', '.join(f'{x:.2f}' for x in c['cpu_x_local_by_round'])}; in the kernel {c['system_seconds']:.2f} s "
              f"against {row['local_system_seconds']:.2f} s); the staged .log downloaded "
              f"{c['staged_log_gets']} times; uploaded {c['bytes_sent'] / c['new_log_bytes']:.2f}x the new .log's "
              f"bytes; {c['requests']} requests")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=STORES, default="moto",
                        help="the S3 server to start on loopback for the compactions (default: %(default)s)")
    parser.add_argument("--endpoint", default=None, metavar="URL",
                        help="compact against this S3 endpoint instead (credentials from the environment; the "
                             "bucket is created if absent; the server's CPU is not measured)")
    parser.add_argument("--bucket", default="tiering-bench", help="the bucket used (default: %(default)s)")
    parser.add_argument("--objects", type=int, default=None,
                        help="objects in the scanned bucket (moto only; default 100000 with moto, 0 otherwise; "
                             "0 skips the scan)")
    parser.add_argument("--segment-mib", type=int, nargs="+", default=[64, 256, 1024],
                        help="sizes of the segments compacted through S3 (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds (the least of each is kept)")
    parser.add_argument("--pin-server", action="store_true",
                        help="run the server on the last CPU and everything measured on the others, so that the "
                             "server's work does not share (and slow) the client's cores")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also compact (checksum + auto) with the package as it was at this git revision, in "
                             "the same rounds: before and after side by side")
    parser.add_argument("--requests", type=int, default=300,
                        help="requests of each kind timed for the client's CPU per request (0: skip)")
    parser.add_argument("--json-out", type=Path, default=OUT_DIR / "bench_s3.json")
    args = parser.parse_args(argv)
    kind = "endpoint" if args.endpoint else args.store
    objects = args.objects if args.objects is not None else (100_000 if kind == "moto" else 0)
    if objects and kind != "moto":
        parser.error("--objects: the scan is measured on moto only (it seeds moto's backend directly)")
    if kind != "endpoint":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # a server started here: never a real account
            os.environ[name] = "bench"
        os.environ.pop("AWS_ENDPOINT_URL", None)
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    doc: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "store": {"kind": kind, "endpoint": redact_url(args.endpoint) if args.endpoint else None}}
    if objects:
        print(f"scan of {objects:,} objects ...", file=sys.stderr)
        doc["scan"] = bench_scan(objects)
    print(f"compaction of {args.segment_mib} MiB segments through S3 ({kind}) and locally ...", file=sys.stderr)
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin_server and (kind == "endpoint" or len(cpus) < 2):
        parser.error("--pin-server needs a server started here and at least two CPUs")
    doc["pinned"] = {"server": cpus[-1:], "client": cpus[:-1]} if args.pin_server else None
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if args.pin_server:  # the server (and every thread it starts) inherits this affinity
            os.sched_setaffinity(0, cpus[-1:])
        server = stack.enter_context(s3_server(args.store, args.endpoint, args.bucket, Path(tmp)))
        if args.pin_server:  # and the local rewrite and the compactions, this one
            os.sched_setaffinity(0, cpus[:-1])
        if args.requests:
            print(f"{args.requests} requests of each kind ...", file=sys.stderr)
            doc["request_cpu_ms"] = bench_requests(server, args.requests)
        baseline = (args.baseline, export_tree(args.baseline)) if args.baseline else None
        doc["rewrite"] = rows = bench_rewrite(server, args.segment_mib, args.repeat, Path(tmp), baseline)
    if len(rows) > 1:
        low, high = rows[0], rows[-1]
        growth = high["configs"][DEFAULT_CONFIG]["peak_rss_mib"] / low["configs"][DEFAULT_CONFIG]["peak_rss_mib"]
        doc["rss_growth"] = {"config": DEFAULT_CONFIG, "from_mib": low["segment_mib"], "to_mib": high["segment_mib"],
                             "ratio": round(growth, 3)}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(doc, indent=2) + "\n")
    if "scan" in doc:
        s = doc["scan"]
        print(f"\n{'scan':<44} {'value':>14}")
        for name, value in (
            (f"objects ({s['partitions']} partitions)", f"{s['objects']:,}"),
            ("wall seconds (moto server included)", f"{s['seconds']:.1f}"),
            ("CPU seconds of the scanner process", f"{s['cpu_seconds']:.1f}"),
            ("peak RSS of the scanner process", f"{s['peak_rss_mib']:.0f} MiB"),
        ):
            print(f"{name:<44} {value:>14}")
    if "request_cpu_ms" in doc:
        print(f"\n{'request (100-byte object)':<28} {'client CPU':>12}")
        for name, ms in doc["request_cpu_ms"].items():
            print(f"{name:<28} {ms:>9.2f} ms")
    _print_rewrite(rows, server)
    if "rss_growth" in doc:
        g = doc["rss_growth"]
        print(f"peak RSS at {g['to_mib']} MiB / at {g['from_mib']} MiB ({DEFAULT_CONFIG}): {g['ratio']:.2f}")
    print(f"\nJSON: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
