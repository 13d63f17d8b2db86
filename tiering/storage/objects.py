"""The object store as the platform sees it, with no S3 client in it: the interface (:class:`ObjectStore`, a
:class:`typing.Protocol`), the values it speaks in (:class:`ObjectInfo`, :class:`ObjectAttrs`,
:class:`BucketFacts`, :class:`Uploaded`), its errors (:class:`~tiering.errors.StorageError` subclasses), the
streamed upload both stores share (:class:`StreamUpload`, :class:`StreamUploads`), :func:`put_json`, and the
probes of what a store honours. Every layer above imports from here; only the entry points that build a
store import an implementation.

:class:`tiering.storage.s3.S3Store` (boto3) and :class:`tiering.storage.memory.MemoryStore` (a dict, for unit tests)
both satisfy it structurally; neither inherits from it. The signatures are S3Store's, copied exactly (the
test suite compares them with :mod:`inspect`, so a change to one that is not made to the others fails a
test). The semantics are S3's, as S3Store exposes them:

- errors are :class:`~tiering.errors.StorageError` subclasses chosen by S3's error code:
  ``ObjectNotFound`` (404), ``PreconditionFailed`` (412), ``AccessDenied`` (403), ...;
- ``if_none_match`` creates only where no object is (412 otherwise); ``if_match`` writes or deletes only
  the version with that ETag (412 for another ETag, 404 where no object is);
- ETags are quoted: the hex MD5 of the bytes for a single PUT or a copy, the MD5 of the parts' MD5s
  followed by ``-<parts>`` for a multipart upload;
- listings come in key order; ``requests`` counts API calls by S3 operation name (what S3 bills).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
from typing import Any, BinaryIO, Final, Protocol, runtime_checkable
from urllib.parse import urlencode, urlsplit, urlunsplit

import crc32c

from tiering.errors import ConfigError, ProofError, StorageError, TieringError
from tiering.lifecycle.vocabulary import StorageClass

MIN_PART_BYTES: Final = 5 * 1024 * 1024  # S3's smallest part (all but the last)


DEFAULT_PART_BYTES: Final = 8 * 1024 * 1024  # memory holds about three parts: two on their way, one filling


MAX_PARTS: Final = 10_000


MAX_COPY_BYTES: Final = 5 * 1024 ** 3  # CopyObject's largest source


MAX_DELETE_KEYS: Final = 1000  # DeleteObjects takes at most this many keys a request


class ObjectNotFound(StorageError):
    """The key (or bucket) does not exist."""


class PreconditionFailed(StorageError):
    """A conditional request lost: the object exists already, or changed since it was read."""


class AccessDenied(StorageError):
    """The credentials may not do this (a configuration problem, not the data's)."""


class Unsupported(StorageError):
    """The store does not implement a feature of S3's API (HTTP 501 ``NotImplemented``): a fact of the store,
    which a retry does not change."""

    code = "NotImplemented"


class Throttled(StorageError):
    """S3 asked us to slow down, even after botocore's retries."""

    retryable = True


class TransportError(StorageError):
    """The request or its answer did not cross the network whole (unreachable endpoint, reset or timed-out
    connection, a body cut short): nothing is known about the data, so trying again can help."""

    retryable = True
    code = "Transport"


class ChecksumMismatch(StorageError):
    """The store reports another CRC-32C for an object than the bytes we sent have: it holds other bytes,
    or computes the checksum wrongly (moto 5.2.5 without the ``crc32c`` package computes CRC-32 for it).
    Never taken for a verified object; ``--verify read-back`` checks by downloading instead."""

    code = "ChecksumMismatch"


class ChecksumUnsupported(StorageError):
    """The store reports no CRC-32C for an object uploaded with one (an endpoint without S3's additional
    checksums): verify it by reading it back."""

    code = "ChecksumUnsupported"


def same_crc(where: str, read: int, produced: int) -> None:
    """:class:`ProofError` unless the CRC-32C of the bytes read for an upload is the producer's."""
    if read != produced:
        raise ProofError("the bytes read for the upload are not the ones produced (the local copy changed)",
                         path=where, expected=crc32c_b64(produced), found=crc32c_b64(read))


def crc32c_b64(value: int) -> str:
    """A CRC-32C as S3's checksum headers carry it: four big-endian bytes, base64."""
    return base64.b64encode(value.to_bytes(4, "big")).decode()


def check_stored(where: str, reported: str | None, ours: int) -> None:
    """:class:`ChecksumUnsupported` without a reported CRC-32C; :class:`ChecksumMismatch` unless it is ours
    (a full-object checksum: a composite one, ``...-N``, never equals it)."""
    if reported is None:
        raise ChecksumUnsupported("the store reports no CRC-32C for the object uploaded with one", path=where)
    if reported != crc32c_b64(ours):
        raise ChecksumMismatch("the store reports another CRC-32C than the bytes sent have", path=where,
                               expected=crc32c_b64(ours), found=reported)


@dataclass(frozen=True, slots=True)
class Uploaded:
    """An object a :class:`StreamUpload` completed: its ETag, size and the CRC-32C of the bytes written."""

    etag: str
    size: int
    crc32c: int


class _Multipart(Protocol):
    """What a :class:`StreamUpload` needs of a store: S3's upload calls, each checked as its store checks them."""

    bucket: str

    def _single(self, key: str, data: bytes | bytearray, metadata: dict[str, str], if_none_match: bool,
                crc: int | None) -> str: ...

    def _start(self, key: str, metadata: dict[str, str], checksum: bool) -> str: ...

    def _part(self, key: str, upload_id: str, number: int, data: bytearray, checksum: bool) -> dict[str, Any]: ...

    def _finish(self, key: str, upload_id: str, parts: Sequence[dict[str, Any]], if_none_match: bool,
                crc: int | None) -> str: ...

    def abort_upload(self, key: str, upload_id: str) -> None: ...


class _Part(bytearray):
    """A part's bytes, sent as they are (a bytearray is not wrapped in a BytesIO by botocore); its repr is short,
    as botocore's debug log prints every request's parameters."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<part of {len(self)} bytes>"


class StreamUpload(io.RawIOBase):
    """A writable file that uploads what is written to it while it is written: parts of ``part_bytes`` go out
    on ``in_flight`` threads as they fill (memory holds at most ``in_flight`` parts being sent and the one
    filling), so no copy of the object is kept anywhere. An object that fits in one part is sent by a single
    PUT at :meth:`finish`; a larger one is a multipart upload, started when the second part begins.

    :meth:`finish` completes it and returns the :class:`Uploaded`; leaving the ``with`` block without
    finishing (an error, a rewrite not worth keeping) aborts it, and nothing is left billed. With
    ``checksum``, every part and the whole object carry their CRC-32C (S3 refuses bytes that do not have
    it) and the one S3 reports for the stored object must equal the CRC-32C of the bytes written
    (:func:`check_stored`)."""

    def __init__(self, store: _Multipart, key: str, *, part_bytes: int = DEFAULT_PART_BYTES,
                 metadata: dict[str, str] | None = None, if_none_match: bool = False, checksum: bool = False,
                 in_flight: int = 2) -> None:
        super().__init__()
        if part_bytes < MIN_PART_BYTES:
            raise ConfigError("part size below S3's minimum", expected=f">= {MIN_PART_BYTES}", found=part_bytes)
        self.store, self.key, self.part_bytes, self.in_flight = store, key, part_bytes, max(1, in_flight)
        self.metadata, self.if_none_match, self.checksum = dict(metadata or {}), if_none_match, checksum
        self.where = f"s3://{store.bucket}/{key}"
        self.size = self.crc = 0
        self.upload_id: str | None = None
        self.result: Uploaded | None = None
        # Parts are filled in buffers of part_bytes, each filled again once its part is in: in_flight + 1 at
        # most (the parts on their way and the one filling), two where the uploads keep up with the writer. The
        # first grows with what is written (a small object needs no more); the others are made whole when a
        # multipart upload needs them. A full buffer is the part's body as it is: a bytearray goes to the
        # socket in one piece, where botocore would wrap bytes in a BytesIO and read it 128 KiB at a time.
        self._buffers: list[_Part] = [_Part()]
        self._users: list[Future[dict[str, Any]] | None] = [None]  # the part last sent from each buffer
        self._filling = self._fill = 0  # the buffer being filled, and its bytes
        self._sent: list[Future[dict[str, Any]]] = []
        self._pool: ThreadPoolExecutor | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self.result is not None or self.closed:
            raise ValueError("write to a finished or aborted upload")
        view = memoryview(data).cast("B")
        self.size += len(view)
        self.crc = crc32c.crc32c(view, self.crc)
        at = 0
        while at < len(view):
            if self._fill == self.part_bytes:  # a full part and more to come: it is not the last
                self._send()
                self._next_buffer()
            take = min(self.part_bytes - self._fill, len(view) - at)
            self._buffers[self._filling][self._fill : self._fill + take] = view[at : at + take]
            self._fill += take
            at += take
        return len(view)

    def _next_buffer(self) -> None:
        """Fill another buffer: one whose part is in, else a new one (there are fewer than ``in_flight + 1``:
        :meth:`_send` left at most ``in_flight`` parts on their way, the one just sent included)."""
        free = [i for i, user in enumerate(self._users) if i != self._filling and (user is None or user.done())]
        if free:
            self._filling = free[0]
        else:
            self._buffers.append(_Part(self.part_bytes))
            self._users.append(None)
            self._filling = len(self._buffers) - 1
        self._fill = 0

    def _last_part(self) -> _Part:
        """What is left to send: the buffer being filled, cut to its bytes (it is not filled again)."""
        buffer = self._buffers[self._filling]
        del buffer[self._fill :]
        return buffer

    def _send(self) -> None:
        """Send the buffer being filled as the next part, once fewer than ``in_flight`` are on their way."""
        if self.upload_id is None:
            self.upload_id = self.store._start(self.key, self.metadata, self.checksum)
            self._pool = ThreadPoolExecutor(self.in_flight, thread_name_prefix="tiering-upload")
        number = len(self._sent) + 1
        if number > MAX_PARTS:
            raise ConfigError("object needs more parts than S3 allows; raise the part size", path=self.where,
                              expected=f"<= {MAX_PARTS}", found=number)
        for sent in self._sent:  # a part S3 refused stops the upload now, not at its end
            if sent.done() and sent.exception() is not None:
                sent.result()
        waiting = [f for f in self._sent if not f.done()]
        if len(waiting) >= self.in_flight:  # bounded memory: wait for the oldest part still on its way
            waiting[0].result()
        assert self._pool is not None
        assert self.upload_id is not None
        part = self._buffers[self._filling]
        self._sent.append(self._pool.submit(self.store._part, self.key, self.upload_id, number, part, self.checksum))
        self._users[self._filling] = self._sent[-1]

    def finish(self, *, expect_crc: int | None = None) -> Uploaded:
        """Complete the object. ``expect_crc``: the CRC-32C its producer computed; other bytes written are a
        :class:`ProofError` and nothing is completed."""
        if self.result is not None:
            return self.result
        if expect_crc is not None:
            same_crc(self.where, self.crc, expect_crc)
        crc = self.crc if self.checksum else None
        last = self._last_part()
        if self.upload_id is None:
            etag = self.store._single(self.key, last, self.metadata, self.if_none_match, crc)
        else:
            self._send()
            parts = [f.result() for f in self._sent]
            try:
                etag = self.store._finish(self.key, self.upload_id, parts, self.if_none_match, crc)
            except (ChecksumUnsupported, ChecksumMismatch):
                self.upload_id = None  # completed, then judged by its checksum: nothing left to abort
                raise
        self.result = Uploaded(etag, self.size, self.crc)
        self._shutdown()
        return self.result

    def abort(self) -> None:
        """Give the upload up: parts on their way are waited for, then the multipart upload is aborted (its
        own errors are not raised: the error that made us abort is the one to report; cleanup and a
        lifecycle rule abort a straggler)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self.upload_id is not None and self.result is None:
            with contextlib.suppress(StorageError):
                self.store.abort_upload(self.key, self.upload_id)
            self.upload_id = None
        self._shutdown()
        self.close()  # nothing more can be written to it

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self._sent, self._buffers, self._users = [], [], []

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.result is None:
            self.abort()
        super().__exit__(exc_type, exc, tb)


class StreamUploads:
    """``upload`` and ``writer`` of a store that makes S3's upload calls (:class:`_Multipart`): both stores
    inherit them, so that a streamed upload is the same code on each."""

    __slots__ = ()

    def upload(self: _Multipart, key: str, stream: BinaryIO, *, part_bytes: int = DEFAULT_PART_BYTES,
               metadata: dict[str, str] | None = None, if_none_match: bool = False, crc: int | None = None) -> str:
        """Upload what ``stream`` yields through a :class:`StreamUpload` (a single PUT for a small input, else
        parts, aborted if anything fails). With ``crc``, the CRC-32C its producer computed: the bytes read must
        have it (:class:`ProofError` otherwise: the local copy changed) and the upload is checked by checksum.
        Returns the ETag."""
        with StreamUpload(self, key, part_bytes=part_bytes, metadata=metadata, if_none_match=if_none_match,
                          checksum=crc is not None) as out:
            while chunk := stream.read(part_bytes):
                out.write(chunk)
            return out.finish(expect_crc=crc).etag

    def writer(self: _Multipart, key: str, *, part_bytes: int = DEFAULT_PART_BYTES,
               metadata: dict[str, str] | None = None, if_none_match: bool = False, checksum: bool = False,
               in_flight: int = 2) -> StreamUpload:
        """A :class:`StreamUpload` to ``key``: what is written goes to the store as it comes, ``in_flight``
        parts at once."""
        return StreamUpload(self, key, part_bytes=part_bytes, metadata=metadata, if_none_match=if_none_match,
                            checksum=checksum, in_flight=in_flight)


class NoCredentials(StorageError):
    """No (complete) AWS credentials were found: a configuration problem."""

    code = "NoCredentials"


class EncryptedWithCustomerKey(StorageError):
    """The object is encrypted with a customer-provided key (SSE-C): it cannot be read without that key."""

    code = "SSE-C"


def redact_url(url: str | None) -> str:
    """An endpoint URL without the user name and password it may carry."""
    if not url:
        return "AWS"
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: datetime
    storage_class: str = StorageClass.STANDARD
    metadata: dict[str, str] = field(default_factory=dict)


# Object settings a rewrite must carry over (invariant 6), as PutObject/CopyObject parameter names.
CONTENT_HEADERS: Final = ("ContentType", "CacheControl", "ContentDisposition", "ContentEncoding", "ContentLanguage")


ENCRYPTION_HEADERS: Final = ("ServerSideEncryption", "SSEKMSKeyId", "BucketKeyEnabled")


@dataclass(frozen=True, slots=True)
class ObjectAttrs:
    """What makes an object more than its bytes: user metadata, content headers, tags, encryption and
    storage class. Read from an original with :meth:`S3Store.attrs`, given to the objects that replace it."""

    metadata: dict[str, str] = field(default_factory=dict)
    headers: dict[str, Any] = field(default_factory=dict)  # content headers and encryption settings
    tags: dict[str, str] = field(default_factory=dict)
    storage_class: str = StorageClass.STANDARD

    def with_metadata(self, extra: Mapping[str, str]) -> ObjectAttrs:
        return replace(self, metadata={**self.metadata, **extra})

    def to_json(self) -> dict[str, object]:
        return {"metadata": self.metadata, "headers": self.headers, "tags": self.tags,
                "storage_class": self.storage_class}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ObjectAttrs:
        return cls(dict(doc["metadata"]), dict(doc["headers"]), dict(doc["tags"]), str(doc["storage_class"]))

    def put_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {"Metadata": self.metadata, **self.headers}
        if self.storage_class != StorageClass.STANDARD:
            args["StorageClass"] = self.storage_class
        if self.tags:
            args["Tagging"] = urlencode(self.tags)
        return args


_JSON_ATTRS: Final = ObjectAttrs(headers={"ContentType": "application/json"})


@dataclass(frozen=True, slots=True)
class BucketFacts:
    """What the cost report needs to know about the bucket: ``None`` where S3 would not say (access denied)."""

    versioned: bool | None
    noncurrent_expiry_days: int | None  # the lifecycle rule that expires noncurrent versions under the prefix


class _JsonWriter(Protocol):
    def put_object(self, key: str, body: bytes | BinaryIO, attrs: ObjectAttrs, *, if_match: str | None = None,
                   if_none_match: bool = False) -> ObjectInfo: ...

    def get_json(self, key: str) -> tuple[Any, str]: ...


def json_document(data: bytes, where: str) -> Any:
    """An object's bytes read as the JSON document ``get_json`` gives (``where``: its s3:// URI)."""
    try:
        return json.loads(data)
    except ValueError:
        raise TieringError("not a JSON document", path=where, expected="JSON", found=f"{len(data)} bytes") from None


def put_json(store: _JsonWriter, key: str, doc: object, *, if_match: str | None = None,
             if_none_match: bool = False) -> str:
    """Write a JSON document through ``store``, conditionally; returns its ETag.

    A conditional write that S3 performed but whose answer was lost (a 5xx or a dropped connection) is
    retried by botocore, and the retry then fails its own condition. So on ``PreconditionFailed`` the
    document is read back: if it is exactly ours, our write happened. Documents that must never be
    mistaken for another writer's carry a unique token (leases, journal entries)."""
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    try:
        return store.put_object(key, data, _JSON_ATTRS, if_match=if_match, if_none_match=if_none_match).etag
    except PreconditionFailed as refused:
        try:
            there, etag = store.get_json(key)
        except ObjectNotFound:
            raise refused from None  # deleted since: the condition failed all the same
        if there == json.loads(data):
            return etag
        raise


@runtime_checkable
class ObjectStore(Protocol):
    """One bucket's objects (see the module docstring)."""

    bucket: str
    requests: Counter[str]

    def head(self, key: str) -> ObjectInfo: ...

    def open(self, key: str, *, if_match: str | None = None, first_bytes: int | None = None,
             start: int | None = None) -> BinaryIO: ...

    def get(self, key: str) -> bytes: ...

    def download(self, key: str, out: BinaryIO, *, etag: str) -> bool: ...

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            metadata: dict[str, str] | None = None, checksum: bool = False) -> str: ...

    def delete(self, key: str, *, if_match: str | None = None, missing_ok: bool = False) -> None: ...

    def delete_many(self, objects: list[tuple[str, str]]) -> set[str]: ...

    def now(self, clock_key: str) -> datetime: ...

    def describe(self, key: str) -> tuple[ObjectInfo, ObjectAttrs]: ...

    def put_object(self, key: str, body: bytes | BinaryIO, attrs: ObjectAttrs, *, if_match: str | None = None,
                   if_none_match: bool = False) -> ObjectInfo: ...

    def copy(self, source: str, key: str, *, source_etag: str, attrs: ObjectAttrs) -> str: ...

    def copy_over(self, source: str, key: str, *, source_etag: str, if_match: str | None, attrs: ObjectAttrs,
                  size: int) -> ObjectInfo: ...

    def transition(self, key: str, *, etag: str, attrs: ObjectAttrs, storage_class: str) -> str: ...

    def get_json(self, key: str) -> tuple[Any, str]: ...

    def put_json(self, key: str, doc: object, *, if_match: str | None = None,
                 if_none_match: bool = False) -> str: ...

    def facts(self, prefix: str) -> BucketFacts: ...

    def list_dirs(self, prefix: str) -> Iterator[str]: ...

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str, datetime]]: ...

    def abort_upload(self, key: str, upload_id: str) -> None: ...

    def another(self) -> ObjectStore: ...

    def for_bucket(self, bucket: str) -> ObjectStore: ...

    def list(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ObjectInfo]: ...

    def upload(self, key: str, stream: BinaryIO, *, part_bytes: int = DEFAULT_PART_BYTES,
               metadata: dict[str, str] | None = None, if_none_match: bool = False,
               crc: int | None = None) -> str: ...

    def writer(self, key: str, *, part_bytes: int = DEFAULT_PART_BYTES, metadata: dict[str, str] | None = None,
               if_none_match: bool = False, checksum: bool = False, in_flight: int = 2) -> StreamUpload: ...


NOT_IMPLEMENTED: Final = 501


def copy_honours_if_match(store: ObjectStore, scratch: str) -> bool:
    """Whether ``store`` honours a CopyObject's target ``If-Match`` as S3 does: it refuses a copy whose
    condition fails (412) and makes one whose condition holds. moto 5.2.5 and some S3-compatible stores copy
    regardless; a store that refuses conditional copies altogether, or answers with another error, is judged
    not to honour them (the PUT swap works on any store). Writes two scratch objects under ``scratch`` (keys
    no one else writes), copies one onto the other twice, deletes both (6 requests). A transport failure is
    raised (retryable), never taken for an answer."""
    source, target = scratch + ".source", scratch + ".target"
    try:
        etag = store.put(source, b"probe")
        there = store.put(target, b"target")
        try:
            store.copy_over(source, target, source_etag=etag, if_match=f'"{"0" * 32}"', attrs=ObjectAttrs(), size=5)
        except PreconditionFailed:
            pass
        else:
            return False  # copied over an object whose ETag the condition did not name
        store.copy_over(source, target, source_etag=etag, if_match=there, attrs=ObjectAttrs(), size=5)
        return True
    except StorageError as e:
        if e.retryable and e.status != NOT_IMPLEMENTED:  # 501 is an answer; other 5xx and transport failures are not
            raise
        return False
    finally:
        store.delete(target, missing_ok=True)
        store.delete(source, missing_ok=True)


def delete_honours_etag(store: ObjectStore, scratch: str) -> bool:
    """Whether ``store``'s DeleteObjects keeps an object named with another ETag than its own, as S3 does
    (moto 5.2.5 and versitygw delete it regardless). Writes one scratch object at ``scratch``, asks to delete
    it under a wrong ETag, looks, and deletes it where it is still there (3 or 4 requests). A transport
    failure is raised, never taken for an answer."""
    try:
        etag = store.put(scratch, b"probe")
        store.delete_many([(scratch, f'"{"0" * 32}"')])
        try:
            store.head(scratch)
        except ObjectNotFound:
            return False
        store.delete_many([(scratch, etag)])
        return True
    except StorageError as e:
        with contextlib.suppress(StorageError):
            store.delete(scratch, missing_ok=True)
        if e.retryable and e.status != NOT_IMPLEMENTED:
            raise
        return False
