"""One compaction through S3 in a process of its own, for bench_s3.py to measure (peak RSS, files on disk).

    python bench/s3_compaction.py --endpoint URL --bucket B --prefix P --topic T --verify checksum --swap copy

Scans ``P`` for topic ``T`` and compacts it to zstd level 3 with the same orchestrator the CLI uses, then
prints one JSON document: the compaction's seconds (wall and CPU), its S3 requests by operation, the GETs of staged
objects, every segment's status, and the process's peak RSS (read by the process itself: a parent's
``wait4`` would report the pages of the fork it was started from).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any

from tiering.commit.protocol import AUTO_SWAP, Context, SwapChoice
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.journal import Swap, Verify
from tiering.plan.scan import ScanOptions, scan
from tiering.run.compact import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.store import S3Store, make_client

STAGING = "/_tiering/staging/"


def _cpu_seconds() -> float:
    """CPU seconds of this process so far, every thread's (the upload parts are sent from threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _vm_hwm_kib() -> int:
    """This process's peak resident size (VmHWM: reset at exec, so none of the parent's pages)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--verify", choices=[v.value for v in Verify], required=True)
    p.add_argument("--swap", choices=[AUTO_SWAP, *(s.value for s in Swap)], required=True)
    p.add_argument("--work-dir", default=None)
    args = p.parse_args(argv)
    store = S3Store(make_client(endpoint_url=args.endpoint), args.bucket)
    staged_gets: list[str] = []

    def get(params: dict[str, Any], **_: Any) -> None:
        if STAGING in params["url_path"]:
            staged_gets.append(params["url_path"])

    store.client.meta.events.register("before-call.s3.GetObject", get)
    plan = scan(store, args.prefix, ScanOptions("zstd", 3, topics=args.topic, min_age_minutes=0))
    before = dict(store.requests)
    ctx = Context(store, args.prefix, f"bench-{args.topic}", RewriteOptions(Codec.ZSTD, 3), work_dir=args.work_dir,
                  verify=Verify(args.verify), swap=SwapChoice(None if args.swap == AUTO_SWAP else Swap(args.swap)))
    started, cpu = time.perf_counter(), _cpu_seconds()
    run = compact(store, plan, ctx, CompactOptions())
    seconds, cpu = time.perf_counter() - started, _cpu_seconds() - cpu
    requests = {op: n - before.get(op, 0) for op, n in sorted(store.requests.items()) if n - before.get(op, 0)}
    json.dump({"seconds": seconds, "requests": requests, "staged_gets": len(staged_gets), "peak_rss_kib": _vm_hwm_kib(),
               "cpu_seconds": cpu,
               "staged_log_gets": sum(1 for k in staged_gets if k.endswith(".log")),
               "segments": [{"status": str(s.status), "reason": s.reason, "bytes_before": s.bytes_before,
                             "bytes_after": s.bytes_after, "verified": (s.stats or {}).get("verified")}
                            for s in run.segments]}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
