"""Separate hosts on this machine: a Linux network namespace per host, each with its own address on a
bridge that only these hosts and the test's own host (the root namespace) share.

    with hosts(["master", "worker", "s3"]) as net:
        net.run("worker", ["python", "-m", "http.server", "--bind", net.address["worker"]])

Addresses come from a private /24 (10.N.0.0/24, N from 231 to 249, a free one); the test's host
is .1 on the bridge. Nothing is routed beyond the bridge: traffic goes to loopback and to these addresses
only. Everything is removed when the block ends (namespaces, veth pairs, the bridge), also after a failure.

Each host has its name as its hostname and resolves every host's name (and ``localhost``) to its address:
``ip netns exec`` mounts ``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``, and that file is written here
(and removed at the end).

A host may also hide paths (``hide=``): its processes run in a private mount namespace where each of those
paths is an empty tmpfs, after the ``binds`` (source -> target) are mounted, so a host sees neither the
checkout nor the build's virtualenv nor the Python it was built with, and still has, say, Spark at a path
of its own.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SUBNETS = range(231, 250)


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def available() -> str | None:
    """Why separate hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    probe = f"tierprobe{os.getpid() % 100000}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode:
        return "unshare --mount failed"
    return None


@dataclass
class Hosts:
    tag: str
    bridge: str
    address: dict[str, str]  # host name -> its address; "here" is the test's own host
    namespace: dict[str, str]
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, host: str, argv: Sequence[str], *, hide: Sequence[Path] = (),
                binds: Mapping[Path, Path] | None = None) -> list[str]:
        """``argv`` as run on ``host``: in its network namespace, with its name as the hostname (its own UTS
        namespace), and ``hide``/``binds`` applied in a private mount namespace."""
        steps = [f"hostname {shlex.quote(host)}"]
        steps += [f"mkdir -p {shlex.quote(str(t))} && mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}"
                  for s, t in (binds or {}).items()]
        steps += [f"mount -t tmpfs none {shlex.quote(str(p))}" for p in hide]
        return ["ip", "netns", "exec", self.namespace[host], "unshare", "--uts", "--mount", "--fork", "sh", "-c",
                " && ".join([*steps, 'exec "$@"']), host, *argv]

    def start(self, host: str, argv: Sequence[str], *, env: Mapping[str, str], log: Path,
              hide: Sequence[Path] = (), binds: Mapping[Path, Path] | None = None) -> subprocess.Popen[bytes]:
        """A long-running process on ``host``, with exactly ``env``, its output to ``log``; stopped at the end."""
        with log.open("ab") as out:
            proc = subprocess.Popen(self.command(host, argv, hide=hide, binds=binds), env=dict(env), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], *, env: Mapping[str, str], hide: Sequence[Path] = (),
            binds: Mapping[Path, Path] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(host, argv, hide=hide, binds=binds), env=dict(env),
                              capture_output=True, text=True, timeout=timeout, check=False)


def wait_for_port(address: str, port: int, *, timeout: float, what: str,
                  alive: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    """Until ``address:port`` accepts a connection (from the test's host)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and alive.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise RuntimeError(f"{what} exited with {alive.returncode} before listening on {address}:{port}\n{tail}")
        with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=1):
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:] if log else ""
    raise RuntimeError(f"{what} did not listen on {address}:{port} within {timeout:.0f} s\n{tail}")


def _free_subnet() -> int:
    """The first free one, searched from a place of this process's own: two test processes making hosts at
    the same moment (pytest's workers) start from different subnets."""
    taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    start = os.getpid() % len(SUBNETS)
    for n in [*SUBNETS[start:], *SUBNETS[:start]]:
        if f" 10.{n}.0." not in taken:
            return n
    raise RuntimeError("no free 10.N.0.0/24 among " + ", ".join(f"10.{n}.0.0/24" for n in SUBNETS))


@contextlib.contextmanager
def hosts(names: Sequence[str]) -> Iterator[Hosts]:
    tag = f"t{os.getpid() % 100000}"
    subnet = _free_subnet()
    bridge = f"{tag}br"
    net = Hosts(tag, bridge, {"here": f"10.{subnet}.0.1"}, {})
    try:
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"10.{subnet}.0.1/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for i, name in enumerate(names, start=2):
            ns, outside, inside = f"{tag}-{name}", f"{tag}v{i}", f"{tag}p{i}"
            _ip("netns", "add", ns)
            net.namespace[name] = ns
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", bridge)
            _ip("link", "set", outside, "up")
            _ip("addr", "add", f"10.{subnet}.0.{i}/24", "dev", inside, netns=ns)
            _ip("link", "set", inside, "up", netns=ns)
            _ip("link", "set", "lo", "up", netns=ns)
            net.address[name] = f"10.{subnet}.0.{i}"
        names_file = "".join(f"{a}\t{n}\n" for n, a in net.address.items() if n != "here")
        for ns in net.namespace.values():
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1\tlocalhost\n{names_file}")
        yield net
    finally:
        for proc in reversed(net.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for ns in net.namespace.values():  # deleting a namespace deletes its end of the veth, and so both ends
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False)
