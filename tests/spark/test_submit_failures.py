"""A failed spark-submit says why in one line and is retried only when another attempt can help."""

from __future__ import annotations

from pathlib import Path

from tiering.spark.submit import SparkJobFailed, SparkJobMisconfigured, failure, failure_summary

JOB = Path(__file__).parents[2] / "spark_jobs" / "run_kind.py"
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
    # An executor without credentials (seen on the multi-host test's worker): the driver re-raises the Python
    # worker's error generically; the summary is the worker's own last line, and it is a configuration error.
    executor = ["pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:",
                "Traceback (most recent call last):",
                '  File "/w/app-1/0/env/lib/python3.11/site-packages/tiering/storage/s3.py", line 371, in _errors',
                "tiering.storage.s3.NoCredentials: s3://b/p/_tiering/runs/r/plan/manifest.json: get_object not "
                "sent: no complete AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a "
                "profile, or a role)",
                " SQLSTATE: 38000",
                "pyspark.errors.exceptions.captured.PythonException: An exception was thrown from the Python worker:"]
    assert failure_summary(executor).startswith("tiering.storage.s3.NoCredentials: s3://b/p/")
    assert isinstance(failure(1, executor, JOB), SparkJobMisconfigured)
    retried = ["WARN TaskSetManager: Lost task 0.0: java.io.FileNotFoundException: /blockmgr-1/x (No such file)",
               "WARN TaskSetManager: Lost task 0.0: ImportError: a flaky mount", *lost]
    assert isinstance(failure(1, retried, JOB), SparkJobFailed)  # a warning of a retried task is not the cause
