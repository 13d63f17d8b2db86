"""One compaction through S3, or one local rewrite, in a process of its own, for bench_s3.py to measure.

    python bench/s3_compaction.py --endpoint URL --bucket B --prefix P --topic T --verify checksum --swap auto
    python bench/s3_compaction.py --local-file 00000000000000000000.log --out-dir DIR
    python bench/s3_compaction.py --endpoint URL --bucket B --requests 300

Through S3: scans ``P`` for topic ``T`` and compacts it to zstd level 3 with the same orchestrator the CLI
uses, then prints one JSON document: the compaction's seconds (wall and CPU, every thread's, and the CPU's
part in the kernel), its S3
requests by operation, the bytes of object bodies it sent and received, the GETs of staged objects, the
swap mode used (the probe's choice with ``--swap auto``), every segment's status, and the process's peak
RSS (read by the process itself: a parent's ``wait4`` would report the pages of the fork it was started
from). Locally: ``tiering segment rewrite``'s function on the same segment, the same figures where they
apply. Either way the timed part is the work alone, not the interpreter's start or the imports.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tiering.commit.operation import AUTO_SWAP, Context, SwapChoice
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.vocabulary import Swap, Verify
from tiering.local import rewrite_file
from tiering.plan.scan import ScanOptions, scan
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.s3 import S3Store, make_client

STAGING = "/_tiering/staging/"
OPTIONS = RewriteOptions(Codec.ZSTD, 3)


def _cpu_seconds() -> float:
    """CPU seconds of this process so far, every thread's (the upload parts are sent from threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _system_seconds() -> float:
    """The part of :func:`_cpu_seconds` spent in the kernel (on loopback, the TCP stack of both ends)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


def _vm_hwm_kib() -> int:
    """This process's peak resident size (VmHWM: reset at exec, so none of the parent's pages)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _body_bytes(body: Any) -> int:
    """The length of a request's body: bytes, or a seekable file (botocore sends either)."""
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    at = body.tell()
    end = body.seek(0, 2)
    body.seek(at)
    return int(end - at)


def local(path: Path, out_dir: Path) -> dict[str, Any]:
    started, cpu, system = time.perf_counter(), _cpu_seconds(), _system_seconds()
    result, _ = rewrite_file(path, out_dir, OPTIONS)
    return {"seconds": time.perf_counter() - started, "cpu_seconds": _cpu_seconds() - cpu,
            "system_seconds": _system_seconds() - system,
            "bytes_in": result.stats.bytes_in, "bytes_out": result.stats.bytes_out, "peak_rss_kib": _vm_hwm_kib()}


def requests(endpoint: str, bucket: str, n: int) -> dict[str, float]:
    """The client's CPU milliseconds per request, by operation: ``n`` of each on a 100-byte object after 20
    unmeasured, with the client the CLI makes."""
    client = make_client(endpoint_url=endpoint)
    client.put_object(Bucket=bucket, Key="r/object", Body=b"x" * 100)

    def get() -> bytes:
        body: bytes = client.get_object(Bucket=bucket, Key="r/object")["Body"].read()
        return body

    calls: dict[str, Callable[[], Any]] = {
        "HeadObject": lambda: client.head_object(Bucket=bucket, Key="r/object"),
        "GetObject": get,
        "PutObject": lambda: client.put_object(Bucket=bucket, Key="r/put", Body=b"y" * 1000),
        "ListObjectsV2": lambda: client.list_objects_v2(Bucket=bucket, Prefix="r/o"),
    }
    ms = {}
    for name, call in calls.items():
        for _ in range(20):
            call()
        before = _cpu_seconds()
        for _ in range(n):
            call()
        ms[name] = round((_cpu_seconds() - before) / n * 1000, 3)
    return ms


def through_s3(args: argparse.Namespace) -> dict[str, Any]:
    store = S3Store(make_client(endpoint_url=args.endpoint), args.bucket)
    staged_gets: list[str] = []
    wire = {"sent": 0, "received": 0}

    def on_get(params: dict[str, Any], **_: Any) -> None:
        if STAGING in params["url_path"]:
            staged_gets.append(params["url_path"])

    def on_send(request: Any, **_: Any) -> None:
        wire["sent"] += _body_bytes(request.body)

    def on_got(parsed: dict[str, Any], **_: Any) -> None:
        wire["received"] += int(parsed.get("ContentLength") or 0)

    plan = scan(store, args.prefix, ScanOptions("zstd", 3, topics=args.topic, min_age_minutes=0))
    store.client.meta.events.register("before-call.s3.GetObject", on_get)
    store.client.meta.events.register("before-send.s3", on_send)
    store.client.meta.events.register("after-call.s3.GetObject", on_got)
    before = dict(store.requests)
    swap = SwapChoice(None if args.swap == AUTO_SWAP else Swap(args.swap))
    ctx = Context(store, args.prefix, f"bench-{args.topic}", OPTIONS, work_dir=args.work_dir,
                  verify=Verify(args.verify), swap=swap)
    started, cpu, system = time.perf_counter(), _cpu_seconds(), _system_seconds()
    run = compact(store, plan, ctx, CompactOptions())
    seconds, cpu, system = time.perf_counter() - started, _cpu_seconds() - cpu, _system_seconds() - system
    requests = {op: n - before.get(op, 0) for op, n in sorted(store.requests.items()) if n - before.get(op, 0)}
    return {"seconds": seconds, "cpu_seconds": cpu, "system_seconds": system, "requests": requests,
            "peak_rss_kib": _vm_hwm_kib(),
            "staged_gets": len(staged_gets), "staged_log_gets": sum(1 for k in staged_gets if k.endswith(".log")),
            "bytes_sent": wire["sent"], "bytes_received": wire["received"],
            "swap": swap.mode.value if swap.mode is not None else None,
            "segments": [{"status": str(s.status), "reason": s.reason, "bytes_before": s.bytes_before,
                          "bytes_after": s.bytes_after, "verified": (s.stats or {}).get("verified")}
                         for s in run.segments]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local-file", type=Path, help="rewrite this segment file locally instead")
    p.add_argument("--out-dir", type=Path, help="where the local rewrite writes")
    p.add_argument("--endpoint")
    p.add_argument("--bucket")
    p.add_argument("--prefix")
    p.add_argument("--topic")
    p.add_argument("--verify", choices=[v.value for v in Verify], default=Verify.CHECKSUM.value)
    p.add_argument("--swap", choices=[AUTO_SWAP, *(s.value for s in Swap)], default=AUTO_SWAP)
    p.add_argument("--work-dir", default=None)
    p.add_argument("--requests", type=int, help="time this many requests of each kind instead")
    args = p.parse_args(argv)
    if args.requests is not None:
        if args.endpoint is None or args.bucket is None:
            p.error("--requests needs --endpoint and --bucket")
        doc = requests(args.endpoint, args.bucket, args.requests)
    elif args.local_file is not None:
        if args.out_dir is None:
            p.error("--local-file needs --out-dir")
        doc = local(args.local_file, args.out_dir)
    else:
        missing = [f"--{n}" for n in ("bucket", "prefix", "topic") if getattr(args, n) is None]
        if missing:
            p.error(f"a compaction through S3 needs {', '.join(missing)}")
        doc = through_s3(args)
    json.dump(doc, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
