"""The boto3 implementation of :class:`~tiering.storage.objects.ObjectStore`: the one module that talks to S3
(the only importer of boto3 in the package). Its values, errors and the streamed upload are defined in
:mod:`tiering.storage.objects`, which imports no S3 client.

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

import base64
import contextlib
import hashlib
import http.client
import io
import os
import platform
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, BinaryIO, Final, cast

import boto3
import botocore.utils
import crc32c
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from botocore.loaders import create_loader
from urllib3.exceptions import HTTPError as URLLib3Error
from zlib_ng import zlib_ng

from tiering import __version__
from tiering.errors import ConfigError, StorageError
from tiering.lifecycle.vocabulary import StorageClass
from tiering.storage.objects import (
    CONTENT_HEADERS,
    ENCRYPTION_HEADERS,
    MAX_COPY_BYTES,
    MAX_DELETE_KEYS,
    AccessDenied,
    BucketFacts,
    EncryptedWithCustomerKey,
    NoCredentials,
    ObjectAttrs,
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StreamUploads,
    Throttled,
    TransportError,
    Unsupported,
    check_stored,
    crc32c_b64,
    json_document,
    put_json,
    redact_url,
)

DEFAULT_MAX_ATTEMPTS: Final = 8  # requests in all, the first included


# What botocore raises when a request or a body read fails on the wire (after its own retries).
_TRANSPORT: Final = (BotoConnectionError, ConnectionClosedError, ReadTimeoutError, ResponseStreamingError,
                     IncompleteReadError, URLLib3Error, http.client.HTTPException, ConnectionError, TimeoutError)


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
    "BadDigest": TransportError,  # the bytes S3 received do not have the checksum sent with them
    "NotImplemented": Unsupported,
    "501": Unsupported,
}


def translate(error: ClientError, *, bucket: str, key: str | None, action: str) -> StorageError:
    """A :class:`StorageError` subclass chosen by S3's error code; the message names the object and action."""
    code = str(error.response.get("Error", {}).get("Code", ""))
    meta = error.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode", 0) or 0)
    request_id = meta.get("RequestId") or meta.get("HTTPHeaders", {}).get("x-amz-request-id")
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    detail = f"HTTP {status}" + (f", request id {request_id}" if request_id else "")
    cls = Unsupported if status == 501 else _BY_CODE.get(code, StorageError)
    message = f"{action} failed with S3 error {code or 'unknown'} ({detail})"
    if cls is Unsupported:
        message = (f"{action} is not implemented by this S3 store ({code or 'HTTP 501'}, {detail}): a store "
                   "without this feature cannot run this command")
    if status == 400 and action in ("head_object", "get_object") and code in ("400", "BadRequest", "InvalidRequest"):
        # S3 answers a HEAD or GET of an SSE-C object without its key with a bare 400.
        cls = EncryptedWithCustomerKey
        message = (f"{action} refused with HTTP 400 ({detail}): the object is most likely encrypted with a "
                   "customer-provided key (SSE-C), which this platform cannot read")
    err = cls(message, path=where)
    err.code = code or err.code
    err.status = status
    err.request_id = request_id
    if cls is StorageError:
        err.retryable = status >= 500
    return err


def transport_error(error: BaseException, *, bucket: str, key: str | None, action: str,
                    endpoint: str | None) -> StorageError:
    """A failure below S3's answers (the network, the credentials chain) as a :class:`StorageError`; the
    message names the object and the endpoint, never its credentials or the underlying message (which may
    quote a URL with them)."""
    where = f"s3://{bucket}/{key}" if key is not None else f"s3://{bucket}"
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return NoCredentials(f"{action} not sent: no complete AWS credentials found (set AWS_ACCESS_KEY_ID and "
                             "AWS_SECRET_ACCESS_KEY, a profile, or a role)", path=where)
    at = redact_url(endpoint)
    if isinstance(error, EndpointConnectionError | ConnectTimeoutError):
        what = f"could not connect to S3 at {at}"
    elif isinstance(error, ReadTimeoutError):
        what = f"S3 at {at} did not answer in time"
    else:
        what = f"the connection to S3 at {at} broke ({type(error).__name__})"
    return TransportError(f"{action}: {what}; retryable", path=where)


_LOADER: Final = create_loader()


_HTTP_DATE: Final = "%a, %d %b %Y %H:%M:%S GMT"
USER_AGENT: Final = f"kafka-s3-tiering/{__version__} Python/{platform.python_version()}"  # boto3 adds Botocore/x


def make_client(*, endpoint_url: str | None = None, region: str | None = None,
                max_attempts: int | None = None) -> Any:
    """An S3 client from the standard AWS environment; explicit arguments win over it. Requests are tried
    ``max_attempts`` times in all (else ``AWS_MAX_ATTEMPTS``, else 8) with botocore's backoff."""
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    if max_attempts is None:
        try:
            max_attempts = int(os.environ.get("AWS_MAX_ATTEMPTS") or DEFAULT_MAX_ATTEMPTS)
        except ValueError:
            raise ConfigError("AWS_MAX_ATTEMPTS is not a whole number",
                              found=os.environ.get("AWS_MAX_ATTEMPTS")) from None
    if max_attempts < 1:
        raise ConfigError("S3 requests need at least one attempt", expected=">= 1", found=max_attempts)
    # Every upload carries a checksum S3 verifies before it stores anything (our CRC-32C, else botocore's CRC32,
    # computed whatever AWS_REQUEST_CHECKSUM_CALCULATION says), so the payload is not also SHA-256 signed:
    # botocore skips that itself over HTTPS when a checksum header is present, and over plain HTTP (a local
    # store) it would hash every byte uploaded, costlier than the CRC-32C and the upload together.
    # A User-Agent of our own, fixed: botocore otherwise rebuilds and sanitizes its feature-by-feature string
    # twice for every request, a quarter of the CPU a small request costs the client.
    config = Config(retries={"mode": "standard", "total_max_attempts": max_attempts}, region_name=region,
                    request_checksum_calculation="when_supported", s3={"payload_signing_enabled": False},
                    user_agent=USER_AGENT)
    # boto3 itself reads AWS_ENDPOINT_URL(_S3) and the credentials chain when endpoint_url is None. A new
    # session per client keeps credentials current; its loader is shared, so the service model is parsed once.
    session = boto3.session.Session()
    session._session.register_component("data_loader", _LOADER)
    session._session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_time)
    client = session.client("s3", endpoint_url=endpoint_url, config=config)
    client.meta.events.register("before-call.s3", _expect_continue)
    return client


def _expect_continue(model: Any, params: dict[str, Any], **_: Any) -> None:
    """A body sent from a buffer (a streamed upload's part) asks for ``100-continue``, as botocore asks for the
    bodies it reads from a file: a refusal (SlowDown, an upload gone) comes before the part's bytes are sent."""
    if model.http.get("method") in ("PUT", "POST") and isinstance(params.get("body"), bytearray):
        params["headers"]["Expect"] = "100-continue"


def parse_time(value: str) -> datetime:
    """botocore's timestamp parser with fast paths for S3's two forms: ISO 8601 (``2026-11-24T00:44:43.000Z``,
    every object of a listing) and RFC 7231's HTTP date (``Tue, 24 Nov 2026 00:44:43 GMT``, the
    ``Last-Modified`` of every HEAD and GET). dateutil's general parser cost a third of a listing's CPU time
    and a fifth of a HEAD's."""
    try:
        parsed = datetime.fromisoformat(value)
        if parsed.tzinfo is not None:
            return parsed
    except (TypeError, ValueError):
        pass
    if isinstance(value, str) and value.endswith(" GMT"):
        try:
            return datetime.strptime(value, _HTTP_DATE).replace(tzinfo=UTC)
        except ValueError:
            pass
    stamp: datetime = botocore.utils.parse_timestamp(value)  # RFC 822 headers, epoch numbers
    return stamp


def server_time(response: Mapping[str, Any]) -> datetime | None:
    """S3's clock: the ``Date`` header of a response, else the ``Last-Modified`` of the object it wrote.
    Leases and grace periods never use a local clock."""
    headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    value = headers.get("date") or headers.get("last-modified")
    return parsedate_to_datetime(value) if value else None


class _Checksum:
    """The full-object checksum S3 keeps for an object, computed over the bytes of a GET as they arrive: CRC-32C
    (what this platform uploads with), CRC-32 (the AWS SDKs' default), SHA-1 or SHA-256. ``None`` from
    :meth:`of` where S3 reported none of these for the whole object (a ranged GET, a composite multipart
    checksum ``...-N``, CRC-64/NVME, an object stored without one)."""

    __slots__ = ("_crc", "_hash", "algorithm", "expected")

    def __init__(self, algorithm: str, expected: str) -> None:
        self.algorithm, self.expected = algorithm, expected
        self._crc = 0
        self._hash = hashlib.new(algorithm.lower()) if algorithm.startswith("SHA") else None

    @classmethod
    def of(cls, response: Mapping[str, Any]) -> _Checksum | None:
        if "ContentRange" in response or response.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT":
            return None
        for algorithm in ("CRC32C", "CRC32", "SHA256", "SHA1"):
            value = response.get(f"Checksum{algorithm}")
            if value and "-" not in value:
                return cls(algorithm, str(value))
        return None

    def update(self, data: memoryview) -> None:
        if self._hash is not None:
            self._hash.update(data)
        elif self.algorithm == "CRC32C":
            self._crc = crc32c.crc32c(data, self._crc)
        else:
            self._crc = zlib_ng.crc32(data, self._crc)

    def found(self) -> str:
        digest = self._hash.digest() if self._hash is not None else self._crc.to_bytes(4, "big")
        return base64.b64encode(digest).decode()


class Body(io.RawIOBase):
    """A GET's body, read in pieces: failures while reading become :class:`TransportError`, and the end of
    the stream is checked against the Content-Length S3 announced, so a body cut short (a connection
    closed early) is never taken for a short object: its bytes are not judged as data. A whole object's
    bytes are checked against the checksum S3 stored for it (:class:`_Checksum`): bytes damaged on the way
    are a :class:`TransportError` (retryable), never invalid data.

    The bytes are read from the innermost stream into the caller's buffer: botocore's ``StreamingBody``
    wraps urllib3's response, which wraps http.client's, and each layer above copies every byte once more
    (botocore's own checksum check, which this one replaces, also covers only CRC-32 and SHA without
    awscrt). A stream without http.client's (moto in-process) is read through urllib3's or botocore's."""

    def __init__(self, response: Mapping[str, Any], store: S3Store, key: str) -> None:
        super().__init__()
        self._raw, self.length, self._store, self._key = response["Body"], int(response["ContentLength"]), store, key
        self._stream = getattr(self._raw, "_raw_stream", self._raw)
        inner = getattr(self._stream, "_fp", None)
        self._readinto = (inner if isinstance(inner, http.client.HTTPResponse) else self._stream).readinto
        self._checksum = _Checksum.of(response)
        self.read_bytes = 0
        self.verified: str | None = None  # the algorithm of the stored checksum the bytes were found to match
        self._ended = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if self.read_bytes >= self.length:
            self._end()  # an empty body has its end here, at its first read
            return 0
        if not len(view):
            return 0
        view = view[: self.length - self.read_bytes]
        with self._store._errors("get_object (reading the body)", self._key):
            n = self._readinto(view)
        if not n:
            raise TransportError("the body ended before its announced length (the connection closed early; "
                                 "retryable)", path=self._where, position=self.read_bytes,
                                 expected=f"{self.length} bytes", found=f"{self.read_bytes} bytes")
        self.read_bytes += n
        if self._checksum is not None:
            self._checksum.update(view[:n])
        if self.read_bytes == self.length:
            self._end()
        return int(n)

    @property
    def _where(self) -> str:
        return f"s3://{self._store.bucket}/{self._key}"

    def _end(self) -> None:
        """The last byte is in: the checksum judged, and the connection handed back to urllib3's pool (read
        below urllib3, the body's end is not seen there). Once."""
        if self._ended:
            return
        self._ended = True
        check, self._checksum = self._checksum, None
        found = check.found() if check is not None else None
        if check is not None and found != check.expected:
            raise TransportError(f"the bytes received do not match the {check.algorithm} S3 stored for the "
                                 "object (damaged on the way; retryable)", path=self._where,
                                 expected=check.expected, found=found)
        self.verified = None if check is None else check.algorithm
        release = getattr(self._stream, "release_conn", None)
        if release is not None:
            release()

    def readall(self) -> bytes:
        out = bytearray(self.length - self.read_bytes)
        view, at = memoryview(out), 0
        while at < len(out):
            at += self.readinto(view[at:])
        self._end()
        return bytes(out)

    def close(self) -> None:
        if not self.closed:
            with contextlib.suppress(Exception):  # closing a broken connection must not hide the real error
                self._raw.close()
        super().close()


@dataclass(slots=True)
class S3Store(StreamUploads):
    """S3 operations on one bucket, errors translated (see the module docstring). ``requests`` counts the API
    calls made through its client by operation name (one per call and per listing page; what S3 bills)."""

    client: Any
    bucket: str
    requests: Counter[str] = field(default_factory=Counter)
    counting: bool = field(default=True, repr=False)  # False: another store counts this client's calls
    _counter_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.counting:
            self.client.meta.events.register("before-call.s3", self._count)

    def _count(self, model: Any, **_: Any) -> None:
        with self._counter_lock:  # an upload's parts are sent from several threads
            self.requests[str(model.name)] += 1

    @contextlib.contextmanager
    def _errors(self, action: str, key: str | None) -> Iterator[None]:
        """S3's answers and the network's failures inside the block, as :class:`StorageError` types."""
        try:
            yield
        except ClientError as e:
            raise translate(e, bucket=self.bucket, key=key, action=action) from e
        except (*_TRANSPORT, NoCredentialsError, PartialCredentialsError) as e:
            raise transport_error(e, bucket=self.bucket, key=key, action=action,
                                  endpoint=self.client.meta.endpoint_url) from None

    def _call(self, action: str, key: str | None, **kwargs: Any) -> Any:
        with self._errors(action, key):
            return getattr(self.client, action)(Bucket=self.bucket, **({"Key": key} if key is not None else {}),
                                                **kwargs)

    def head(self, key: str) -> ObjectInfo:
        r = self._call("head_object", key)
        return ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"],
                          str(r.get("StorageClass", StorageClass.STANDARD)), dict(r.get("Metadata", {})))

    def open(self, key: str, *, if_match: str | None = None, first_bytes: int | None = None,
             start: int | None = None) -> BinaryIO:
        """A streaming body (read it in pieces; it is never loaded whole). ``if_match`` pins the version read;
        ``first_bytes`` reads only the object's beginning, ``start`` only from that byte on (ranged GETs)."""
        kwargs = {"IfMatch": if_match} if if_match else {}
        if first_bytes is not None:
            kwargs["Range"] = f"bytes=0-{max(0, first_bytes - 1)}"
        elif start is not None:
            kwargs["Range"] = f"bytes={start}-"
        r = self._call("get_object", key, **kwargs)
        return cast(BinaryIO, Body(r, self, key))

    def get(self, key: str) -> bytes:
        with self.open(key) as body:
            return body.read()

    def download(self, key: str, out: BinaryIO, *, etag: str) -> bool:
        """Copy the object's version ``etag`` into ``out``, its length checked; where the ETag is a plain MD5
        (not a multipart upload, not SSE-KMS) the bytes are checked against it too (True), and a mismatch is
        a :class:`TransportError`: bytes damaged on the way. False when the ETag could not vouch for them."""
        digest = etag.strip('"')
        md5 = hashlib.md5(usedforsecurity=False)
        r = self._call("get_object", key, IfMatch=etag)
        # SSE-KMS and SSE-C objects have 32 hex digits of ETag too, but not the MD5 of their bytes.
        encrypted = str(r.get("ServerSideEncryption", "")).startswith("aws:kms") or "SSECustomerAlgorithm" in r
        plain = not encrypted and len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)
        with Body(r, self, key) as body:
            while chunk := body.read(1 << 20):
                md5.update(chunk)
                out.write(chunk)
        if plain and md5.hexdigest() != digest:
            raise TransportError("the bytes received do not match the object's ETag (damaged on the way; "
                                 "retryable)", path=f"s3://{self.bucket}/{key}", expected=digest,
                                 found=md5.hexdigest())
        return plain

    def put(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None,
            metadata: dict[str, str] | None = None, checksum: bool = False) -> str:
        """Write ``data``; with ``if_none_match`` only if the key does not exist, with ``if_match`` only if its
        ETag is still that one (:class:`PreconditionFailed` otherwise). With ``checksum`` the data's CRC-32C
        goes with it (S3 refuses bytes that do not have it) and the one S3 reports for the stored object must
        equal it (:func:`check_stored`). Returns the new ETag."""
        if if_none_match and if_match:
            raise ConfigError("a put is conditional on absence or on an ETag, not both")
        kwargs: dict[str, Any] = {"Body": data, "Metadata": metadata or {}}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match:
            kwargs["IfMatch"] = if_match
        return self._put(key, kwargs, crc32c.crc32c(data) if checksum else None)

    def _put(self, key: str, kwargs: dict[str, Any], crc: int | None) -> str:
        """One PutObject; with ``crc`` (the body's CRC-32C) sent with it and checked against S3's."""
        if crc is not None:
            kwargs = {**kwargs, "ChecksumAlgorithm": "CRC32C", "ChecksumCRC32C": crc32c_b64(crc)}
        r = self._call("put_object", key, **kwargs)
        if crc is not None:
            check_stored(f"s3://{self.bucket}/{key}", r.get("ChecksumCRC32C") or self._stored_crc(key), crc)
        return str(r["ETag"])

    def _stored_crc(self, key: str) -> str | None:
        """The full-object CRC-32C S3 reports for ``key`` (a HEAD in checksum mode), or None."""
        r = self._call("head_object", key, ChecksumMode="ENABLED")
        return None if r.get("ChecksumType", "FULL_OBJECT") != "FULL_OBJECT" else r.get("ChecksumCRC32C")

    def delete(self, key: str, *, if_match: str | None = None, missing_ok: bool = False) -> None:
        """Delete ``key``; with ``if_match`` only if its ETag is still that one. ``missing_ok``: an absent key
        counts as deleted (what a re-run after a crash needs). S3 answers a conditional delete of an absent
        key with 404, SeaweedFS with 412: a 412 is looked into (a HEAD), and an absent key is taken as S3's
        404 would be."""
        try:
            try:
                self._call("delete_object", key, **({"IfMatch": if_match} if if_match else {}))
            except PreconditionFailed:
                if if_match is None:
                    raise
                self.head(key)  # ObjectNotFound where the key is gone; else the condition failed indeed
                raise
        except ObjectNotFound:
            if not missing_ok:
                raise

    def delete_many(self, objects: list[tuple[str, str]]) -> set[str]:
        """Delete ``(key, etag)`` pairs with DeleteObjects, 1,000 a request, each only if its ETag is still that
        one (S3 checks the per-object ``ETag``; a key rewritten since it was listed stays). Returns the keys
        deleted (an absent key counts as deleted); per-key refusals are left out, not raised."""
        deleted: set[str] = set()
        for at in range(0, len(objects), MAX_DELETE_KEYS):
            chunk = objects[at:at + MAX_DELETE_KEYS]
            r = self._call("delete_objects", None, Delete={
                "Objects": [{"Key": key, "ETag": etag} for key, etag in chunk], "Quiet": True})
            refused = {str(e["Key"]) for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"}
            deleted.update(key for key, _ in chunk if key not in refused)
        return deleted

    def now(self, clock_key: str) -> datetime:
        """S3's current time: the ``Date`` of a HEAD of the bucket; where an endpoint sends no ``Date`` (moto
        in-process), the ``Last-Modified`` of an empty object written to ``clock_key``."""
        when = server_time(self._call("head_bucket", None))
        if when is None:
            when = server_time(self._call("put_object", clock_key, Body=b""))
        if when is None:
            raise StorageError("S3 sent neither Date nor Last-Modified: cannot read its clock",
                               path=f"s3://{self.bucket}")
        return when

    def describe(self, key: str) -> tuple[ObjectInfo, ObjectAttrs]:
        """An object's size and ETag, with its metadata, content headers, encryption, tags and storage class."""
        r = self._call("head_object", key)
        headers = {name: r[name] for name in CONTENT_HEADERS + ENCRYPTION_HEADERS if name in r}
        if headers.get("ServerSideEncryption") == "AES256":
            headers.pop("ServerSideEncryption")  # S3's default encryption: nothing to ask for
        try:
            tags = {t["Key"]: t["Value"] for t in self._call("get_object_tagging", key)["TagSet"]}
        except Unsupported:
            tags = {}  # a store without object tagging: its objects have no tags to keep
        info = ObjectInfo(key, int(r["ContentLength"]), str(r["ETag"]), r["LastModified"],
                          str(r.get("StorageClass", StorageClass.STANDARD)), dict(r.get("Metadata", {})))
        return info, ObjectAttrs(dict(info.metadata), headers, tags, info.storage_class)

    def put_object(self, key: str, body: bytes | BinaryIO, attrs: ObjectAttrs, *, if_match: str | None = None,
                   if_none_match: bool = False) -> ObjectInfo:
        """One PUT of ``body`` (bytes, or a seekable file: Kafka segments stay under S3's 5 GiB single-PUT
        limit) with ``attrs``; conditional like :meth:`put`. Returns the new object's key, size and ETag."""
        kwargs = attrs.put_args()
        if if_match:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        r = self._call("put_object", key, Body=body, **kwargs)
        size = len(body) if isinstance(body, bytes) else body.seek(0, os.SEEK_END)
        when = server_time(r) or datetime.now(UTC)  # informative only: decisions use the listing's time
        return ObjectInfo(key, size, str(r["ETag"]), when, attrs.storage_class, attrs.metadata)

    def copy(self, source: str, key: str, *, source_etag: str, attrs: ObjectAttrs) -> str:
        """Server-side copy keeping metadata and tags (``COPY`` directives) with ``attrs``' storage class and
        encryption; ``CopySourceIfMatch`` asks S3 to copy only the version we planned on. Returns the ETag."""
        kwargs: dict[str, Any] = {name: attrs.headers[name] for name in ENCRYPTION_HEADERS if name in attrs.headers}
        if attrs.storage_class != StorageClass.STANDARD:
            kwargs["StorageClass"] = attrs.storage_class
        r = self._call("copy_object", key, CopySource={"Bucket": self.bucket, "Key": source},
                       CopySourceIfMatch=source_etag, MetadataDirective="COPY", TaggingDirective="COPY", **kwargs)
        return str(r["CopyObjectResult"]["ETag"])

    def copy_over(self, source: str, key: str, *, source_etag: str, if_match: str | None, attrs: ObjectAttrs,
                  size: int) -> ObjectInfo:
        """Replace ``key`` by a server-side copy of ``source`` (``size`` bytes), with ``attrs``' metadata,
        content headers, tags, encryption and storage class (``REPLACE`` directives). ``CopySourceIfMatch``
        copies only the version verified; ``IfMatch`` overwrites only the version planned on, as a PutObject
        with ``If-Match`` would (``if_match`` None: no condition on the destination). Kafka segments stay
        under CopyObject's 5 GiB limit (``segment.bytes`` is an int32). Returns the new object's key, size
        and ETag."""
        if size > MAX_COPY_BYTES:
            raise ConfigError("object above CopyObject's limit", path=f"s3://{self.bucket}/{source}",
                              expected=f"<= {MAX_COPY_BYTES} bytes", found=size)
        r = self._call("copy_object", key, CopySource={"Bucket": self.bucket, "Key": source},
                       CopySourceIfMatch=source_etag, MetadataDirective="REPLACE", TaggingDirective="REPLACE",
                       **({"IfMatch": if_match} if if_match is not None else {}), **attrs.put_args())
        result = r["CopyObjectResult"]
        when = result.get("LastModified") or server_time(r) or datetime.now(UTC)
        return ObjectInfo(key, size, str(result["ETag"]), when, attrs.storage_class, attrs.metadata)

    def transition(self, key: str, *, etag: str, attrs: ObjectAttrs, storage_class: str) -> str:
        """Move an object to ``storage_class`` by copying it onto itself: metadata, tags, content headers and
        encryption kept. ``CopySourceIfMatch`` and ``IfMatch`` make S3 copy only the version planned on and
        overwrite only that version (a writer in between wins: nothing it wrote is lost). The new ETag."""
        kwargs: dict[str, Any] = {name: attrs.headers[name] for name in ENCRYPTION_HEADERS if name in attrs.headers}
        r = self._call("copy_object", key, CopySource={"Bucket": self.bucket, "Key": key}, CopySourceIfMatch=etag,
                       IfMatch=etag, StorageClass=storage_class, MetadataDirective="COPY", TaggingDirective="COPY",
                       **kwargs)
        return str(r["CopyObjectResult"]["ETag"])

    def get_json(self, key: str) -> tuple[Any, str]:
        """A JSON document and its ETag (for a later ``If-Match`` update)."""
        r = self._call("get_object", key)
        with Body(r, self, key) as body:
            data = body.read()
        return json_document(data, f"s3://{self.bucket}/{key}"), str(r["ETag"])

    def put_json(self, key: str, doc: object, *, if_match: str | None = None, if_none_match: bool = False) -> str:
        """Write a JSON document, conditionally like :meth:`put`; returns its ETag (see :func:`put_json`)."""
        return put_json(self, key, doc, if_match=if_match, if_none_match=if_none_match)

    def facts(self, prefix: str) -> BucketFacts:
        """Whether the bucket keeps versions, and after how many days a lifecycle rule that covers ``prefix``
        expires noncurrent versions (``None`` if no rule does, or S3 denied the question)."""
        try:
            status = self._call("get_bucket_versioning", None).get("Status")
        except AccessDenied:
            return BucketFacts(None, None)
        days: int | None = None
        try:
            rules = self._call("get_bucket_lifecycle_configuration", None).get("Rules", [])
        except StorageError:  # NoSuchLifecycleConfiguration, or not allowed to ask
            rules = []
        for rule in rules:
            where = rule.get("Filter", {})
            scope = where.get("Prefix", where.get("And", {}).get("Prefix", rule.get("Prefix", "")))
            expiry = rule.get("NoncurrentVersionExpiration", {}).get("NoncurrentDays")
            if rule.get("Status") == "Enabled" and expiry is not None and prefix.startswith(scope):
                days = int(expiry) if days is None else min(days, int(expiry))
        return BucketFacts(status == "Enabled", days)  # suspended: overwrites replace the null version

    def list_dirs(self, prefix: str) -> Iterator[str]:
        """The "directories" directly under ``prefix`` (which ends with ``/`` or is empty), paginated."""
        with self._errors("list_objects_v2", prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                          Delimiter="/")
            for page in pages:
                for item in page.get("CommonPrefixes", []):
                    yield str(item["Prefix"])

    def list_uploads(self, prefix: str) -> Iterator[tuple[str, str, datetime]]:
        """Incomplete multipart uploads under ``prefix`` as (key, upload id, initiated): billed, yet invisible
        to an object listing."""
        with self._errors("list_multipart_uploads", prefix):
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
            for page in pages:
                for item in page.get("Uploads", []):
                    yield str(item["Key"]), str(item["UploadId"]), item["Initiated"]

    def abort_upload(self, key: str, upload_id: str) -> None:
        self._call("abort_multipart_upload", key, UploadId=upload_id)

    def another(self) -> ObjectStore:
        """The same bucket through a client of its own (from the same endpoint, region and AWS environment),
        with its own request count: what another thread uses, so that each thread's requests are counted
        apart (a client counts every call made through it, whichever store made it)."""
        meta = self.client.meta
        return S3Store(make_client(endpoint_url=meta.endpoint_url, region=meta.region_name), self.bucket)

    def for_bucket(self, bucket: str) -> ObjectStore:
        """The same client on another bucket (an inventory's, a plan's), its calls counted here too."""
        return self if bucket == self.bucket else S3Store(self.client, bucket, self.requests, counting=False)

    def list(self, prefix: str, *, delimiter: str | None = None) -> Iterator[ObjectInfo]:
        """Every object under ``prefix``, page after page (1000 keys a request), in key order."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        with self._errors("list_objects_v2", prefix):
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **kwargs):
                for item in page.get("Contents", []):
                    yield ObjectInfo(item["Key"], int(item["Size"]), str(item["ETag"]), item["LastModified"],
                                     str(item.get("StorageClass", StorageClass.STANDARD)))

    # StreamUpload's calls (_Multipart).

    def _single(self, key: str, data: bytes | bytearray, metadata: dict[str, str], if_none_match: bool,
                crc: int | None) -> str:
        return self._put(key, {"Body": data, "Metadata": metadata, **({"IfNoneMatch": "*"} if if_none_match else {})},
                         crc)

    def _start(self, key: str, metadata: dict[str, str], checksum: bool) -> str:
        checked = {"ChecksumAlgorithm": "CRC32C", "ChecksumType": "FULL_OBJECT"} if checksum else {}
        return str(self._call("create_multipart_upload", key, Metadata=metadata, **checked)["UploadId"])

    def _part(self, key: str, upload_id: str, number: int, data: bytearray, checksum: bool) -> dict[str, Any]:
        crc = {"ChecksumCRC32C": crc32c_b64(crc32c.crc32c(data))} if checksum else {}
        r = self._call("upload_part", key, UploadId=upload_id, PartNumber=number, Body=data,
                       **({"ChecksumAlgorithm": "CRC32C"} | crc if checksum else {}))
        return {"PartNumber": number, "ETag": r["ETag"], **crc}

    def _finish(self, key: str, upload_id: str, parts: Sequence[dict[str, Any]], if_none_match: bool,
                crc: int | None) -> str:
        extra: dict[str, Any] = {"IfNoneMatch": "*"} if if_none_match else {}
        if crc is not None:
            extra |= {"ChecksumCRC32C": crc32c_b64(crc), "ChecksumType": "FULL_OBJECT"}
        r = self._call("complete_multipart_upload", key, UploadId=upload_id, MultipartUpload={"Parts": list(parts)},
                       **extra)
        if crc is not None:
            check_stored(f"s3://{self.bucket}/{key}", r.get("ChecksumCRC32C") or self._stored_crc(key), crc)
        return str(r["ETag"])
