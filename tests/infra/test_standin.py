"""The compose stack as this machine can run it (tests/infra/standin.py): every service of
docker-compose.yml on a host of its own, PostgreSQL from Debian's packages, and the DAG triggered through
Airflow's REST API as a user of the stack would, then waited for.

The stand-in reads docker-compose.yml and the Dockerfile instead of copying them; the static tests below
fail when either file says something the stand-in would not act on.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import needs
from tests.cluster.hosts import available
from tests.infra.standin import (
    COMPOSE_FILE,
    DOCKERFILE,
    POSTGRES_BIN,
    UNDERSTOOD,
    Api,
    services,
    standin,
    trigger_and_wait,
)
from tiering.run.pipeline import safe_run_id
from tiering.storage.layout import run_result_key
from tiering.storage.s3 import S3Store, make_client

COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())


def test_the_stand_in_acts_on_every_key_of_every_service() -> None:
    for name, svc in COMPOSE["services"].items():
        assert set(svc) <= UNDERSTOOD, (name, sorted(set(svc) - UNDERSTOOD))


def test_every_service_is_started_with_its_command_and_no_path_of_the_image_is_left(tmp_path: Path) -> None:
    found = services(tmp_path)
    assert set(found) == set(COMPOSE["services"])
    for name, svc in found.items():
        image_paths = [v for v in (*svc.command, *svc.env.values(), *(svc.healthcheck or ()))
                       if re.search(r"(?<![\w/.-])/opt/", v)]
        assert image_paths == [], name
        if name != "postgres":  # the one service whose image is not ours: started as its entrypoint would
            assert svc.command, name
            assert shutil.which(svc.command[0], path=svc.env["PATH"]) or Path(svc.command[0]).is_file(), svc.command
    order = list(found)
    for name, svc in found.items():
        assert all(order.index(dep) < order.index(name) for dep in svc.depends_on), name


def test_the_image_environment_and_the_services_environment_both_reach_a_service(tmp_path: Path) -> None:
    dockerfile = DOCKERFILE.read_text()
    scheduler = services(tmp_path)["airflow-scheduler"]
    image_env = dict(re.findall(r"\b(AIRFLOW_HOME|SPARK_HOME|PYSPARK_PYTHON)=(\S+)", dockerfile))
    assert set(image_env) <= set(scheduler.env)
    assert scheduler.env["AIRFLOW_HOME"] == str(tmp_path / "opt" / "airflow")
    assert Path(scheduler.env["SPARK_HOME"], "bin", "spark-class").is_file()
    compose_env = COMPOSE["services"]["airflow-scheduler"]["environment"]
    assert scheduler.env["AIRFLOW__CORE__EXECUTOR"] == compose_env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert scheduler.env["AWS_ENDPOINT_URL"] == compose_env["AWS_ENDPOINT_URL"]


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.postgres
@pytest.mark.airflow  # its api-server, scheduler and dag-processor
@pytest.mark.spark  # the stand-in's master and worker
def test_the_stack_runs_the_dag_triggered_through_the_rest_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    if why := available():
        needs.missing(needs.ROOT, f"separate hosts: {why}")
    if not (POSTGRES_BIN / "postgres").exists():
        needs.missing(needs.POSTGRES, f"PostgreSQL is not installed at {POSTGRES_BIN} (scripts/ensure-postgres.sh "
                                      "installs it)")
    with standin(tmp_path, log=lambda line: None, timeout=300) as stack:
        api_env = stack.services["airflow-apiserver"].env
        api = Api(f"http://{stack.address('airflow-apiserver')}:8080", api_env["AIRFLOW_ADMIN_USER"],
                  api_env["AIRFLOW_ADMIN_PASSWORD"])
        run = trigger_and_wait(api, "kafka_segment_compaction", {"min_segment_age_minutes": 0}, timeout=900)
        tasks = api.call("GET", f"/api/v2/dags/kafka_segment_compaction/dagRuns/{run['dag_run_id']}/taskInstances")
        states = {t["task_id"]: t["state"] for t in tasks["task_instances"]}
        assert run["state"] == "success", (states, stack.log_tail("airflow-scheduler"))
        seeded = stack.services["s3-seed"].env
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
            monkeypatch.setenv(name, seeded[name])
        store = S3Store(make_client(endpoint_url=f"http://{stack.address('s3')}:5000"), seeded["TIERING_BUCKET"])
        doc = store.get_json(run_result_key(seeded["TIERING_PREFIX"], safe_run_id(run["dag_run_id"]), "compact"))[0]
        assert doc["totals"]["compacted"] > 0
        assert states["compaction"] == "success"
        # The Spark stage ran on the stand-in's worker (the stack's spark_cluster connection), not in local mode.
        work_dir = Path(stack.services["spark-worker"].command[stack.services["spark-worker"].command.index(
            "--work-dir") + 1])
        assert len(list(work_dir.glob("app-*/*/stderr"))) == 1
