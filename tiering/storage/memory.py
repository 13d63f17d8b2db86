"""One bucket in memory that answers like :class:`~tiering.storage.s3.S3Store` does on S3: unit tests of the commit
protocol run on it without moto. It satisfies :class:`~tiering.storage.objects.ObjectStore`.

- Errors: S3Store's types, with the code, status and message :func:`~tiering.storage.s3.translate` gives them.
- Conditions: ``If-None-Match: *`` refuses an existing key (412); ``If-Match`` refuses another ETag (412) or
  a missing key (404) on PUT, GET, DELETE and a copy's target; a DELETE without one succeeds on a missing key.
  Unlike moto, ``CopyObject``'s source and target conditions and ``DeleteObjects``' per-object ETags are
  enforced, as S3 does.
- ETags: the quoted hex MD5 for a PUT or a copy; the MD5 of the parts' MD5s and ``-<parts>`` for a multipart
  upload. Metadata names are kept in lower case; a copy keeps metadata, content headers and tags, and takes
  storage class and encryption from the request. Archived objects (GLACIER, DEEP_ARCHIVE) cannot be read.
- Listings: key order, 1,000 entries a page (keys and common prefixes). Incomplete uploads are listed by key,
  then by initiation time.
- ``requests``: by S3 operation name, one per call and per listing page, as S3Store's client counts them.
- Time: ``now()`` and every ``LastModified`` come from ``clock``, in whole seconds as S3's headers give them;
  a test moves a :class:`ManualClock` instead of sleeping.

A lock serialises every request (the scanner and compactions use threads), so S3's 409 for racing
conditional writes never happens. Not modelled: versioning and lifecycle rules (``facts`` says neither),
SSE-KMS ETags (S3's are not MD5s), and S3's checks of tags, part sizes and copies onto themselves.
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO, Final, TypeVar

import crc32c

from tiering.errors import ConfigError, StorageError
from tiering.lifecycle.vocabulary import StorageClass
from tiering.storage.objects import (
    CONTENT_HEADERS,
    ENCRYPTION_HEADERS,
    MAX_DELETE_KEYS,
    BucketFacts,
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StreamUploads,
    TransportError,
    check_stored,
    crc32c_b64,
    json_document,
    put_json,
)

PAGE: Final = 1000  # entries a listing page holds (keys and common prefixes), uploads a ListMultipartUploads page
DEFAULT_CONTENT_TYPE: Final = "binary/octet-stream"
ARCHIVED: Final = frozenset({StorageClass.GLACIER, StorageClass.DEEP_ARCHIVE})  # not readable without a restore
_HEADERS: Final = frozenset(CONTENT_HEADERS + ENCRYPTION_HEADERS)
_T = TypeVar("_T")


def single_etag(data: bytes) -> str:
    """S3's ETag of an object written by one PUT (or a copy): the quoted hex MD5 of its bytes."""
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def multipart_etag(parts: list[bytes]) -> str:
    """S3's ETag of a multipart upload: the quoted MD5 of the parts' binary MD5s, then ``-<parts>``."""
    digests = b"".join(hashlib.md5(part, usedforsecurity=False).digest() for part in parts)
    return f'"{hashlib.md5(digests, usedforsecurity=False).hexdigest()}-{len(parts)}"'


def _same(etag: str, condition: str) -> bool:
    return etag.strip('"') == condition.strip('"')  # S3 takes an If-Match with or without its quotes


class ManualClock:
    """A clock a test moves by hand: ``MemoryStore(bucket, clock=clock)``, then ``clock.advance(seconds=61)``."""

    def __init__(self, start: datetime | None = None) -> None:
        self.at = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += timedelta(**delta)


@dataclass(frozen=True, slots=True)
class _Object:
    data: bytes
    etag: str
    last_modified: datetime
    metadata: dict[str, str]
    headers: dict[str, Any]  # content headers and encryption, as PutObject parameter names
    tags: dict[str, str]
    storage_class: str

    def info(self, key: str, *, listed: bool = False) -> ObjectInfo:
        """As HEAD shows it; a listing shows no metadata."""
        return ObjectInfo(key, len(self.data), self.etag, self.last_modified, self.storage_class,
                          {} if listed else dict(self.metadata))


@dataclass(slots=True)
class _Upload:
    key: str
    initiated: datetime
    metadata: dict[str, str]
    parts: dict[int, bytes] = field(default_factory=dict)


class MemoryStore(StreamUploads):
    """One bucket in memory, with S3's semantics as S3Store exposes them (see the module docstring)."""

    def __init__(self, bucket: str, *, clock: Callable[[], datetime] | None = None, checksums: bool = True,
                 delete_etags: bool = True) -> None:
        self.bucket = bucket
        self.checksums = checksums  # False: an endpoint without S3's additional checksums
        self.delete_etags = delete_etags  # False: DeleteObjects ignores each object's ETag (versitygw does)
        self.requests: Counter[str] = Counter()
        self._clock = clock or (lambda: datetime.now(UTC))
        self._objects: dict[str, _Object] = {}
        self._uploads: dict[str, _Upload] = {}
        self._lock = threading.RLock()

    # Requests, errors, conditions: always called with the lock held.

    def _count(self, operation: str) -> None:
        self.requests[operation] += 1

    def _now(self) -> datetime:
        return self._clock().astimezone(UTC).replace(microsecond=0)

    def _error(self, cls: type[StorageError], action: str, key: str, code: str, status: int) -> StorageError:
        """What :func:`~tiering.storage.s3.translate` makes of S3's answer (S3's request id aside)."""
        err = cls(f"{action} failed with S3 error {code} (HTTP {status})", path=f"s3://{self.bucket}/{key}")
        err.code, err.status = code, status
        return err

    def _get(self, key: str, action: str, *, if_match: str | None = None) -> _Object:
        obj = self._objects.get(key)
        if obj is None:  # a HEAD's answer has no body, so no error code: botocore names it by its status
            raise self._error(ObjectNotFound, action, key, "404" if action == "head_object" else "NoSuchKey", 404)
        if if_match and not _same(obj.etag, if_match):
            raise self._error(PreconditionFailed, action, key, "PreconditionFailed", 412)
        return obj

    def _readable(self, key: str, *, if_match: str | None = None) -> _Object:
        obj = self._get(key, "get_object", if_match=if_match)
        if obj.storage_class in ARCHIVED:
            raise self._error(StorageError, "get_object", key, "InvalidObjectState", 403)
        return obj

    def _source(self, source: str, key: str, etag: str) -> _Object:
        """A copy's source, held to ``x-amz-copy-source-if-match`` (errors name the target, as S3Store's do)."""
        obj = self._objects.get(source)
        if obj is None:
            raise self._error(ObjectNotFound, "copy_object", key, "NoSuchKey", 404)
        if not _same(obj.etag, etag):
            raise self._error(PreconditionFailed, "copy_object", key, "PreconditionFailed", 412)
        if obj.storage_class in ARCHIVED:
            raise self._error(StorageError, "copy_object", key, "ObjectNotInActiveTierError", 403)
        return obj

    def _write(self, key: str, data: bytes, action: str, *, if_match: str | None = None,
               if_none_match: bool = False, metadata: dict[str, str], headers: dict[str, Any] | None = None,
               tags: dict[str, str] | None = None, storage_class: str = StorageClass.STANDARD,
               etag: str | None = None) -> _Object:
        if if_none_match and key in self._objects:
            raise self._error(PreconditionFailed, action, key, "PreconditionFailed", 412)
        if if_match:
            self._get(key, action, if_match=if_match)
        obj = _Object(data, etag or single_etag(data), self._now(), {k.lower(): v for k, v in metadata.items()},
                      {k: v for k, v in (headers or {}).items() if k in _HEADERS}, dict(tags or {}), storage_class)
        self._objects[key] = obj
        return obj

    @staticmethod
    def _kept(source: _Object, attrs: ObjectAttrs) -> dict[str, Any]:
        """A copy's headers: the source's content headers (``COPY``), the request's encryption."""
        return ({k: v for k, v in source.headers.items() if k in CONTENT_HEADERS}
                | {k: attrs.headers[k] for k in ENCRYPTION_HEADERS if k in attrs.headers})

    # The interface (tiering.storage.objects.ObjectStore), in S3Store's order.

    def head(self, key: str) -> ObjectInfo:
        with self._lock:
            self._count("HeadObject")
            return self._get(key, "head_object").info(key)

    def open(self, key: str, *, if_match: str | None = None, first_bytes: int | None = None,
             start: int | None = None) -> BinaryIO:
        with self._lock:
            self._count("GetObject")
            data = self._readable(key, if_match=if_match).data
            if first_bytes is None and start is None:
                return io.BytesIO(data)
            first, last = (0, max(0, first_bytes - 1)) if first_bytes is not None else (start or 0, len(data))
            if first >= len(data):
                raise self._error(StorageError, "get_object", key, "InvalidRange", 416)
            return io.BytesIO(data[first:last + 1])

    def get(self, key: str) -> bytes:
        with self.open(key) as body:
            return body.read()

    def download(self, key: str, out: BinaryIO, *, etag: str) -> bool:
        digest = etag.strip('"')
        plain = len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)
        with self.open(key, if_match=etag) as body:
            data = body.read()
        out.write(data)
        found = hashlib.md5(data, usedforsecurity=False).hexdigest()
        if plain and found != digest:
            raise TransportError("the bytes received do not match the object's ETag (damaged on the way; "
                                 "retryable)", path=f"s3://{self.bucket}/{key}", expected=digest, found=found)
        return plain

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            metadata: dict[str, str] | None = None, checksum: bool = False) -> str:
        if if_none_match and if_match:
            raise ConfigError("a put is conditional on absence or on an ETag, not both")
        with self._lock:
            self._count("PutObject")
            obj = self._write(key, bytes(data), "put_object", if_match=if_match, if_none_match=if_none_match,
                              metadata=metadata or {})
        if checksum:
            check_stored(f"s3://{self.bucket}/{key}", self._reported_crc(obj.data), crc32c.crc32c(data))
        return obj.etag

    def _reported_crc(self, stored: bytes) -> str | None:
        """The full-object CRC-32C this store reports for an object holding ``stored`` (None: no checksums)."""
        return crc32c_b64(crc32c.crc32c(stored)) if self.checksums else None

    def delete(self, key: str, *, if_match: str | None = None, missing_ok: bool = False) -> None:
        with self._lock:
            self._count("DeleteObject")
            try:
                if if_match:
                    try:
                        self._get(key, "delete_object", if_match=if_match)
                    except PreconditionFailed:
                        self._count("HeadObject")  # S3Store looks at a 412 (absent, or changed?), as here
                        raise
            except ObjectNotFound:
                if not missing_ok:
                    raise
            self._objects.pop(key, None)  # a DELETE without a condition succeeds on a missing key

    def delete_many(self, objects: list[tuple[str, str]]) -> set[str]:
        deleted: set[str] = set()
        for at in range(0, len(objects), MAX_DELETE_KEYS):
            with self._lock:
                self._count("DeleteObjects")
                for key, etag in objects[at:at + MAX_DELETE_KEYS]:
                    current = self._objects.get(key)
                    if current is None or _same(current.etag, etag) or not self.delete_etags:  # absent: deleted
                        self._objects.pop(key, None)
                        deleted.add(key)
        return deleted

    def now(self, clock_key: str) -> datetime:
        """The bucket's clock, as S3's ``Date`` header gives it to a HEAD of the bucket (``clock_key`` is only
        written where an endpoint sends no ``Date``: here it is not)."""
        with self._lock:
            self._count("HeadBucket")
            return self._now()

    def describe(self, key: str) -> tuple[ObjectInfo, ObjectAttrs]:
        with self._lock:
            self._count("HeadObject")
            obj = self._get(key, "head_object")
            self._count("GetObjectTagging")
        headers = {"ContentType": DEFAULT_CONTENT_TYPE, **obj.headers}
        if headers.get("ServerSideEncryption") == "AES256":
            headers.pop("ServerSideEncryption")  # S3's default encryption, as S3Store leaves it out
        info = obj.info(key)
        return info, ObjectAttrs(dict(info.metadata), headers, dict(obj.tags), obj.storage_class)

    def put_object(self, key: str, body: bytes | BinaryIO, attrs: ObjectAttrs, *, if_match: str | None = None,
                   if_none_match: bool = False) -> ObjectInfo:
        data = body if isinstance(body, bytes) else body.read()
        size = len(body) if isinstance(body, bytes) else body.seek(0, os.SEEK_END)
        with self._lock:
            self._count("PutObject")
            obj = self._write(key, data, "put_object", if_match=if_match, if_none_match=if_none_match,
                              metadata=attrs.metadata, headers=attrs.headers, tags=attrs.tags,
                              storage_class=attrs.storage_class)
        return ObjectInfo(key, size, obj.etag, obj.last_modified, attrs.storage_class, attrs.metadata)

    def copy(self, source: str, key: str, *, source_etag: str, attrs: ObjectAttrs) -> str:
        with self._lock:
            self._count("CopyObject")
            src = self._source(source, key, source_etag)
            return self._write(key, src.data, "copy_object", metadata=src.metadata, headers=self._kept(src, attrs),
                               tags=src.tags, storage_class=attrs.storage_class).etag

    def copy_over(self, source: str, key: str, *, source_etag: str, if_match: str | None, attrs: ObjectAttrs,
                  size: int) -> ObjectInfo:
        with self._lock:
            self._count("CopyObject")
            src = self._source(source, key, source_etag)
            obj = self._write(key, src.data, "copy_object", if_match=if_match, metadata=attrs.metadata,
                              headers=attrs.headers, tags=attrs.tags, storage_class=attrs.storage_class)
        return ObjectInfo(key, len(obj.data), obj.etag, obj.last_modified, attrs.storage_class, attrs.metadata)

    def transition(self, key: str, *, etag: str, attrs: ObjectAttrs, storage_class: str) -> str:
        with self._lock:
            self._count("CopyObject")
            src = self._source(key, key, etag)
            return self._write(key, src.data, "copy_object", if_match=etag, metadata=src.metadata,
                               headers=self._kept(src, attrs), tags=src.tags, storage_class=storage_class).etag

    def get_json(self, key: str) -> tuple[Any, str]:
        with self._lock:
            self._count("GetObject")
            obj = self._readable(key)
        return json_document(obj.data, f"s3://{self.bucket}/{key}"), obj.etag

    def put_json(self, key: str, doc: object, *, if_match: str | None = None, if_none_match: bool = False) -> str:
        """As :meth:`S3Store.put_json` (the same read-back on ``PreconditionFailed``)."""
        return put_json(self, key, doc, if_match=if_match, if_none_match=if_none_match)

    def facts(self, prefix: str) -> BucketFacts:
        with self._lock:
            self._count("GetBucketVersioning")
            self._count("GetBucketLifecycleConfiguration")
        return BucketFacts(False, None)

    def _paged(self, items: list[_T], operation: str) -> Iterator[list[_T]]:
        """Pages of ``items``, one request each, counted as they are read (a paginator's laziness)."""
        for at in range(0, max(len(items), 1), PAGE):
            with self._lock:
                self._count(operation)
            yield items[at:at + PAGE]

    def _listing(self, prefix: str, delimiter: str | None) -> Iterator[list[tuple[str, ObjectInfo | None]]]:
        """ListObjectsV2's pages: keys (with their listing's info) and common prefixes (None) in key order."""
        with self._lock:
            entries: list[tuple[str, ObjectInfo | None]] = []
            for key in sorted(k for k in self._objects if k.startswith(prefix)):
                cut = key.find(delimiter, len(prefix)) if delimiter else -1
                if cut < 0 or not delimiter:
                    entries.append((key, self._objects[key].info(key, listed=True)))
                    continue
                common = key[:cut + len(delimiter)]  # the keys under it are contiguous in key order
                if not entries or entries[-1][0] != common:
                    entries.append((common, None))
        return self._paged(entries, "ListObjectsV2")

    def list_dirs(self, prefix: str) -> Iterator[str]:
        for page in self._listing(prefix, "/"):
            yield from (name for name, info in page if info is None)

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str, datetime]]:
        with self._lock:
            uploads = sorted(((u.key, upload_id, u.initiated) for upload_id, u in self._uploads.items()
                              if u.key.startswith(prefix)), key=lambda u: (u[0], u[2]))
        for page in self._paged(uploads, "ListMultipartUploads"):
            yield from page

    def _upload(self, key: str, upload_id: str, action: str) -> _Upload:
        up = self._uploads.get(upload_id)
        if up is None or up.key != key:
            raise self._error(StorageError, action, key, "NoSuchUpload", 404)
        return up

    def abort_upload(self, key: str, upload_id: str) -> None:
        with self._lock:
            self._count("AbortMultipartUpload")
            self._upload(key, upload_id, "abort_multipart_upload")
            del self._uploads[upload_id]

    def another(self) -> ObjectStore:
        """As :meth:`S3Store.another`: the same objects (and lock), a request count of its own."""
        twin = copy.copy(self)
        twin.requests = Counter()
        return twin

    def for_bucket(self, bucket: str) -> ObjectStore:
        """This store: it holds one bucket, and another cannot be reached from it."""
        if bucket != self.bucket:
            raise ConfigError("a memory store holds one bucket", expected=self.bucket, found=bucket)
        return self

    def list(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ObjectInfo]:
        for page in self._listing(prefix, delimiter):
            yield from (info for _, info in page if info is not None)

    def create_upload(self, key: str, *, metadata: dict[str, str] | None = None) -> str:
        """Start a multipart upload (CreateMultipartUpload); its id. Alone, it is what a process killed during
        :meth:`upload` leaves behind."""
        with self._lock:
            self._count("CreateMultipartUpload")
            upload_id = secrets.token_urlsafe(24)
            self._uploads[upload_id] = _Upload(key, self._now(), dict(metadata or {}))
            return upload_id

    def _single(self, key: str, data: bytes | bytearray, metadata: dict[str, str], if_none_match: bool,
                crc: int | None) -> str:
        return self.put(key, bytes(data), if_none_match=if_none_match, metadata=metadata, checksum=crc is not None)

    def _start(self, key: str, metadata: dict[str, str], checksum: bool) -> str:
        return self.create_upload(key, metadata=metadata)

    def _part(self, key: str, upload_id: str, number: int, data: bytearray, checksum: bool) -> dict[str, Any]:
        with self._lock:
            self._count("UploadPart")
            self._upload(key, upload_id, "upload_part").parts[number] = bytes(data)  # the caller reuses it
        return {"PartNumber": number}

    def _finish(self, key: str, upload_id: str, parts: Sequence[dict[str, Any]], if_none_match: bool,
                crc: int | None) -> str:
        with self._lock:
            self._count("CompleteMultipartUpload")
            up = self._upload(key, upload_id, "complete_multipart_upload")
            data = [up.parts[p["PartNumber"]] for p in parts]
            obj = self._write(key, b"".join(data), "complete_multipart_upload", if_none_match=if_none_match,
                              metadata=up.metadata, etag=multipart_etag(data))  # refused: the upload stays
            del self._uploads[upload_id]
        if crc is not None:
            check_stored(f"s3://{self.bucket}/{key}", self._reported_crc(obj.data), crc)
        return obj.etag
