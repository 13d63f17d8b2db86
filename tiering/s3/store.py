"""The one module that talks to S3 (the only importer of boto3 in the package).

- :func:`make_client`: a client from the standard AWS environment (``AWS_ENDPOINT_URL``,
  ``AWS_REGION``/``AWS_DEFAULT_REGION``, the credentials chain), with retries configured once here
  (botocore's "standard" mode already retries throttling and 5xx: nothing above retries again).
- :class:`S3Store`: the few operations the platform needs, each with its S3 errors translated by error
  CODE (never by message text) into :mod:`tiering.errors` types: streaming reads, conditional writes
  (``If-None-Match: *`` to create, ``If-Match: <etag>`` to replace), paginated listing, and uploads
  from a stream in parts of bounded size (memory never holds more than one part).

Nothing here logs or returns credentials or presigned URLs.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, Final

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from tiering.errors import ConfigError, TieringError

DEFAULT_MAX_ATTEMPTS: Final = 8  # requests in all, the first included
MIN_PART_BYTES: Final = 5 * 1024 * 1024  # S3's smallest part (all but the last)
DEFAULT_PART_BYTES: Final = 16 * 1024 * 1024
MAX_PARTS: Final = 10_000


class StorageError(TieringError):
    """An S3 request failed; ``code`` is S3's error code."""

    code: str = ""


class ObjectNotFound(StorageError):
    """The key (or bucket) does not exist."""


class PreconditionFailed(StorageError):
    """A conditional request lost: the object exists already, or changed since it was read."""


class AccessDenied(StorageError):
    """The credentials may not do this (a configuration problem, not the data's)."""


class Throttled(StorageError):
    """S3 asked us to slow down, even after botocore's retries."""

    retryable = True


_BY_CODE: Final[dict[str, type[StorageError]]] = {
    "NoSuchKey": ObjectNotFound,
    "NoSuchBucket": ObjectNotFound,
    "404": ObjectNotFound,
    "NotFound": ObjectNotFound,
    "PreconditionFailed": PreconditionFailed,
    "412": PreconditionFailed,
    "ConditionalRequestConflict": PreconditionFailed,
    "AccessDenied": AccessDenied,
    "403": AccessDenied,
    "SlowDown": Throttled,
    "Throttling": Throttled,
    "RequestTimeout": Throttled,
}


def translate(error: ClientError, *, bucket: str, key: str | None, action: str) -> StorageError:
    """A :class:`StorageError` subclass chosen by S3's error code; the message names the object and action."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    cls = _BY_CODE.get(code, StorageError)
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    err = cls(f"{action} failed with S3 error {code or 'unknown'}", path=where)
    err.code = code
    if cls is StorageError:
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        err.retryable = status >= 500
    return err


def make_client(*, endpoint_url: str | None = None, region: str | None = None,
                max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> Any:
    """An S3 client from the standard AWS environment; explicit arguments win over it."""
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    config = Config(retries={"mode": "standard", "total_max_attempts": max_attempts}, region_name=region)
    # boto3 itself reads AWS_ENDPOINT_URL(_S3) and the credentials chain when endpoint_url is None.
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    etag: str
    last_modified: datetime
    storage_class: str = "STANDARD"
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class S3Store:
    """S3 operations on one bucket, errors translated (see the module docstring)."""

    client: Any
    bucket: str

    def _call(self, action: str, key: str | None, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, action)(Bucket=self.bucket, **({"Key": key} if key is not None else {}),
                                                **kwargs)
        except ClientError as e:
            raise translate(e, bucket=self.bucket, key=key, action=action) from e

    def head(self, key: str) -> ObjectInfo:
        r = self._call("head_object", key)
        return ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"],
                          str(r.get("StorageClass", "STANDARD")), dict(r.get("Metadata", {})))

    def open(self, key: str, *, if_match: str | None = None) -> IO[bytes]:
        """A streaming body (read it in pieces; it is never loaded whole). ``if_match`` pins the version read."""
        kwargs = {"IfMatch": if_match} if if_match else {}
        body: IO[bytes] = self._call("get_object", key, **kwargs)["Body"]
        return body

    def get(self, key: str) -> bytes:
        with self.open(key) as body:
            return body.read()

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            metadata: dict[str, str] | None = None) -> str:
        """Write ``data``; with ``if_none_match`` only if the key does not exist, with ``if_match`` only if its
        ETag is still that one (:class:`PreconditionFailed` otherwise). Returns the new ETag."""
        if if_none_match and if_match:
            raise ConfigError("a put is conditional on absence or on an ETag, not both")
        kwargs: dict[str, Any] = {"Body": data, "Metadata": metadata or {}}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        return str(self._call("put_object", key, **kwargs)["ETag"])

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        self._call("delete_object", key, **({"IfMatch": if_match} if if_match else {}))

    def list(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, page after page (1000 keys a request), in key order."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kwargs):
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"], int(item["Size"]), str(item["ETag"]), item["LastModified"],
                                     str(item.get("StorageClass", "STANDARD")))
        except ClientError as e:
            raise translate(e, bucket=self.bucket, key=prefix, action="list_objects_v2") from e

    def upload(self, key: str, stream: IO[bytes], *, part_bytes: int = DEFAULT_PART_BYTES,
               metadata: dict[str, str] | None = None, if_none_match: bool = False) -> str:
        """Upload what ``stream`` yields, at most two parts of ``part_bytes`` in memory (the one being sent and
        the next, read ahead to tell the last part). Small inputs go in a single PUT; a failed multipart
        upload is aborted so that no parts are left billed. Returns the ETag."""
        if part_bytes < MIN_PART_BYTES:
            raise ConfigError("part size below S3's minimum", expected=f">= {MIN_PART_BYTES}", found=part_bytes)
        first = stream.read(part_bytes)
        nxt = stream.read(part_bytes) if len(first) == part_bytes else b""
        if not nxt:
            return self.put(key, first, if_none_match=if_none_match, metadata=metadata)
        upload_id = self._call("create_multipart_upload", key, Metadata=metadata or {})["UploadId"]
        try:
            parts = []
            chunk, number = first, 1
            while chunk:
                if number > MAX_PARTS:
                    raise ConfigError("object needs more parts than S3 allows; raise the part size",
                                      path=f"s3://{self.bucket}/{key}", expected=f"<= {MAX_PARTS}", found=number)
                r = self._call("upload_part", key, UploadId=upload_id, PartNumber=number, Body=chunk)
                parts.append({"PartNumber": number, "ETag": r["ETag"]})
                chunk, nxt, number = nxt, (stream.read(part_bytes) if nxt else b""), number + 1
            extra = {"IfNoneMatch": "*"} if if_none_match else {}
            r = self._call("complete_multipart_upload", key, UploadId=upload_id,
                           MultipartUpload={"Parts": parts}, **extra)
            return str(r["ETag"])
        except BaseException:
            # The original error is the one to report; a lifecycle rule aborts any straggler.
            with contextlib.suppress(StorageError):
                self._call("abort_multipart_upload", key, UploadId=upload_id)
            raise
