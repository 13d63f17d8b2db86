"""Run a PySpark job with ``spark-submit`` (the Spark that the ``pyspark`` package ships, or ``SPARK_HOME``).

The same call runs ``local[*]`` (the embedded default) or submits to a cluster (``spark://host:7077``
in client mode, ``yarn``, ``k8s://...``): only the master and the ``--conf`` pairs change. The job's
output is streamed line by line to ``log`` (task logs show progress); the environment is passed on as
it is (AWS endpoint and credentials included) and never printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final

from tiering.errors import ConfigError, TieringError
from tiering.spark.daemon import DAEMON_CONF, DAEMON_MODULE

TAIL_LINES: Final = 400  # of a job's output, kept to say why it failed
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
    """spark-submit exited with an error that another attempt may not meet (a lost executor, a cluster
    restarting, S3 failing for the driver): retryable. The job's log says why."""

    retryable = True


class SparkJobMisconfigured(ConfigError):
    """spark-submit failed for a reason another attempt meets again (a Python or program the cluster cannot
    find, a module missing on the executors, a bad master URL, no credentials): not retried."""


# Lines of a failed job's output that say why; and the markers of a configuration problem.
OURS: Final = re.compile(r"^tiering: .*")
# An exception of our package, as a Python worker's traceback ends (``tiering.storage.objects.NoCredentials: ...``):
# the root cause of a task's failure, below the driver's generic "exception from the Python worker".
OURS_RAISED: Final = re.compile(r"^tiering(\.\w+)+: .*")
RAISED: Final = re.compile(r"^(Exception in thread .*|[\w.$]*(Error|Exception)(: .*)?)$")
CAUSE: Final = re.compile(r"^Caused by: .*")
LOGGED: Final = re.compile(r".*\b(ERROR|FATAL)\b.*")
# Matched in the failure's summary only (a warning of a task attempt that was retried and succeeded is
# not the failure).
MISCONFIGURED: Final = ("Cannot run program", "ModuleNotFoundError", "No module named", "ImportError",
                        "ClassNotFoundException", "Could not parse Master URL", "Master must either be",
                        "Unable to locate credentials", "NoCredentials", "InvalidAccessKeyId",
                        "SignatureDoesNotMatch", "UnrecognizedOptionException", "Unrecognized option")
EXIT_CONFIG: Final = 2  # the job's own exit for a configuration error (tiering.errors.ExitCode.USAGE)


def failure_summary(lines: Sequence[str]) -> str:
    """Why a job failed, from its output: our job's own ``tiering:`` line; else the last exception of our
    package a task raised; else the last exception raised with its deepest ``Caused by``; else the last
    ERROR line; else the last lines (a stack frame alone says nothing, so frames are dropped)."""
    text = [line.strip() for line in lines
            if line.strip() and not line.strip().startswith(("at ", "..."))]
    for pattern in (OURS, OURS_RAISED):
        ours = [line for line in text if pattern.match(line)]
        if ours:
            return ours[-1][:500]
    raised = [line for line in text if RAISED.match(line)]
    causes = [line for line in text if CAUSE.match(line)]
    if raised or causes:
        return " | ".join(dict.fromkeys([*raised[-1:], *causes[-1:]]))[:500]
    logged = [line for line in text if LOGGED.match(line)]
    return (logged[-1] if logged else " | ".join(text[-3:]))[:500]


def failure(code: int, lines: Sequence[str], job: Path) -> TieringError:
    """The error for a spark-submit that exited with ``code``: retryable or not, by what its output says."""
    summary = failure_summary(lines)
    if code == EXIT_CONFIG or any(marker in summary for marker in MISCONFIGURED):
        return SparkJobMisconfigured(f"spark-submit exited with {code}: the job is misconfigured, and another "
                                     "attempt would fail the same way", path=str(job), found=summary)
    return SparkJobFailed(f"spark-submit exited with {code}", path=str(job), found=summary)


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
    """Run the job to its end; on a non-zero exit, :class:`SparkJobMisconfigured` (not retryable) or
    :class:`SparkJobFailed` (retryable), with the line of its output that says why."""
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
        tail: deque[str] = deque(maxlen=TAIL_LINES)
        for raw in proc.stdout:
            line = raw.rstrip()
            if line and not any(n in line for n in NOISE):
                log(line)
                tail.append(line)
        code = proc.wait()
    if code != 0:
        raise failure(code, list(tail), job)
