"""A failed spark-submit says why in one line and is retried only when another attempt can help."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tiering.spark.submit import SparkJobFailed, SparkJobMisconfigured, failure, failure_summary, submit

JOB = Path(__file__).parents[2] / "spark_jobs" / "compact_segments.py"
TINY = "from pyspark.sql import SparkSession\n" \
       "spark = SparkSession.builder.getOrCreate()\n" \
       "print(spark.sparkContext.parallelize([1, 2], 2).map(lambda x: x + 1).collect())\n" \
       "spark.stop()\n"


def test_the_summary_is_the_root_cause_not_a_stack_frame() -> None:
    lines = ["Py4JJavaError: An error occurred while calling o42.collectToPython.",
             ": org.apache.spark.SparkException: Job aborted due to stage failure",
             "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(DAGScheduler.scala:2898)",
             'Caused by: java.io.IOException: Cannot run program "./env/bin/python": error=2, No such file',
             "\tat java.base/java.lang.ProcessImpl.forkAndExec(Native Method)",
             "\t... 17 more"]
    assert failure_summary(lines) == (
        "Py4JJavaError: An error occurred while calling o42.collectToPython. | Caused by: "
        'java.io.IOException: Cannot run program "./env/bin/python": error=2, No such file')
    assert isinstance(failure(1, lines, JOB), SparkJobMisconfigured)
    lost = ["ERROR TaskSchedulerImpl: Lost executor 1 on 10.0.0.2: worker lost",
            "Py4JJavaError: An error occurred while calling o42.collectToPython."]
    got = failure(1, lost, JOB)
    assert isinstance(got, SparkJobFailed)
    assert got.retryable
    assert got.found == "Py4JJavaError: An error occurred while calling o42.collectToPython."
    assert failure_summary(["starting", "\tat x.y(Z.java:1)", "done badly"]) == "starting | done badly"
    assert failure_summary(["tiering: the plan is gone", "Exception: x"]) == "tiering: the plan is gone"


@pytest.mark.slow
def test_an_executor_python_the_cluster_cannot_run_fails_once_naming_it(tmp_path: Path) -> None:
    job = tmp_path / "tiny.py"
    job.write_text(TINY)
    submit(job, [], master="local[1]", log=lambda line: None)  # the job itself is fine
    with pytest.raises(SparkJobMisconfigured) as e:
        submit(job, [], master="local[1]", conf={"spark.pyspark.python": str(tmp_path / "no-python")},
               log=lambda line: None)
    assert not e.value.retryable
    assert "Cannot run program" in str(e.value.found)
    assert "no-python" in str(e.value.found)


@pytest.mark.slow
def test_the_job_s_own_configuration_error_is_one_line_and_not_retried(tmp_path: Path) -> None:
    with pytest.raises(SparkJobMisconfigured) as e:
        submit(JOB, ["--plan", "plan.json", "--run-id", "r"], master="local[1]", log=lambda line: None)
    assert str(e.value.found).startswith("tiering: a plan is named by its manifest on S3")
    assert sys.executable  # the driver ran this interpreter
