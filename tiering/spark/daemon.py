"""PySpark's worker daemon, started with the compaction job's imports done once instead of once per worker.

Spark starts one Python daemon per executor (``python -m pyspark.daemon``) and the daemon forks a worker
for each concurrent task; each worker then imports ``pyspark.worker`` and, with the first task, ``tiering``.
Two costs follow, measured on the 2-vCPU machine this was built on:

- Spark puts its own ``pyspark.zip`` first on the workers' ``PYTHONPATH``, and modules imported from a zip
  are compiled from source every time: ``import pyspark.worker`` takes ~1.0 s from the zip and ~0.2 s
  from the installed (byte-compiled) package;
- ``import tiering.run.pipeline`` (boto3, the codecs) takes ~0.35 s, in every worker.

With ``spark.python.daemon.module=tiering.spark.daemon`` the daemon takes the installed ``pyspark`` when it is
the very same version as the zip (their ``version.py`` files are compared), imports ``pyspark.worker`` and
``tiering.run.pipeline`` before it forks, and then runs Spark's own daemon loop: every worker starts with both
already in memory. None of these imports starts a thread (forking with threads alive is what Spark's daemon
guards against by importing after the fork; a test checks it stays so).

Only for executors whose Python has ``tiering`` installed (local mode, the docker-compose Spark worker, an
image built from requirements.lock): ``tiering.spark.submit`` sets it for ``local`` masters, a cluster sets it
in its Spark configuration. Shipping ``tiering`` with ``--py-files`` instead does not make it importable
before a task runs: keep Spark's default daemon there.
"""

from __future__ import annotations

import sys
import zipfile
from importlib.util import find_spec
from pathlib import Path

DAEMON_MODULE = "tiering.spark.daemon"
DAEMON_CONF = "spark.python.daemon.module"


def _spark_zips() -> list[str]:
    return [p for p in sys.path if p.endswith(".zip") and Path(p).name.startswith(("pyspark", "py4j"))]


def prefer_installed_pyspark() -> bool:
    """Drop Spark's zips from ``sys.path`` when the installed ``pyspark`` is the same version; True if done."""
    zips = _spark_zips()
    pyspark_zip = next((z for z in zips if Path(z).name == "pyspark.zip"), None)
    if pyspark_zip is None or "pyspark" in sys.modules:
        return False
    kept = [p for p in sys.path if p not in zips]
    saved, sys.path[:] = list(sys.path), kept
    try:
        spec = find_spec("pyspark")
        installed = Path(spec.origin).parent / "version.py" if spec and spec.origin else None
        with zipfile.ZipFile(pyspark_zip) as z:
            zipped = z.read("pyspark/version.py")
        same = installed is not None and installed.is_file() and zipped == installed.read_bytes()
    except (OSError, KeyError, zipfile.BadZipFile, ImportError):
        same = False
    if not same:
        sys.path[:] = saved
    return same


def main() -> None:
    prefer_installed_pyspark()
    import pyspark.worker  # noqa: F401, PLC0415 - imported before the fork, inherited by every worker
    from pyspark import daemon  # noqa: PLC0415

    import tiering.run.pipeline  # noqa: F401, PLC0415 - what the compaction tasks import

    daemon.manager()


if __name__ == "__main__":
    main()
