"""A store that lacks an S3 feature answers 501 NotImplemented (s3proxy has no object tagging): a fact of the
store, said as such (exit 2, naming the operation), never a transient error to retry forever; where the
feature is optional for correctness (tags: an object on a store without tagging has none) the run goes on.
The chaos proxy stands in for such a store in front of moto."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
import yaml

from tests.chaos.proxy import Action, Proxy, Request, Rule
from tests.s3.conftest import PREFIX, seed
from tiering.cli import main
from tiering.commit.operation import Context
from tiering.demo.s3 import moto_server
from tiering.errors import ExitCode
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.run.cleanup import CleanupFigures, CleanupOptions, cleanup
from tiering.storage.layout import backup_key
from tiering.storage.memory import MemoryStore
from tiering.storage.objects import ObjectInfo, ObjectNotFound, Unsupported, delete_honours_etag
from tiering.storage.s3 import S3Store, make_client

NOT_IMPLEMENTED = Action("error", status=501, code="NotImplemented")


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


def _bucket(endpoint: str, name: str, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = make_client(endpoint_url=endpoint)
    client.create_bucket(Bucket=name)
    return S3Store(client, name)


def _compact(endpoint: str, bucket: str) -> tuple[int, dict[str, object], str]:
    out, err = StringIO(), StringIO()
    code = main(["s3", "compact", "--bucket", bucket, "--prefix", PREFIX, "--codec", "zstd", "--min-age-minutes",
                 "0", "--endpoint-url", endpoint, "--json", "--no-report"], stdout=out, stderr=err)
    return code, json.loads(out.getvalue()), err.getvalue()


def _tagging(r: Request) -> bool:
    return "tagging" in r.query


def test_a_store_without_object_tagging_is_compacted_as_if_its_objects_had_no_tags(
        upstream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _bucket(upstream, "no-tagging", monkeypatch)
    seed(store, segments=3)
    rule = Rule(_tagging, NOT_IMPLEMENTED, times=None)
    with Proxy(upstream, [rule]) as proxy:
        code, run, err = _compact(proxy.url, store.bucket)
    assert code == ExitCode.OK, err
    assert rule.fired > 0  # the store was asked for tags, and said it has no such feature
    assert [s["status"] for s in run["segments"]] == ["compacted", "compacted"]  # type: ignore[union-attr]


def test_a_missing_feature_the_protocol_needs_is_a_configuration_fact_not_a_retry(
        upstream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = _bucket(upstream, "no-staging-puts", monkeypatch)
    seed(store, segments=3)
    rule = Rule(lambda r: r.method == "PUT" and "/_tiering/staging/" in f"/{r.key}", NOT_IMPLEMENTED, times=None)
    with Proxy(upstream, [rule]) as proxy:
        code, run, err = _compact(proxy.url, store.bucket)
    assert code == ExitCode.USAGE, err
    assert run["pending"] == 0  # nothing left "for a later run": a retry would meet the same store
    failed = [s for s in run["segments"] if s["status"] == "failed"]  # type: ignore[union-attr]
    assert failed
    assert all("not implemented by this S3 store" in s["reason"] for s in failed), failed
    assert all(s["error"]["error"] == "Unsupported" for s in failed), failed
    # The originals are untouched: what stands in the bucket is what was seeded.
    assert not [o.key for o in store.list(f"{PREFIX}/_tiering/backup/")]


def test_501_translates_to_unsupported_whatever_the_code() -> None:
    from botocore.exceptions import ClientError

    from tiering.storage.s3 import translate

    for code in ("NotImplemented", "", "XNotImplemented"):
        e = ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 501}}, "PutObjectTagging")
        err = translate(e, bucket="b", key="k", action="put_object_tagging")
        assert isinstance(err, Unsupported)
        assert not err.retryable
        assert "put_object_tagging is not implemented by this S3 store" in str(err)


def test_a_store_refusing_an_in_place_copy_stops_tiering_as_configuration_not_invalid_data(
        upstream: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """versitygw answers a copy of an object onto itself (how a storage class changes) with 400
    InvalidRequest: the store's refusal (exit 2), not invalid data (exit 1); nothing is moved."""
    store = _bucket(upstream, "no-self-copy", monkeypatch)
    seed(store, segments=2, segment_bytes=300_000)  # records a year old, .log above 128 KiB: one to move
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({"cluster": {"storage.tiers": [{"after.days": 30,
                                                                     "storage.class": "STANDARD_IA"}]}}))
    in_place = Rule(lambda r: r.method == "PUT" and (r.header("x-amz-copy-source") or "").lstrip("/").split("?")[0]
                    == f"{r.bucket}/{r.key}", Action("error", status=400, code="InvalidRequest"), times=None)
    out, err = StringIO(), StringIO()
    with Proxy(upstream, [in_place]) as proxy:
        code = main(["s3", "tier", "--bucket", store.bucket, "--prefix", PREFIX, "--policy", str(policy),
                     "--endpoint-url", proxy.url, "--json"], stdout=out, stderr=err)
    assert in_place.fired > 0
    assert code == ExitCode.USAGE, err.getvalue()
    assert "1 segments stopped" in capsys.readouterr().err
    run = json.loads(out.getvalue())
    (failed,) = [r for r in run["run"]["segments"] if r["status"] == "failed"]
    assert "InvalidRequest" in failed["reason"]
    assert all("StorageClass" not in store.client.head_object(Bucket=store.bucket, Key=o.key)
               for o in store.list(f"{PREFIX}/") if "/_tiering/" not in o.key)


def test_the_delete_etag_probe_tells_the_stores_apart(upstream: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 (and SeaweedFS) keep an object DeleteObjects names with another ETag; moto 5.2.5 and versitygw
    delete it regardless (MemoryStore does either, as told)."""
    moto = _bucket(upstream, "probe-delete", monkeypatch)
    assert not delete_honours_etag(moto, "probe/one")  # fails the day moto checks them: then say so here
    assert delete_honours_etag(MemoryStore("b"), "probe/one")
    assert not delete_honours_etag(MemoryStore("b", delete_etags=False), "probe/one")
    assert not list(moto.list("probe/"))  # the probe leaves nothing


@pytest.mark.parametrize("delete_etags", [True, False])
def test_cleanup_never_deletes_a_backup_rewritten_after_it_was_listed(delete_etags: bool) -> None:
    """Where DeleteObjects ignores the ETags (versitygw), cleanup looks at each expired object again before
    deleting it; where it honours them, the condition alone keeps a rewritten one."""
    store = MemoryStore("b", delete_etags=delete_etags)
    old, victim = (backup_key(PREFIX, "r1", "t-0", base, ".log") for base in (0, 100))
    store.put(old, b"an original, kept its grace period")
    store.put(victim, b"an original, kept its grace period")
    listing = store.list

    def list_then_rewrite(prefix: str, **kwargs: object) -> Iterator[ObjectInfo]:
        items = list(listing(prefix, **kwargs))  # type: ignore[arg-type]
        if "/backup/" in prefix:
            store.put(victim, b"written again right after the listing")
        return iter(items)

    store.list = list_then_rewrite  # type: ignore[method-assign]
    looked: list[str] = []
    head = store.head

    def counted_head(key: str) -> ObjectInfo:
        looked.append(key)
        return head(key)

    store.head = counted_head  # type: ignore[method-assign]
    result = cleanup(store, Context(store, PREFIX, "cleanup-1", RewriteOptions(Codec.ZSTD)), CleanupOptions(0))
    assert CleanupFigures.of(result).backups_deleted == 1
    assert store.get(victim) == b"written again right after the listing"
    with pytest.raises(ObjectNotFound):
        store.get(old)
    assert sorted(k for k in looked if "/backup/" in k) == ([] if delete_etags else [old, victim])
