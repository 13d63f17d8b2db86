"""A GET's body as the store reads it (:class:`tiering.storage.s3.Body`): every byte checked against the
checksum S3 stored for the whole object, whichever of CRC-32C, CRC-32, SHA-256 or SHA-1 it is; bytes damaged
on the way are a retryable transport failure, never invalid data. Against a moto server behind the chaos proxy,
which can flip a bit of a body (test_seaweedfs.py shows the same reads on SeaweedFS keep their connection)."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator

import pytest

from tests.chaos.proxy import Action, Proxy, Request, Rule
from tests.s3.conftest import PREFIX, seed
from tiering.cli import main
from tiering.demo.s3 import moto_server
from tiering.errors import ExitCode
from tiering.storage.objects import TransportError
from tiering.storage.s3 import Body, S3Store, make_client

DATA = hashlib.sha256(b"seed").digest() * 40_000  # 1.25 MiB: several reads of the body
FLIP = Action("flip")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def _store(endpoint: str, bucket: str) -> S3Store:
    return S3Store(make_client(endpoint_url=endpoint), bucket)


def _put(store: S3Store, key: str, algorithm: str) -> None:
    """``DATA`` stored with a checksum of ``algorithm``: CRC32C as this platform uploads, the others as an
    AWS SDK does (CRC32 is botocore's default)."""
    if algorithm == "CRC32C":
        store.put(key, DATA, checksum=True)
    else:
        store.client.put_object(Bucket=store.bucket, Key=key, Body=DATA, ChecksumAlgorithm=algorithm)


def _gets(key: str) -> Rule:
    return Rule(lambda r: r.method == "GET" and r.key == key, FLIP, times=None)


@pytest.mark.usefixtures("credentials")
@pytest.mark.parametrize("algorithm", ["CRC32C", "CRC32", "SHA256", "SHA1"])
def test_a_whole_object_read_is_checked_against_its_stored_checksum(upstream: str, algorithm: str) -> None:
    bucket = f"body-{algorithm.lower()}"
    direct = _store(upstream, bucket)
    direct.client.create_bucket(Bucket=bucket)
    _put(direct, "obj", algorithm)
    with Proxy(upstream, [_gets("damaged")]) as proxy:
        store = _store(proxy.url, bucket)
        with store.open("obj") as body:
            assert body.read() == DATA
        assert isinstance(body, Body)
        assert body.verified == algorithm
        _put(direct, "damaged", algorithm)
        with pytest.raises(TransportError, match=f"do not match the {algorithm} S3 stored") as e:
            store.get("damaged")
        assert e.value.path == f"s3://{bucket}/damaged"


@pytest.mark.usefixtures("credentials")
def test_a_ranged_read_has_no_whole_object_checksum_to_meet(upstream: str) -> None:
    direct = _store(upstream, "body-range")
    direct.client.create_bucket(Bucket="body-range")
    _put(direct, "obj", "CRC32C")
    with direct.open("obj", first_bytes=1000) as head, direct.open("obj", start=1000) as tail:
        assert head.read() + tail.read() == DATA
    assert isinstance(head, Body)
    assert isinstance(tail, Body)
    assert (head.verified, tail.verified) == (None, None)  # read, not checked against the whole object's


def _log_gets(r: Request) -> bool:
    return r.method == "GET" and r.key.endswith(".log") and "/_tiering/" not in r.key


@pytest.mark.usefixtures("credentials")
def test_a_segment_damaged_on_the_way_is_a_retry_and_the_original_stays(upstream: str) -> None:
    direct = _store(upstream, "body-compact")
    direct.client.create_bucket(Bucket="body-compact")
    originals = seed(direct, segments=2)
    before = {o.key: o.etag for o in direct.list(f"{PREFIX}/")}
    flip = Rule(_log_gets, FLIP, times=None)
    with Proxy(upstream, [flip]) as proxy:
        out, err = io.StringIO(), io.StringIO()
        code = main(["s3", "compact", "--bucket", "body-compact", "--prefix", PREFIX, "--codec", "zstd",
                     "--min-age-minutes", "0", "--endpoint-url", proxy.url, "--no-report", "--json"],
                    stdout=out, stderr=err)
    assert flip.fired >= len(originals)
    assert code == ExitCode.RETRY, out.getvalue() + err.getvalue()
    # Caught by the checksum the seeding upload stored (botocore's CRC32), before any batch was judged.
    reasons = [s["reason"] for s in json.loads(out.getvalue())["segments"]]
    assert reasons
    assert all("do not match the CRC32 S3 stored for the object (damaged on the way" in r for r in reasons), reasons
    assert {o.key: o.etag for o in direct.list(f"{PREFIX}/") if "/_tiering/" not in o.key} == before


@pytest.mark.usefixtures("credentials")
def test_an_empty_object_is_checked_too(upstream: str) -> None:
    direct = _store(upstream, "body-empty")
    direct.client.create_bucket(Bucket="body-empty")
    direct.put("empty", b"", checksum=True)
    with direct.open("empty") as body:
        assert body.read() == b""
    assert isinstance(body, Body)
    assert body.verified == "CRC32C"
