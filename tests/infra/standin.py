"""docker-compose.yml without Docker: every service as a host of its own on this machine, started from
what docker-compose.yml and infra/docker/Dockerfile say, not from a copy of it.

Each service is a network namespace named after the service (tests/cluster/hosts.py: its own address, and
every service's name resolving to the service's address, as on compose's network). What a container would
get comes from the files:

- the command and environment of the service (YAML anchors and merges resolved by the YAML loader;
  ``${VAR:-default}`` at its default), over the image's ``ENV`` lines;
- paths inside the image mapped to this machine: what the image's final stage ``COPY``s from the build
  context to the checkout's files, ``/opt/venv`` (the build stage's venv) to this venv, the directories
  the image creates (``/opt/airflow``, ``/opt/spark-work``) and the named volumes to a work directory;
- the start order and readiness: ``depends_on`` with its conditions, and each service's own healthcheck
  command run inside the service's host;
- one-shot services (``restart: "no"``) run to their end.

The one service not built from the image, ``postgres`` (``postgres:<version>``), is Debian's PostgreSQL
started the way the image's entrypoint starts it: a cluster created with ``POSTGRES_USER`` /
``POSTGRES_PASSWORD`` as its superuser, UTF-8 (the image's locale is en_US.utf8), the ``POSTGRES_DB``
database, password logins from the network.
Processes run as root here (the image's user is ``tiering``), PostgreSQL as ``postgres``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.hosts import Hosts, hosts

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "infra" / "docker" / "Dockerfile"
POSTGRES_BIN = Path("/usr/lib/postgresql/15/bin")
# The compose keys this stand-in acts on; any other key in a service is an error (tests/infra/test_standin.py),
# so that a change to docker-compose.yml cannot be silently ignored here.
UNDERSTOOD = {"image", "build", "command", "environment", "depends_on", "healthcheck", "restart", "init",
              "hostname", "ports", "expose", "volumes"}
# Compose keys with no effect on one machine without containers: init (a reaper), ports/expose (every host's
# ports are reachable on the bridge), image/build (the checkout and this venv are the image).
WITHOUT_EFFECT = {"init", "ports", "expose", "image", "build", "hostname", "restart"}


def compose_default(value: str) -> str:
    """``${VAR:-default}`` and ``${VAR-default}`` at their default, as compose takes them without a .env."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def _final_stage(dockerfile: str) -> list[str]:
    """The instructions of the Dockerfile's last stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.startswith("#")))
    lines = [line.strip() for line in joined.splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.upper().startswith("FROM ")]
    return lines[starts[-1]:]


def image_env(dockerfile: str) -> dict[str, str]:
    """The final stage's ``ENV`` settings (``$VAR`` of an earlier one expanded; ``$PATH`` left to the host)."""
    env: dict[str, str] = {}
    for line in _final_stage(dockerfile):
        if line.upper().startswith("ENV "):
            for key, value in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line[4:]):
                env[key] = re.sub(r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: env.get(m.group(1), m.group(0)), value)
    return env


def image_paths(dockerfile: str, work: Path) -> dict[str, Path]:
    """Paths inside the image -> paths here: the build context's files it copies, the venv, the directories
    it creates."""
    paths: dict[str, Path] = {}
    for line in _final_stage(dockerfile):
        words = line.split()
        if words[0].upper() != "COPY":
            continue
        if any(w.startswith("--from=") for w in words):  # the build stage's venv: this one
            paths[words[-1]] = Path(sys.prefix)
            continue
        sources, target = words[1:-1], words[-1]
        if target.endswith("/"):
            for source in sources:
                paths[target + Path(source).name] = ROOT / source
        else:
            paths[target] = ROOT / sources[0]
    for line in _final_stage(dockerfile):
        made = [d for group in re.findall(r"mkdir -p ((?:/\S+\s*)+)", line) for d in group.split()]
        made += re.findall(r"--home-dir (/\S+)", line)
        for directory in made:
            paths.setdefault(directory.rstrip("/"), work / directory.strip("/"))
    return paths


def translate(value: str, paths: dict[str, Path]) -> str:
    """``value`` with every image path replaced by its path here (longest first)."""
    for image_path in sorted(paths, key=len, reverse=True):
        value = re.sub(re.escape(image_path) + r"(?=/|\b|$)", str(paths[image_path]), value)
    return value


@dataclass(frozen=True)
class Service:
    name: str
    command: tuple[str, ...]
    env: dict[str, str]
    one_shot: bool
    depends_on: dict[str, str]  # service -> condition
    healthcheck: tuple[str, ...] | None  # argv run in the service's host


def services(work: Path, compose: dict[str, Any] | None = None, dockerfile: str | None = None
             ) -> dict[str, Service]:
    """Every service of docker-compose.yml as this machine runs it, in a start order."""
    compose = compose or yaml.safe_load(COMPOSE_FILE.read_text())
    dockerfile = dockerfile or DOCKERFILE.read_text()
    paths = image_paths(dockerfile, work)
    base = {**image_env(dockerfile), "PATH": f"{Path(sys.prefix) / 'bin'}:/usr/local/bin:/usr/bin:/bin"}
    found: dict[str, Service] = {}
    for name, svc in compose["services"].items():
        env = {k: translate(compose_default(str(v)), paths) for k, v in (svc.get("environment") or {}).items()}
        env = {k: translate(v, paths) for k, v in base.items()} | env
        health = svc.get("healthcheck", {}).get("test")
        check: tuple[str, ...] | None = None
        if health:
            kind, *rest = health
            check = tuple(translate(a, paths) for a in rest) if kind == "CMD" else ("sh", "-c", translate(rest[0],
                                                                                                           paths))
        depends = svc.get("depends_on") or {}
        found[name] = Service(name, tuple(translate(str(a), paths) for a in svc.get("command") or ()), env,
                              str(svc.get("restart")) == "no",
                              {k: v["condition"] for k, v in depends.items()} if isinstance(depends, dict) else
                              dict.fromkeys(depends, "service_started"), check)
    order: list[str] = []
    while len(order) < len(found):
        ready = [n for n, s in found.items() if n not in order and all(d in order for d in s.depends_on)]
        if not ready:
            raise ValueError(f"depends_on has a cycle among {sorted(set(found) - set(order))}")
        order += sorted(ready)
    return {n: found[n] for n in order}


@dataclass
class Stack:
    net: Hosts
    work: Path
    services: dict[str, Service]
    scratch: Path  # outside the work directory, which the postgres user may not reach
    logs: dict[str, Path] = field(default_factory=dict)

    def address(self, service: str) -> str:
        return self.net.address[service]

    def log_tail(self, service: str, chars: int = 3000) -> str:
        path = self.logs.get(service)
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""


def _wait(what: str, check: Any, timeout: float, stack: Stack, service: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(1)
    raise RuntimeError(f"{service}: {what} not within {timeout:.0f} s\n{stack.log_tail(service)}")


def _postgres(stack: Stack, svc: Service) -> None:
    """The postgres image's entrypoint, with Debian's PostgreSQL: a cluster owned by the postgres user whose
    superuser is POSTGRES_USER, the database POSTGRES_DB, scram password logins from other hosts."""
    data = stack.scratch / "postgres"
    data.mkdir()
    shutil.chown(data, "postgres", "postgres")
    password = data / "password"
    env = {**svc.env, "PATH": f"{POSTGRES_BIN}:/usr/sbin:/usr/bin:/sbin:/bin", "PGHOST": "127.0.0.1"}
    as_pg = ["runuser", "-u", "postgres", "--"]
    cluster = data / "cluster"
    init = stack.net.run(svc.name, [*as_pg, "sh", "-c", f"printf %s \"$POSTGRES_PASSWORD\" > {password} && "
                                    f"{POSTGRES_BIN / 'initdb'} -D {cluster} -U \"$POSTGRES_USER\" -E UTF8 "
                                    f"--locale=C.UTF-8 --pwfile={password} --auth-host=scram-sha-256 "
                                    "--auth-local=trust && "
                                    f"rm {password}"], env=env, timeout=120)
    if init.returncode:
        raise RuntimeError(f"postgres: initdb failed: {init.stderr[-2000:]}")
    (cluster / "pg_hba.conf").write_text("local all all trust\nhost all all 0.0.0.0/0 scram-sha-256\n")
    stack.logs[svc.name] = stack.work / "postgres.log"
    stack.net.start(svc.name, [*as_pg, str(POSTGRES_BIN / "postgres"), "-D", str(cluster), "-c",
                               "listen_addresses=*", "-c", f"unix_socket_directories={data}"],
                    env=env, log=stack.logs[svc.name])
    _wait("ready", lambda: stack.net.run(svc.name, [str(POSTGRES_BIN / "pg_isready"), "-h", "127.0.0.1"],
                                         env=env).returncode == 0, 60, stack, svc.name)
    made = stack.net.run(svc.name, [*as_pg, str(POSTGRES_BIN / "createdb"), "-h", str(data), "-U",
                                    svc.env["POSTGRES_USER"], svc.env["POSTGRES_DB"]], env=env)
    if made.returncode:
        raise RuntimeError(f"postgres: createdb failed: {made.stderr[-2000:]}")


def _healthy(stack: Stack, svc: Service, timeout: float) -> None:
    if svc.healthcheck is None:
        return
    env = {**svc.env, "PATH": f"{POSTGRES_BIN}:{svc.env['PATH']}", "PGHOST": "127.0.0.1"}
    _wait("healthy", lambda: stack.net.run(svc.name, list(svc.healthcheck or ()), env=env,
                                           timeout=60).returncode == 0, timeout, stack, svc.name)


@contextlib.contextmanager
def standin(work: Path, *, log: Any = print, timeout: float = 300) -> Iterator[Stack]:
    """The stack up (every service started, one-shots done, each healthy), down at the end."""
    defined = services(work)
    for made in image_paths(DOCKERFILE.read_text(), work).values():
        if str(made).startswith(str(work)):
            made.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="tiering-standin-"))  # in /tmp: reachable by the postgres user
    scratch.chmod(0o755)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, scratch, ignore_errors=True)
        net = cleanup.enter_context(hosts(list(defined)))
        stack = Stack(net, work, defined, scratch)
        for name, svc in defined.items():
            started = time.monotonic()
            for dep, condition in svc.depends_on.items():
                if condition == "service_healthy":
                    _healthy(stack, defined[dep], timeout)
            if name == "postgres" and not svc.command:
                _postgres(stack, svc)
            elif svc.one_shot:
                done = net.run(name, list(svc.command), env=svc.env, timeout=timeout)
                (work / f"{name}.log").write_text(done.stdout + done.stderr)
                if done.returncode:
                    raise RuntimeError(f"{name} exited with {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
            else:
                stack.logs[name] = work / f"{name}.log"
                net.start(name, list(svc.command), env=svc.env, log=stack.logs[name])
            log(f"  {name} at {net.address[name]} ({time.monotonic() - started:.1f} s)")
        for svc in defined.values():
            if not svc.one_shot:
                _healthy(stack, svc, timeout)
        yield stack


class Api:
    """Airflow's REST API (v2) as the compose stack's user reaches it: a JWT from /auth/token."""

    def __init__(self, base: str, user: str, password: str) -> None:
        self.base = base.rstrip("/")
        body = self._call("POST", "/auth/token", {"username": user, "password": password}, token=None)
        self.token = str(body["access_token"])

    def _call(self, method: str, path: str, body: Any = None, *, token: str | None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  **({"Authorization": f"Bearer {token}"} if token else {})})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"null")

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self._call(method, path, body, token=self.token)


def trigger_and_wait(api: Api, dag_id: str, conf: dict[str, Any], *, timeout: float) -> dict[str, Any]:
    """Unpause ``dag_id`` once it is parsed, trigger a run with ``conf``, and wait for its end."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.call("GET", f"/api/v2/dags/{dag_id}")
            break
        except urllib.error.HTTPError as e:
            if e.code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(2)
    api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = api.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    while time.monotonic() < deadline:
        state = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}")
        if state["state"] in ("success", "failed"):
            return dict(state)
        time.sleep(3)
    raise TimeoutError(f"{dag_id} run {run['dag_run_id']} not finished within {timeout:.0f} s")


if __name__ == "__main__":  # python -m tests.infra.standin: the stack up until Ctrl-C
    with standin(Path(tempfile.mkdtemp(prefix="tiering-standin-"))) as up:
        print(json.dumps(up.net.address))
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(60)
    os._exit(0)
