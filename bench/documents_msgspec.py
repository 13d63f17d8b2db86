"""The run document (schema version 3, as :meth:`tiering.run.documents.RunResult.to_json` writes it) declared
once as msgspec structs, for ``bench/bench_documents.py``: the same declaration as
``bench/documents_pydantic.py`` (frozen, unknown fields refused, strict types, the vocabulary's enums, a
segment's ``stats`` a union tagged by its ``kind``), with fields equal to their default left out when
written (``omit_defaults``, as today's writers leave out null fields). Imported only where msgspec is."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tiering.errors import ConfigError, ExitCode
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status, Verify

LIBRARY = "msgspec"
VERSION = msgspec.__version__


class Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The documents' options (a subclass inherits them; ``frozen`` is said again on each for mypy, whose
    dataclass_transform reading takes a subclass without it for a mutable one)."""


class SourceLog(Strict, frozen=True):
    """The source ``.log`` a result is priced by (its size, class and age)."""

    size: int
    storage_class: str  # a StorageClass, or another class S3 reported
    last_modified: str | None = None


class RewriteStats(Strict, frozen=True, tag_field="kind", tag="rewrite"):
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
    seconds: float
    source_payload_xxh3: str | None = None
    rebatch: dict[str, Any] | None = None
    verified: Verify | None = None
    log: SourceLog | None = None


class SourceStats(Strict, frozen=True, tag_field="kind", tag="source"):
    """A segment left as it was at planning: only its source's facts."""

    log: SourceLog


class MergeFacts(Strict, frozen=True):
    segments_before: int
    segments_after: int
    storage_class: str
    objects_before: tuple[int, ...]
    objects_after: tuple[int, ...]


class MergeStats(Strict, frozen=True, tag_field="kind", tag="merge"):
    log: SourceLog
    merge: MergeFacts | None = None


class SegmentError(Strict, frozen=True):
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


class Segment(Strict, frozen=True):
    """:class:`tiering.commit.operation.SegmentResult`."""

    directory: str
    base_offset: int
    status: Status
    reason: str = ""
    bytes_before: int = 0
    bytes_after: int = 0
    recovered: bool = False
    stats: RewriteStats | SourceStats | MergeStats | None = None
    error: SegmentError | None = None
    run_id: str | None = None
    encryption: str | None = None
    pending: Pending | None = None
    cause: Cause | None = None
    seconds: float | None = None


class TopicRow(Strict, frozen=True):
    topic: str
    compacted: int
    bytes_before: int
    bytes_after: int


class OutcomeRow(Strict, frozen=True):
    """One key of :attr:`RunResult.outcomes` (topic, status, cause) with its count: msgspec writes no
    tuple-keyed mapping (only str-like or number-like keys), so it is written as rows, as today."""

    topic: str
    status: Status
    cause: Cause | None
    segments: int


class Usage(Strict, frozen=True):
    requests: dict[str, dict[str, int]]
    compute_seconds: float


class RunDocument(Strict, frozen=True):
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


class Header(msgspec.Struct, frozen=True):
    """A document's ``kind`` and ``schema_version``, whatever else it holds (what the reader checks first)."""

    kind: Any = None
    schema_version: Any = None


_DECODER = msgspec.json.Decoder(RunDocument)
_HEADER = msgspec.json.Decoder(Header)
_ENCODER = msgspec.json.Encoder()


def decode(data: bytes) -> RunDocument:
    return _DECODER.decode(data)


def encode(doc: RunDocument) -> bytes:
    """The document's JSON, compact, fields equal to their default left out."""
    return _ENCODER.encode(doc)


def read(data: bytes, where: str) -> RunDocument:
    """The run document in ``data``: its kind and version checked first (a :class:`ConfigError` naming what
    it found), then the whole of it (msgspec's message names the place: ``- at `$.segments[5000]```);
    ``where``: the document's key."""
    try:
        head = _HEADER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise ConfigError("not a run document: not a JSON object", path=where) from None
    if head.kind not in list(RunKind) or head.schema_version != 3:
        raise ConfigError("not a run document this version can read", path=where, expected="a run's kind v3",
                          found=f"{head.kind} v{head.schema_version}")
    try:
        return decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise ConfigError(f"not a run document this version can read: {e}", path=where) from None
