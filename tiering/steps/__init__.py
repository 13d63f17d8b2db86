"""The steps of every kind of run as the DAGs' tasks take them: typed inputs (the params, read once) to a typed
step document, whose JSON is the task's XCom (keys and counts only; the documents themselves are on S3).

A DAG file declares its tasks and params and calls these, one call per task; the sequencing, the Spark
submission, the reports and the sentences a task prints live here. Below them are the run layer's steps,
the same ones the CLI and the Spark jobs run.
"""

from collections.abc import Callable

from tiering.commit.operation import SegmentResult


def segment_lines(log: Callable[[str], None]) -> Callable[[SegmentResult], None]:
    """A run's progress in a task's log: a line for each segment it finishes, with its status and reason."""
    return lambda r: log(f"  {r.directory}/{r.base_offset:020d}: {r.status}" + (f" ({r.reason})" if r.reason else ""))
