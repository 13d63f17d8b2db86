"""The chaos proxy itself, driven by real boto3: verbatim forwarding (Expect: 100-continue, multipart,
keep-alive) and each fault as the client sees it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import BotoCoreError, ClientError

from tests.chaos.proxy import Action, Flaky, Proxy, Request, Response, Rule
from tiering.storage.s3 import make_client

BUCKET = "proxy-check"


@pytest.fixture
def client_via(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A factory of boto3 clients that talk to moto through a given proxy (the bucket exists)."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    direct = make_client(endpoint_url=moto_endpoint)
    direct.create_bucket(Bucket=BUCKET)

    def make(proxy: Proxy, attempts: int = 3) -> Any:
        return make_client(endpoint_url=proxy.url, max_attempts=attempts)

    yield make
    for item in direct.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        direct.delete_object(Bucket=BUCKET, Key=item["Key"])
    direct.delete_bucket(Bucket=BUCKET)


def _is_put(key: str) -> Any:
    return lambda r: r.method == "PUT" and r.key == key and "partNumber" not in r.query


def test_put_get_and_multipart_pass_through_verbatim(moto_endpoint: str, client_via: Any) -> None:
    big = os.urandom(6 * 1024 * 1024)
    with Proxy(moto_endpoint) as proxy:
        s3 = client_via(proxy)
        s3.put_object(Bucket=BUCKET, Key="a/b c+d.log", Body=big[:2_000_000])  # sent with Expect: 100-continue
        assert s3.get_object(Bucket=BUCKET, Key="a/b c+d.log")["Body"].read() == big[:2_000_000]
        assert s3.head_object(Bucket=BUCKET, Key="a/b c+d.log")["ContentLength"] == 2_000_000
        upload = s3.create_multipart_upload(Bucket=BUCKET, Key="mp")["UploadId"]
        parts = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=BUCKET, Key="mp", UploadId=upload, PartNumber=n,
                                                          Body=chunk)["ETag"]}
                 for n, chunk in ((1, big[: 5 * 1024 * 1024]), (2, big[5 * 1024 * 1024 :]))]
        s3.complete_multipart_upload(Bucket=BUCKET, Key="mp", UploadId=upload, MultipartUpload={"Parts": parts})
        assert s3.get_object(Bucket=BUCKET, Key="mp")["Body"].read() == big
        with pytest.raises(ClientError) as refused:
            s3.put_object(Bucket=BUCKET, Key="mp", Body=b"x", IfNoneMatch="*")
        assert refused.value.response["Error"]["Code"] == "PreconditionFailed"
        s3.delete_object(Bucket=BUCKET, Key="mp")
    requests = proxy.lines()
    assert requests[0].startswith("PUT /proxy-check/a/b%20c%2Bd.log")
    assert requests[0].endswith("-> 200 [pass]")
    assert sum("uploadId=" in line and line.startswith("PUT") for line in requests) == 2
    assert any(line.startswith("DELETE /proxy-check/mp") and "-> 204" in line for line in requests)


def test_each_fault_reaches_the_client_as_intended(moto_endpoint: str, client_via: Any) -> None:
    calls: list[str] = []

    def before(request: Request) -> None:
        calls.append(f"before {request.method} {request.key} if-match={request.header('If-Match')}")

    def after(request: Request, response: Response) -> None:
        calls.append(f"after {request.method} {request.key} {response.status}")

    rules = [Rule(_is_put("err"), Action("error", 503, "SlowDown")),
             Rule(_is_put("rst"), Action("reset", before=before)),
             Rule(_is_put("drop"), Action("drop", after=after)),
             Rule(lambda r: r.method == "GET" and r.key == "cut", Action("cut"), times=None)]
    with Proxy(moto_endpoint, rules) as proxy:
        s3 = client_via(proxy)
        for key in ("err", "rst", "drop", "cut"):
            s3.put_object(Bucket=BUCKET, Key=key, Body=key.encode() * 1000)  # each is retried once, then passes
        body = s3.get_object(Bucket=BUCKET, Key="cut")["Body"]
        with pytest.raises((BotoCoreError, OSError, ValueError)):
            body.read()
    assert calls == ["before PUT rst if-match=None", "after PUT drop 200"]
    puts = [line for line in proxy.lines() if line.startswith("PUT")]
    assert [line.rsplit("[", 1)[1] for line in puts] == ["error]", "pass]", "reset]", "pass]", "drop]", "pass]",
                                                         "pass]"]
    assert proxy.lines()[-1].endswith("-> 200 [cut]")


def test_flaky_mode_is_seeded_and_the_client_still_succeeds(moto_endpoint: str, client_via: Any) -> None:
    rounds = []
    for _ in range(2):
        flaky = Flaky(0.3, seed=7, kinds=("error500", "error503", "reset", "drop", "delay"))
        with Proxy(moto_endpoint, [flaky]) as proxy:
            s3 = client_via(proxy, attempts=10)
            for n in range(8):
                s3.put_object(Bucket=BUCKET, Key=f"k{n}", Body=b"v" * n)
            assert [s3.get_object(Bucket=BUCKET, Key=f"k{n}")["Body"].read() for n in range(8)] == [
                b"v" * n for n in range(8)]
        rounds.append(dict(flaky.fired))
    assert rounds[0] == rounds[1]
    assert sum(rounds[0].values()) >= 3
