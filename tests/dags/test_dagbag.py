"""The DAG folder loads cleanly: no import errors, no heavy imports or I/O at parse time, validated params.

Runs in a subprocess with its own AIRFLOW_HOME, so Airflow's configuration stays out of pytest's process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

SCRIPT = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
dag = bag.dags.get("kafka_segment_compaction")
bad = {}
for name, value in {"codec": "brotli", "bucket": "A", "min_segment_age_minutes": -1, "max_segments": 0,
                    "level": 99, "dry_run": "yes", "lease_ttl_seconds": 0, "cleanup_grace_days": -1}.items():
    try:
        dag.params.get_param(name).resolve(value)
        bad[name] = "accepted"
    except Exception as e:
        bad[name] = type(e).__name__
tier = bag.dags.get("kafka_segment_tiering")
undo = bag.dags.get("kafka_segment_rollback")
print(json.dumps({
    "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
    "dags": sorted(bag.dags),
    "heavy_modules": [m for m in ("boto3", "pyspark", "moto") if m in sys.modules],
    "tiering_modules": sorted(m for m in sys.modules if m == "tiering" or m.startswith("tiering.")),
    "params": sorted(dag.params.keys()),
    "doc_md": dag.doc_md,
    "bad_values": bad,
    "tasks": sorted(dag.task_ids),
    "retries": {t.task_id: t.retries for t in dag.tasks},
    "outlets": [str(getattr(o, "name", o)) for o in dag.get_task("report").outlets],
    "schedule": str(dag.schedule),
    "tiering": {"tasks": sorted(tier.task_ids), "params": sorted(tier.params.keys()), "doc_md": tier.doc_md,
                "outlets": [str(getattr(o, "name", o)) for o in tier.get_task("report").outlets],
                "retries": sorted({t.retries for t in tier.tasks}), "schedule": str(tier.schedule)},
    "rollback": {"tasks": sorted(undo.task_ids), "params": sorted(undo.params.keys()), "doc_md": undo.doc_md,
                 "retries": sorted({t.retries for t in undo.tasks}), "schedule": str(undo.schedule)},
}))
"""


@pytest.mark.airflow
def test_dag_folder_loads_without_errors_or_heavy_imports(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(ROOT / "dags")], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["import_errors"] == {}
    assert facts["dags"] == ["kafka_segment_compaction", "kafka_segment_rollback", "kafka_segment_tiering"]
    assert facts["heavy_modules"] == []  # boto3 and pyspark load inside tasks only, and of tiering only the
    # options' declarations (the params are made from them) and what they need
    assert facts["tiering_modules"] == ["tiering", "tiering.documents", "tiering.errors", "tiering.options"]
    assert facts["tasks"] == ["cleanup", "compaction", "key_compaction", "merge", "plan", "report", "scan"]
    assert set(facts["retries"].values()) == {2}
    assert facts["outlets"] == ["kafka_segment_compaction_report"]
    assert facts["schedule"] == "@daily"
    for name in facts["params"]:
        assert f"`{name}`" in facts["doc_md"], f"param {name} is not explained in doc_md"
    assert {name: result for name, result in facts["bad_values"].items() if result == "accepted"} == {}
    tier = facts["tiering"]
    assert tier["tasks"] == ["report", "tier"]
    assert tier["outlets"] == ["kafka_segment_tiering_report"]
    assert tier["retries"] == [2]
    assert tier["schedule"] == "None"  # no TIERING_POLICY_FILE here: triggered runs only
    for name in tier["params"]:
        assert f"`{name}`" in tier["doc_md"], f"param {name} is not explained in the tiering doc_md"
    undo = facts["rollback"]
    assert (undo["tasks"], undo["retries"], undo["schedule"]) == (["rollback"], [2], "None")  # triggered by hand
    assert undo["params"] == ["bucket", "dag", "prefix", "undo"]
    for name in undo["params"]:
        assert f"`{name}`" in undo["doc_md"], f"param {name} is not explained in the rollback doc_md"


MASTER_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from kafka_segment_compaction import spark_master
print(json.dumps([spark_master(v) for v in ("conn:spark_cluster", "conn:bare_host", "local[2]", "yarn")]))
"""


@pytest.mark.airflow
def test_the_spark_master_can_come_from_an_airflow_connection(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW_CONN_SPARK_CLUSTER": json.dumps({"conn_type": "spark", "host": "spark://spark-master",
                                                     "port": 7077}),
           "AIRFLOW_CONN_BARE_HOST": json.dumps({"conn_type": "spark", "host": "10.1.2.3", "port": 7078})}
    done = subprocess.run([sys.executable, "-c", MASTER_SCRIPT, str(ROOT / "dags")], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "spark://spark-master:7077", "spark://10.1.2.3:7078", "local[2]", "yarn"]


@pytest.mark.airflow
def test_a_task_fails_at_once_on_what_another_attempt_would_meet_again() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from tiering.errors import ConfigError
    from tiering.storage.objects import TransportError

    sys.path.insert(0, str(ROOT / "dags"))
    try:
        from kafka_segment_compaction import fail_fast
    finally:
        sys.path.remove(str(ROOT / "dags"))

    @fail_fast
    def misconfigured() -> None:
        raise ConfigError("the policy file does not exist", path="policy.yaml")

    @fail_fast
    def flaky() -> None:
        raise TransportError("S3 did not answer in time; retryable")

    with pytest.raises(AirflowFailException, match=r"ConfigError: policy\.yaml: the policy file does not exist"):
        misconfigured()
    with pytest.raises(TransportError):
        flaky()
    with pytest.raises(KeyError):  # not ours: Airflow's retries decide
        fail_fast(lambda: {}["x"])()
    assert fail_fast(lambda: 3)() == 3


# The compaction DAG's params as Airflow hands them to a task (every one set), for the steps called directly.
STEP_PARAMS: dict[str, object] = {
    "bucket": "b", "prefix": "p", "topics": None, "codec": "zstd", "level": None, "min_segment_age_minutes": 0,
    "max_segments": None, "max_bytes": None, "dry_run": False, "cleanup_grace_days": 7, "lease_ttl_seconds": 600,
    "verify": "checksum", "swap": "auto", "inventory": "", "policy": "", "rebatch": False,
    "rebatch_max_bytes": 1 << 20, "compact_keys": False, "compact_keys_merge": True, "merge": False,
    "merge_target_bytes": 1 << 30}


def test_merging_runs_by_the_merge_param_or_by_a_policy_that_enables_it_never_both(tmp_path: Path) -> None:
    from tiering.demo.seed import seed_partition
    from tiering.errors import ConfigError
    from tiering.kafka.codecs import Codec
    from tiering.steps.compaction import CompactionParams, SparkJob, merge
    from tiering.storage.memory import MemoryStore

    never = SparkJob(tmp_path / "not-submitted.py", "local[1]", {})  # no branch below submits it
    params = dict(STEP_PARAMS)
    store = MemoryStore("b")
    seed_partition(store, "p", "metrics", 0, segments=4, kind="json", codec=Codec.NONE, segment_bytes=20_000)
    listed = {i.key: i.etag for i in store.list("p/")}
    assert merge(store, CompactionParams.from_params(params, "r"), never, print).run is None  # not asked
    dry = merge(store, CompactionParams.from_params({**params, "merge": True, "dry_run": True}, "r"), never, print)
    assert dry.run is None
    assert {i.key: i.etag for i in store.list("p/")} == listed  # a dry run changes nothing
    assert dry.forecast is not None
    forecast = dry.forecast.to_json()
    # three small sealed segments merged into one, the active one left: 4 -> 2 segments, 12 -> 6 objects
    assert {k: forecast[k] for k in ("groups", "segments_before", "segments_after", "objects_before",
                                     "objects_after")} == {"groups": 1, "segments_before": 4, "segments_after": 2,
                                                           "objects_before": 12, "objects_after": 6}
    assert dry.to_json()["dry_run"] is True
    off = tmp_path / "off.yaml"
    off.write_text("cluster:\n  compression.type: zstd\n")
    assert merge(store, CompactionParams.from_params({**params, "policy": str(off)}, "r"), never,
                 print).run is None  # no scope of the policy enables merging
    on = tmp_path / "on.yaml"
    on.write_text("topics:\n  - regex: 'metrics\\..*'\n    merge.enable: true\n")
    with pytest.raises(ConfigError, match=r"merge\.enable"):
        merge(store, CompactionParams.from_params({**params, "policy": str(on), "merge": True}, "r"), never, print)


def test_a_key_compaction_dry_run_says_what_the_pass_would_clean_and_changes_nothing(tmp_path: Path) -> None:
    from tiering.demo.seed import seed_partition
    from tiering.kafka.codecs import Codec
    from tiering.steps.compaction import CompactionParams, SparkJob, key_compaction
    from tiering.storage.memory import MemoryStore

    never = SparkJob(tmp_path / "not-submitted.py", "local[1]", {})  # a dry run submits nothing
    params = {**STEP_PARAMS, "topics": r"metrics\..*", "dry_run": True, "compact_keys": True}
    store = MemoryStore("b")
    seed_partition(store, "p", "metrics.a", 0, segments=4, kind="json", codec=Codec.NONE, segment_bytes=20_000)
    seed_partition(store, "p", "orders", 0, segments=4, kind="json", codec=Codec.NONE, segment_bytes=20_000)
    # a chosen partition of one segment: a pass only reads it, so it is not counted
    seed_partition(store, "p", "metrics.b", 0, segments=1, kind="json", codec=Codec.NONE, segment_bytes=20_000)
    listed = {i.key: (i.etag, i.size) for i in store.list("p/")}
    lines: list[str] = []
    dry = key_compaction(store, CompactionParams.from_params(params, "r"), never, lines.append)
    assert dry.run is None
    assert {i.key: (i.etag, i.size) for i in store.list("p/")} == listed
    sealed = sorted((k, size) for k, (_, size) in listed.items() if k.startswith("p/metrics.a-0/")
                    and k.endswith(".log"))[:-1]  # the pass reads all four and may clean all but the last
    assert dry.to_json() == {"dry_run": True, "partitions": 1, "segments": 3,
                             "log_bytes": sum(size for _, size in sealed)}
    assert any("3 segments it may clean" in line for line in lines), lines
