"""tiering.storage.s3 against moto's in-process S3 (mock_aws)."""

from __future__ import annotations

import io
import platform
from collections.abc import Iterator
from typing import Any

import boto3
import botocore
import botocore.utils
import pytest
from moto import mock_aws

from tiering import __version__
from tiering.errors import ConfigError
from tiering.storage.objects import MIN_PART_BYTES, AccessDenied, ObjectAttrs, ObjectNotFound, PreconditionFailed
from tiering.storage.s3 import S3Store, StorageError, make_client, parse_time

BUCKET = "segments"


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Store]:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    with mock_aws():
        client = make_client()
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        yield S3Store(client, BUCKET)


def test_client_honours_region_and_retry_settings(store: S3Store) -> None:
    assert store.client.meta.region_name == "eu-west-1"
    retries = store.client.meta.config.retries
    assert retries["mode"] == "standard"
    assert retries["total_max_attempts"] == 8  # the first request and up to 7 retries


def test_requests_name_this_tool_in_their_user_agent(store: S3Store) -> None:
    sent: list[str] = []
    store.client.meta.events.register("before-send.s3", lambda request, **_: sent.append(request.headers["User-Agent"]))
    store.put("p/ua.log", b"x")
    store.head("p/ua.log")
    assert len(sent) == 2
    assert {ua.decode() if isinstance(ua, bytes) else ua for ua in sent} == {
        f"kafka-s3-tiering/{__version__} Python/{platform.python_version()} Botocore/{botocore.__version__}"}


@pytest.mark.parametrize("value", [
    "Sun, 29 Nov 2026 18:00:07 GMT",    # a Last-Modified or Date header
    "Tue, 01 Dec 2026 00:00:00 GMT",
    "2026-11-24T00:44:43.000Z",         # a listing's LastModified
    "2026-11-24T00:44:43+01:00",
    "Sun, 29 Nov 2026 18:00:07 +0000",  # forms only botocore's parser reads
    "1700000000",
])
def test_parse_time_agrees_with_botocores_parser(value: str) -> None:
    parsed = parse_time(value)
    assert parsed.tzinfo is not None
    assert parsed == botocore.utils.parse_timestamp(value)


def test_parse_time_refuses_what_botocore_refuses() -> None:
    with pytest.raises(ValueError, match="Invalid timestamp"):
        parse_time("Sun, 32 Nov 2026 18:00:07 GMT")


def test_put_get_head_and_streaming_read(store: S3Store) -> None:
    etag = store.put("p/a.log", b"x" * 1000, metadata={"tiering-codec": "zstd"})
    info = store.head("p/a.log")
    assert (info.size, info.etag, info.metadata) == (1000, etag, {"tiering-codec": "zstd"})
    with store.open("p/a.log") as body:
        assert body.read(10) == b"x" * 10
        assert len(body.read()) == 990
    assert store.get("p/a.log") == b"x" * 1000


def test_missing_object_is_object_not_found_naming_it(store: S3Store) -> None:
    with pytest.raises(ObjectNotFound, match=r"s3://segments/nope: get_object failed with S3 error NoSuchKey"):
        store.get("nope")
    with pytest.raises(ObjectNotFound):
        store.head("nope")


def test_create_only_if_absent(store: S3Store) -> None:
    store.put("lease", b"one", if_none_match=True)
    with pytest.raises(PreconditionFailed) as info:
        store.put("lease", b"two", if_none_match=True)
    assert info.value.code == "PreconditionFailed"
    assert store.get("lease") == b"one"


def test_replace_only_if_unchanged(store: S3Store) -> None:
    first = store.put("journal", b"v1")
    second = store.put("journal", b"v2", if_match=first)
    with pytest.raises(PreconditionFailed):
        store.put("journal", b"v3", if_match=first)  # a stale ETag loses
    assert store.get("journal") == b"v2"
    with pytest.raises(PreconditionFailed):
        store.delete("journal", if_match=first)
    store.delete("journal", if_match=second)
    with pytest.raises(ObjectNotFound):
        store.head("journal")
    with pytest.raises(ConfigError):
        store.put("journal", b"v4", if_none_match=True, if_match=second)


def test_list_pages_past_1000_keys(store: S3Store) -> None:
    for i in range(1205):
        store.client.put_object(Bucket=BUCKET, Key=f"logs/t-0/{i:020d}.log", Body=b"")
    store.put("logs-other/x", b"")
    keys = [o.key for o in store.list("logs/")]
    assert len(keys) == 1205
    assert keys == sorted(keys)
    assert keys[0] == "logs/t-0/00000000000000000000.log"


def test_delete_many_batches_1000_keys_a_request_each_conditional_on_its_etag(store: S3Store) -> None:
    for i in range(1205):
        store.client.put_object(Bucket=BUCKET, Key=f"gone/{i:05d}", Body=b"x")
    sent: list[list[dict[str, str]]] = []
    store.client.meta.events.register("before-parameter-build.s3.DeleteObjects",
                                      lambda params, **_: sent.append(params["Delete"]["Objects"]))
    listed = [(o.key, o.etag) for o in store.list("gone/")]
    deleted = store.delete_many([*listed, ("gone/never-there", '"0"')])
    assert deleted == {k for k, _ in listed} | {"gone/never-there"}  # an absent key counts as deleted
    assert [len(objects) for objects in sent] == [1000, 206]
    assert all(o["ETag"] == dict(listed).get(o["Key"], '"0"') for objects in sent for o in objects)  # moto ignores it
    assert not list(store.list("gone/"))


class _Counting(io.RawIOBase):
    """A stream of ``size`` bytes generated as it is read, never held whole."""

    def __init__(self, size: int) -> None:
        self.left = size
        self.sent = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = bytes([self.sent % 251]) * n
        self.left -= n
        self.sent += n
        return n


class _Spy:
    """A client that records how much of the source had been read when each part was sent."""

    def __init__(self, client: Any, source: _Counting) -> None:
        self._client = client
        self._source = source
        self.read_at_part: list[int] = []

    def upload_part(self, **kwargs: Any) -> Any:
        self.read_at_part.append(self._source.sent)
        return self._client.upload_part(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def test_multipart_upload_streams_with_bounded_memory(store: S3Store) -> None:
    size = 3 * MIN_PART_BYTES + 123
    source = _Counting(size)
    spy = _Spy(store.client, source)
    etag = S3Store(spy, BUCKET).upload("big.log", source, part_bytes=MIN_PART_BYTES)  # type: ignore[arg-type]
    info = store.head("big.log")
    assert info.size == size
    assert info.etag == etag
    assert etag.strip('"').endswith("-4")  # four parts
    # Each part is sent with at most the next one read ahead: memory holds two parts, never the object.
    assert spy.read_at_part == [2 * MIN_PART_BYTES, 3 * MIN_PART_BYTES, size, size]
    with store.open("big.log") as body:
        assert body.read(3) == b"\x00\x00\x00"


def test_small_upload_is_one_put_and_honours_if_none_match(store: S3Store) -> None:
    store.upload("small.log", io.BytesIO(b"abc"), if_none_match=True)
    assert store.get("small.log") == b"abc"
    with pytest.raises(PreconditionFailed):
        store.upload("small.log", io.BytesIO(b"def"), if_none_match=True)
    with pytest.raises(ConfigError):
        store.upload("x", io.BytesIO(b""), part_bytes=1024)


def test_failed_multipart_upload_is_aborted(store: S3Store) -> None:
    class Broken(io.RawIOBase):
        def __init__(self) -> None:
            self.calls = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            self.calls += 1
            if self.calls > 2:
                raise OSError("disk went away")
            buffer[: len(buffer)] = b"\x01" * len(buffer)
            return len(buffer)

    with pytest.raises(OSError, match="disk went away"):
        store.upload("broken.log", Broken(), part_bytes=MIN_PART_BYTES)  # type: ignore[arg-type]
    assert store.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []
    with pytest.raises(ObjectNotFound):
        store.head("broken.log")


def test_errors_are_translated_by_code_not_text(store: S3Store) -> None:
    with mock_aws():
        other = S3Store(boto3.client("s3", region_name="eu-west-1"), "no-such-bucket")
        with pytest.raises(ObjectNotFound) as info:
            other.get("k")
    assert info.value.code == "NoSuchBucket"
    assert isinstance(info.value, StorageError)
    assert not info.value.retryable
    assert issubclass(AccessDenied, StorageError)


def test_client_takes_the_endpoint_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the demo and Spark executors rely on: AWS_ENDPOINT_URL points every client at the local S3."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5999")
    monkeypatch.setenv("AWS_REGION", "ap-south-1")
    client = make_client()
    assert client.meta.endpoint_url == "http://127.0.0.1:5999"
    assert client.meta.region_name == "ap-south-1"
    assert make_client(endpoint_url="http://localhost:1234").meta.endpoint_url == "http://localhost:1234"


def test_an_sse_kms_objects_etag_does_not_vouch_for_its_bytes(store: S3Store) -> None:
    """On S3 an SSE-KMS object's ETag has 32 hex digits but is not the MD5 of its bytes: a download must not
    compare them (a mismatch there would read as bytes damaged on the way, retried forever)."""
    key_id = boto3.client("kms", region_name=store.client.meta.region_name).create_key()["KeyMetadata"]["KeyId"]
    plain = store.put("plain", b"kafka")
    etag = store.put_object("kms", b"kafka", ObjectAttrs(headers={"ServerSideEncryption": "aws:kms",
                                                                  "SSEKMSKeyId": key_id})).etag
    assert store.download("plain", io.BytesIO(), etag=plain) is True
    out = io.BytesIO()
    assert store.download("kms", out, etag=etag) is False
    assert out.getvalue() == b"kafka"
