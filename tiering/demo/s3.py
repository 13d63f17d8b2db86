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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tiering.cost.document import Report
from tiering.cost.forecast import Forecast
from tiering.demo.inventory import write_inventory
from tiering.demo.seed import generate_partition, upload_partition
from tiering.errors import ConfigError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.lifecycle.vocabulary import RunKind
from tiering.plan.planfile import PlanManifest
from tiering.run.documents import RunResult
from tiering.run.pipeline import safe_run_id
from tiering.storage.layout import (
    PlanName,
    plan_dir,
    plan_manifest_key,
    report_key,
    reserved_dir,
    run_result_key,
    segment_key,
)
from tiering.storage.objects import ObjectNotFound, ObjectStore
from tiering.storage.s3 import S3Store, make_client

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


def use_airflow_home(home: Path) -> None:
    """This process's Airflow: the demo's settings (:func:`airflow_env`) in its environment, and the metadata
    database under ``home`` prepared."""
    os.environ.update(airflow_env(home))
    prepare_airflow(home)


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


def run_dag(conf: Mapping[str, object], dag: Any = None) -> tuple[str, str]:
    """``dag.test()`` with ``conf`` (the compaction DAG by default); the DAG run's final state and our run id
    (its key-safe form)."""
    dag = dag or load_dag()
    dag_run = dag.test(run_conf=dict(conf))
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


@dataclass(frozen=True, slots=True)
class DemoRun:
    """One DAG run of the demo: its state, our run id, the run document, the report and the segment objects
    it left (key -> ETag)."""

    state: str
    run_id: str
    result: RunResult
    report: Report
    plan_source: str  # "listing", or the S3 Inventory manifest it planned from
    objects: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "run_id": self.run_id, "document": self.result.to_json(),
                "report": self.report.to_json(), "plan_source": self.plan_source}


@dataclass(frozen=True, slots=True)
class DryRun:
    """The demo's dry run: its forecast, its report, and the segment objects it changed (none)."""

    state: str
    run_id: str
    forecast: Forecast
    report: Report
    changed: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "run_id": self.run_id, "forecast": self.forecast.to_json(),
                "report": self.report.to_json(), "segment_objects_changed": list(self.changed)}


@dataclass(frozen=True, slots=True)
class PipelineDemo:
    """What the demo did: the dry run, both runs, and what the checks compare (the seeded and final bytes)."""

    bucket: str
    prefix: str
    seeded: Seeded
    dry_run: DryRun
    runs: tuple[DemoRun, DemoRun]
    changed_by_second_run: tuple[str, ...]
    finals: dict[str, bytes]  # .log key -> its bytes at the end
    final_indexes: dict[str, tuple[bytes | None, bytes | None]]  # .log key -> its .index and .timeindex
    report_keys: tuple[str, ...]  # the runs' HTML reports on S3 (the moto server is gone with the demo)
    local_copies: tuple[str, ...]  # and their copies in the work directory

    @property
    def ok(self) -> bool:
        """Every DAG run succeeded, the dry run changed nothing, and the second run no segment object."""
        return (self.dry_run.state == "success" and all(r.state == "success" for r in self.runs)
                and not self.dry_run.changed and not self.changed_by_second_run)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "bucket": self.bucket, "prefix": self.prefix, "dry_run": self.dry_run.to_json(),
                "runs": [r.to_json() for r in self.runs],
                "segment_objects_changed_by_run_2": list(self.changed_by_second_run),
                "reports": list(self.report_keys), "local_copies": list(self.local_copies)}


def _report(store: ObjectStore, run_id: str) -> Report:
    key = report_key(PREFIX, run_id)
    return Report.from_json(store.get_json(key)[0], f"s3://{store.bucket}/{key}")


def _plan_header(store: ObjectStore, run_id: str) -> PlanManifest:
    return PlanManifest.from_json(store.get_json(plan_manifest_key(PREFIX, run_id, PlanName.PLAN))[0])


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2: Airflow's and Spark's logs, warnings, child
    processes) appended to ``path`` for the duration of the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with path.open("ab") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            try:
                yield
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


def run_pipeline_demo(workdir: Path, *, codec: Codec = Codec.ZSTD, level: int | None = None, scale: float = 1.0,
                      spark_master: str = "local[2]", log: Callable[[str], None] = print,
                      tool_log: str | None = None) -> PipelineDemo:
    """The whole demo (see the module docstring). ``tool_log``: a file name in ``workdir`` that receives
    everything Airflow, Spark and the libraries print (``log`` must then write elsewhere than stdout and
    stderr, a terminal opened before, say)."""
    if not 0 < scale <= 20:
        raise ConfigError("demo scale out of range", expected="a number in (0, 20]", found=scale)
    _clear(workdir)
    with output_to(workdir / tool_log) if tool_log else contextlib.nullcontext():
        return _run(workdir, codec, level, scale, spark_master, log)


def _run(workdir: Path, codec: Codec, level: int | None, scale: float, spark_master: str,
         log: Callable[[str], None]) -> PipelineDemo:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "demo")  # moto accepts any credentials; no AWS account is used
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    log("preparing Airflow (its SQLite metadata database)")
    use_airflow_home(workdir / "airflow")
    with moto_server(log) as endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        store = S3Store(make_client(), BUCKET)
        store.client.create_bucket(Bucket=BUCKET)
        seeded = seed_demo(store, scale)
        before = segment_objects(store)
        log(f"seeded s3://{BUCKET}/{PREFIX}: {len(before)} objects in {len(PARTITIONS)} partitions, "
            f"{sum(len(v) for v in seeded.originals.values()) / MIB:.1f} MiB of .log")
        conf = {"bucket": BUCKET, "prefix": PREFIX, "codec": codec.label, "level": level,
                "min_segment_age_minutes": 0, "spark_master": spark_master}
        log("dry run: DAG kafka_segment_compaction with dry_run (scan, plan, forecast from sampled batches)")
        state, run_id = run_dag({**conf, "dry_run": True})
        forecast = _plan_header(store, run_id).header.estimate
        if forecast is None:
            raise ConfigError("the dry run's plan holds no forecast", path=plan_dir(PREFIX, run_id, PlanName.PLAN))
        dry_run = DryRun(state, run_id, forecast, _report(store, run_id),
                         tuple(sorted(k for k, v in segment_objects(store).items() if before.get(k) != v)))
        total = forecast.total
        log(f"dry run: {state}; forecast: saves {total.saved_bytes / MIB:.2f} MiB of {total.bytes_before / MIB:.2f} "
            f"MiB ({total.saved_low / MIB:.2f} to {total.saved_high / MIB:.2f} MiB)")
        runs = []
        for n in (1, 2):
            run_conf = conf
            if n == 2:  # the second run plans from an S3 Inventory report of the bucket, as a large bucket would
                uri = write_inventory(store, BUCKET, "inventory/kafka-demo/daily", store.list(""))
                run_conf = {**conf, "inventory": uri}
                log(f"run 2 plans from an S3 Inventory report of the bucket: {uri}")
            log(f"run {n}: DAG kafka_segment_compaction (scan, plan, compaction on Spark {spark_master}, report, "
                "cleanup)")
            state, run_id = run_dag(run_conf)
            key = run_result_key(PREFIX, run_id, RunKind.COMPACT)
            result = RunResult.from_json(store.get_json(key)[0], f"s3://{BUCKET}/{key}")
            (workdir / f"run-{n}.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
            report = _report(store, run_id)
            runs.append(DemoRun(state, run_id, result, report, _plan_header(store, run_id).source,
                                segment_objects(store)))
            t = report.totals
            log(f"run {n}: {state}; {t.segments_seen} segments: {t.segments_rewritten} rewritten, "
                f"{t.segments_skipped} skipped, {t.segments_failed} failed")
            (workdir / f"report-run-{n}.html").write_bytes(store.get(report_key(PREFIX, run_id, "html")))
        first, second = runs
        changed_by_second = tuple(sorted(k for k in first.objects if second.objects.get(k) != first.objects[k]))
        finals = {key: store.get(key) for key in seeded.originals}
        final_indexes = {key: (_get_or_none(store, key[: -len(LOG_SUFFIX)] + INDEX_SUFFIX),
                               _get_or_none(store, key[: -len(LOG_SUFFIX)] + TIME_INDEX_SUFFIX))
                         for key in seeded.originals}
    return PipelineDemo(BUCKET, PREFIX, seeded, dry_run, (first, second), changed_by_second, finals, final_indexes,
                        tuple(f"s3://{BUCKET}/{report_key(PREFIX, r.run_id, 'html')}" for r in runs),
                        tuple(str(workdir / f"report-run-{n}.html") for n in (1, 2)))
