"""SeaweedFS (`weed mini`: master, volume server, filer and S3 gateway in one process), the test suite's
second S3 store beside moto: a real store that enforces what moto ignores (a copy's ``If-Match``,
``DeleteObjects``' per-object ETags, CRC-32C checks) and runs in its own process.

``scripts/fetch-seaweedfs.sh`` (run by ``make test``) builds the pinned version into a cache outside the
repository. :func:`weed_mini` starts it on loopback with static credentials and its data in a temporary
folder, waits until its S3 gateway answers, and stops it by its PID (the whole process group). Without the
binary the tests that need it skip, saying how to build it, except where ``TIERING_REQUIRE_SEAWEEDFS=1``
(CI), where they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tests import needs

if TYPE_CHECKING:
    from tiering.storage.s3 import S3Store

VERSION: Final = "v0.0.0-20261109003541-7506e5f91cd6"  # SeaweedFS 4.53; scripts/fetch-seaweedfs.sh pins the same
ACCESS_KEY: Final = "tiering-test"
SECRET_KEY: Final = "tiering-test-secret-never-printed"
START_SECONDS: Final = 90.0
# `weed mini` otherwise sizes its volumes from the disk's total (1 GiB on a large disk) and counts them from
# the disk's free space: on a machine with a few GiB free it has three or four, and a suite that creates a
# bucket (a collection with its own volume) per test runs out. Fixed here, the same on every machine; a
# volume takes disk only as it is written.
VOLUME_SIZE_MB: Final = 64
VOLUME_SLOTS: Final = 1000
RUNNING: list[Seaweed] = []  # the servers up now, whose logs a failing test's report shows (tests/conftest.py)


def binary() -> Path:
    """Where scripts/fetch-seaweedfs.sh builds ``weed`` (``TIERING_SEAWEEDFS`` names another one)."""
    if explicit := os.environ.get("TIERING_SEAWEEDFS"):
        return Path(explicit)
    cache = os.environ.get("TIERING_CACHE") or str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                                                    / "tiering")
    return Path(cache) / "seaweedfs" / VERSION / "weed"


def require() -> Path:
    """The binary, or a skip (a failure where CI requires it) that says how to build it."""
    weed = binary()
    if not os.access(weed, os.X_OK):
        why = f"needs SeaweedFS at {weed}: run scripts/fetch-seaweedfs.sh (make test does)"
        needs.missing(needs.SEAWEEDFS, why)
    return weed


def _free_ports(n: int) -> list[int]:
    """``n`` ports free on loopback, each with port + 10000 free too (SeaweedFS's default gRPC port)."""
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port > 55000 or port in ports or port + 10000 in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def _answers(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # an S3 error document (403 without a signature): the gateway is up
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class Seaweed:
    endpoint: str
    access_key: str
    secret_key: str
    log: Path
    pid: int  # the weed process (its CPU time is the server's)


@contextlib.contextmanager
def weed_mini(workdir: Path, *, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY) -> Iterator[Seaweed]:
    """A `weed mini` on 127.0.0.1 (free ports, no telemetry, no WebDAV, admin UI or catalogs) with its data
    under ``workdir``, for the duration of the block; requests must be signed with the credentials given.

    Its volumes are counted from the free disk, and a deleted object's space comes back only when its volume
    is vacuumed, a bucket's as soon as the bucket is deleted: users of a long-lived server delete their
    buckets, or every PUT ends in a 500 (no writable volume) once the disk's worth has been written."""
    weed = require()
    data = workdir / "data"
    data.mkdir(parents=True)
    config = workdir / "s3.json"
    config.write_text(json.dumps({"identities": [{
        "name": "tiering", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}))
    master, volume, filer, s3 = _free_ports(4)
    args = [str(weed), "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
            f"-s3.config={config}", "-master.telemetry=false", "-webdav=false", "-admin.ui=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.iam=false",
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}", f"-volume.max={VOLUME_SLOTS}"]
    log = workdir / "weed.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    endpoint = f"http://127.0.0.1:{s3}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while not _answers(endpoint):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not start (exit {proc.poll()}); its log ends: "
                                   + log.read_text(errors="replace")[-2000:])
            time.sleep(0.3)
        server = Seaweed(endpoint, access_key, secret_key, log, proc.pid)
        RUNNING.append(server)
        yield server
    finally:
        RUNNING[:] = [s for s in RUNNING if s.pid != proc.pid]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def complaints(lines: int = 40) -> str:
    """The last errors and warnings in the logs of the servers running now (glog's ``E``/``W`` lines), for a
    failing test's report: a store's 500 says little, its log says why."""
    found = []
    for server in RUNNING:
        logged = [line for line in server.log.read_text(errors="replace").splitlines()
                  if line[:1] in ("E", "W") and line[1:5].isdigit()]
        if logged:
            found.append(f"{server.log}:\n" + "\n".join(logged[-lines:]))
    return "\n".join(found)


def empty(store: S3Store, prefix: str = "", *, delete_bucket: bool = False) -> None:
    """Every object and multipart upload under ``prefix`` gone, and with ``delete_bucket`` the bucket too.
    SeaweedFS frees a deleted object's space only when it vacuums the volume, a bucket's at once (its volumes go
    with it): a long-lived server's users delete their buckets, or empty a bucket they keep."""
    store.delete_many([(o.key, o.etag) for o in store.list(prefix)])
    for key, upload_id, _ in store.list_uploads(prefix):
        store.abort_upload(key, upload_id)
    if delete_bucket:
        store.client.delete_bucket(Bucket=store.bucket)
