"""A run's documents and its exit code: the options of a compaction, the run document (its totals and every
segment's outcome by topic, status and cause), the tally that builds it, the step documents of a unit's
stage and a chunk's commit, and the fold of segment results into one exit code."""

from __future__ import annotations

import contextlib
import secrets
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar, Final, Literal, Protocol

from tiering.commit.lease import DEFAULT_TTL_SECONDS, release_leases_of
from tiering.commit.operation import (
    SegmentResult,
)
from tiering.documents import Document, check_document
from tiering.errors import ExitCode, TieringError
from tiering.kafka.merge import Limits
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status
from tiering.storage.layout import run_result_key
from tiering.storage.objects import ObjectNotFound, ObjectStore

MAX_LISTED_SEGMENTS: Final = 10_000  # segments a run document names one by one (the rest are counted)
RUN_SCOPE: Final = "_run"  # requests of the run outside any partition's work (listing, plan, documents)
OTHER_SCOPE: Final = "_other_partitions"  # requests of the partitions past the run document's limit
MAX_LISTED_PARTITIONS: Final = 10_000
DONE_STATUSES: Final = (Status.COMPACTED, Status.ROLLED_BACK, Status.MERGED)


def new_run_id() -> str:
    """A sortable, unique run id (the local clock only names it; nothing is decided by it)."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class CompactOptions:
    max_segments: int | None = None
    max_bytes: int | None = None
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    workers: int = 1  # partitions compacted at once


def _outcomes_from_json(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, Status, Cause | None], int]:
    """A run document's outcome rows (version 2's by reason text: a text that is no cause's name counts under
    its status alone)."""
    out: Counter[tuple[str, Status, Cause | None]] = Counter()
    for o in rows:
        out[(str(o["topic"]), Status(o["status"]), Cause.named(o.get("cause", o.get("reason"))))] += int(o["segments"])
    return dict(out)


@dataclass(frozen=True, slots=True)
class RunResult:
    """A run's document (``runs/<run>/<kind>.json``): its totals, the outcome of every segment counted by
    topic and reason, and the segments themselves up to :data:`MAX_LISTED_SEGMENTS` (those that failed or
    were left to a later run first), so that it stays small whatever the run's size. Every segment's
    result is in the run's step documents (``runs/<run>/<step>/``)."""

    SCHEMA_VERSION: ClassVar[int] = 3

    kind: RunKind
    run_id: str
    bucket: str
    prefix: str
    started_at: str
    finished_at: str
    settings: Mapping[str, Any]
    counts: Mapping[str, int]  # segments by status
    bytes_before: int  # of the segments compacted (or rolled back)
    bytes_after: int
    exit: ExitCode
    hard_failures: int  # failed for a reason a retry does not fix
    pending: int  # left to a later run (busy, transient)
    topics: Mapping[str, tuple[int, int, int]]  # compacted, bytes before, bytes after
    outcomes: Mapping[tuple[str, Status, Cause | None], int]  # every other outcome, by topic, status and cause
    segments: tuple[SegmentResult, ...]
    omitted: int = 0  # segments not listed
    usage: Mapping[str, Any] = field(default_factory=dict)  # S3 requests by partition and class, task seconds

    def outcome_rows(self) -> list[tuple[str, Status, Cause | None, int]]:
        """The outcomes other than compacted, by topic, status and cause (none for a repair or a move)."""
        return [(t, st, cause, n) for (t, st, cause), n in
                sorted(self.outcomes.items(), key=lambda o: (o[0][0], o[0][1], o[0][2] or ""))]

    def totals(self) -> dict[str, int]:
        return {"segments": sum(self.counts.values()), **dict(sorted(self.counts.items())),
                "bytes_before": self.bytes_before, "bytes_after": self.bytes_after}

    @property
    def failed(self) -> bool:
        """A segment failed for a reason a retry does not fix (invalid data, a proof failure, a refusal)."""
        return self.hard_failures > 0

    def exit_code(self) -> ExitCode:
        return self.exit

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.kind.value, "run_id": self.run_id,
                "bucket": self.bucket, "prefix": self.prefix, "started_at": self.started_at,
                "finished_at": self.finished_at, "settings": dict(self.settings), "totals": self.totals(),
                "exit_code": int(self.exit), "hard_failures": self.hard_failures, "pending": self.pending,
                "by_topic": [{"topic": t, "compacted": n, "bytes_before": b, "bytes_after": a}
                             for t, (n, b, a) in sorted(self.topics.items())],
                "outcomes": [{"topic": t, "status": st.value, "cause": cause.value if cause else None, "segments": n}
                             for t, st, cause, n in self.outcome_rows()],
                "segments": [s.to_json() for s in self.segments], "segments_omitted": self.omitted,
                **({"usage": dict(self.usage)} if self.usage else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], where: str) -> RunResult:
        version = doc.get("schema_version")
        if version == 1:  # every segment listed: counted again
            tally = RunTally()
            for s in doc["segments"]:
                tally.add(SegmentResult.from_json(s))
            return tally.result(RunKind(doc["kind"]), doc["run_id"], doc["bucket"], doc["prefix"], doc["started_at"],
                                doc.get("finished_at", ""), doc.get("settings") or {}, doc.get("usage") or {})
        if version == 2:  # outcomes by reason text: a text that is no cause's name reads back without one
            doc = {**doc, "schema_version": cls.SCHEMA_VERSION}
        check_document(doc, kind=None, version=cls.SCHEMA_VERSION, what="a run document", where=where)
        totals = dict(doc["totals"])
        before, after = int(totals.pop("bytes_before")), int(totals.pop("bytes_after"))
        totals.pop("segments")
        return cls(RunKind(doc["kind"]), str(doc["run_id"]), str(doc["bucket"]), str(doc["prefix"]),
                   str(doc["started_at"]), str(doc["finished_at"]), dict(doc.get("settings") or {}),
                   {k: int(v) for k, v in totals.items()}, before, after, ExitCode(doc["exit_code"]),
                   int(doc["hard_failures"]), int(doc["pending"]),
                   {t["topic"]: (int(t["compacted"]), int(t["bytes_before"]), int(t["bytes_after"]))
                    for t in doc["by_topic"]},
                   _outcomes_from_json(doc["outcomes"]),
                   tuple(SegmentResult.from_json(s) for s in doc["segments"]), int(doc["segments_omitted"]),
                   dict(doc.get("usage") or {}))


def topic_of(directory: str) -> str:
    return directory.rsplit("-", 1)[0]


class RequestTally:
    """A run's S3 requests, for its run document: by partition for up to :data:`MAX_LISTED_PARTITIONS` of them
    (the others' summed under :data:`OTHER_SCOPE`), and the run's own outside any partition (:data:`RUN_SCOPE`)."""

    def __init__(self) -> None:
        self.by_scope: dict[str, Counter[str]] = {}
        self._partitions = 0

    def add(self, scope: str, counts: Mapping[str, int]) -> None:
        if scope not in self.by_scope and scope != RUN_SCOPE:
            if self._partitions >= MAX_LISTED_PARTITIONS:
                scope = OTHER_SCOPE
            else:
                self._partitions += 1
        self.by_scope.setdefault(scope, Counter()).update(counts)

    def to_json(self) -> dict[str, dict[str, int]]:
        return {k: dict(sorted(v.items())) for k, v in sorted(self.by_scope.items()) if v}


class RunTally:
    """Folds a run's results, one at a time, into its :class:`RunResult`: memory for the listed segments
    and the counts, whatever the number of results; with them, the S3 requests and compute seconds the steps
    that made them recorded (:meth:`add_usage`)."""

    def __init__(self, max_listed: int | None = None) -> None:
        self.max_listed = MAX_LISTED_SEGMENTS if max_listed is None else max_listed
        self.counts: Counter[str] = Counter()
        self.before = self.after = self.hard_failures = self.pending = self.omitted = 0
        self.codes: set[ExitCode] = set()
        self.topics: dict[str, list[int]] = {}
        self.outcomes: Counter[tuple[str, Status, Cause | None]] = Counter()
        self.problems: list[SegmentResult] = []  # failed or left to a later run: listed first
        self.others: list[SegmentResult] = []
        self.requests = RequestTally()
        self.seconds = 0.0

    def add(self, r: SegmentResult) -> None:
        self.counts[str(r.status)] += 1
        self.codes.add(exit_code_of(r))
        topic = topic_of(r.directory)
        if r.status in DONE_STATUSES:
            self.before += r.bytes_before
            self.after += r.bytes_after
        if r.status is Status.COMPACTED:
            row = self.topics.setdefault(topic, [0, 0, 0])
            row[0] += 1
            row[1] += r.bytes_before
            row[2] += r.bytes_after
        else:
            self.outcomes[(topic, r.status, r.cause)] += 1
        problem = r.status is Status.FAILED or r.pending is not None
        self.hard_failures += r.status is Status.FAILED and r.pending is None
        self.pending += r.pending is not None
        kept = self.problems if problem else self.others
        if len(self.problems) + len(self.others) < self.max_listed:
            kept.append(r)
        elif problem and self.others:
            self.others.pop()  # a problem is listed in place of a segment that went well
            self.problems.append(r)
            self.omitted += 1
        else:
            self.omitted += 1

    def add_usage(self, requests: Mapping[str, Mapping[str, int]], seconds: float = 0.0) -> None:
        """A step's S3 requests by scope (a partition, or :data:`RUN_SCOPE`) and the seconds its work took."""
        for scope, counts in requests.items():
            self.requests.add(scope, counts)
        self.seconds += seconds

    def usage(self, **more: object) -> dict[str, object]:
        """The run document's usage: the requests by scope, ``more`` figures, the compute seconds."""
        return {"requests": self.requests.to_json(), **more, "compute_seconds": round(self.seconds, 3)}

    def write(self, store: ObjectStore, kind: RunKind, run_id: str, prefix: str, started_at: str,
              settings: Mapping[str, object], usage: Mapping[str, object] | None = None) -> RunResult:
        """The run document, finished now, written to ``runs/<run>/<kind>.json``."""
        run = self.result(kind, run_id, store.bucket, prefix, started_at, datetime.now(UTC).isoformat(), settings,
                          usage)
        end_run(store, prefix, run_id, kind, run)
        return run

    def result(self, kind: RunKind, run_id: str, bucket: str, prefix: str, started_at: str, finished_at: str,
               settings: Mapping[str, object], usage: Mapping[str, object] | None = None) -> RunResult:
        listed = sorted(self.problems + self.others, key=lambda r: (r.directory, r.base_offset, not r.recovered))
        return RunResult(kind, run_id, bucket, prefix, started_at, finished_at, dict(settings), dict(self.counts),
                         self.before, self.after, worst(self.codes), self.hard_failures, self.pending,
                         {t: (n, b, a) for t, (n, b, a) in self.topics.items()}, dict(self.outcomes),
                         tuple(listed), self.omitted, dict(usage or {}))


class RunDocument(Protocol):
    """A run's document (:class:`RunResult`, a tiering run's)."""

    def to_json(self) -> dict[str, Any]: ...


def end_run(store: ObjectStore, prefix: str, run_id: str, kind: RunKind, document: RunDocument) -> None:
    """How every run ends: each lease it still holds released (one a unit kept for a later step, or one an
    attempt killed before its release left), then its run document written to ``runs/<run>/<kind>.json``."""
    with contextlib.suppress(TieringError):  # best effort: a lease left expires, or the cleanup releases it
        release_leases_of(store, prefix, run_id)
    store.put_json(run_result_key(prefix, run_id, kind), document.to_json())


@dataclass(frozen=True, slots=True)
class StepResults:
    """What one step of a run (a unit of the engine, the operations its planner finished, the results its
    planning noted) did: its segments' results and the S3 requests it made, by partition. Stored at
    ``runs/<run>/<step>/<name>.json``."""

    KIND: ClassVar[str] = "tiering.step-results"
    SCHEMA_VERSION: ClassVar[int] = 1

    results: tuple[SegmentResult, ...]
    requests: dict[str, dict[str, int]] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            out[str(r.status)] = out.get(str(r.status), 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND,
                "results": [r.to_json() for r in self.results], "usage": self.requests}

    @classmethod
    def from_json(cls, doc: dict[str, Any], where: str) -> StepResults:
        check_document(doc, kind=cls.KIND, version=cls.SCHEMA_VERSION, what="step results", where=where)
        return cls(tuple(SegmentResult.from_json(r) for r in doc["results"]),
                   {k: dict(v) for k, v in doc.get("usage", {}).items()})


class StepUsage(Document, frozen=True, tag="tiering.step-usage"):
    """The S3 requests a step made for the run outside any partition's work (``runs/<run>/usage/<step>.json``)."""

    requests: dict[str, int]
    schema_version: Literal[1] = 1


def finished_at(store: ObjectStore, prefix: str, run_id: str) -> datetime | None:
    """When run ``run_id``'s document was written (S3's clock), or None while it has none."""
    for kind in RunKind:
        try:
            return store.head(run_result_key(prefix, run_id, kind)).last_modified
        except ObjectNotFound:
            continue
    return None


def exit_code_of(r: SegmentResult) -> ExitCode:
    """What one result says about the run's exit: a failed proof (our bug, or the store's), invalid or
    unreadable data (or data this version cannot handle, or a rollback's backup gone), a refusal (access,
    configuration), S3 failing (retry), work left to a busy partition or a concurrent writer, or a rollback
    that must wait for a later run's or cannot restore over what is in place, else done."""
    if r.cause in (Cause.UNSUPPORTED, Cause.BACKUP_MISSING):
        return ExitCode.INVALID
    if r.cause in (Cause.LATER_RUN, Cause.NOT_RESTORABLE):  # a rollback that must wait for a later run's, or
        # one that finds a writer's object in place of its run's: not restored over
        return ExitCode.BUSY
    if r.status == Status.FAILED and r.pending is None:
        return (ExitCode.INTERNAL if r.cause is Cause.PROOF_FAILED else
                ExitCode.INVALID if r.cause in (Cause.INVALID, Cause.UNREADABLE) else ExitCode.USAGE)
    if r.pending is Pending.TRANSIENT:
        return ExitCode.RETRY
    if r.pending is Pending.BUSY:
        return ExitCode.BUSY
    return ExitCode.OK


def worst(codes: Iterable[ExitCode]) -> ExitCode:
    """The exit code that says the most, of several: in the order :func:`exit_code_of` lists them."""
    seen = set(codes)
    order = (ExitCode.INTERNAL, ExitCode.INVALID, ExitCode.USAGE, ExitCode.RETRY, ExitCode.BUSY)
    return next((c for c in order if c in seen), ExitCode.OK)


def outcome(results: Iterable[SegmentResult]) -> ExitCode:
    """The exit code of ``results`` (see :func:`exit_code_of`)."""
    return worst(exit_code_of(r) for r in results)


def limits_json(limits: Limits) -> list[int]:
    """A merged segment's bounds in a document: ``[segment.bytes, segment.index.bytes]``."""
    return [limits.segment_bytes, limits.index_bytes]


def limits_of(doc: object) -> Limits:
    """:func:`limits_json` read back (a TypeError for anything but two integers)."""
    if not (isinstance(doc, list) and len(doc) == 2 and all(isinstance(n, int) and not isinstance(n, bool)
                                                           for n in doc)):
        raise TypeError(f"merge bounds must be [segment.bytes, segment.index.bytes], found {doc!r}")
    return Limits(doc[0], doc[1])
