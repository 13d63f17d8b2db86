"""The compaction DAG on a Spark cluster whose worker is another host that has neither this checkout, nor
its virtualenv, nor the Python it was built with: only Java, Spark, and the job archive the driver ships.

Hosts (network namespaces on one bridge, made and removed by the test, see hosts.py):

    here     the test, the Airflow task (dag.test) and the Spark driver it submits, in client mode
    master   the Spark standalone master
    worker   the Spark worker, in a private mount namespace where the checkout, the venv and the base
             Python are empty directories; Spark's distribution is mounted at a path of its own
    s3       the moto server every host reaches S3 at

The same partitions, seeded twice, are compacted once with ``local[2]`` and once on the cluster (with the
``TIERING_SPARK_CONF`` recipe of docs/dag.md): the segment objects must be byte-identical. Then the worker
is restarted without AWS credentials: the run must fail at once (no retry of the Spark task) saying why,
hold no lease, and leave the segments as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import needs
from tests.cluster.hosts import Hosts, available, hosts, wait_for_port
from tiering.demo.seed import seed_partition
from tiering.kafka.codecs import Codec
from tiering.spark.artifact import build
from tiering.storage.layout import lease_key, reserved_dir, run_result_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store, make_client

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.spark]  # hosts; a master and a worker
ROOT = Path(__file__).parents[2]
BUCKET, TOPIC, PARTITIONS = "multi-host", "orders", (0, 1)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "cluster", "AWS_SECRET_ACCESS_KEY": "cluster", "AWS_DEFAULT_REGION": "us-east-1"}
MOTO_PORT, MASTER_PORT, MASTER_UI = 5000, 7077, 8080


def _java_home() -> str:
    java = shutil.which("java")
    assert java is not None, "the Spark hosts need Java"
    return str(Path(java).resolve().parents[1])


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class Cluster:
    net: Hosts
    work: Path
    endpoint: str
    master: str
    artifact: Path

    def base_env(self) -> dict[str, str]:
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "JAVA_HOME": _java_home(),
                "LANG": "C.UTF-8"}

    def hidden(self) -> list[Path]:
        """What the worker host must not see: the checkout, the venv and the Python it was made from."""
        paths = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT.resolve()}
        return sorted(p for p in paths if not any(p != q and p.is_relative_to(q) for q in paths))

    def start_worker(self, name: str, *, credentials: bool) -> Path:
        spark = self.work / "worker-spark"  # Spark's distribution, at a path the mount namespace keeps
        work_dir = self.work / name
        work_dir.mkdir()
        env = {**self.base_env(), "SPARK_HOME": str(spark), "SPARK_WORKER_DIR": str(work_dir),
               "SPARK_LOG_DIR": str(work_dir), "HOME": str(work_dir), "AWS_EC2_METADATA_DISABLED": "true"}
        if credentials:  # as instance credentials would be: the worker's environment, never a --conf
            env |= {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}
        log = self.work / f"{name}.log"
        self.net.start("worker", [str(spark / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker",
                                  "--host", self.net.address["worker"], "--cores", "2", "--memory", "2g",
                                  "--work-dir", str(work_dir), self.master],
                       env=env, log=log, hide=self.hidden(), binds={_spark_home(): spark})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if any(w["state"] == "ALIVE" and w["host"] == self.net.address["worker"] for w in self.state()["workers"]):
                return work_dir
            time.sleep(0.5)
        raise AssertionError(f"the worker did not register:\n{log.read_text(errors='replace')[-3000:]}")

    def stop_workers(self) -> None:
        worker_ns = self.net.namespace["worker"]
        for proc in list(self.net.processes):
            if worker_ns in proc.args:  # type: ignore[operator]
                os.killpg(proc.pid, 9)
                proc.wait(timeout=30)
                self.net.processes.remove(proc)

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://{self.net.address['master']}:{MASTER_UI}/json/", timeout=5) as r:
            doc: dict[str, Any] = json.loads(r.read())
        return doc

    def run_dag(self, prefix: str, master: str, *, spark_conf: dict[str, str] | None = None
                ) -> tuple[dict[str, Any], str]:
        env = {**os.environ, **CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint}
        env.pop("TIERING_SPARK_CONF", None)
        if spark_conf is not None:
            env["TIERING_SPARK_CONF"] = json.dumps(spark_conf)
        conf = {"bucket": BUCKET, "prefix": prefix, "spark_master": master}
        done = subprocess.run([sys.executable, "-m", "tests.cluster.dag_run", str(self.work), json.dumps(conf)],
                              env=env, cwd=ROOT, capture_output=True, text=True, timeout=900, check=False)
        (self.work / f"dag-{prefix.replace('/', '-')}.log").write_text(done.stdout + done.stderr)
        assert done.returncode == 0, done.stderr[-4000:]
        facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return facts, done.stdout + done.stderr

    def cluster_conf(self) -> dict[str, str]:
        """docs/dag.md's recipe for a standalone cluster in client mode."""
        return {"spark.archives": f"{self.artifact}#env", "spark.pyspark.python": "./env/bin/python",
                "spark.pyspark.driver.python": sys.executable, "spark.driver.host": self.net.address["here"]}


def _store(endpoint: str) -> S3Store:
    return S3Store(make_client(endpoint_url=endpoint), BUCKET)  # the credentials: the cluster fixture's


def _seed(store: S3Store, prefix: str) -> None:
    for p in PARTITIONS:
        seed_partition(store, prefix, TOPIC, p, segments=3, kind="json", codec=Codec.SNAPPY, segment_bytes=60_000,
                       seed=p)


def _segments(store: S3Store, prefix: str) -> dict[str, bytes]:
    """The segment objects under ``prefix`` by their key below it, with their bytes."""
    return {o.key.removeprefix(prefix + "/"): store.get(o.key) for o in store.list(prefix + "/")
            if not o.key.startswith(reserved_dir(prefix))}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if why := available():
        needs.missing(needs.ROOT, f"separate hosts: {why}")
    work = tmp_path_factory.mktemp("multi-host")
    artifact = Path(str(build(work / "dist", source=ROOT, lock=ROOT / "requirements.lock")["archive"]))
    with pytest.MonkeyPatch.context() as env, hosts(["master", "worker", "s3"]) as net:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        s3 = net.address["s3"]
        moto_log = work / "moto.log"
        moto = net.start("s3", [sys.executable, "-m", "moto.server", "-H", s3, "-p", str(MOTO_PORT)],
                         env={**os.environ, **CREDENTIALS}, log=moto_log)
        wait_for_port(s3, MOTO_PORT, timeout=60, what="moto server", alive=moto, log=moto_log)
        _store(f"http://{s3}:{MOTO_PORT}").client.create_bucket(Bucket=BUCKET)
        master_log = work / "master.log"
        master = net.start("master", [str(_spark_home() / "bin" / "spark-class"),
                                      "org.apache.spark.deploy.master.Master", "--host", net.address["master"],
                                      "--port", str(MASTER_PORT), "--webui-port", str(MASTER_UI)],
                           env={"PATH": "/usr/bin:/bin", "JAVA_HOME": _java_home(), "SPARK_HOME": str(_spark_home()),
                                "SPARK_LOG_DIR": str(work), "HOME": str(work)}, log=master_log)
        wait_for_port(net.address["master"], MASTER_UI, timeout=90, what="Spark master", alive=master, log=master_log)
        yield Cluster(net, work, f"http://{s3}:{MOTO_PORT}", f"spark://{net.address['master']}:{MASTER_PORT}",
                      artifact)


def test_the_worker_host_sees_neither_the_checkout_nor_a_python_of_ours(cluster: Cluster) -> None:
    hide = cluster.hidden()
    binds = {_spark_home(): cluster.work / "worker-spark"}
    for probe in ([sys.executable, "-c", "print(1)"], ["ls", str(ROOT / "tiering")]):
        done = cluster.net.run("worker", probe, env=cluster.base_env(), hide=hide, binds=binds)
        assert done.returncode != 0, (probe, done.stdout)
    spark = cluster.net.run("worker", ["ls", str(cluster.work / "worker-spark" / "jars")], env=cluster.base_env(),
                            hide=hide, binds=binds)
    assert spark.returncode == 0
    assert "spark-core" in spark.stdout


@pytest.mark.airflow
def test_the_dag_on_the_cluster_writes_what_local_mode_writes(cluster: Cluster) -> None:
    store = _store(cluster.endpoint)
    _seed(store, "local/logs")
    _seed(store, "cluster/logs")
    local, _ = cluster.run_dag("local/logs", "local[2]")
    assert local["state"] == "success", local
    work_dir = cluster.start_worker("worker-1", credentials=True)
    remote, log = cluster.run_dag("cluster/logs", cluster.master, spark_conf=cluster.cluster_conf())
    assert remote["state"] == "success", log[-4000:]
    docs = {name: store.get_json(run_result_key(prefix, facts["run_id"], "compact"))[0]
            for name, prefix, facts in (("local", "local/logs", local), ("cluster", "cluster/logs", remote))}
    assert docs["cluster"]["totals"]["compacted"] == docs["local"]["totals"]["compacted"] == 2 * len(PARTITIONS)
    assert _segments(store, "cluster/logs") == _segments(store, "local/logs")
    # The stage ran on the worker host, from the shipped archive: the application's executor directory
    # holds the unpacked environment, and the master saw the application finish there.
    apps = [a for a in cluster.state()["completedapps"] if remote["run_id"] in a["name"]]
    assert len(apps) == 1
    unpacked = list(work_dir.glob(f"{apps[0]['id']}/*/env/bin/python"))
    assert unpacked, sorted(str(p) for p in work_dir.rglob("*"))[:50]
    cluster.stop_workers()


@pytest.mark.airflow
def test_an_executor_without_credentials_fails_the_run_at_once_and_holds_no_lease(cluster: Cluster) -> None:
    store = _store(cluster.endpoint)
    _seed(store, "nocreds/logs")
    before = _segments(store, "nocreds/logs")
    cluster.start_worker("worker-2", credentials=False)
    facts, log = cluster.run_dag("nocreds/logs", cluster.master, spark_conf=cluster.cluster_conf())
    cluster.stop_workers()
    assert facts["state"] == "failed"
    assert facts["tasks"]["compaction"] == ["failed", 1], [  # misconfigured: not retried
        line for line in log.splitlines() if "spark-submit exited" in line or "tiering:" in line][-5:]
    assert "credentials" in log
    assert "misconfigured" in log
    for p in PARTITIONS:
        with pytest.raises(ObjectNotFound):
            store.head(lease_key("nocreds/logs", f"{TOPIC}-{p}"))
    assert _segments(store, "nocreds/logs") == before
