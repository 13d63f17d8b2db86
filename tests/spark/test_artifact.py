"""The executor environment archive: reproducible, and it runs the job's code on a host that has neither
this checkout, nor its virtualenv, nor the Python it was built with."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests import needs
from tiering.spark.artifact import ARCHIVE, build

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden" / "logdir" / "events-snappy-0" / "00000000000000000000.log"
# Rewrites a Kafka-written segment to zstd and reads the result back: the codecs, the compiled proof and
# walker, and the records digest of source and copy, all from the archive.
WORK = """
import io, json, sys, tiering
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions, read_back, rewrite_segment
import tiering.kafka._proof, tiering.kafka._walker, boto3, crc32c, xxhash, yaml
from tiering.run.engine import unit_task
src = open(sys.argv[1], "rb").read()
out = io.BytesIO()
result = rewrite_segment(io.BytesIO(src), out, base_offset=0, options=RewriteOptions(Codec.ZSTD))
back = read_back(io.BytesIO(out.getvalue()), base_offset=0)
print(json.dumps({"prefix": sys.prefix, "module": tiering.__file__, "bytes_in": len(src),
                  "bytes_out": len(out.getvalue()), "same_records": back.payload_xxh3 == result.stats.payload_xxh3,
                  "proof": tiering.kafka._proof.library(), "path": sys.path}))
"""


def _bare(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` in a private mount namespace where the checkout, the venv and the base Python are empty."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), ROOT}
    hidden = sorted(str(p) for p in paths if not any(p != q and p.is_relative_to(q) for q in paths))
    mounts = " && ".join(f"mount -t tmpfs none '{h}'" for h in hidden)
    script = f"{mounts} && exec \"$@\""
    return subprocess.run(["unshare", "--mount", "--fork", "sh", "-c", script, "bare", *command],
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--mount", "true"], check=False).returncode:
        needs.missing(needs.ROOT, "needs unshare --mount (root in a Linux host or container)")
    return build(tmp_path_factory.mktemp("artifact"), source=ROOT, lock=ROOT / "requirements.lock")


@pytest.mark.root  # the archive is built once the fixture has found root's unshare
def test_the_archive_is_reproducible_and_holds_no_path_of_the_build_host(
        built: dict[str, object], tmp_path: Path) -> None:
    again = build(tmp_path, source=ROOT, lock=ROOT / "requirements.lock")
    assert again["sha256"] == built["sha256"]
    assert hashlib.sha256((tmp_path / ARCHIVE).read_bytes()).hexdigest() == again["sha256"]
    with tarfile.open(str(built["archive"])) as tar:
        names = tar.getnames()
        assert {"bin/python", "tiering-job-env.json"} <= set(names)
        assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
        assert not any(n.split("/")[-1] in ("pyspark", "airflow") for n in names)  # the worker's Spark has pyspark
        assert {m.mtime for m in tar.getmembers()} == {315532800}
        launcher = tar.extractfile("bin/python")
        assert launcher is not None
        assert str(ROOT).encode() not in launcher.read()
    assert int(str(built["bytes"])) < 80 << 20


@pytest.mark.root
def test_the_job_s_code_runs_from_the_archive_on_a_bare_host(built: dict[str, object], tmp_path: Path) -> None:
    env = tmp_path / "somewhere-else" / "env"
    env.mkdir(parents=True)
    with tarfile.open(str(built["archive"])) as tar:
        tar.extractall(env, filter="data")
    segment = tmp_path / "segment.log"
    shutil.copyfile(GOLDEN, segment)
    done = _bare([str(env / "bin" / "python"), "-c", WORK, str(segment)])
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["prefix"] == str(env)
    assert facts["module"].startswith(str(env))
    assert facts["same_records"]
    assert facts["proof"].startswith(str(env)), facts["proof"]  # the zstandard package's libzstd, archived
    assert 0 < facts["bytes_out"] < facts["bytes_in"]
    assert not any(str(ROOT) in p or p.startswith(sys.base_prefix) for p in facts["path"])
    missing = _bare([sys.executable, "-c", "print(1)"])  # the build's own Python is not there
    assert missing.returncode != 0


def _third_party_imports(entries: list[Path]) -> set[str]:
    """The top-level modules outside the standard library and this package that the files ``entries`` import,
    directly or through modules of the package (imports inside functions included)."""
    import ast

    package = ROOT / "tiering"
    seen: set[Path] = set()
    todo = list(entries)
    found: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen or not path.exists():
            continue
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                if top == "tiering":
                    parts = name.split(".")[1:]
                    module = package.joinpath(*parts)
                    todo += [module.with_suffix(".py"), module / "__init__.py"]
                elif top not in sys.stdlib_module_names:
                    found.add(top)
    return found


def test_the_archive_holds_every_package_the_executor_entries_import() -> None:
    """What a Spark task imports (the job, whose tasks build their store, and what it reaches in the
    package) is in the archive: a package missing there fails every task on a real cluster, and nowhere else."""
    from importlib.metadata import packages_distributions

    from tiering.spark.artifact import RUNTIME

    provided = {"pyspark"}  # the worker's Spark
    dists = packages_distributions()
    jobs = sorted((ROOT / "spark_jobs").glob("*.py"))
    assert [j.name for j in jobs] == ["run_kind.py"]
    imported = _third_party_imports(jobs) - provided
    needed = {d.lower() for m in imported for d in dists.get(m, [m])}
    assert needed <= {r.lower() for r in RUNTIME}, sorted(needed - {r.lower() for r in RUNTIME})
