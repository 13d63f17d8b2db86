"""Run a PySpark job with ``spark-submit`` (the Spark that the ``pyspark`` package ships, or ``SPARK_HOME``).

The same call runs ``local[*]`` (the embedded default) or submits to a cluster (``spark://host:7077``
in client mode, ``yarn``, ``k8s://...``): only the master and the ``--conf`` pairs change. The job's
output is streamed line by line to ``log`` (task logs show progress); the environment is passed on as
it is (AWS endpoint and credentials included) and never printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from tiering.errors import ConfigError, TieringError
from tiering.spark.daemon import DAEMON_CONF, DAEMON_MODULE

NOISE: Final = ("WARN NativeCodeLoader", "WARN Utils: Your hostname", "WARN Utils: Set SPARK_LOCAL_IP",
                "Using Spark's default log4j profile", "Setting default log level", "To adjust logging level")


LOCAL_DEFAULTS: Final = {
    # The executors are this machine's Python, with tiering installed: see tiering.spark.daemon.
    DAEMON_CONF: DAEMON_MODULE,
    # In local mode the driver JVM only coordinates (the work is in the Python workers), yet its C2 JIT and
    # parallel GC threads took ~4 s of CPU during a 12 s stage on 2 vCPUs, competing with the tasks. C1 only and
    # the serial collector cut that to ~1.4 s (see docs/benchmarks.md, "The Spark path").
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}
"""Configuration for ``local`` masters (the embedded default); anything the caller passes wins."""


class SparkJobFailed(TieringError):
    """spark-submit exited with an error (the job's log says why)."""

    retryable = True


def spark_home() -> Path:
    """``SPARK_HOME``, else the Spark distribution inside the installed ``pyspark`` package."""
    if os.environ.get("SPARK_HOME"):
        return Path(os.environ["SPARK_HOME"])
    import pyspark  # noqa: PLC0415 - only where a job is submitted

    return Path(pyspark.__file__).parent


def submit_command(job: Path, job_args: Sequence[str], *, master: str,
                   conf: Mapping[str, str] | None = None, py_files: Sequence[str] = ()) -> list[str]:
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", master]
    conf = dict(conf or {})
    if master.startswith("local"):
        conf = {**LOCAL_DEFAULTS, **conf}
    for key, value in sorted(conf.items()):
        cmd += ["--conf", f"{key}={value}"]
    if py_files:
        cmd += ["--py-files", ",".join(py_files)]
    return [*cmd, str(job), *job_args]


def submit(job: Path, job_args: Sequence[str], *, master: str, conf: Mapping[str, str] | None = None,
           py_files: Sequence[str] = (), log: Callable[[str], None] = print) -> None:
    """Run the job to its end; :class:`SparkJobFailed` on a non-zero exit."""
    if not job.is_file():
        raise ConfigError("the Spark job file does not exist", path=str(job))
    cmd = submit_command(job, job_args, master=master, conf=conf, py_files=py_files)
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)  # executors run this interpreter (local mode)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    env["SPARK_HOME"] = str(spark_home())
    log(f"spark-submit --master {master} {job.name} {' '.join(job_args)}")
    # The command is ours: the Spark binary, a job file, and arguments passed as a list (no shell).
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # noqa: S603
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        tail: list[str] = []
        for raw in proc.stdout:
            line = raw.rstrip()
            if line and not any(n in line for n in NOISE):
                log(line)
                tail = [*tail[-19:], line]
        code = proc.wait()
    if code != 0:
        raise SparkJobFailed(f"spark-submit exited with {code}", path=str(job), found=" | ".join(tail[-5:]))
