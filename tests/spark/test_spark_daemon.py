"""tiering.spark.daemon: the installed pyspark replaces Spark's zip only when it is the same version, the preloaded
imports start no thread (the daemon forks after them), and spark-submit gets the daemon for local masters only."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tiering.spark.daemon import DAEMON_CONF, DAEMON_MODULE
from tiering.spark.submit import LOCAL_DEFAULTS, spark_home, submit_command

SPARK_LIB = spark_home() / "python" / "lib"
_PROBE = """
import json, sys, threading
from tiering.spark.daemon import prefer_installed_pyspark
before = list(sys.path)
done = prefer_installed_pyspark()
import pyspark.worker, tiering.run.pipeline
print(json.dumps({"done": done, "same_path": sys.path == before, "pyspark": __import__("pyspark").__file__,
                  "threads": threading.active_count()}))
"""


def _probe(pythonpath: list[Path]) -> dict[str, object]:
    env = {"PYTHONPATH": ":".join(str(p) for p in pythonpath), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_installed_pyspark_replaces_the_same_version_zip() -> None:
    zips = sorted(SPARK_LIB.glob("*.zip"))
    assert any(z.name == "pyspark.zip" for z in zips)
    found = _probe(zips)
    assert found["done"] is True
    assert ".zip" not in str(found["pyspark"])
    assert found["threads"] == 1  # nothing imported before the daemon forks starts a thread


def test_a_zip_of_another_version_is_kept(tmp_path: Path) -> None:
    other = tmp_path / "pyspark.zip"
    with zipfile.ZipFile(SPARK_LIB / "pyspark.zip") as src, zipfile.ZipFile(other, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            dst.writestr(item, b'__version__: str = "0.0.1"\n' if item.filename == "pyspark/version.py" else data)
    found = _probe([other, *SPARK_LIB.glob("py4j*.zip")])
    assert found["done"] is False
    assert found["same_path"] is True
    assert str(found["pyspark"]).startswith(str(other))


@pytest.mark.parametrize(("master", "expected"), [("local[2]", DAEMON_MODULE), ("local", DAEMON_MODULE),
                                                  ("spark://host:7077", None), ("yarn", None)])
def test_submit_sets_the_daemon_for_local_masters_only(master: str, expected: str | None) -> None:
    cmd = submit_command(Path("job.py"), [], master=master)
    confs = [cmd[i + 1] for i, part in enumerate(cmd) if part == "--conf"]
    assert (f"{DAEMON_CONF}={DAEMON_MODULE}" in confs) is (expected is not None)
    assert all((f"{k}={v}" in confs) is (expected is not None) for k, v in LOCAL_DEFAULTS.items())
    explicit = submit_command(Path("job.py"), [], master=master, conf={DAEMON_CONF: "pyspark.daemon"})
    assert f"{DAEMON_CONF}=pyspark.daemon" in explicit
    assert f"{DAEMON_CONF}={DAEMON_MODULE}" not in explicit
