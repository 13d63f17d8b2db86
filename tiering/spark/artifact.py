"""The Spark job's executor environment as one archive that runs on a bare worker.

    python -m tiering.spark.artifact --out dist/        (make spark-artifact)

builds ``dist/tiering-job-env.tar.gz``: a relocatable Python (this interpreter's binary, its shared
library and its standard library, without the test suites, IDLE and Tk), the packages the executors
import (boto3 and its dependencies, the codecs, crc32c, zlib-ng, xxhash, PyYAML; not Airflow, not pyspark: the
worker's Spark provides pyspark), and the ``tiering`` wheel with its compiled extensions for this
platform. ``env/bin/python`` is a small launcher that finds its own directory, so the archive works
wherever Spark unpacks it (``spark.archives=...tiering-job-env.tar.gz#env`` and
``spark.pyspark.python=./env/bin/python``; see docs/deploying.md). Nothing in it points back to the build
host. The archive is reproducible: entries sorted, times, owners and modes normalized, no bytecode.
The workers need the same platform as the build host (Linux, the same CPU architecture, a glibc at least
as new) and a shell at ``/bin/sh``.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tiering.errors import ConfigError

ARCHIVE: Final = "tiering-job-env.tar.gz"
# What the executors import, pinned by requirements.lock (boto3's own dependencies included).
RUNTIME: Final = ("boto3", "botocore", "s3transfer", "jmespath", "urllib3", "python-dateutil", "six",
                  "python-snappy", "cramjam", "lz4", "zstandard", "crc32c", "zlib-ng", "xxhash", "PyYAML", "msgspec")
STDLIB_LEFT_OUT: Final = frozenset({"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip",
                                    "lib2to3", "__pycache__", "pydoc_data", "venv"})
EPOCH: Final = 315532800  # 1980-01-01, the earliest time a zip (a wheel) can hold: every entry's mtime
LAUNCHER: Final = """#!/bin/sh
# The job's Python, wherever the archive was unpacked (no path of the build host in it).
here=$(cd "$(dirname "$0")/.." && pwd)
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONHOME="$here" PYTHONNOUSERSITE=1 \\
  exec "$here/bin/python%(version)s" "$@"
"""


def pins(lock: Path, names: tuple[str, ...] = RUNTIME) -> list[str]:
    """``name==version`` for each of ``names``, from the lock file."""
    wanted = {n.lower(): n for n in names}
    found: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.lower() in wanted:
            found[name.lower()] = f"{wanted[name.lower()]}=={version.split(';')[0].strip()}"
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ConfigError("the lock file does not pin every package the executors need", path=str(lock),
                          expected=", ".join(names), found=f"missing {', '.join(missing)}")
    return [found[n.lower()] for n in names]


def _copy_python(env: Path) -> str:
    """This interpreter's binary, shared library and standard library into ``env``; its version."""
    version = sysconfig.get_python_version()
    base = Path(sys.base_prefix)
    (env / "bin").mkdir(parents=True)
    shutil.copy2(Path(sys.executable).resolve(), env / "bin" / f"python{version}")
    (env / "lib").mkdir()
    soname = sysconfig.get_config_var("INSTSONAME")  # the name the binary links against: libpython3.11.so.1.0
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and soname:
        shutil.copy2((Path(sysconfig.get_config_var("LIBDIR")) / soname).resolve(), env / "lib" / soname)
    stdlib = Path(sysconfig.get_paths(vars={"installed_base": str(base), "base": str(base)})["stdlib"])
    shutil.copytree(stdlib, env / "lib" / f"python{version}", symlinks=False,
                    ignore=lambda d, names: [n for n in names if n in STDLIB_LEFT_OUT or n.endswith(".pyc")
                                             or (n.startswith("config-") and Path(d) == stdlib)])
    (env / "lib" / f"python{version}" / "site-packages").mkdir()
    launcher = env / "bin" / "python"
    launcher.write_text(LAUNCHER % {"version": version})
    launcher.chmod(0o755)
    return version


def _pip(*args: str) -> None:
    # The command is ours: this interpreter's pip with fixed arguments, no shell.
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args],  # noqa: S603
                   check=True)


def _entries(root: Path) -> Iterator[Path]:
    yield root
    for path in sorted(root.iterdir()):
        if path.is_dir() and not path.is_symlink():
            yield from _entries(path)
        else:
            yield path


def _normalized(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.mtime = EPOCH
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def write_archive(env: Path, out: Path) -> str:
    """``env`` as a reproducible ``.tar.gz`` at ``out`` (entries under ``env/``... relative names); its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _entries(env):
            name = path.relative_to(env).as_posix()
            if name == ".":
                continue
            tar.add(path, arcname=name, recursive=False, filter=_normalized)
    with out.open("wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    return hashlib.sha256(out.read_bytes()).hexdigest()


def build(out_dir: Path, *, source: Path, lock: Path) -> dict[str, object]:
    """Build the archive in ``out_dir`` from the project at ``source``; what it holds."""
    if sys.platform != "linux":
        raise ConfigError("the executor environment is built on the workers' platform", expected="linux",
                          found=sys.platform)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiering-artifact-") as tmp:
        env, wheels = Path(tmp) / "env", Path(tmp) / "wheels"
        version = _copy_python(env)
        _pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(wheels), str(source))
        [wheel] = sorted(wheels.glob("*.whl"))
        site = env / "lib" / f"python{version}" / "site-packages"
        packages = pins(lock)
        _pip("install", "--no-deps", "--no-compile", "--only-binary=:all:", "--target", str(site), *packages)
        _pip("install", "--no-deps", "--no-compile", "--target", str(site), str(wheel))
        for cache in site.rglob("__pycache__"):
            shutil.rmtree(cache)
        for direct_url in site.glob("*.dist-info/direct_url.json"):  # names the build host's wheel path
            direct_url.unlink()
        for record in site.glob("*.dist-info/RECORD"):
            record.write_text("".join(line + "\n" for line in record.read_text().splitlines()
                                      if "direct_url.json" not in line))
        manifest = {"python": version, "platform": sysconfig.get_platform(), "wheel": wheel.name,
                    "packages": packages}
        (env / "tiering-job-env.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        archive = out_dir / ARCHIVE
        digest = write_archive(env, archive)
    return {**manifest, "archive": str(archive), "bytes": archive.stat().st_size, "sha256": digest}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("dist"), help="directory for the archive (default: dist)")
    p.add_argument("--source", type=Path, default=Path(__file__).resolve().parents[2],
                   help="the project to build the wheel from (default: this checkout)")
    p.add_argument("--lock", type=Path, default=None, help="pinned versions (default: SOURCE/requirements.lock)")
    args = p.parse_args(argv)
    built = build(args.out, source=args.source, lock=args.lock or args.source / "requirements.lock")
    print(json.dumps(built, indent=2))
    print(f"spark-submit --conf spark.archives={os.path.abspath(str(built['archive']))}#env "
          "--conf spark.pyspark.python=./env/bin/python ...", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
