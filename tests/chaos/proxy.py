"""A fault-injecting HTTP/1.1 reverse proxy for S3 on loopback (the chaos suite's network).

The proxy listens on 127.0.0.1 (a free port) and forwards each request verbatim to one upstream (a moto
server), keeping both connections alive between requests. Bodies are framed by ``Content-Length`` or
``Transfer-Encoding: chunked`` (kept as sent, ``aws-chunked`` included). ``Expect: 100-continue`` is
answered by the proxy itself, then stripped: the body is always read whole before anything is decided,
so a fault never leaves half a request on a connection that stays open.

For each request the first :class:`Rule` (or :class:`Flaky`) that returns an :class:`Action` decides:

- ``pass``: forward and reply; ``delay``: sleep ``seconds``, then the same;
- ``error``: answer ``status`` with an S3 error document (``code``) without forwarding;
- ``reset``: close with a TCP RST without forwarding (S3 never sees the request);
- ``drop``: forward, then close without replying (S3 executed it, the client never hears);
- ``cut``: forward, reply with the headers and half of the body, then close (FIN);
- ``flip``: forward, reply with one bit of the body's middle byte flipped (bytes damaged on the way).

An action's ``before`` hook runs before the request is forwarded, its ``after`` hook once S3 has
answered and before the client is: a test kills the client there, or mirrors objects behind its back.
Every request is recorded in :attr:`Proxy.seen`, and :attr:`Proxy.connections` counts the connections accepted.
"""

from __future__ import annotations

import contextlib
import random
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Final, Literal, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

Kind = Literal["pass", "delay", "error", "reset", "drop", "cut", "flip"]
MAX_LINE: Final = 65_536
TIMEOUT_SECONDS: Final = 120.0
_ERROR_REASONS: Final = {500: "Internal Server Error", 503: "Service Unavailable"}


class ProtocolViolation(Exception):
    """The peer sent something that is not HTTP/1.1 as this proxy understands it."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request as the client sent it; ``body`` keeps its framing (chunks stay chunks)."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), None)

    @property
    def bucket(self) -> str:
        return self._path().partition("/")[0]

    @property
    def key(self) -> str:
        """The object key (path-style addressing: ``/<bucket>/<key>``), percent-decoded."""
        return self._path().partition("/")[2]

    @property
    def query(self) -> dict[str, str]:
        return dict(parse_qsl(urlsplit(self.target).query, keep_blank_values=True))

    def _path(self) -> str:
        return unquote(urlsplit(self.target).path).lstrip("/")


@dataclass(frozen=True, slots=True)
class Response:
    """S3's answer: the status line and headers as received, and the framed body."""

    status: int
    head: bytes
    body: bytes
    close: bool  # the upstream connection cannot carry another request


Hook = Callable[[Request], None]
AfterHook = Callable[[Request, Response], None]


@dataclass(frozen=True, slots=True)
class Action:
    """What the proxy does with one request (see the module docstring)."""

    kind: Kind = "pass"
    status: int = 500
    code: str = "InternalError"
    seconds: float = 0.0
    before: Hook | None = None
    after: AfterHook | None = None


class Decider(Protocol):
    def decide(self, request: Request) -> Action | None: ...


class Rule:
    """``action`` for the requests ``match`` accepts: after ``skip`` matches, at most ``times`` times
    (``None``: every time). ``fired`` counts the requests it took."""

    def __init__(self, match: Callable[[Request], bool], action: Action, *, skip: int = 0,
                 times: int | None = 1) -> None:
        self.match, self.action, self.skip, self.times = match, action, skip, times
        self.fired = 0
        self._lock = threading.Lock()

    def decide(self, request: Request) -> Action | None:
        if not self.match(request):
            return None
        with self._lock:
            if self.skip > 0:
                self.skip -= 1
                return None
            if self.times is not None and self.fired >= self.times:
                return None
            self.fired += 1
        return self.action


class Flaky:
    """A flaky S3: each request fails with probability ``rate``, in one of the ways in ``kinds``
    (drawn from a seeded RNG); ``cut`` is drawn only for GETs, whose answers have a body to cut."""

    KINDS: Final[tuple[str, ...]] = ("error500", "error503", "reset", "drop", "cut", "delay")

    def __init__(self, rate: float, seed: int, kinds: Sequence[str] = KINDS, max_delay: float = 0.3) -> None:
        self.rate, self.kinds, self.max_delay = rate, tuple(kinds), max_delay
        self.rng = random.Random(seed)
        self.fired: dict[str, int] = {}
        self._lock = threading.Lock()

    def decide(self, request: Request) -> Action | None:
        with self._lock:
            if self.rng.random() >= self.rate:
                return None
            kinds = [k for k in self.kinds if k != "cut" or request.method == "GET"]
            kind = self.rng.choice(kinds)
            seconds = self.rng.uniform(0.01, self.max_delay)
            self.fired[kind] = self.fired.get(kind, 0) + 1
        return {"error500": Action("error", 500, "InternalError"), "error503": Action("error", 503, "SlowDown"),
                "reset": Action("reset"), "drop": Action("drop"), "cut": Action("cut"),
                "delay": Action("delay", seconds=seconds)}[kind]


@dataclass(frozen=True, slots=True)
class Seen:
    """One request the proxy saw, and what it did with it."""

    method: str
    target: str
    action: str
    status: int | None

    def line(self) -> str:
        return f"{self.method} {self.target} -> {self.status if self.status is not None else '-'} [{self.action}]"


def _read_line(f: BinaryIO) -> bytes:
    line = f.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise ProtocolViolation("line too long")
    return line


def _read_head(f: BinaryIO) -> tuple[bytes, list[tuple[str, str]]] | None:
    """The start line and the headers; None at a clean end of the connection."""
    first = _read_line(f)
    while first in (b"\r\n", b"\n"):  # tolerated between requests (RFC 9112, 2.2)
        first = _read_line(f)
    if not first:
        return None
    headers: list[tuple[str, str]] = []
    while True:
        line = _read_line(f)
        if not line:
            raise ProtocolViolation("connection closed inside a header block")
        if line in (b"\r\n", b"\n"):
            return first.rstrip(b"\r\n"), headers
        name, sep, value = line.decode("latin-1").partition(":")
        if not sep:
            raise ProtocolViolation(f"malformed header line {line!r}")
        headers.append((name.strip(), value.strip()))


def _get(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    return next((v for k, v in headers if k.lower() == name), None)


def _read_exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ProtocolViolation(f"body ended after {len(data)} of {n} bytes")
    return data


def _read_body(f: BinaryIO, headers: Sequence[tuple[str, str]]) -> bytes | None:
    """The framed body as sent (chunked stays chunked); None when it is delimited by the connection's end."""
    if "chunked" in (_get(headers, "transfer-encoding") or "").lower():
        parts: list[bytes] = []
        while True:
            size_line = _read_line(f)
            parts.append(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailer fields, then the empty line
                    trailer = _read_line(f)
                    parts.append(trailer)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(parts)
            parts.append(_read_exact(f, size + 2))
    length = _get(headers, "content-length")
    if length is not None:
        return _read_exact(f, int(length))
    return None


def _render(start: bytes, headers: Sequence[tuple[str, str]]) -> bytes:
    lines = [start] + [f"{k}: {v}".encode("latin-1") for k, v in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _error_response(status: int, code: str) -> bytes:
    body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>injected by the chaos '
            f"proxy</Message><RequestId>CHAOS0000000000</RequestId></Error>").encode()
    head = _render(f"HTTP/1.1 {status} {_ERROR_REASONS.get(status, 'Error')}".encode(),
                   [("Content-Type", "application/xml"), ("Content-Length", str(len(body))),
                    ("x-amz-request-id", "CHAOS0000000000")])
    return head + body


class _Upstream:
    """One keep-alive connection to the upstream server, opened again when it is closed."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.sock: socket.socket | None = None
        self.file: BinaryIO | None = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.file = None

    def exchange(self, raw: bytes, method: str) -> Response:
        """Send one request and read its answer; a reused connection the server had closed is retried once
        on a new one (nothing was executed: the server closed it before reading)."""
        for attempt in (0, 1):
            reused = self.sock is not None
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=TIMEOUT_SECONDS)
                self.file = self.sock.makefile("rb")
            assert self.file is not None
            try:
                self.sock.sendall(raw)
                head = _read_head(self.file)
            except (ConnectionError, ProtocolViolation):
                head = None
            if head is None:
                self.close()
                if reused and attempt == 0:
                    continue
                raise ProtocolViolation("the upstream closed the connection without answering")
            return self._response(head, method)
        raise AssertionError("unreachable")

    def _response(self, head: tuple[bytes, list[tuple[str, str]]], method: str) -> Response:
        assert self.file is not None
        start, headers = head
        status = int(start.split()[1])
        while 100 <= status < 200:  # an interim answer (we strip Expect, so only if the server sends one anyway)
            nxt = _read_head(self.file)
            if nxt is None:
                raise ProtocolViolation("the upstream closed after an interim answer")
            start, headers = nxt
            status = int(start.split()[1])
        close = (_get(headers, "connection") or "").lower() == "close" or start.startswith(b"HTTP/1.0")
        if method == "HEAD" or status in (204, 304):
            body = b""
        else:
            framed = _read_body(self.file, headers)
            if framed is None:
                framed, close = self.file.read(), True
            body = framed
        if close:
            self.close()
        return Response(status, _render(start, headers), body, close)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    proxy: Proxy


class _Handler(socketserver.BaseRequestHandler):
    request: socket.socket
    server: _Server

    def handle(self) -> None:
        self.server.proxy._serve(self.request)


class Proxy:
    """The proxy (see the module docstring). Use as a context manager; ``url`` is its endpoint."""

    def __init__(self, upstream: str, rules: Sequence[Decider] = ()) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.rules: list[Decider] = list(rules)
        self.seen: list[Seen] = []
        self.connections = 0
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._server.serve_forever, name="chaos-proxy", daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Proxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening and cut every connection still open."""
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            for sock in self._clients:
                with contextlib.suppress(OSError):  # closed by its client meanwhile
                    sock.shutdown(socket.SHUT_RDWR)

    def lines(self) -> list[str]:
        return [s.line() for s in self.seen]

    def _decide(self, request: Request) -> Action:
        for rule in self.rules:
            action = rule.decide(request)
            if action is not None:
                return action
        return Action()

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(TIMEOUT_SECONDS)
        with self._lock:
            self._clients.add(client)
            self.connections += 1
        upstream = _Upstream(self.upstream)
        f = client.makefile("rb")
        try:
            while self._one(client, f, upstream):
                pass
        except (OSError, ProtocolViolation, ValueError):
            pass  # the client went away, or spoke something else: nothing left to serve
        finally:
            upstream.close()
            with self._lock:
                self._clients.discard(client)
            f.close()
            client.close()

    def _one(self, client: socket.socket, f: BinaryIO, upstream: _Upstream) -> bool:
        """Serve one request; False when the connection is finished."""
        head = _read_head(f)
        if head is None:
            return False
        start, headers = head
        method, target, _ = start.decode("latin-1").split(" ", 2)
        if (_get(headers, "expect") or "").lower() == "100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            headers = [(k, v) for k, v in headers if k.lower() != "expect"]
        body = _read_body(f, headers) or b""
        request = Request(method, target, tuple(headers), body)
        action = self._decide(request)
        if action.before is not None:
            action.before(request)
        if action.kind == "delay":
            time.sleep(action.seconds)
        if action.kind == "error":
            self.seen.append(Seen(method, target, "error", action.status))
            client.sendall(_error_response(action.status, action.code))
            return True
        if action.kind == "reset":
            self.seen.append(Seen(method, target, "reset", None))
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        response = upstream.exchange(_render(start, headers) + body, method)
        if action.after is not None:
            action.after(request, response)
        kind = action.kind
        if kind == "cut" and not response.body:
            kind = "drop"  # nothing to cut: the closest fault is an answer that never comes
        if kind == "flip" and not response.body:
            kind = "pass"  # no byte to damage
        self.seen.append(Seen(method, target, kind, response.status))
        if kind == "drop":
            return False
        if kind == "cut":
            client.sendall(response.head + response.body[: len(response.body) // 2])
            client.shutdown(socket.SHUT_WR)
            return False
        body = response.body
        if kind == "flip":
            middle = len(body) // 2
            body = body[:middle] + bytes([body[middle] ^ 0x10]) + body[middle + 1 :]
        client.sendall(response.head + body)
        # Where the upstream closed (its body may have been delimited by the close), so does the client's.
        return not (response.close or (_get(headers, "connection") or "").lower() == "close")
