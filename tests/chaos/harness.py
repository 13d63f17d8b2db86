"""The chaos harness: trials that run the real CLI in its own processes against a moto server (through
the fault-injecting :mod:`tests.chaos.proxy`), kill them with SIGKILL, re-run until the bucket converges,
and check the platform's invariants against a snapshot taken before the trial.

A trial (:func:`run_trial`) is one :class:`TrialSpec`:

1. a fresh bucket is seeded (generated partitions with different codecs, and the Kafka-written golden
   logdir as it is) and snapshotted;
2. the faulted phase of its kind runs (:data:`KINDS`): a SIGKILL at a random instant or at an aimed protocol
   step, a flaky S3, two runs at once (or one stalled past its lease while the other takes over), a rollback
   beside a compaction, a naive mirror, a killed re-run;
3. the same commands re-run without faults, straight to moto, until one exits 0 with nothing left to do
   (:data:`MAX_RERUNS` at most per command);
4. the invariants are checked (:func:`check_bucket`), every run that compacted something is rolled back,
   and the originals must be back byte for byte (:func:`check_restored`).

Every process's output is checked too (:meth:`Proc.problems`): no canary secret, no traceback, an exit
code in :data:`EXIT_CODES`, JSON on stdout under ``--json``. A *clean failure* is a nonzero exit with one
``tiering:`` line on stderr; anything in :attr:`TrialResult.bad` fails the trial.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import boto3
from botocore.config import Config

from tests.chaos.proxy import Action, Decider, Flaky, Proxy, Request, Response, Rule
from tests.reference_index import rebuild
from tests.s3.conftest import PREFIX
from tiering.demo.seed import GeneratedSegment, generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.segment import verify_segment
from tiering.storage.layout import segment_key
from tiering.storage.s3 import S3Store

ROOT: Final = Path(__file__).resolve().parents[2]
GOLDEN: Final = ROOT / "tests" / "data" / "golden" / "logdir"
ACCESS_KEY: Final = "testing"
CANARY: Final = "chaos-canary-7Qx2vL9pZr4KfT8wN3sJ"  # the secret key every CLI process gets; never to be printed
EXIT_CODES: Final = frozenset({0, 1, 2, 3, 4, 75})
LEASE_TTL: Final = 3  # seconds: a killed run's lease expires quickly enough for a bounded wait
# More arguments for every compaction of a trial, e.g. "--rebatch" (TIERING_CHAOS_COMPACT_ARGS, split on spaces).
COMPACT_EXTRA: Final = tuple(os.environ.get("TIERING_CHAOS_COMPACT_ARGS", "").split())
MAX_RERUNS: Final = 4
PROCESS_TIMEOUT: Final = 180.0
RESERVED: Final = f"{PREFIX}/_tiering/"
INDEXES: Final = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)
KINDS: Final = ("random-kill", "aimed-kill", "flaky", "concurrent", "rollback-race", "mirror", "rerun-kill")
_FINAL: Final = re.compile(rf"{re.escape(PREFIX)}/(?P<dir>[^/]+)/(?P<base>[0-9]{{20}})(?P<sfx>\.[a-z]+)")
_RESERVED_SEGMENT: Final = re.compile(
    rf"{re.escape(RESERVED)}(?:journal|backup/[^/]+|staging/[^/]+)/(?P<dir>[^/]+)/(?P<base>[0-9]{{20}})\.[a-z]+")




# --- protocol steps, as requests on the wire -----------------------------------------------------------


def _final(key: str) -> re.Match[str] | None:
    m = _FINAL.fullmatch(key)
    return m if m is not None and m["dir"] != "_tiering" else None


def _is_final(request: Request, *suffixes: str) -> bool:
    m = _final(request.key)
    return m is not None and m["sfx"] in suffixes


def _copy(request: Request) -> bool:
    return request.header("x-amz-copy-source") is not None


def _under(request: Request, sub: str) -> bool:
    return request.key.startswith(RESERVED + sub + "/")


# Each aimed step: which requests of a compaction (or rollback) carry it.
STEPS: Final[dict[str, Callable[[Request], bool]]] = {
    "lease": lambda r: r.method == "PUT" and _under(r, "leases"),
    "log-get": lambda r: r.method == "GET" and _is_final(r, LOG_SUFFIX),
    "staging-put": lambda r: r.method == "PUT" and _under(r, "staging"),
    "journal": lambda r: r.method == "PUT" and _under(r, "journal"),
    "backup-copy": lambda r: r.method == "PUT" and _under(r, "backup") and _copy(r),
    "index-delete": lambda r: r.method == "DELETE" and _is_final(r, *INDEXES),
    # a PutObject, or a CopyObject of the staged .log where the store honours a copy's If-Match (SeaweedFS)
    "log-swap": lambda r: r.method == "PUT" and _is_final(r, LOG_SUFFIX) and r.header("If-Match") is not None,
    "index-put": lambda r: r.method == "PUT" and _is_final(r, *INDEXES) and not _copy(r),
    "state": lambda r: r.method == "PUT" and _under(r, "state"),
    "journal-delete": lambda r: r.method == "DELETE" and _under(r, "journal"),
}
AIMED_STEPS: Final = tuple(STEPS)


def segment_of(key: str) -> tuple[str, int] | None:
    """The (directory, base offset) a final or reserved per-segment key belongs to."""
    m = _final(key) or _RESERVED_SEGMENT.fullmatch(key)
    return (m["dir"], int(m["base"])) if m is not None else None


# --- the seeded bucket ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionSpec:
    """One generated partition (the last segment is the active one, never compacted)."""

    topic: str
    partition: int
    codec: Codec
    kind: str = "json"
    segments: int = 3
    segment_bytes: int = 40_000


SMALL: Final = (PartitionSpec("orders.v1", 0, Codec.SNAPPY), PartitionSpec("orders.v1", 1, Codec.LZ4, "logs"))
FULL: Final = (*SMALL, PartitionSpec("clicks", 0, Codec.GZIP, segments=4, segment_bytes=60_000))


@dataclass(frozen=True)
class Snapshot:
    """Every object of the bucket before the trial: bytes and ETag by key."""

    objects: dict[str, bytes]
    etags: dict[str, str]

    def segments(self) -> dict[tuple[str, int], dict[str, str]]:
        """(directory, base offset) -> suffix -> key, for every segment with a ``.log``."""
        out: dict[tuple[str, int], dict[str, str]] = {}
        for key in self.objects:
            m = _final(key)
            if m is not None:
                out.setdefault((m["dir"], int(m["base"])), {})[m["sfx"]] = key
        return {seg: files for seg, files in out.items() if LOG_SUFFIX in files}

    def sealed(self) -> list[tuple[str, int]]:
        """Segments a compaction may replace: all but the last of each partition."""
        last: dict[str, int] = {}
        for d, base in self.segments():
            last[d] = max(last.get(d, base), base)
        return sorted(seg for seg in self.segments() if seg[1] != last[seg[0]])


@functools.cache
def _generated(p: PartitionSpec) -> tuple[GeneratedSegment, ...]:
    return generate_partition(segments=p.segments, kind=p.kind, codec=p.codec, segment_bytes=p.segment_bytes)


_RECORDS: dict[tuple[str, int], tuple[str | None, bytes, bytes]] = {}
_RECORDS_LOCK: Final = threading.Lock()


def records(log: bytes, base: int) -> tuple[str | None, bytes, bytes]:
    """A ``.log``'s records digest and the indexes rebuilt from it (cached by content)."""
    key = (hashlib.sha256(log).hexdigest(), base)
    with _RECORDS_LOCK:
        if key in _RECORDS:
            return _RECORDS[key]
    summary = verify_segment(io.BytesIO(log), segment_base=base)
    value = (summary.records_sha256, *rebuild(log, base))
    with _RECORDS_LOCK:
        _RECORDS[key] = value
    return value


class Lab:
    """The moto server every trial uses, and what a trial's bucket is seeded with."""

    def __init__(self, endpoint: str, partitions: Sequence[PartitionSpec] = SMALL, *, golden: bool = True,
                 source: Path | None = None) -> None:
        self.endpoint, self.partitions, self.source = endpoint, tuple(partitions), source
        self.golden = ({str(p.relative_to(GOLDEN)): p.read_bytes() for p in sorted(GOLDEN.rglob("*")) if p.is_file()}
                       if golden else {})
        self._buckets = 0

    def store(self, bucket: str) -> S3Store:
        """A client straight to the store (no proxy), as the harness's own tools use it."""
        session = boto3.session.Session(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=CANARY,
                                        region_name="us-east-1")
        config = Config(retries={"mode": "standard", "total_max_attempts": 5})
        return S3Store(session.client("s3", endpoint_url=self.endpoint, config=config), bucket)

    def new_bucket(self, label: str) -> tuple[S3Store, Snapshot]:
        """A fresh, seeded bucket and its snapshot."""
        self._buckets += 1
        name = re.sub(r"[^a-z0-9-]+", "-", f"chaos-{self._buckets}-{label}".lower())[:63].strip("-")
        store = self.store(name)
        store.client.create_bucket(Bucket=name)
        known: dict[str, bytes] = {}
        for p in self.partitions:
            generated = _generated(p)
            upload_partition(store, PREFIX, p.topic, p.partition, generated)
            for g in generated:
                files = ((LOG_SUFFIX, g.log), (INDEX_SUFFIX, g.offset_index), (TIME_INDEX_SUFFIX, g.time_index))
                for sfx, data in files:
                    known[segment_key(PREFIX, p.topic, p.partition, g.base_offset, sfx)] = data
        for rel, data in self.golden.items():
            store.put(f"{PREFIX}/{rel}", data)
            known[f"{PREFIX}/{rel}"] = data
        objects, etags = {}, {}
        for info in store.list(""):  # what S3 holds now (the partition files too), bytes read only where unknown
            objects[info.key] = known[info.key] if info.key in known else store.get(info.key)
            etags[info.key] = info.etag
        return store, Snapshot(objects, etags)

    @staticmethod
    def drop_bucket(store: S3Store) -> None:
        """Delete the bucket and everything in it (moto keeps objects in this process's memory)."""
        client, name = store.client, store.bucket
        for upload in client.list_multipart_uploads(Bucket=name).get("Uploads", []):
            client.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        keys = [info.key for info in store.list("")]
        for at in range(0, len(keys), 1000):
            client.delete_objects(Bucket=name, Delete={"Objects": [{"Key": k} for k in keys[at:at + 1000]]})
        client.delete_bucket(Bucket=name)


# --- processes --------------------------------------------------------------------------------------------


def cli_env(endpoint: str, source: Path | None = None) -> dict[str, str]:
    """The environment of a CLI process: the AWS variables it needs (the canary as its secret), nothing
    inherited from ours; ``source``: a directory holding another ``tiering`` package to run instead."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    if source is not None:
        env["PYTHONPATH"] = str(source)
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=CANARY,
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull,
               AWS_EC2_METADATA_DISABLED="true")
    return env


@dataclass
class Proc:
    """One finished CLI process."""

    label: str
    argv: list[str]
    code: int
    killed: bool
    stdout: str
    stderr: str
    seconds: float

    @property
    def doc(self) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.stdout)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) else None

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("tiering:")]

    @property
    def clean_failure(self) -> bool:
        return (not self.killed and self.code != 0 and len(self.error_lines) == 1
                and "Traceback" not in self.stderr + self.stdout)

    def tail(self) -> str:
        """What the process said last on stderr (the exception line of a traceback, or its error line)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def problems(self) -> list[str]:
        """Output rules broken: a leaked secret, a traceback, an exit code outside the contract, no JSON."""
        out = []
        if CANARY in self.stdout + self.stderr:
            out.append(f"{self.label}: the secret key leaked into its output")
        if "Traceback" in self.stdout + self.stderr:
            state = "killed (after printing it)" if self.killed else f"exit {self.code}"
            out.append(f"{self.label}: {state} with a traceback: {self.tail()}")
        if not self.killed and self.code not in EXIT_CODES:
            out.append(f"{self.label}: exit code {self.code} is outside {sorted(EXIT_CODES)}")
        if not self.killed and self.doc is None:
            out.append(f"{self.label}: exit {self.code} without a JSON document on stdout")
        return out

    def summary(self) -> str:
        state = "killed" if self.killed else f"exit {self.code}"
        return f"{self.label}: {state} in {self.seconds:.1f}s" + (f" | {self.tail()}" if self.tail() else "")


class Running:
    """A CLI process in flight; :meth:`kill` (SIGKILL) may be called from any thread (a proxy hook)."""

    def __init__(self, label: str, argv: list[str], endpoint: str, source: Path | None = None) -> None:
        self.label, self.argv = label, argv
        self._dir = Path(tempfile.mkdtemp(prefix="chaos-"))  # stdout and stderr: files never fill up like pipes
        self.started = time.monotonic()
        with (self._dir / "out").open("wb") as out, (self._dir / "err").open("wb") as err:
            self.popen = subprocess.Popen([sys.executable, "-m", "tiering", *argv], cwd=source or ROOT,
                                          env=cli_env(endpoint, source), stdout=out, stderr=err,
                                          stdin=subprocess.DEVNULL)
        self.killed = False

    def kill(self) -> None:
        """SIGKILL now, and return only once the process can no longer act."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.popen.pid, signal.SIGKILL)
        stat = Path(f"/proc/{self.popen.pid}/stat")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
            except (OSError, IndexError):
                return  # reaped already
            time.sleep(0.002)

    def wait(self, kill_after: float | None = None) -> Proc:
        """Wait for the end (SIGKILL once ``kill_after`` seconds have passed since the start)."""
        if kill_after is not None:
            try:
                self.popen.wait(timeout=max(0.0, kill_after - (time.monotonic() - self.started)))
            except subprocess.TimeoutExpired:
                self.kill()
        try:
            code = self.popen.wait(timeout=PROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.popen.wait()
        seconds = time.monotonic() - self.started
        out, err = ((self._dir / name).read_bytes().decode("utf-8", "replace") for name in ("out", "err"))
        shutil.rmtree(self._dir)
        killed = self.killed and code == -signal.SIGKILL
        return Proc(self.label, self.argv, code, killed, out, err, seconds)


# --- invariants -------------------------------------------------------------------------------------------


def run_killed(endpoint: str, argv: list[str], label: str, kill: tuple[int, str] | None = None,
               at: Callable[[Request], bool] = lambda _: True) -> tuple[Proc, int]:
    """The CLI with ``argv`` in its own process, reaching S3 through a proxy; ``kill``: SIGKILL it before or
    after its N-th request (of those ``at`` accepts, e.g. one of :data:`STEPS`). The process and how many
    requests it made."""
    victim: list[Running] = []

    def die(*_: object) -> None:
        victim[0].kill()

    rules = [] if kill is None else [Rule(at, Action(before=die) if kill[1] == "before" else Action(after=die),
                                          skip=kill[0])]
    with Proxy(endpoint, rules) as proxy:
        victim.append(Running(label, argv, proxy.url))
        proc = victim[0].wait()
        return proc, len(proxy.seen)


def _outside_keys(store: S3Store, snap: Snapshot) -> tuple[dict[str, str], list[str]]:
    """The ETags of the keys outside ``_tiering/`` now, and what broke the rule that only our documented swap
    changes them: no new key, nothing deleted but a segment's index, other files unchanged."""
    now = {info.key: info.etag for info in store.list("") if not info.key.startswith(RESERVED)}
    problems = [f"a new object outside _tiering/: {key}" for key in sorted(now.keys() - snap.objects.keys())]
    for key in sorted(snap.objects.keys() - now.keys()):
        m = _final(key)
        if m is None or m["sfx"] not in INDEXES:
            problems.append(f"deleted outside _tiering/: {key}")
    for key in sorted(now.keys() & snap.objects.keys()):
        m = _final(key)
        if (m is None or m["sfx"] not in (LOG_SUFFIX, *INDEXES)) and now[key] != snap.etags[key]:
            problems.append(f"changed, though not a segment file we replace: {key}")
    return now, problems


def _journals(store: S3Store) -> list[str]:
    return [f"a journal entry is still pending: {info.key}" for info in store.list(RESERVED + "journal/")]


def check_bucket(store: S3Store, snap: Snapshot) -> list[str]:
    """The invariants after convergence: every segment holds its original records, every index present is the
    rebuild of its ``.log`` (never an old index beside a new ``.log``), only our keys changed, no journal
    pending, and no valid segment remembered as invalid."""
    now, problems = _outside_keys(store, snap)
    for (d, base), files in sorted(snap.segments().items()):
        if files[LOG_SUFFIX] not in now:
            continue  # reported as deleted
        log = store.get(files[LOG_SUFFIX])
        want = records(snap.objects[files[LOG_SUFFIX]], base)
        try:
            got = records(log, base)
        except Exception as e:  # the check must report any failure to read the segment, whatever it is
            problems.append(f"{d}/{base}: the .log does not read back: {type(e).__name__}: {e}")
            continue
        if got[0] != want[0]:
            problems.append(f"{d}/{base}: the .log's records differ from the original's")
        for sfx, rebuilt in zip(INDEXES, got[1:], strict=True):
            key = files.get(sfx)
            if key is None or key not in now:
                continue
            data = store.get(key)
            if data != rebuilt:
                old = data == snap.objects.get(key) and log != snap.objects[files[LOG_SUFFIX]]
                problems.append(f"{d}/{base}: the {sfx} does not match its .log"
                                + (" (the ORIGINAL index beside a NEW .log)" if old else ""))
    problems += _journals(store)
    problems += invalid_verdicts(store)
    return problems


def invalid_verdicts(store: S3Store) -> list[str]:
    """Segments the partition state remembers as invalid data (every seeded segment is valid)."""
    out = []
    for info in store.list(RESERVED + "state/"):
        doc = json.loads(store.get(info.key))
        for base, entry in sorted(doc.get("segments", {}).items()):
            if isinstance(entry, dict) and entry.get("outcome") == "invalid":
                out.append(f"{info.key.rsplit('/', 1)[1]} segment {base} remembered as invalid data: "
                           f"{str(entry.get('reason'))[:200]}")
    return out


def wrong_verdicts(procs: Sequence[Proc]) -> list[str]:
    """Processes that blamed the data or the usage: every seeded segment is valid and every command line is
    right, so exit 1 (invalid data) or 2 (usage, configuration), or a segment failed as invalid data, is a
    failure put in the wrong category (a retry would be told it cannot help)."""
    out = []
    for proc in procs:
        if proc.killed:
            continue
        invalid = [line for line in unfinished(proc.doc) if "invalid data" in line]
        out += [f"{proc.label}: a valid segment was judged invalid: {line}" for line in invalid]
        if proc.code in (1, 2) and not invalid:
            why = "; ".join(unfinished(proc.doc)[:2]) or proc.tail()
            out.append(f"{proc.label}: exit {proc.code} ({'invalid data' if proc.code == 1 else 'usage'}) on "
                       f"valid data and usage: {why[:300]}")
    return out


def compacting_runs(store: S3Store, snap: Snapshot) -> dict[str, set[tuple[str, int]]]:
    """The run (``tiering-run``) whose ``.log`` is in place, with the segments it holds."""
    runs: dict[str, set[tuple[str, int]]] = {}
    for seg, files in snap.segments().items():
        with contextlib.suppress(Exception):  # a missing .log is reported by check_bucket
            run = store.head(files[LOG_SUFFIX]).metadata.get("tiering-run")
            if run:
                runs.setdefault(run, set()).add(seg)
    return runs


def check_restored(store: S3Store, snap: Snapshot, restored: set[tuple[str, int]]) -> list[str]:
    """After rolling back every run: each ``.log`` and each index present is the original byte for byte, the
    segments a rollback restored have their indexes back, and nothing is pending."""
    now, problems = _outside_keys(store, snap)
    for (d, base), files in sorted(snap.segments().items()):
        for sfx, key in sorted(files.items()):
            if sfx not in (LOG_SUFFIX, *INDEXES):
                continue
            if key not in now:
                if sfx != LOG_SUFFIX and (d, base) in restored:
                    problems.append(f"{d}/{base}: rolled back without its {sfx}")
                continue
            if now[key] != snap.etags[key] and store.get(key) != snap.objects[key]:
                problems.append(f"{d}/{base}: the {sfx} is not the original after the rollback")
    return problems + _journals(store)


# --- trials -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aim:
    """A SIGKILL of the client at the ``nth`` request of a protocol step, ``before`` S3 sees it or after
    S3 executed it (``after``)."""

    step: str
    phase: str = "after"
    nth: int = 1

    def __str__(self) -> str:
        return f"{self.phase}-{self.step}" + (f"#{self.nth}" if self.nth > 1 else "")


@dataclass(frozen=True)
class TrialSpec:
    """One trial: its kind (one of :data:`KINDS`) and the details of its faults."""

    kind: str
    name: str
    seed: int = 0
    aim: Aim | None = None  # aimed-kill, rerun-kill (the first run); concurrent: where run A stalls
    aim2: Aim | None = None  # rerun-kill: the re-run
    delay: float | None = None  # random-kill; concurrent/rollback-race/rerun-kill: kill one run at this time
    rate: float = 0.0  # flaky: the share of requests that fail
    mirror: str = ""  # mirror: when the naive mirror uploads (see MIRRORS)
    nth: int = 1  # mirror: at the nth request of its step
    recover: str = "compact"  # what first re-runs after a kill: the same compaction, or cleanup (lease expired)
    victim: str = "compact"  # aimed-kill: the compaction, or the rollback of a clean compaction
    workers: int = 1  # partitions each compaction works on at once (--workers)


MIRRORS: Final = ("after-log-swap", "after-index-put", "after-journal", "before-index-delete", "split", "timed")


@dataclass
class TrialResult:
    """What a trial did and found; ``bad`` fails it, and so does not converging."""

    spec: TrialSpec
    converged: bool = False
    bad: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    procs: list[Proc] = field(default_factory=list)
    fired: int = 0  # faults the proxies injected (kills, errors, resets, ...) and mirror uploads
    requests: int = 0  # requests the proxies saw
    seconds: float = 0.0

    @property
    def clean_failures(self) -> int:
        return sum(p.clean_failure for p in self.procs)

    @property
    def other_failures(self) -> int:
        """Nonzero exits (not killed) without exactly one ``tiering:`` line (and no traceback)."""
        return sum(not p.killed and p.code != 0 and not p.clean_failure and "Traceback" not in p.stderr
                   for p in self.procs)

    @property
    def exit_codes(self) -> list[str]:
        return ["killed" if p.killed else str(p.code) for p in self.procs]

    @property
    def ok(self) -> bool:
        return self.converged and not self.bad

    def describe(self) -> str:
        lines = [f"trial {self.spec.name} ({self.spec}): converged={self.converged}, {self.seconds:.1f}s, "
                 f"{self.requests} proxied requests, {self.fired} faults"]
        lines += [f"  BAD: {b}" for b in self.bad]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  {p.summary()}" for p in self.procs]
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.spec.name, "kind": self.spec.kind, "spec": repr(self.spec), "converged": self.converged,
                "bad": self.bad, "notes": self.notes, "clean_failures": self.clean_failures,
                "other_failures": self.other_failures, "exit_codes": self.exit_codes, "fired": self.fired,
                "requests": self.requests, "seconds": round(self.seconds, 2),
                "processes": [p.summary() for p in self.procs]}


def unfinished(doc: dict[str, Any] | None) -> list[str]:
    """Work a run's JSON says is still to do (failed, busy, stopped, pending)."""
    if doc is None:
        return ["no JSON result"]
    out: list[str] = []
    for s in doc.get("segments", []):
        reason = str(s.get("reason", ""))
        if s.get("status") == "failed" or s.get("pending") or reason.startswith(("partition busy", "stopped")):
            out.append(f"{s.get('directory')}/{s.get('base_offset')}: {s.get('status')} {reason[:120]}")
    return out


class Trial:
    """The state of one trial in progress: its bucket, snapshot, processes and proxies."""

    def __init__(self, lab: Lab, spec: TrialSpec) -> None:
        self.lab, self.spec = lab, spec
        self.rng = random.Random(spec.seed)
        self.store, self.snap = lab.new_bucket(spec.name)
        self.result = TrialResult(spec)
        self.proxies: list[Proxy] = []
        self.rules: list[Rule | Flaky] = []
        self.unsettled: list[str] = []  # commands that did not converge on re-run

    # processes

    def argv(self, verb: str, *extra: str) -> list[str]:
        return ["s3", verb, "--bucket", self.store.bucket, "--prefix", PREFIX, "--json",
                "--lease-ttl-seconds", str(LEASE_TTL), *extra]

    def compact_args(self, run_id: str, *extra: str) -> list[str]:
        return ["--codec", "zstd", "--min-age-minutes", "0", "--no-report", "--run-id", run_id,
                "--workers", str(self.spec.workers), *COMPACT_EXTRA, *extra]

    def start(self, label: str, argv: list[str], rules: Callable[[Running], Sequence[Decider]] | None) -> Running:
        """Start a CLI process, through a new proxy with ``rules(process)`` if given, else straight to moto."""
        if rules is None:
            return Running(label, argv, self.lab.endpoint, self.lab.source)
        proxy = Proxy(self.lab.endpoint).__enter__()
        self.proxies.append(proxy)
        running = Running(label, argv, proxy.url, self.lab.source)
        proxy.rules = list(rules(running))
        self.rules += [r for r in proxy.rules if isinstance(r, Rule | Flaky)]
        return running

    def finish(self, running: Running, kill_after: float | None = None) -> Proc:
        proc = running.wait(kill_after)
        self.result.procs.append(proc)
        self.result.bad += proc.problems()
        left = [] if proc.killed or proc.code == 0 else unfinished(proc.doc)
        if left:
            self.result.notes.append(f"{proc.label}: exit {proc.code}, left: {'; '.join(left[:3])}")
        return proc

    def run(self, label: str, argv: list[str], rules: Callable[[Running], Sequence[Decider]] | None = None,
            kill_after: float | None = None) -> Proc:
        return self.finish(self.start(label, argv, rules), kill_after)

    def settle(self, label: str, argv: list[str]) -> bool:
        """Re-run a command without faults until it exits 0 with nothing left to do."""
        for attempt in range(1, MAX_RERUNS + 1):
            proc = self.run(f"{label} (re-run {attempt})", argv)
            left = unfinished(proc.doc)
            if proc.code == 0 and not left:
                return True
            # A lease left by a killed process (another owner) expires within its TTL.
            time.sleep(LEASE_TTL + 1 if any("lease" in item or "busy:" in item for item in left) else 0.2)
        self.unsettled.append(label)
        return False

    # faults

    def aimed(self, aim: Aim) -> Callable[[Running], Sequence[Decider]]:
        """Rules that SIGKILL the process at ``aim``."""
        def rules(running: Running) -> Sequence[Decider]:
            if aim.phase == "before":
                action = Action("reset", before=lambda _r: running.kill())
            else:
                action = Action("drop", after=lambda _r, _s: running.kill())
            return [Rule(STEPS[aim.step], action, skip=aim.nth - 1)]
        return rules

    def flaky(self, rate: float, salt: int) -> Callable[[Running], Sequence[Decider]]:
        """A flaky S3 at ``rate`` (no rule at all for 0), seeded by the trial's seed and ``salt``."""
        return lambda _running: [Flaky(rate, self.spec.seed * 1000 + salt)] if rate > 0 else []

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.close()
            self.result.requests += len(proxy.seen)
        self.result.fired += sum(r.fired if isinstance(r, Rule) else sum(r.fired.values()) for r in self.rules)
        if any(isinstance(r, Flaky) for r in self.rules):
            kinds: dict[str, int] = {}
            for r in self.rules:
                if isinstance(r, Flaky):
                    for k, n in r.fired.items():
                        kinds[k] = kinds.get(k, 0) + n
            self.result.notes.append("flaky faults injected: "
                                     + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


class Mirror:
    """A naive mirroring tool: re-uploads a segment's original ``.log``, ``.index`` and ``.timeindex`` in that
    order, unconditionally, straight to S3. :meth:`upload` sends some of them now; :meth:`finish` sends what is
    left (a mirror always completes its pass)."""

    def __init__(self, trial: Trial) -> None:
        self.trial = trial
        self.segment: tuple[str, int] | None = None
        self.left = [LOG_SUFFIX, *INDEXES]
        self._lock = threading.Lock()

    def upload(self, segment: tuple[str, int] | None, suffixes: Sequence[str] = (LOG_SUFFIX, *INDEXES)) -> None:
        with self._lock:
            if segment is None or segment not in self.trial.snap.segments() or (
                    self.segment is not None and segment != self.segment):
                return
            self.segment = segment
            files = self.trial.snap.segments()[segment]
            for sfx in [s for s in self.left if s in suffixes]:
                if sfx in files:
                    self.trial.store.put(files[sfx], self.trial.snap.objects[files[sfx]])
                    self.trial.result.fired += 1
                self.left.remove(sfx)

    def finish(self) -> None:
        self.upload(self.segment)


def _mirror_rules(mirror: Mirror, variant: str, nth: int) -> list[Decider]:
    def everything(request: Request, _response: Response | None = None) -> None:
        mirror.upload(segment_of(request.key))

    if variant == "after-log-swap":
        return [Rule(STEPS["log-swap"], Action(after=everything), skip=nth - 1)]
    if variant == "after-index-put":
        return [Rule(STEPS["index-put"], Action(after=everything), skip=nth - 1)]
    if variant == "after-journal":
        return [Rule(STEPS["journal"], Action(after=everything), skip=nth - 1)]
    if variant == "before-index-delete":
        return [Rule(STEPS["index-delete"], Action(before=everything), skip=nth - 1)]
    if variant == "split":  # the .log right after our swap, its indexes right after ours
        def log_only(request: Request, _response: Response) -> None:
            mirror.upload(segment_of(request.key), (LOG_SUFFIX,))

        def indexes(request: Request, _response: Response) -> None:
            mirror.upload(segment_of(request.key), INDEXES)

        def ours_last_index(r: Request) -> bool:
            return (STEPS["index-put"](r) and r.key.endswith(TIME_INDEX_SUFFIX)
                    and mirror.segment is not None and segment_of(r.key) == mirror.segment)
        return [Rule(STEPS["log-swap"], Action(after=log_only), skip=nth - 1),
                Rule(ours_last_index, Action(after=indexes))]
    if variant == "timed":
        return []
    raise ValueError(f"unknown mirror variant {variant!r}")


def _faulted_phase(t: Trial) -> tuple[str, list[str]]:
    """Run the kind's faulted commands; the run id to converge with, and the run ids killed on the way."""
    spec, a = t.spec, "run-a"
    compact_a = t.argv("compact", *t.compact_args(a))
    killed: list[str] = []
    if spec.kind == "random-kill":
        if t.run("compact A", compact_a, lambda _r: [], kill_after=spec.delay).killed:
            killed.append(a)
    elif spec.kind == "aimed-kill" and spec.victim == "rollback":
        assert spec.aim is not None
        if t.run("compact R0 (clean)", t.argv("compact", *t.compact_args("run-0"))).code != 0:
            t.result.bad.append("the clean compaction before the rollback failed")
        rollback = t.argv("rollback", "--run-id", "run-0")
        if not t.run(f"rollback R0 killed {spec.aim}", rollback, t.aimed(spec.aim)).killed:
            t.result.notes.append(f"the rollback never reached {spec.aim}: nothing was killed")
        t.settle("rollback R0", rollback)  # its lease (a new owner each time) expires first
    elif spec.kind in ("aimed-kill", "rerun-kill"):
        assert spec.aim is not None
        if t.run(f"compact A killed {spec.aim}", compact_a, t.aimed(spec.aim)).killed:
            killed.append(a)
        else:
            t.result.notes.append(f"the run never reached {spec.aim}: nothing was killed")
        if spec.kind == "rerun-kill":
            aimed = t.aimed(spec.aim2) if spec.aim2 is not None else (lambda _r: [])
            flaky = t.flaky(spec.rate, 3)
            t.run(f"compact A again{f' on a flaky S3 ({spec.rate:.0%})' if spec.rate else ''}, killed "
                  f"{spec.aim2 or f'at {spec.delay:.2f}s'}", compact_a, lambda r: [*aimed(r), *flaky(r)],
                  kill_after=None if spec.aim2 is not None else spec.delay)
    elif spec.kind == "flaky":
        t.run(f"compact A on a flaky S3 ({spec.rate:.0%})", compact_a, t.flaky(spec.rate, 1))
        t.run(f"cleanup on a flaky S3 ({spec.rate:.0%})", t.argv("cleanup"), t.flaky(spec.rate, 2))
    elif spec.kind == "concurrent" and spec.aim is not None:
        # A stalls at its aimed request for longer than its lease lives; B takes the partition over and runs
        # to its end; then A's request goes on (a GC pause, a hung connection).
        compact_b = t.argv("compact", *t.compact_args("run-b"))

        def take_over(*_: object) -> None:
            time.sleep(LEASE_TTL + 1.5)
            t.run("compact B (while A stalls)", compact_b)

        stall = spec.aim
        hook = Action(before=take_over) if stall.phase == "before" else Action(after=take_over)
        t.run(f"compact A stalled {stall}", compact_a, lambda _r: [Rule(STEPS[stall.step], hook, skip=stall.nth - 1)])
    elif spec.kind == "concurrent":
        b = "run-b"
        runs = [t.start("compact A", compact_a, t.flaky(spec.rate, 1)),
                t.start("compact B", t.argv("compact", *t.compact_args(b)), t.flaky(spec.rate, 2))]
        victim = t.rng.randrange(2)
        procs = [t.finish(r, spec.delay if i == victim else None) for i, r in enumerate(runs)]
        killed += [rid for rid, p in zip((a, b), procs, strict=True) if p.killed]
    elif spec.kind == "rollback-race":
        first = t.run("compact R0 (clean)", t.argv("compact", *t.compact_args("run-0", "--max-segments", "3")))
        if first.code != 0:
            t.result.bad.append("the clean compaction before the race failed")
        runs = [t.start("rollback R0", t.argv("rollback", "--run-id", "run-0"), t.flaky(spec.rate, 1)),
                t.start("compact A", compact_a, t.flaky(spec.rate, 2))]
        victim = t.rng.randrange(2)
        procs = [t.finish(r, spec.delay if i == victim else None) for i, r in enumerate(runs)]
        if procs[1].killed:
            killed.append(a)
        t.settle("rollback R0", t.argv("rollback", "--run-id", "run-0"))
    elif spec.kind == "mirror":
        mirror = Mirror(t)
        running = t.start(f"compact A beside a mirror ({spec.mirror})", compact_a,
                          lambda _r: _mirror_rules(mirror, spec.mirror, spec.nth))
        if spec.mirror == "timed":
            timer = threading.Timer(spec.delay or 1.0, mirror.upload, (t.rng.choice(t.snap.sealed()),))
            timer.start()
            t.finish(running)
            timer.join()
        else:
            t.finish(running)
        mirror.finish()
        if mirror.segment is not None:
            t.result.notes.append(f"the mirror re-uploaded {mirror.segment[0]}/{mirror.segment[1]}")
    else:
        raise ValueError(f"unknown trial kind {spec.kind!r}")
    return a, killed


def run_trial(lab: Lab, spec: TrialSpec) -> TrialResult:
    """One trial (see the module docstring): fault, converge, check, roll back, check again."""
    started = time.monotonic()
    t = Trial(lab, spec)
    try:
        run_id, killed = _faulted_phase(t)
        if killed and spec.recover == "cleanup":
            time.sleep(LEASE_TTL + 1)  # the killed run's lease expires: cleanup may finish its journals
            t.settle("cleanup", t.argv("cleanup"))
        for rid in killed:  # a retry of each killed run takes its leases back at once
            if rid != run_id:
                t.run(f"retry of {rid}", t.argv("compact", *t.compact_args(rid)))
        t.settle("compact A", t.argv("compact", *t.compact_args(run_id)))
        t.result.converged = not t.unsettled
        t.result.notes += [f"{label}: did not converge in {MAX_RERUNS} re-runs" for label in t.unsettled]
        t.result.bad += check_bucket(t.store, t.snap)
        t.result.bad += wrong_verdicts(t.result.procs)
        runs = compacting_runs(t.store, t.snap)
        restored: set[tuple[str, int]] = set()
        for rid, segments in sorted(runs.items()):
            if not t.settle(f"rollback {rid}", t.argv("rollback", "--run-id", rid)):
                t.result.bad.append(f"the rollback of {rid} did not converge")
            restored |= segments
        t.result.bad += [f"after rollback: {p}" for p in check_restored(t.store, t.snap, restored)]
    finally:
        t.close()
        Lab.drop_bucket(t.store)
    t.result.seconds = time.monotonic() - started
    return t.result


def random_spec(kind: str, index: int, rng: random.Random) -> TrialSpec:
    """A trial of ``kind`` with its details drawn from ``rng`` (the long mode's trials)."""
    def aim() -> Aim:
        return Aim(rng.choice(AIMED_STEPS), rng.choice(("before", "after")), rng.randint(1, 3))

    spec = TrialSpec(kind, f"{kind}-{index}", seed=rng.randrange(1 << 30))
    if kind == "random-kill":
        return replace(spec, delay=rng.uniform(0.5, 4.0), recover=rng.choice(("compact", "cleanup")))
    if kind == "aimed-kill":
        victim = rng.choice(("compact", "compact", "rollback"))
        return replace(spec, aim=aim(), victim=victim,
                       recover=rng.choice(("compact", "cleanup")) if victim == "compact" else "compact")
    if kind == "flaky":
        return replace(spec, rate=rng.uniform(0.05, 0.2))
    if kind == "concurrent" and rng.random() < 1 / 3:
        return replace(spec, aim=aim(), workers=rng.choice((1, 2)))  # A stalls there, B takes over
    if kind in ("concurrent", "rollback-race"):
        return replace(spec, delay=rng.choice((None, rng.uniform(0.5, 3.0))), rate=rng.choice((0.0, 0.0, 0.05)),
                       workers=rng.choice((1, 2)))
    if kind == "mirror":
        return replace(spec, mirror=rng.choice(MIRRORS), nth=rng.randint(1, 3), delay=rng.uniform(0.8, 3.0))
    if kind == "rerun-kill":
        second = rng.random() < 0.5
        return replace(spec, aim=aim(), aim2=aim() if second else None,
                       delay=None if second else rng.uniform(0.5, 3.0), rate=rng.choice((0.0, 0.1)))
    raise ValueError(f"unknown trial kind {kind!r}")
