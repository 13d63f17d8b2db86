"""docker-compose.yml and its image, checked statically (no Docker engine here, no network).

What a `docker compose up` needs to end in a successful DAG run, as far as a file can show it: every
service the DAG uses, one image for Airflow and Spark (equal Python), pinned images, the Spark connection
resolving to the master's address, client-mode confs pointing the executors back at the scheduler, the S3
endpoint at the moto server, healthchecks and a start order, and no real credential anywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests import needs

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / "infra" / "docker" / "Dockerfile.dockerignore"
PG_REQUIREMENTS = ROOT / "infra" / "docker" / "requirements-postgres.txt"

POSTGRES, S3, SEED = "postgres", "s3", "s3-seed"
SPARK_MASTER, SPARK_WORKER = "spark-master", "spark-worker"
AIRFLOW_INIT, API_SERVER, SCHEDULER = "airflow-init", "airflow-apiserver", "airflow-scheduler"
DAG_PROCESSOR, TRIGGERER = "airflow-dag-processor", "airflow-triggerer"
AIRFLOW = (AIRFLOW_INIT, API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER)
ONE_SHOT = (AIRFLOW_INIT, SEED)
OUR_IMAGE = (S3, SEED, SPARK_MASTER, SPARK_WORKER, *AIRFLOW)
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment (mapping or list form), with compose's ${VAR:-default} taken at its default."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {str(k): compose_default(str(v)) for k, v in raw.items()}


def compose_default(value: str) -> str:
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def arg_after(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


def resolve_spark_master(conn: dict[str, Any]) -> str:
    """The contract the DAG implements for TIERING_SPARK_MASTER=conn:<id>: host (with or without spark://)
    plus :port."""
    host = str(conn["host"])
    url = host if "://" in host else f"spark://{host}"
    return f"{url}:{conn['port']}" if conn.get("port") else url


def test_every_service_the_dag_needs_is_there_and_runs_the_right_program(services: dict[str, Any]) -> None:
    assert set(services) == {POSTGRES, S3, SEED, SPARK_MASTER, SPARK_WORKER, *AIRFLOW}
    assert services[S3]["command"][0] == "moto_server"
    assert services[SEED]["command"] == ["python", "/opt/tiering/infra/seed_demo.py"]
    assert services[SPARK_MASTER]["command"][:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert services[SPARK_WORKER]["command"][:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    assert services[AIRFLOW_INIT]["command"] == ["airflow", "db", "migrate"]
    assert services[API_SERVER]["command"] == ["/opt/tiering/infra/start-api-server.sh"]
    assert services[SCHEDULER]["command"] == ["airflow", "scheduler"]
    assert services[DAG_PROCESSOR]["command"] == ["airflow", "dag-processor"]
    assert services[TRIGGERER]["command"] == ["airflow", "triggerer"]
    for name in AIRFLOW:
        assert env(services[name])["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor", name


def test_every_image_is_pinned(services: dict[str, Any]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for name, service in services.items():
        image = service["image"]
        _repo, sep, tag = image.rpartition(":")
        assert sep, f"{name}: {image} has no tag"
        assert "/" not in tag, f"{name}: {image} has no tag"
        assert tag not in {"", "latest"}, f"{name}: {image} is not pinned"
        if "build" in service:
            assert image == f"kafka-s3-tiering:{version}", name
    assert re.fullmatch(r"postgres:\d+\.\d+-bookworm", services[POSTGRES]["image"]), "postgres needs an exact tag"
    assert "build" not in services[POSTGRES]


def test_airflow_spark_and_s3_run_the_one_image_built_from_the_one_dockerfile(services: dict[str, Any]) -> None:
    """One image: the Spark driver (in the scheduler) and the executors (in the worker) run the same Python."""
    builds = {name: services[name]["build"] for name in OUR_IMAGE}
    assert all(b == {"context": ".", "dockerfile": "infra/docker/Dockerfile"} for b in builds.values()), builds
    assert len({services[name]["image"] for name in OUR_IMAGE}) == 1
    assert (ROOT / builds[SCHEDULER]["context"] / builds[SCHEDULER]["dockerfile"]).resolve() == DOCKERFILE
    assert sorted(p.name for p in ROOT.rglob("Dockerfile*") if ".venv" not in p.parts) == [
        "Dockerfile", "Dockerfile.dockerignore"]


def test_the_dockerfile_pins_python_3_11_and_installs_the_lock_then_the_package() -> None:
    text = dockerfile_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base.group(1)), base.group(1)
    assert "Python 3.11" in (ROOT / "requirements.lock").read_text().splitlines()[0]  # what the lock was made for
    froms = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert froms == ["${PYTHON_IMAGE}", "${PYTHON_IMAGE}"]  # build and runtime stages: the same Python
    lock = text.index("pip install -r requirements.lock")
    drivers = text.index("pip install -r infra/docker/requirements-postgres.txt")
    package = text.index("pip install --no-deps --no-build-isolation .")
    assert lock < drivers < package
    assert "openjdk-17-jre-headless" in text
    assert "SPARK_HOME=/opt/venv/lib/python3.11/site-packages/pyspark" in text
    assert "COPY dags /opt/tiering/dags" in text
    assert "COPY spark_jobs /opt/tiering/spark_jobs" in text
    assert re.search(r"^USER tiering$", text, re.MULTILINE), "services run as an unprivileged user"


def test_the_build_context_keeps_out_everything_the_image_does_not_copy() -> None:
    rules = [line for line in DOCKERIGNORE.read_text().splitlines() if line and not line.startswith("#")]
    assert rules[0] == "**"
    included = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    sources = set()
    for line in dockerfile_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources |= set(line.split()[1:-1])
    for source in sources:
        assert any(source == inc or source.startswith(inc + "/") for inc in included), source
        assert (ROOT / source).exists(), source
    assert ".venv" not in included
    assert ".git" not in included


def test_the_postgres_drivers_are_pinned_and_only_the_image_installs_them(services: dict[str, Any]) -> None:
    pins = [line for line in PG_REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.]*", p) for p in pins), pins
    names = {p.split("==")[0].lower() for p in pins}
    assert names == {"psycopg2-binary", "asyncpg"}
    locked = {line.split("==")[0].lower() for line in (ROOT / "requirements.lock").read_text().splitlines()}
    assert not names & locked
    url = urlsplit(env(services[SCHEDULER])["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    assert url.scheme == "postgresql+psycopg2"  # Airflow derives postgresql+asyncpg for its async engine
    assert url.hostname == POSTGRES
    assert url.port == 5432
    pg = env(services[POSTGRES])
    assert (url.username, url.password, url.path) == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"],
                                                      "/" + pg["POSTGRES_DB"])


def test_the_spark_connection_resolves_to_the_master_service_and_its_port(services: dict[str, Any]) -> None:
    airflow_env = env(services[SCHEDULER])
    master_arg = airflow_env["TIERING_SPARK_MASTER"]
    assert master_arg.startswith("conn:")
    conn_id = master_arg.removeprefix("conn:")
    conn = json.loads(airflow_env[f"AIRFLOW_CONN_{conn_id.upper()}"])
    assert conn["conn_type"] == "spark"
    url = resolve_spark_master(conn)
    assert url == "spark://spark-master:7077"
    parts = urlsplit(url)
    master = services[SPARK_MASTER]
    assert parts.hostname in {SPARK_MASTER, master.get("hostname")}
    assert parts.hostname == arg_after(master["command"], "--host")
    assert parts.port == int(arg_after(master["command"], "--port"))
    assert services[SPARK_WORKER]["command"][-1] == url  # the worker registers with the same master
    for name in AIRFLOW:  # every Airflow container resolves the same connection
        assert env(services[name])[f"AIRFLOW_CONN_{conn_id.upper()}"] == airflow_env[f"AIRFLOW_CONN_{conn_id.upper()}"]


def test_spark_runs_in_client_mode_with_the_driver_in_the_scheduler(services: dict[str, Any]) -> None:
    scheduler = services[SCHEDULER]
    conf = json.loads(env(scheduler)["TIERING_SPARK_CONF"])
    assert all(isinstance(v, str) for v in conf.values())  # spark-submit --conf key=value
    assert conf["spark.submit.deployMode"] == "client"
    assert conf["spark.python.daemon.module"] == "tiering.spark.daemon"  # tiering is installed in the image
    assert conf["spark.driver.host"] in {SCHEDULER, scheduler["hostname"]}
    assert scheduler["hostname"] == SCHEDULER
    ports = {int(conf["spark.driver.port"]), int(conf["spark.blockManager.port"])}
    assert len(ports) == 2
    assert ports <= {int(p) for p in scheduler["expose"]}
    # executors run the image's interpreter: the same Python 3.11 as the driver, by construction
    assert conf["spark.pyspark.python"] == conf["spark.pyspark.driver.python"] == "/opt/venv/bin/python"
    assert "RUN python -m venv /opt/venv" in dockerfile_text()
    assert "COPY --from=build /opt/venv /opt/venv" in dockerfile_text()
    worker = services[SPARK_WORKER]["command"]
    assert int(conf["spark.cores.max"]) <= int(arg_after(worker, "--cores"))


def test_the_s3_endpoint_is_the_moto_service_for_driver_executors_and_seed(services: dict[str, Any]) -> None:
    moto = services[S3]["command"]
    for name in (SEED, SPARK_WORKER, *AIRFLOW):
        aws = env(services[name])
        endpoint = urlsplit(aws["AWS_ENDPOINT_URL"])
        assert (endpoint.scheme, endpoint.hostname) == ("http", S3), name
        assert endpoint.port == int(arg_after(moto, "-p")), name
        assert aws["AWS_DEFAULT_REGION"] == "us-east-1", name
        assert aws["AWS_ACCESS_KEY_ID"], name
        assert aws["AWS_SECRET_ACCESS_KEY"], name
    assert arg_after(moto, "-H") == "0.0.0.0"


def test_the_dag_defaults_name_the_seeded_demo_bucket(services: dict[str, Any]) -> None:
    from tiering.demo.s3 import BUCKET, PREFIX

    for name in (SEED, *AIRFLOW):
        assert (env(services[name])["TIERING_BUCKET"], env(services[name])["TIERING_PREFIX"]) == (BUCKET, PREFIX)


def test_airflow_settings_agree_across_components(services: dict[str, Any]) -> None:
    envs = {name: env(services[name]) for name in AIRFLOW}
    base = dict(envs[SCHEDULER])
    for name, values in envs.items():
        extra = {"AIRFLOW_ADMIN_USER", "AIRFLOW_ADMIN_PASSWORD"} if name == API_SERVER else set()
        assert {k: v for k, v in values.items() if k not in extra} == base, name
    assert base["AIRFLOW__CORE__DAGS_FOLDER"] == "/opt/tiering/dags"
    assert (ROOT / "dags" / "kafka_segment_compaction.py").exists()
    api = urlsplit(base["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"])
    assert (api.hostname, api.port, api.path) == (API_SERVER, 8080, "/execution/")
    assert "127.0.0.1:8080:8080" in services[API_SERVER]["ports"]
    assert len(base["AIRFLOW__API_AUTH__JWT_SECRET"]) >= 64  # HS512 wants a 64-byte key
    assert base["AIRFLOW__API__SECRET_KEY"]
    assert base["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert base["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith("/opt/airflow/")
    assert envs[API_SERVER]["AIRFLOW_ADMIN_PASSWORD"] == "admin"
    assert base["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "True"
    for name in AIRFLOW:
        assert "airflow-logs:/opt/airflow/logs" in services[name]["volumes"], name


def test_long_running_services_have_healthchecks_and_one_shots_do_not_restart(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if name in ONE_SHOT:
            assert service.get("restart") == "no", name
            assert "healthcheck" not in service, name
            continue
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert check["test"][0] in {"CMD", "CMD-SHELL"}, name
        assert len(check["test"]) > 1, name
        assert service.get("restart") == "unless-stopped", name
    assert "8974/health" in " ".join(services[SCHEDULER]["healthcheck"]["test"])
    assert "/api/v2/monitor/health" in " ".join(services[API_SERVER]["healthcheck"]["test"])


def test_start_order(services: dict[str, Any]) -> None:
    def deps(name: str) -> dict[str, str]:
        return {d: spec["condition"] for d, spec in (services[name].get("depends_on") or {}).items()}

    for name in services:
        for dep, condition in deps(name).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            assert condition in CONDITIONS, (name, dep)
            if condition == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
            if condition == "service_completed_successfully":
                assert dep in ONE_SHOT, (name, dep)
    assert deps(AIRFLOW_INIT) == {POSTGRES: "service_healthy"}
    assert deps(SEED) == {S3: "service_healthy"}
    assert deps(SPARK_WORKER) == {SPARK_MASTER: "service_healthy"}
    for name in (API_SERVER, SCHEDULER, DAG_PROCESSOR, TRIGGERER):
        assert deps(name)[AIRFLOW_INIT] == "service_completed_successfully", name
    # the scheduler runs the tasks: the bucket is seeded and the cluster is up before the DAG can run
    assert deps(SCHEDULER)[SEED] == "service_completed_successfully"
    assert deps(SCHEDULER)[SPARK_WORKER] == "service_healthy"
    assert deps(SCHEDULER)[API_SERVER] == "service_healthy"

    seen: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"dependency cycle: {(*path, name)}"
        if name not in seen:
            for dep in deps(name):
                visit(dep, (*path, name))
            seen.add(name)

    for name in services:
        visit(name, ())


def test_published_ports_are_on_loopback_only(services: dict[str, Any]) -> None:
    published = [(name, p) for name, s in services.items() for p in s.get("ports", [])]
    assert published
    assert all(str(p).startswith("127.0.0.1:") for _, p in published), published


def _strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return [str(node)] if node is not None else []


def test_no_real_credentials(compose: dict[str, Any], services: dict[str, Any]) -> None:
    text = COMPOSE_FILE.read_text()
    assert not re.search(r"\b(AKIA|ASIA)[A-Z0-9]{16}\b", text), "an AWS access key id"
    assert "-----BEGIN" not in text
    for value in _strings(compose):
        assert not re.fullmatch(r"[A-Za-z0-9/+]{40}", value), f"looks like a secret access key: {value[:4]}..."
    demo = {"", "demo", "airflow", "admin"}
    for name, service in services.items():
        for key, value in env(service).items():
            if re.search(r"SECRET|PASSWORD|TOKEN|_KEY\b|FERNET", key) and not key.endswith(("_FILE", "_KEY_ID")):
                assert value in demo or value.startswith("demo-only-"), f"{name}: {key} is not a demo value"
        assert env(service).get("AWS_ACCESS_KEY_ID", "demo") == "demo", name


def test_seed_refuses_a_bucket_or_prefix_the_demo_does_not_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    seed = _load_seed_script()
    monkeypatch.setenv("TIERING_BUCKET", "kafka-demo")
    monkeypatch.setenv("TIERING_PREFIX", "other/logs")
    assert seed.main() == 2  # before any S3 request


def test_seed_leaves_a_bucket_that_already_holds_the_prefix_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    from tiering.demo.s3 import BUCKET, PREFIX
    from tiering.storage.s3 import make_client

    seed = _load_seed_script()
    for key, value in {"AWS_ACCESS_KEY_ID": "demo", "AWS_SECRET_ACCESS_KEY": "demo", "AWS_DEFAULT_REGION": "us-east-1",
                       "TIERING_BUCKET": BUCKET, "TIERING_PREFIX": PREFIX}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with mock_aws():
        client = make_client()
        client.create_bucket(Bucket=BUCKET)
        client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/topic-0/00000000000000000000.log", Body=b"compacted")
        assert seed.main() == 0
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"]]
    assert keys == [f"{PREFIX}/topic-0/00000000000000000000.log"]


def _load_seed_script() -> Any:
    spec = importlib.util.spec_from_file_location("seed_demo", ROOT / "infra" / "docker" / "seed_demo.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_server_script_writes_the_admin_login_then_starts_airflow(tmp_path: Path) -> None:
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "airflow").write_text('#!/bin/sh\necho "airflow $*"\n')
    (fake_bin / "airflow").chmod(0o755)
    (fake_bin / "python").symlink_to(sys.executable)
    passwords = tmp_path / "passwords.json"
    done = subprocess.run(["bash", str(ROOT / "infra" / "docker" / "start-api-server.sh")], capture_output=True,
                          text=True, check=False, timeout=60,
                          env={"PATH": f"{fake_bin}:/usr/bin:/bin", "AIRFLOW_ADMIN_USER": "admin",
                               "AIRFLOW_ADMIN_PASSWORD": 'pa"ss',
                               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "airflow api-server --port 8080"
    assert json.loads(passwords.read_text()) == {"admin": 'pa"ss'}
    assert passwords.stat().st_mode & 0o077 == 0


@pytest.mark.docker
def test_docker_compose_config_accepts_the_file_when_a_compose_v2_client_is_here() -> None:
    """`docker compose config` needs no engine; skipped where the compose plugin is missing (as here)."""
    docker = shutil.which("docker")
    if docker is None:
        needs.missing(needs.DOCKER_COMPOSE, "no docker client")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False, timeout=30)
    if probe.returncode != 0:
        needs.missing(needs.DOCKER_COMPOSE, "the docker client has no compose plugin")
    done = subprocess.run([docker, "compose", "-f", str(COMPOSE_FILE), "config", "--format", "json"],
                          capture_output=True, text=True, check=False, timeout=60, cwd=ROOT,
                          env={**os.environ, "COMPOSE_PROJECT_NAME": "kafka-s3-tiering"})
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)["services"]) == {POSTGRES, S3, SEED, SPARK_MASTER, SPARK_WORKER, *AIRFLOW}
