"""A Spark job's driver: the session, the work, and the driver's own failure said in one line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from tiering.errors import TieringError, exit_code


def run_driver(app_name: str, work: Callable[[Any], int]) -> int:
    """``work(spark)`` in a session named ``app_name``; a :class:`TieringError` of the driver's own (a plan
    or policy unreadable, S3 refusing) is printed in one line and becomes its exit code."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - only a job's driver needs Spark

    spark = SparkSession.builder.appName(app_name).getOrCreate()
    try:
        return work(spark)
    except TieringError as e:
        print(f"tiering: {e}", file=sys.stderr, flush=True)
        return int(exit_code(e))
    finally:
        spark.stop()
