"""A whole DAG run over many small segments: wall time per step, requests per segment, document sizes.

    .venv/bin/python bench/bench_dag_scale.py --partitions 2000 --segments 10      # the 20,000-segment run
    .venv/bin/python bench/bench_dag_scale.py --partitions 200 --segments 10       # 2,000 segments

A moto server in its own process holds ``--partitions`` partitions of ``--segments`` sealed segments each
(plus the active one), small snappy JSON segments, the same bytes in every partition (seeding is not
measured). A child process runs ``kafka_segment_compaction`` with ``dag.test()`` (Airflow on SQLite, Spark
``--spark-master``, default ``local[2]``); afterwards it reads each task's duration from Airflow's
metadata database, the run document (segments compacted, S3 requests by partition) and the sizes of every
document the run wrote under ``PREFIX/_tiering/runs/<run>/``. The child's peak resident size (VmHWM) is
the Airflow process's (the tasks run in it; the Spark driver and executors are processes of their own).

Prints a table and writes ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from bench_s3 import moto_process  # same directory: on sys.path as the script's
from bench_scan import _status_kib

from tiering.demo.seed import generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.storage.layout import run_dir, run_result_key
from tiering.storage.s3 import S3Store, make_client

BUCKET: Final = "bench-dag"
PREFIX: Final = "kafka/logs"
TOPIC: Final = "events"


def seed(store: S3Store, partitions: int, segments: int) -> None:
    generated = generate_partition(segments=segments + 1, kind="json", codec=Codec.SNAPPY, segment_bytes=8_000)
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda p: upload_partition(S3Store(store.client, BUCKET), PREFIX, TOPIC, p, generated),
                      range(partitions)))


def child(endpoint: str, master: str) -> dict[str, Any]:
    """Run the DAG once in this process; what it cost."""
    from airflow.models import TaskInstance  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415

    from tiering.demo.s3 import load_dag, run_dag  # noqa: PLC0415

    started = time.perf_counter()
    state, run_id = run_dag({"bucket": BUCKET, "prefix": PREFIX, "codec": "zstd", "level": 3,
                             "min_segment_age_minutes": 0, "spark_master": master}, load_dag())
    wall = time.perf_counter() - started
    steps: dict[str, float] = {}
    with create_session() as session:
        for ti in session.query(TaskInstance).filter(TaskInstance.dag_id == "kafka_segment_compaction").all():
            if ti.duration is not None:
                steps[ti.task_id] = steps.get(ti.task_id, 0.0) + float(ti.duration)
    store = S3Store(make_client(endpoint_url=endpoint), BUCKET)
    doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
    by_class = doc["usage"].get("requests_by_class") or doc["usage"]["requests"]  # every request, by class
    requests = sum(sum(v.values()) for v in by_class.values())
    sizes = {info.key.removeprefix(run_dir(PREFIX, run_id)): info.size
             for info in store.list(run_dir(PREFIX, run_id))}
    peak_kib = _status_kib("VmHWM")
    compacted = int(doc["totals"].get("compacted", 0))
    return {"state": state, "run_id": run_id, "wall_s": round(wall, 1), "steps_s": steps,
            "totals": doc["totals"], "requests": requests,
            "requests_per_segment": round(requests / compacted, 2) if compacted else None,
            "documents": len(sizes), "largest_documents": sorted(sizes.items(), key=lambda kv: -kv[1])[:5],
            "airflow_peak_rss_mib": round(peak_kib / 1024, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", type=int, default=2000)
    p.add_argument("--segments", type=int, default=10, help="sealed segments per partition")
    p.add_argument("--spark-master", default="local[2]")
    p.add_argument("--json", type=Path, default=Path("bench/out/bench_dag_scale.json"))
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "bench")  # moto takes any credentials
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if args.child:
        print(json.dumps(child(args.endpoint, args.spark_master)))
        return 0
    from tiering.demo.s3 import airflow_env, prepare_airflow  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp, moto_process(BUCKET) as (store, endpoint, _):
        started = time.perf_counter()
        seed(store, args.partitions, args.segments)
        print(f"  seeded {args.partitions * args.segments:,} sealed segments in {time.perf_counter() - started:.0f} s",
              file=sys.stderr, flush=True)
        home = Path(tmp) / "airflow"
        prepare_airflow(home)
        env = {**os.environ, **airflow_env(home), "AWS_ENDPOINT_URL": endpoint}
        out = subprocess.run([sys.executable, __file__, "--child", "--endpoint", endpoint, "--spark-master",
                              args.spark_master], env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the DAG run failed (exit {out.returncode}): {out.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(partitions=args.partitions, segments_planned=args.partitions * args.segments)
    print(f"DAG run {result['state']}: {result['totals']}")
    print(f"{'step':<18} {'seconds':>9}")
    for step, seconds in result["steps_s"].items():
        print(f"{step:<18} {seconds:>9.1f}")
    print(f"{'whole run':<18} {result['wall_s']:>9.1f}")
    print(f"requests per compacted segment: {result['requests_per_segment']}; documents: {result['documents']}, "
          f"largest {result['largest_documents'][:3]}; Airflow process peak RSS {result['airflow_peak_rss_mib']} MiB")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
