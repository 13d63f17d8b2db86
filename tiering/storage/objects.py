"""The object-store interface the platform needs, as a :class:`typing.Protocol`.

:class:`tiering.storage.store.S3Store` (boto3) and :class:`tiering.storage.memory.MemoryStore` (a dict, for unit tests)
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

import contextlib
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any, BinaryIO, Final, Protocol, runtime_checkable

from tiering.errors import StorageError
from tiering.storage.store import (
    DEFAULT_PART_BYTES,
    BucketFacts,
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    StreamUpload,
)


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

    def copy_over(self, source: str, key: str, *, source_etag: str, if_match: str, attrs: ObjectAttrs,
                  size: int) -> ObjectInfo: ...

    def transition(self, key: str, *, etag: str, attrs: ObjectAttrs, storage_class: str) -> str: ...

    def get_json(self, key: str) -> tuple[Any, str]: ...

    def put_json(self, key: str, doc: object, *, if_match: str | None = None,
                 if_none_match: bool = False) -> str: ...

    def facts(self, prefix: str) -> BucketFacts: ...

    def list_dirs(self, prefix: str) -> Iterator[str]: ...

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str, datetime]]: ...

    def abort_upload(self, key: str, upload_id: str) -> None: ...

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
