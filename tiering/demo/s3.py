"""The pipeline demo: a moto S3 server on 127.0.0.1, a realistic ``logdir`` tree, the Airflow DAG run
twice with ``dag.test()`` (SQLite) and local Spark, and the savings it reports.

The bucket ``kafka-demo`` holds, under ``kafka/logs``: JSON click events written by snappy, lz4 and gzip
producers, uncompressed application log lines, an already-zstd topic, an incompressible topic, one
sealed segment without its indexes, one corrupt segment, and Kafka's internal ``__consumer_offsets``
(skipped). Every partition has sealed segments and an active one. The first run compacts; the second
must change no segment object (it only writes a new run document). A dry run goes first: it plans
and estimates the savings from sampled batches, and changes nothing. Working files go to the work
directory (replaced on each run): ``airflow/`` (AIRFLOW_HOME, SQLite), ``run-1.json``, ``run-2.json``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tiering.demo.inventory import write_inventory
from tiering.demo.seed import generate_partition, upload_partition
from tiering.errors import ConfigError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.run.pipeline import safe_run_id
from tiering.storage.layout import report_key, reserved_dir, run_key, run_result_key, segment_key
from tiering.storage.objects import ObjectStore
from tiering.storage.store import ObjectNotFound, S3Store, make_client

BUCKET: Final = "kafka-demo"
PREFIX: Final = "kafka/logs"
MARKER: Final = ".tiering-demo"
MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class DemoPartition:
    topic: str
    partition: int
    kind: str
    codec: Codec
    segments: int  # the last one is the active segment
    segment_mib: float


PARTITIONS: Final = (
    DemoPartition("clickstream.events", 0, "json", Codec.SNAPPY, 4, 1.0),
    DemoPartition("clickstream.events", 1, "json", Codec.LZ4, 4, 1.0),
    DemoPartition("clickstream.events", 2, "json", Codec.GZIP, 3, 1.0),
    DemoPartition("app_logs", 0, "logs", Codec.NONE, 3, 1.0),
    DemoPartition("app_logs", 1, "logs", Codec.NONE, 3, 1.0),
    DemoPartition("metrics.zstd", 0, "json", Codec.ZSTD, 3, 0.5),
    DemoPartition("payments.encrypted", 0, "random", Codec.NONE, 3, 0.5),
    DemoPartition("__consumer_offsets", 0, "json", Codec.NONE, 2, 0.25),
)
INDEXLESS: Final = ("app_logs", 1, 0)  # topic, partition, which segment loses its .index/.timeindex
CORRUPT: Final = ("clickstream.events", 1, 1)  # topic, partition, which segment gets a flipped byte


@dataclass(frozen=True, slots=True)
class Seeded:
    originals: dict[str, bytes]  # .log key -> bytes as seeded (the corrupt one as damaged)
    active: list[str]  # .log keys of the active segments
    corrupt: str
    indexless: str


def seed_demo(store: ObjectStore, scale: float = 1.0) -> Seeded:
    originals: dict[str, bytes] = {}
    active = []
    corrupt = indexless = ""
    for i, p in enumerate(PARTITIONS):
        generated = generate_partition(segments=p.segments, kind=p.kind, codec=p.codec,
                                       segment_bytes=max(64 * 1024, int(p.segment_mib * scale * MIB)), seed=i * 10)
        upload_partition(store, PREFIX, p.topic, p.partition, generated)
        for n, g in enumerate(generated):
            key = segment_key(PREFIX, p.topic, p.partition, g.base_offset, LOG_SUFFIX)
            data = g.log
            if (p.topic, p.partition, n) == CORRUPT:
                damaged = bytearray(data)
                damaged[len(damaged) // 2] ^= 0x5A
                data = bytes(damaged)
                store.put(key, data)
                corrupt = key
            if (p.topic, p.partition, n) == INDEXLESS:
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                    store.delete(segment_key(PREFIX, p.topic, p.partition, g.base_offset, suffix))
                indexless = key
            originals[key] = data
            if n == len(generated) - 1:
                active.append(key)
    return Seeded(originals, active, corrupt, indexless)


def segment_objects(store: ObjectStore) -> dict[str, str]:
    """Every object outside our reserved prefix, with its ETag."""
    reserved = reserved_dir(PREFIX)
    return {o.key: o.etag for o in store.list(PREFIX + "/") if not o.key.startswith(reserved)}


@contextlib.contextmanager
def moto_server(log: Callable[[str], None] | None = None) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (a free port, quiet) for the duration of the block; its endpoint URL,
    also given to ``log`` when there is one."""
    from moto.server import ThreadedMotoServer  # noqa: PLC0415 - only the demo and tests start one

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    if log is not None:
        log(f"moto S3 server on http://{host}:{port}")
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def dags_folder() -> Path:
    return Path(os.environ.get("TIERING_DAGS_FOLDER", Path(__file__).resolve().parents[2] / "dags"))


def airflow_env(home: Path) -> dict[str, str]:
    """The Airflow settings of the demo: its own AIRFLOW_HOME with SQLite, our DAGs, quiet logs."""
    return {"AIRFLOW_HOME": str(home.resolve()), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",  # SQLite: absolute
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder()), "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False"}


def prepare_airflow(home: Path) -> None:
    """Create the SQLite metadata database (``airflow db migrate``) once per AIRFLOW_HOME."""
    if (home / "airflow.db").exists():
        return
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **airflow_env(home)}
    airflow = Path(sys.executable).parent / "airflow"
    done = subprocess.run([str(airflow), "db", "migrate"], env=env, capture_output=True, text=True,  # noqa: S603
                          check=False)
    if done.returncode != 0:
        raise ConfigError("airflow db migrate failed", path=str(home), found=done.stderr[-500:])


def load_dag(name: str = "kafka_segment_compaction", attr: str = "compaction_dag") -> Any:
    """The DAG object ``attr`` of ``dags/<name>.py``."""
    path = dags_folder() / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError("cannot load the DAG file", path=str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attr)


def run_dag(conf: dict[str, Any], dag: Any = None) -> tuple[str, str]:
    """``dag.test()`` with ``conf`` (the compaction DAG by default); the DAG run's final state and our run id
    (its key-safe form)."""
    dag = dag or load_dag()
    dag_run = dag.test(run_conf=conf)
    return str(dag_run.state), safe_run_id(dag_run.run_id)


def _get_or_none(store: ObjectStore, key: str) -> bytes | None:
    try:
        return store.get(key)
    except ObjectNotFound:
        return None


def _clear(workdir: Path) -> None:
    if workdir.exists():
        if not (workdir / MARKER).exists():
            raise ConfigError("refusing to replace a directory the demo did not create", path=str(workdir),
                              expected=f"a directory holding {MARKER}", found="other files")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    (workdir / MARKER).write_text("created by `tiering demo`; the next run replaces this directory\n")


def run_pipeline_demo(workdir: Path, *, codec: Codec = Codec.ZSTD, level: int | None = None, scale: float = 1.0,
                      spark_master: str = "local[2]", log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole demo (see the module docstring); returns both runs' documents and the checks' inputs."""
    if not 0 < scale <= 20:
        raise ConfigError("demo scale out of range", expected="a number in (0, 20]", found=scale)
    _clear(workdir)
    home = workdir / "airflow"
    os.environ.update(airflow_env(home))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "demo")  # moto accepts any credentials; no AWS account is used
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    log("preparing Airflow (SQLite metadata database) ...")
    prepare_airflow(home)
    with moto_server(log) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        store = S3Store(make_client(), BUCKET)
        store.client.create_bucket(Bucket=BUCKET)
        log(f"seeding s3://{BUCKET}/{PREFIX} ...")
        seeded = seed_demo(store, scale)
        before = segment_objects(store)
        log(f"  {len(before)} objects in {len(PARTITIONS)} partitions, "
            f"{sum(len(v) for v in seeded.originals.values()) / MIB:.1f} MiB of .log")
        conf = {"bucket": BUCKET, "prefix": PREFIX, "codec": codec.label, "level": level,
                "min_segment_age_minutes": 0, "spark_master": spark_master}
        log("run 0: dry run (scan, plan with a savings estimate from sampled batches; nothing changes) ...")
        state, run_id = run_dag({**conf, "dry_run": True})
        plan = store.get_json(run_key(PREFIX, run_id, "plan", "manifest.json"))[0]
        dry_run = {"state": state, "run_id": run_id, "estimate": plan["estimate"],
                   "report": store.get_json(report_key(PREFIX, run_id))[0],
                   "changed": sorted(k for k, v in segment_objects(store).items() if before.get(k) != v)}
        log(f"run 0: {state}; estimated savings {plan['estimate']['saved_bytes_estimate']:,} bytes "
            f"({plan['estimate']['saved_bytes_low']:,} to {plan['estimate']['saved_bytes_high']:,})")
        runs = []
        for n in (1, 2):
            run_conf = conf
            if n == 2:  # the second run plans from an S3 Inventory report of the bucket, as a large bucket would
                uri = write_inventory(store, BUCKET, "inventory/kafka-demo/daily", store.list(""))
                run_conf = {**conf, "inventory": uri}
                log(f"  an S3 Inventory report of the bucket: {uri}")
            log(f"run {n}: dag kafka_segment_compaction (scan → plan → Spark {spark_master} → commit → report "
                "→ cleanup) ...")
            state, run_id = run_dag(run_conf)
            doc = store.get_json(run_result_key(PREFIX, run_id, "compact"))[0]
            (workdir / f"run-{n}.json").write_text(json.dumps(doc, indent=2) + "\n")
            runs.append({"state": state, "run_id": run_id, "document": doc, "objects": segment_objects(store),
                         "report": store.get_json(report_key(PREFIX, run_id))[0],
                         "plan_source": store.get_json(run_key(PREFIX, run_id, "plan", "manifest.json"))[0]["source"]})
            log(f"run {n}: {state}; {doc['totals']}")
            (workdir / f"report-run-{n}.html").write_bytes(store.get(report_key(PREFIX, run_id, "html")))
        after_first = runs[0]["objects"]
        changed_by_second = sorted(k for k in after_first if runs[1]["objects"].get(k) != after_first[k])
        finals = {key: store.get(key) for key in seeded.originals}
        final_indexes = {key: tuple(_get_or_none(store, key[: -len(LOG_SUFFIX)] + sfx)
                                    for sfx in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)) for key in seeded.originals}
    return {"bucket": BUCKET, "prefix": PREFIX, "endpoint": endpoint, "seeded": seeded, "before": before,
            "dry_run": dry_run, "runs": runs, "changed_by_second_run": changed_by_second, "finals": finals,
            "final_indexes": final_indexes,
            "report_keys": [f"s3://{BUCKET}/{report_key(PREFIX, r['run_id'], 'html')}" for r in runs],
            "local_copies": [str(workdir / f"report-run-{n}.html") for n in (1, 2)]}
