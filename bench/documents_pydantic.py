"""The run document (schema version 3, as :meth:`tiering.run.documents.RunResult.to_json` writes it) declared
once as pydantic v2 models, for ``bench/bench_documents.py``: frozen, unknown fields and wrong types refused
(``extra="forbid"``, ``strict=True``, parsed from bytes by ``model_validate_json``), the enums of
:mod:`tiering.lifecycle.vocabulary` as field types, a segment's ``stats`` a union tagged by its ``kind``
(a field today's stats do not have yet: the bench's documents carry it). ``settings`` and a rewrite's
``rebatch`` stay free JSON objects; ``usage`` is a compaction's (requests by scope, compute seconds)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tiering.errors import ConfigError, ExitCode
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status, Verify

LIBRARY = "pydantic"
VERSION = pydantic.VERSION


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class SourceLog(Strict):
    """The source ``.log`` a result is priced by (its size, class and age)."""

    size: int
    storage_class: str  # a StorageClass, or another class S3 reported
    last_modified: str | None = None


class RewriteStats(Strict):
    kind: Literal["rewrite"]
    path: str
    base_offset: int
    codec: str
    level: int | None
    bytes_in: int
    bytes_out: int
    ratio: float | None
    saved_bytes: int
    batches: int
    records: int
    batches_rewritten: int
    batches_kept: dict[str, int]
    codecs_before: dict[str, int]
    codecs_after: dict[str, int]
    uncompressed_bytes: int
    payload_xxh3: str
    source_payload_xxh3: str | None = None
    seconds: float
    rebatch: dict[str, Any] | None = None
    verified: Verify | None = None
    log: SourceLog | None = None


class SourceStats(Strict):
    """A segment left as it was at planning: only its source's facts."""

    kind: Literal["source"]
    log: SourceLog


class MergeFacts(Strict):
    segments_before: int
    segments_after: int
    storage_class: str
    objects_before: tuple[int, ...]
    objects_after: tuple[int, ...]


class MergeStats(Strict):
    kind: Literal["merge"]
    merge: MergeFacts | None = None
    log: SourceLog


Stats = Annotated[RewriteStats | SourceStats | MergeStats, Field(discriminator="kind")]


class SegmentError(Strict):
    """:meth:`tiering.errors.TieringError.to_dict` (an S3 error's code, status and request id with it)."""

    error: str
    message: str
    path: str | None
    position: int | None
    base_offset: int | None
    expected: str | None
    found: str | None
    retryable: bool
    code: str | None = None
    status: int | None = None
    request_id: str | None = None


class Segment(Strict):
    """:class:`tiering.commit.operation.SegmentResult`."""

    directory: str
    base_offset: int
    status: Status
    reason: str = ""
    bytes_before: int = 0
    bytes_after: int = 0
    recovered: bool = False
    stats: Stats | None = None
    error: SegmentError | None = None
    run_id: str | None = None
    encryption: str | None = None
    pending: Pending | None = None
    cause: Cause | None = None
    seconds: float | None = None


class TopicRow(Strict):
    topic: str
    compacted: int
    bytes_before: int
    bytes_after: int


class OutcomeRow(Strict):
    """One key of :attr:`RunResult.outcomes` (topic, status, cause) with its count: a JSON object's keys are
    strings, so the tuple-keyed mapping is written as rows."""

    topic: str
    status: Status
    cause: Cause | None
    segments: int


class Usage(Strict):
    requests: dict[str, dict[str, int]]
    compute_seconds: float


class RunDocument(Strict):
    schema_version: Literal[3]
    kind: RunKind
    run_id: str
    bucket: str
    prefix: str
    started_at: str
    finished_at: str
    settings: dict[str, Any]
    totals: dict[str, int]
    exit_code: ExitCode
    hard_failures: int
    pending: int
    by_topic: tuple[TopicRow, ...]
    outcomes: tuple[OutcomeRow, ...]
    segments: tuple[Segment, ...]
    segments_omitted: int
    usage: Usage | None = None


class Header(BaseModel):
    """A document's ``kind`` and ``schema_version``, whatever else it holds (what the reader checks first)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: Any = None
    schema_version: Any = None


_ADAPTER: TypeAdapter[RunDocument] = TypeAdapter(RunDocument)


def decode(data: bytes) -> RunDocument:
    return RunDocument.model_validate_json(data)


def encode(doc: RunDocument) -> bytes:
    """The document's JSON, compact, its null fields left out (as today's writers leave them)."""
    return _ADAPTER.dump_json(doc, exclude_none=True)


def read(data: bytes, where: str) -> RunDocument:
    """The run document in ``data``: its kind and version checked first (a :class:`ConfigError` naming what
    it found), then the whole of it (a :class:`ConfigError` naming the first error's place in it); ``where``:
    the document's key."""
    try:
        head = Header.model_validate_json(data)
    except ValidationError:
        raise ConfigError("not a run document: not a JSON object", path=where) from None
    if head.kind not in list(RunKind) or head.schema_version != 3:
        raise ConfigError("not a run document this version can read", path=where, expected="a run's kind v3",
                          found=f"{head.kind} v{head.schema_version}")
    try:
        return decode(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        at = ".".join(str(p) for p in first["loc"])
        found = repr(first["input"])
        found = found if len(found) <= 80 else found[:77] + "..."
        raise ConfigError(f"not a run document this version can read: {at}: {first['msg']}, found {found}",
                          path=where) from None
