"""A store for a dry run: the bucket read as it is, the run's own documents written to memory beside it.

A run's steps write their documents below the run's directory (``_tiering/runs/<run>/``, see
:func:`~tiering.storage.layout.run_dir`). :class:`WriteAside` hands those writes to a
:class:`~tiering.storage.memory.MemoryStore` and reads them back from it, so that a dry run goes through the
very steps a real run takes (scan, plan, forecast) and leaves the bucket as it found it. Below ``aside`` the
bucket itself is not seen: the memory stands for it there, so that documents a real run of the same id left
do not mix with the dry run's. Any other write (a segment, a journal entry, a lease, a report) is refused
with :class:`DryRunWrite` before it reaches S3: a step that would change the bucket cannot run dry.

Reading S3's clock (:meth:`now`) goes to the bucket, as in every run: on an endpoint that sends no ``Date``
header (moto in-process) that read writes the empty ``_tiering/clock`` object, the one exception.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any, BinaryIO

from tiering.errors import ConfigError, StorageError
from tiering.storage.memory import MemoryStore
from tiering.storage.objects import (
    DEFAULT_PART_BYTES,
    BucketFacts,
    ObjectAttrs,
    ObjectInfo,
    ObjectStore,
    StreamUpload,
)


class DryRunWrite(StorageError):
    """A dry run tried to change the bucket outside its own documents: refused, nothing was sent."""

    code = "DryRun"


class WriteAside:
    """``store`` as it is, with every key below ``aside`` in memory instead (see the module docstring)."""

    def __init__(self, store: ObjectStore, aside: str, memory: MemoryStore | None = None) -> None:
        if not aside.endswith("/"):
            raise ConfigError("the keys set aside are a directory", expected="a prefix ending in '/'", found=aside)
        self.bucket = store.bucket
        self.requests: Counter[str] = store.requests  # what the bucket is asked: the memory bills nothing
        self.aside = aside
        self._store = store
        self._memory = memory or MemoryStore(store.bucket)

    # Routing: a key below ``aside`` is the memory's; a write anywhere else is refused.

    def _mine(self, key: str) -> bool:
        return key.startswith(self.aside)

    def _read(self, key: str) -> ObjectStore:
        return self._memory if self._mine(key) else self._store

    def _write(self, key: str, action: str) -> MemoryStore:
        if not self._mine(key):
            raise DryRunWrite(f"a dry run writes nothing to the bucket: refused {action}",
                              path=f"s3://{self.bucket}/{key}", expected=f"a key below {self.aside}", found=key)
        return self._memory

    def head(self, key: str) -> ObjectInfo:
        return self._read(key).head(key)

    def open(self, key: str, *, if_match: str | None = None, first_bytes: int | None = None,
             start: int | None = None) -> BinaryIO:
        return self._read(key).open(key, if_match=if_match, first_bytes=first_bytes, start=start)

    def get(self, key: str) -> bytes:
        return self._read(key).get(key)

    def download(self, key: str, out: BinaryIO, *, etag: str) -> bool:
        return self._read(key).download(key, out, etag=etag)

    def describe(self, key: str) -> tuple[ObjectInfo, ObjectAttrs]:
        return self._read(key).describe(key)

    def get_json(self, key: str) -> tuple[Any, str]:
        return self._read(key).get_json(key)

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            metadata: dict[str, str] | None = None, checksum: bool = False) -> str:
        return self._write(key, "put").put(key, data, if_none_match=if_none_match, if_match=if_match,
                                           metadata=metadata, checksum=checksum)

    def put_object(self, key: str, body: bytes | BinaryIO, attrs: ObjectAttrs, *, if_match: str | None = None,
                   if_none_match: bool = False) -> ObjectInfo:
        return self._write(key, "put").put_object(key, body, attrs, if_match=if_match, if_none_match=if_none_match)

    def put_json(self, key: str, doc: object, *, if_match: str | None = None, if_none_match: bool = False) -> str:
        return self._write(key, "put").put_json(key, doc, if_match=if_match, if_none_match=if_none_match)

    def upload(self, key: str, stream: BinaryIO, *, part_bytes: int = DEFAULT_PART_BYTES,
               metadata: dict[str, str] | None = None, if_none_match: bool = False, crc: int | None = None) -> str:
        return self._write(key, "upload").upload(key, stream, part_bytes=part_bytes, metadata=metadata,
                                                 if_none_match=if_none_match, crc=crc)

    def writer(self, key: str, *, part_bytes: int = DEFAULT_PART_BYTES, metadata: dict[str, str] | None = None,
               if_none_match: bool = False, checksum: bool = False, in_flight: int = 2) -> StreamUpload:
        return self._write(key, "upload").writer(key, part_bytes=part_bytes, metadata=metadata,
                                                 if_none_match=if_none_match, checksum=checksum,
                                                 in_flight=in_flight)

    def delete(self, key: str, *, if_match: str | None = None, missing_ok: bool = False) -> None:
        self._write(key, "delete").delete(key, if_match=if_match, missing_ok=missing_ok)

    def delete_many(self, objects: list[tuple[str, str]]) -> set[str]:
        for key, _ in objects:
            self._write(key, "delete")
        return self._memory.delete_many(objects) if objects else set()

    def copy(self, source: str, key: str, *, source_etag: str, attrs: ObjectAttrs) -> str:
        self._write(source, "copy")  # a copy from the bucket into memory is not one S3 request: not offered
        return self._write(key, "copy").copy(source, key, source_etag=source_etag, attrs=attrs)

    def copy_over(self, source: str, key: str, *, source_etag: str, if_match: str | None, attrs: ObjectAttrs,
                  size: int) -> ObjectInfo:
        self._write(source, "copy")
        return self._write(key, "copy").copy_over(source, key, source_etag=source_etag, if_match=if_match,
                                                  attrs=attrs, size=size)

    def transition(self, key: str, *, etag: str, attrs: ObjectAttrs, storage_class: str) -> str:
        return self._write(key, "storage-class change").transition(key, etag=etag, attrs=attrs,
                                                                   storage_class=storage_class)

    def abort_upload(self, key: str, upload_id: str) -> None:
        self._write(key, "multipart abort").abort_upload(key, upload_id)

    def now(self, clock_key: str) -> datetime:
        return self._store.now(clock_key)

    def facts(self, prefix: str) -> BucketFacts:
        return self._store.facts(prefix)

    # Listings: below ``aside`` the memory's; above it, the bucket's without what lies below ``aside``,
    # merged in key order with the memory's.

    def list(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ObjectInfo]:
        if self._mine(prefix):
            return self._memory.list(prefix, delimiter=delimiter)
        bucket = self._store.list(prefix, delimiter=delimiter)
        if not self.aside.startswith(prefix):
            return bucket
        return heapq.merge((info for info in bucket if not self._mine(info.key)),
                           self._memory.list(prefix, delimiter=delimiter), key=lambda info: info.key)

    def list_dirs(self, prefix: str) -> Iterator[str]:
        if self._mine(prefix):
            return self._memory.list_dirs(prefix)
        bucket = self._store.list_dirs(prefix)
        if not self.aside.startswith(prefix):
            return bucket
        return _unique(heapq.merge((d for d in bucket if not self._mine(d)), self._memory.list_dirs(prefix)))

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str, datetime]]:
        if self._mine(prefix):
            return self._memory.list_uploads(prefix)
        return (u for u in self._store.list_uploads(prefix) if not self._mine(u[0]))

    def another(self) -> ObjectStore:
        """The bucket's :meth:`~ObjectStore.another`, beside the same memory."""
        return WriteAside(self._store.another(), self.aside, self._memory)

    def for_bucket(self, bucket: str) -> ObjectStore:
        """Another bucket (a plan or an inventory kept elsewhere), with the same keys set aside in a memory of
        its own; this store where ``bucket`` is its own."""
        if bucket == self.bucket:
            return self
        return WriteAside(self._store.for_bucket(bucket), self.aside, MemoryStore(bucket))


def _unique(names: Iterator[str]) -> Iterator[str]:
    last = None
    for name in names:
        if name != last:
            yield name
        last = name
