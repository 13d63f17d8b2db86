"""The object-store contract: S3Store on moto's in-process S3 and MemoryStore answer alike.

Every test named ``test_both_*`` runs on both stores and asserts the same concrete answers (values, ETags,
error types with S3's code, status and message), so the two stores agree with each other and with S3.
``test_differential_transcript`` runs one script on both at once and compares everything they returned,
including the ``requests`` counts. Where moto is known not to enforce what S3 enforces, the test asserts
S3's documented behaviour on MemoryStore only and says so (``MOTO:`` comments).
"""

from __future__ import annotations

import hashlib
import inspect
import io
import json
import re
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.s3.conftest import BUCKET
from tiering.errors import ConfigError, StorageError, TieringError
from tiering.storage.aside import WriteAside
from tiering.storage.memory import ManualClock, MemoryStore
from tiering.storage.objects import (
    MIN_PART_BYTES,
    BucketFacts,
    ObjectAttrs,
    ObjectInfo,
    ObjectStore,
    PreconditionFailed,
)
from tiering.storage.s3 import S3Store

MEMBERS = ("head", "open", "get", "download", "put", "delete", "delete_many", "now", "describe", "put_object", "copy",
           "copy_over",
           "transition", "get_json", "put_json", "facts", "list_dirs", "list_uploads", "abort_upload", "list", "upload",
           "writer", "another", "for_bucket")
ATTRIBUTES = ("bucket", "requests")


def md5(data: bytes) -> str:
    return f'"{hashlib.md5(data, usedforsecurity=False).hexdigest()}"'


def md5_of_parts(parts: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p, usedforsecurity=False).digest() for p in parts)
    return f'"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(parts)}"'


@pytest.fixture(params=["moto", "memory"])
def s(request: pytest.FixtureRequest) -> ObjectStore:
    """Each store of the contract: conftest's S3Store on moto, or a MemoryStore of the same bucket name."""
    if request.param == "moto":
        moto: S3Store = request.getfixturevalue("store")
        return moto
    return MemoryStore(BUCKET)


def on_moto(store: ObjectStore) -> bool:
    return isinstance(store, S3Store)


def stray_upload(store: ObjectStore, key: str) -> str:
    """A multipart upload left incomplete (what a killed process leaves); its id."""
    if isinstance(store, S3Store):
        return str(store.client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"])
    assert isinstance(store, MemoryStore)
    return store.create_upload(key)


def failure(call: Callable[[], object]) -> tuple[str, str, int | None, str]:
    """How a call failed: the error type, S3's code and status, and the message without S3's request id."""
    with pytest.raises(TieringError) as caught:
        call()
    err = caught.value
    message = re.sub(r", request id [^)]*", "", str(err))
    return type(err).__name__, getattr(err, "code", ""), getattr(err, "status", None), message


def where(key: str) -> str:
    return f"s3://{BUCKET}/{key}"


# --- The interface -------------------------------------------------------------------------------------------


def _s3_is_an_object_store(store: S3Store) -> ObjectStore:
    return store  # mypy checks this assignment: S3Store satisfies the protocol structurally


def _memory_is_an_object_store(store: MemoryStore) -> ObjectStore:
    return store


def _methods(cls: type) -> set[str]:
    """The public methods of ``cls``, those it inherits from our own classes included."""
    return {name for klass in cls.__mro__ if klass.__module__.startswith("tiering.")
            for name, value in vars(klass).items() if inspect.isfunction(value) and not name.startswith("_")}


def _signature(cls: type, name: str) -> inspect.Signature:
    """A method's signature past ``self`` (a shared implementation may declare the self type it needs)."""
    signature = inspect.signature(getattr(cls, name))
    return signature.replace(parameters=list(signature.parameters.values())[1:])


def test_the_protocol_names_exactly_the_interface_with_s3store_signatures() -> None:
    """A method added to S3Store, or a signature changed in one place only, fails here until the three agree."""
    assert _methods(ObjectStore) == _methods(S3Store) == set(MEMBERS)
    assert _methods(MemoryStore) == {*MEMBERS, "create_upload"}  # what a killed upload leaves, for tests
    assert set(ObjectStore.__annotations__) == set(ATTRIBUTES)
    for name in MEMBERS:
        want = _signature(S3Store, name)
        assert _signature(ObjectStore, name) == want, name
        assert _signature(MemoryStore, name) == want, name
        assert _signature(WriteAside, name) == want, name
    assert _methods(WriteAside) == set(MEMBERS)
    assert S3Store.__annotations__["requests"] == ObjectStore.__annotations__["requests"] == "Counter[str]"


def test_both_stores_are_object_stores(s: ObjectStore) -> None:
    assert isinstance(s, ObjectStore)
    assert s.bucket == BUCKET
    assert isinstance(s.requests, Counter)


# --- Reads and writes ----------------------------------------------------------------------------------------


def test_both_put_head_get_and_stream(s: ObjectStore) -> None:
    etag = s.put("p/a.log", b"x" * 1000, metadata={"Tiering-Codec": "zstd"})
    assert etag == md5(b"x" * 1000)
    info = s.head("p/a.log")
    assert (info.key, info.size, info.etag, info.storage_class) == ("p/a.log", 1000, etag, "STANDARD")
    assert info.metadata == {"tiering-codec": "zstd"}  # S3 names user metadata in lower case
    assert info.last_modified.tzinfo is not None
    assert info.last_modified.microsecond == 0
    assert abs(info.last_modified - datetime.now(UTC)) < timedelta(minutes=1)
    with s.open("p/a.log") as body:
        assert body.read(10) == b"x" * 10
        assert len(body.read()) == 990
    assert s.get("p/a.log") == b"x" * 1000
    assert s.put("p/empty", b"") == md5(b"")


def test_both_name_a_missing_object_alike(s: ObjectStore) -> None:
    assert failure(lambda: s.get("nope")) == (
        "ObjectNotFound", "NoSuchKey", 404, f"{where('nope')}: get_object failed with S3 error NoSuchKey (HTTP 404)")
    head = ("ObjectNotFound", "404", 404, f"{where('nope')}: head_object failed with S3 error 404 (HTTP 404)")
    assert failure(lambda: s.head("nope")) == head
    assert failure(lambda: s.describe("nope")) == head
    assert failure(lambda: s.open("nope", if_match='"0"'))[:3] == ("ObjectNotFound", "NoSuchKey", 404)
    assert failure(lambda: s.get_json("nope"))[:3] == ("ObjectNotFound", "NoSuchKey", 404)
    assert failure(lambda: s.download("nope", io.BytesIO(), etag='"0"'))[:3] == ("ObjectNotFound", "NoSuchKey", 404)


def test_both_create_only_if_absent(s: ObjectStore) -> None:
    first = s.put("lease", b"one", if_none_match=True)
    assert failure(lambda: s.put("lease", b"two", if_none_match=True)) == (
        "PreconditionFailed", "PreconditionFailed", 412,
        f"{where('lease')}: put_object failed with S3 error PreconditionFailed (HTTP 412)")
    assert (s.get("lease"), s.head("lease").etag) == (b"one", first)
    refused = failure(lambda: s.put_object("lease", b"three", ObjectAttrs(), if_none_match=True))
    assert refused[:3] == ("PreconditionFailed", "PreconditionFailed", 412)
    assert s.get("lease") == b"one"


def test_both_replace_only_if_unchanged(s: ObjectStore) -> None:
    first = s.put("journal", b"v1")
    second = s.put("journal", b"v2", if_match=first)
    assert second == md5(b"v2")
    stale = failure(lambda: s.put("journal", b"v3", if_match=first))
    assert stale[:3] == ("PreconditionFailed", "PreconditionFailed", 412)
    assert s.get("journal") == b"v2"
    assert s.put("journal", b"v4", if_match=second.strip('"')) == md5(b"v4")  # S3 takes it without quotes too
    # If-Match on a key that does not exist: 404 (S3's documented answer; moto agrees), not 412.
    assert failure(lambda: s.put("absent", b"x", if_match=first)) == (
        "ObjectNotFound", "NoSuchKey", 404, f"{where('absent')}: put_object failed with S3 error NoSuchKey (HTTP 404)")
    assert failure(lambda: s.put_object("absent", b"x", ObjectAttrs(), if_match=first))[:3] == (
        "ObjectNotFound", "NoSuchKey", 404)
    before = sum(s.requests.values())
    with pytest.raises(ConfigError):
        s.put("journal", b"v5", if_none_match=True, if_match=second)
    assert sum(s.requests.values()) == before  # refused before any request


def test_both_delete_conditionally(s: ObjectStore) -> None:
    etag = s.put("k", b"v")
    s.delete("never-there")  # a plain DELETE of a missing key succeeds on S3
    assert failure(lambda: s.delete("k", if_match='"0123"')) == (
        "PreconditionFailed", "PreconditionFailed", 412,
        f"{where('k')}: delete_object failed with S3 error PreconditionFailed (HTTP 412)")
    assert s.get("k") == b"v"
    # A conditional DELETE of a missing key: 404 (moto; S3 for general purpose buckets), hence missing_ok.
    assert failure(lambda: s.delete("never-there", if_match=etag))[:3] == ("ObjectNotFound", "NoSuchKey", 404)
    s.delete("never-there", if_match=etag, missing_ok=True)
    s.delete("k", if_match=etag)
    assert failure(lambda: s.head("k"))[0] == "ObjectNotFound"


def test_both_ranged_and_pinned_reads(s: ObjectStore) -> None:
    etag = s.put("r", b"0123456789")
    s.put("empty", b"")
    assert s.open("r", first_bytes=4).read() == b"0123"
    assert s.open("r", first_bytes=0).read() == b"0"  # bytes=0-0
    assert s.open("r", first_bytes=100).read() == b"0123456789"
    assert s.open("r", start=7).read() == b"789"
    assert s.open("r", if_match=etag, start=0).read() == b"0123456789"
    assert failure(lambda: s.open("r", if_match='"0"')) == (
        "PreconditionFailed", "PreconditionFailed", 412,
        f"{where('r')}: get_object failed with S3 error PreconditionFailed (HTTP 412)")
    assert failure(lambda: s.open("r", start=10)) == (
        "StorageError", "InvalidRange", 416, f"{where('r')}: get_object failed with S3 error InvalidRange (HTTP 416)")
    assert failure(lambda: s.open("empty", first_bytes=10))[:3] == ("StorageError", "InvalidRange", 416)
    with pytest.raises(StorageError) as caught:
        s.open("r", start=11)
    assert not caught.value.retryable


def test_both_download_checks_plain_etags_only(s: ObjectStore) -> None:
    etag = s.put("d", b"payload")
    out = io.BytesIO()
    assert s.download("d", out, etag=etag) is True
    assert out.getvalue() == b"payload"
    assert failure(lambda: s.download("d", io.BytesIO(), etag=md5(b"other")))[:3] == (
        "PreconditionFailed", "PreconditionFailed", 412)
    big = b"a" * MIN_PART_BYTES + b"b"
    multipart = s.upload("big", io.BytesIO(big), part_bytes=MIN_PART_BYTES)
    out = io.BytesIO()
    assert s.download("big", out, etag=multipart) is False  # a multipart ETag cannot vouch for the bytes
    assert out.getvalue() == big


# --- Multipart uploads ---------------------------------------------------------------------------------------


def test_both_compute_multipart_etags_as_s3_does(s: ObjectStore) -> None:
    parts = [b"a" * MIN_PART_BYTES, b"b" * MIN_PART_BYTES, b"c" * 10]
    etag = s.upload("big.log", io.BytesIO(b"".join(parts)), part_bytes=MIN_PART_BYTES, metadata={"owner": "x"})
    assert etag == md5_of_parts(parts)
    assert etag.endswith('-3"')
    info = s.head("big.log")
    assert (info.size, info.etag, info.metadata) == (2 * MIN_PART_BYTES + 10, etag, {"owner": "x"})
    assert s.open("big.log", start=2 * MIN_PART_BYTES).read() == b"c" * 10
    assert not list(s.list_uploads(""))
    assert (s.requests["CreateMultipartUpload"], s.requests["UploadPart"], s.requests["CompleteMultipartUpload"]) == (
        1, 3, 1)
    # A copy is written in one request: its ETag is the plain MD5 of the bytes.
    assert s.copy("big.log", "copied.log", source_etag=etag, attrs=ObjectAttrs()) == md5(b"".join(parts))


def test_both_upload_small_inputs_in_one_put_and_honour_if_none_match(s: ObjectStore) -> None:
    assert s.upload("small.log", io.BytesIO(b"abc"), if_none_match=True) == md5(b"abc")
    assert s.requests["PutObject"] == 1
    assert failure(lambda: s.upload("small.log", io.BytesIO(b"def"), if_none_match=True))[:3] == (
        "PreconditionFailed", "PreconditionFailed", 412)
    assert s.get("small.log") == b"abc"
    with pytest.raises(ConfigError):
        s.upload("x", io.BytesIO(b""), part_bytes=1024)
    # A multipart upload over an existing key: the completion is refused and the upload aborted.
    big = io.BytesIO(b"z" * (MIN_PART_BYTES + 1))
    assert failure(lambda: s.upload("small.log", big, part_bytes=MIN_PART_BYTES, if_none_match=True)) == (
        "PreconditionFailed", "PreconditionFailed", 412,
        f"{where('small.log')}: complete_multipart_upload failed with S3 error PreconditionFailed (HTTP 412)")
    assert s.get("small.log") == b"abc"
    assert not list(s.list_uploads(""))
    assert s.requests["AbortMultipartUpload"] == 1


def test_both_abort_a_failed_multipart_upload(s: ObjectStore) -> None:
    class Broken(io.RawIOBase):
        calls = 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer: Any) -> int:
            self.calls += 1
            if self.calls > 2:
                raise OSError("disk went away")
            buffer[: len(buffer)] = b"\x01" * len(buffer)
            return len(buffer)

    with pytest.raises(OSError, match="disk went away"):
        s.upload("broken.log", Broken(), part_bytes=MIN_PART_BYTES)  # type: ignore[arg-type]
    assert not list(s.list_uploads(""))
    assert s.requests["AbortMultipartUpload"] == 1
    assert failure(lambda: s.head("broken.log"))[0] == "ObjectNotFound"


def test_both_list_and_abort_incomplete_uploads(s: ObjectStore) -> None:
    first = stray_upload(s, "p/u1")
    second = stray_upload(s, "p/u0")
    stray_upload(s, "q/u2")
    listed = list(s.list_uploads("p/"))
    assert {(key, upload_id) for key, upload_id, _ in listed} == {("p/u1", first), ("p/u0", second)}
    assert all(isinstance(when, datetime) and when.tzinfo is not None for _, _, when in listed)
    s.abort_upload("p/u1", first)
    assert [key for key, _, _ in s.list_uploads("p/")] == ["p/u0"]
    assert failure(lambda: s.abort_upload("p/u1", first)) == (
        "StorageError", "NoSuchUpload", 404,
        f"{where('p/u1')}: abort_multipart_upload failed with S3 error NoSuchUpload (HTTP 404)")
    assert failure(lambda: s.head("p/u0"))[0] == "ObjectNotFound"  # an upload is no object


def test_memory_lists_uploads_as_s3_does_and_checks_the_key_on_abort() -> None:
    """MOTO: its ListMultipartUploads answers in creation order with a fixed Initiated date (2010-11-10), and
    its AbortMultipartUpload ignores the key. S3 lists by key, then by initiation time, and answers
    NoSuchUpload to an id under another key."""
    clock = ManualClock(datetime(2030, 1, 1, 12, 0, 0, 500_000, tzinfo=UTC))
    s = MemoryStore(BUCKET, clock=clock)
    late = s.create_upload("p/b")
    clock.advance(seconds=5)
    b_again = s.create_upload("p/b")
    a = s.create_upload("p/a")
    assert list(s.list_uploads("p/")) == [("p/a", a, clock.at.replace(microsecond=0)),
                                          ("p/b", late, datetime(2030, 1, 1, 12, tzinfo=UTC)),
                                          ("p/b", b_again, clock.at.replace(microsecond=0))]
    assert failure(lambda: s.abort_upload("p/a", late))[:3] == ("StorageError", "NoSuchUpload", 404)
    assert len(list(s.list_uploads("p/"))) == 3


# --- Listing -------------------------------------------------------------------------------------------------

KEYS = ("d/a/x", "d/b/y", "d/b/z", "d/c", "d/a/", "d/a", "d//q", "e/x", "d-z", "d.y/k")


def test_both_list_in_key_order_with_prefixes_and_delimiters(s: ObjectStore) -> None:
    for i, key in enumerate(reversed(KEYS)):
        s.put(key, bytes(i))
    listed = list(s.list("d/"))
    assert [o.key for o in listed] == ["d//q", "d/a", "d/a/", "d/a/x", "d/b/y", "d/b/z", "d/c"]
    assert all(o.metadata == {} and o.storage_class == "STANDARD" for o in listed)  # a listing has no metadata
    heads = {o.key: s.head(o.key) for o in listed}
    assert [(o.size, o.etag, o.last_modified) for o in listed] == [
        (heads[o.key].size, heads[o.key].etag, heads[o.key].last_modified) for o in listed]
    assert [o.key for o in s.list("")] == sorted(KEYS)
    assert [o.key for o in s.list("d/", delimiter="/")] == ["d/a", "d/c"]
    assert [o.key for o in s.list("", delimiter="/")] == ["d-z"]
    assert [o.key for o in s.list("d", delimiter="/")] == ["d-z"]
    assert list(s.list_dirs("d/")) == ["d//", "d/a/", "d/b/"]
    assert list(s.list_dirs("")) == ["d.y/", "d/", "e/"]
    assert list(s.list_dirs("d")) == ["d.y/", "d/"]
    assert list(s.list("zzz/")) == []
    assert list(s.list_dirs("zzz/")) == []


def test_both_page_listings_and_deletes_by_the_thousand(s: ObjectStore) -> None:
    for i in range(1001):
        s.put(f"many/{i:04d}/x", b"x")
    s.requests.clear()
    pages = s.list("many/")
    assert s.requests["ListObjectsV2"] == 0  # lazily, page by page
    assert len(list(pages)) == 1001
    assert s.requests["ListObjectsV2"] == 2
    assert len(list(s.list_dirs("many/"))) == 1001  # common prefixes fill pages as keys do
    assert s.requests["ListObjectsV2"] == 4
    assert list(s.list("many/", delimiter="/")) == []
    assert s.requests["ListObjectsV2"] == 6
    listed = [(o.key, o.etag) for o in s.list("many/")]
    assert s.delete_many([*listed, ("many/never-there", '"0"')]) == {k for k, _ in listed} | {"many/never-there"}
    assert s.requests["DeleteObjects"] == 2
    assert s.delete_many([]) == set()
    assert s.requests["DeleteObjects"] == 2
    assert list(s.list("many/")) == []
    assert list(s.list_uploads("many/")) == []
    assert s.requests["ListMultipartUploads"] == 1  # an empty listing is one request all the same


def test_memory_delete_many_keeps_a_key_rewritten_since_it_was_listed() -> None:
    """MOTO: its DeleteObjects ignores the per-object ETag (tests/s3/test_store.py sends it all the same). S3
    refuses that key with PreconditionFailed, which S3Store leaves out of the keys deleted."""
    s = MemoryStore(BUCKET)
    old = s.put("a", b"1")
    s.put("b", b"2")
    s.put("a", b"rewritten")
    assert s.delete_many([("a", old), ("b", md5(b"2"))]) == {"b"}
    assert s.get("a") == b"rewritten"
    assert s.delete_many([("a", old.strip('"'))]) == set()


# --- Attributes, copies and transitions ----------------------------------------------------------------------

ATTRS = ObjectAttrs({"owner": "team-a"}, {"ContentType": "text/plain", "CacheControl": "no-cache",
                                          "ContentEncoding": "identity", "ContentLanguage": "en",
                                          "ContentDisposition": "inline"},
                    {"cost-center": "42", "team": "a b"}, "STANDARD_IA")


def test_both_keep_metadata_headers_tags_and_storage_class(s: ObjectStore) -> None:
    written = s.put_object("a", b"hello", ATTRS)
    assert written == ObjectInfo("a", 5, md5(b"hello"), written.last_modified, "STANDARD_IA", {"owner": "team-a"})
    info, attrs = s.describe("a")
    assert attrs == ATTRS
    assert (info.size, info.etag, info.storage_class, info.metadata) == (5, md5(b"hello"), "STANDARD_IA",
                                                                         {"owner": "team-a"})
    assert s.put_object("f", io.BytesIO(b"from a file"), ObjectAttrs()).size == 11
    assert s.describe("f")[1] == ObjectAttrs(headers={"ContentType": "binary/octet-stream"})  # S3's default
    s.put_object("sse", b"x", ObjectAttrs(headers={"ServerSideEncryption": "AES256"}))
    assert s.describe("sse")[1].headers == {"ContentType": "binary/octet-stream"}  # S3's default encryption
    assert [o.storage_class for o in s.list("")] == ["STANDARD_IA", "STANDARD", "STANDARD"]
    assert (s.requests["HeadObject"], s.requests["GetObjectTagging"]) == (3, 3)


def test_both_copy_keeps_the_source_s_attributes_with_the_request_s_class(s: ObjectStore) -> None:
    etag = s.put_object("src", b"original", ATTRS).etag
    assert s.copy("src", "plain-copy", source_etag=etag, attrs=ObjectAttrs()) == etag
    assert s.describe("plain-copy")[1] == ObjectAttrs(ATTRS.metadata, ATTRS.headers, ATTRS.tags, "STANDARD")
    assert s.copy("src", "backup", source_etag=etag, attrs=ATTRS) == etag
    assert s.describe("backup")[1] == ATTRS
    assert s.get("backup") == b"original"
    assert failure(lambda: s.copy("gone", "dst", source_etag=etag, attrs=ATTRS)) == (
        "ObjectNotFound", "NoSuchKey", 404, f"{where('dst')}: copy_object failed with S3 error NoSuchKey (HTTP 404)")
    assert s.requests["CopyObject"] == 3


def test_both_transition_in_place_keeping_everything_else(s: ObjectStore) -> None:
    etag = s.put_object("t", b"bytes", ATTRS).etag
    assert s.transition("t", etag=etag, attrs=ATTRS, storage_class="GLACIER_IR") == etag
    info, attrs = s.describe("t")
    assert attrs == ObjectAttrs(ATTRS.metadata, ATTRS.headers, ATTRS.tags, "GLACIER_IR")
    assert info.storage_class == "GLACIER_IR"
    assert s.get("t") == b"bytes"  # GLACIER_IR is readable at once
    assert failure(lambda: s.transition("gone", etag=etag, attrs=ATTRS, storage_class="GLACIER"))[:3] == (
        "ObjectNotFound", "NoSuchKey", 404)


def test_both_refuse_to_read_or_copy_an_archived_object(s: ObjectStore) -> None:
    etag = s.put("cold", b"frozen")
    s.transition("cold", etag=etag, attrs=ObjectAttrs(), storage_class="GLACIER")
    assert s.head("cold").storage_class == "GLACIER"
    assert [o.storage_class for o in s.list("cold")] == ["GLACIER"]
    assert failure(lambda: s.get("cold")) == (
        "StorageError", "InvalidObjectState", 403,
        f"{where('cold')}: get_object failed with S3 error InvalidObjectState (HTTP 403)")
    assert failure(lambda: s.open("cold", first_bytes=2))[1:3] == ("InvalidObjectState", 403)
    assert failure(lambda: s.copy("cold", "warm", source_etag=etag, attrs=ObjectAttrs()))[:3] == (
        "StorageError", "ObjectNotInActiveTierError", 403)
    if not on_moto(s):
        # MOTO: its GetObjectTagging refuses an archived object (InvalidObjectState); S3 serves tags whatever
        # the storage class (they are not the object's data).
        assert s.describe("cold")[1].storage_class == "GLACIER"


def test_memory_copies_only_the_planned_version() -> None:
    """MOTO: it ignores CopyObject's x-amz-copy-source-if-match and destination If-Match (the protocol HEADs
    the source after a backup copy because of it). S3 refuses a changed source with 412; so does MemoryStore."""
    s = MemoryStore(BUCKET)
    planned = s.put_object("seg.log", b"planned", ATTRS).etag
    s.put("seg.log", b"rewritten by a mirror")
    assert failure(lambda: s.copy("seg.log", "backup.log", source_etag=planned, attrs=ATTRS)) == (
        "PreconditionFailed", "PreconditionFailed", 412,
        f"{where('backup.log')}: copy_object failed with S3 error PreconditionFailed (HTTP 412)")
    assert failure(lambda: s.head("backup.log"))[0] == "ObjectNotFound"
    assert failure(lambda: s.transition("seg.log", etag=planned, attrs=ATTRS, storage_class="GLACIER"))[:3] == (
        "PreconditionFailed", "PreconditionFailed", 412)
    assert s.head("seg.log").storage_class == "STANDARD"
    assert s.get("seg.log") == b"rewritten by a mirror"


# --- JSON documents ------------------------------------------------------------------------------------------


def test_both_round_trip_json_with_its_etag(s: ObjectStore) -> None:
    doc = {"b": [1, 2], "a": "x"}
    etag = s.put_json("j.json", doc, if_none_match=True)
    assert etag == md5(json.dumps(doc, indent=1, sort_keys=True).encode())
    assert s.get_json("j.json") == (doc, etag)
    assert s.describe("j.json")[1].headers == {"ContentType": "application/json"}
    s.put("not.json", b"\xff{")
    assert failure(lambda: s.get_json("not.json")) == (
        "TieringError", "", None, f"{where('not.json')}: not a JSON document (expected JSON, found 2 bytes)")


def test_both_read_back_a_refused_json_write_and_take_it_when_it_is_ours(s: ObjectStore) -> None:
    """What a retried conditional write whose first answer was lost needs: the 412 of the retry is read back,
    and an identical document is ours (its ETag returned); any other document is a real refusal."""
    first = s.put_json("lease.json", {"owner": "a", "token": 1}, if_none_match=True)
    s.requests.clear()
    assert s.put_json("lease.json", {"token": 1, "owner": "a"}, if_none_match=True) == first
    assert (s.requests["PutObject"], s.requests["GetObject"]) == (1, 1)  # the refused write, then the read-back
    assert failure(lambda: s.put_json("lease.json", {"owner": "b"}, if_none_match=True))[:3] == (
        "PreconditionFailed", "PreconditionFailed", 412)
    second = s.put_json("lease.json", {"owner": "a", "token": 2}, if_match=first)
    assert s.put_json("lease.json", {"owner": "a", "token": 2}, if_match=first) == second  # stale, but ours
    assert failure(lambda: s.put_json("lease.json", {"owner": "c"}, if_match=first))[:3] == (
        "PreconditionFailed", "PreconditionFailed", 412)
    assert failure(lambda: s.put_json("missing.json", {}, if_match=first))[:3] == ("ObjectNotFound", "NoSuchKey", 404)
    assert s.get_json("lease.json") == ({"owner": "a", "token": 2}, second)


# --- Bucket facts, clock, threads ----------------------------------------------------------------------------


def test_both_report_an_unversioned_bucket_without_lifecycle_rules(s: ObjectStore) -> None:
    assert s.facts("prod/") == BucketFacts(False, None)
    assert (s.requests["GetBucketVersioning"], s.requests["GetBucketLifecycleConfiguration"]) == (1, 1)


def test_both_tell_the_time_by_the_store_s_clock(s: ObjectStore) -> None:
    now = s.now("_tiering/clock")
    assert now.tzinfo is not None
    assert now.microsecond == 0
    assert abs(now - datetime.now(UTC)) < timedelta(minutes=1)
    assert s.requests["HeadBucket"] == 1
    # moto in-process sends no Date header: S3Store then reads Last-Modified of an empty clock object. S3 (and
    # MemoryStore) answer the HEAD of the bucket with a Date, and no object is written.
    assert [o.key for o in s.list("_tiering/")] == (["_tiering/clock"] if on_moto(s) else [])


def test_memory_takes_every_time_from_its_clock() -> None:
    clock = ManualClock(datetime(2030, 5, 6, 7, 8, 9, 999_999, tzinfo=UTC))
    s = MemoryStore(BUCKET, clock=clock)
    s.put("a", b"")
    clock.advance(hours=25)
    assert s.head("a").last_modified == datetime(2030, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert s.now("clock") == datetime(2030, 5, 7, 8, 8, 9, tzinfo=UTC)
    assert s.now("clock") - next(s.list("a")).last_modified == timedelta(hours=25)


def test_both_let_exactly_one_of_many_threads_create_a_key(s: ObjectStore) -> None:
    """Eight writers create one key with ``If-None-Match: *``: one wins, seven are refused. moto checks the
    condition and then writes, with nothing between two requests (S3 itself decides atomically), so on moto
    the writers take turns; the in-memory store is raced by eight threads at once."""
    won: list[int] = []
    lost: list[int] = []

    def contend(i: int) -> None:
        try:
            s.put_json("race.json", {"owner": i}, if_none_match=True)
            won.append(i)
        except PreconditionFailed:
            lost.append(i)

    if on_moto(s):
        for i in range(8):
            contend(i)
    else:
        threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(won) == 1
    assert len(lost) == 7
    assert s.get_json("race.json")[0] == {"owner": won[0]}


def test_concurrent_compare_and_swaps_lose_no_update() -> None:
    """Each write carries a token: without one, put_json's read-back takes another writer's identical document
    for its own (two increments of the same value), and an update is lost by design. The memory store only:
    moto checks a condition and stores the object in two steps, so under load two of its writers can both
    pass one ETag (S3 itself serializes conditional writes of a key)."""
    s = MemoryStore(BUCKET)
    s.put_json("counter.json", {"n": 0})

    def increment(times: int) -> None:
        for _ in range(times):
            while True:
                doc, etag = s.get_json("counter.json")
                try:
                    s.put_json("counter.json", {"n": doc["n"] + 1, "token": secrets.token_hex(8)}, if_match=etag)
                    break
                except PreconditionFailed:
                    continue

    threads = [threading.Thread(target=increment, args=(5,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.get_json("counter.json")[0]["n"] == 20


# --- Both at once --------------------------------------------------------------------------------------------


def _transcript(s: ObjectStore) -> list[object]:
    """One script of calls; what each returned (times and upload ids left out) or how it failed."""
    out: list[object] = []

    def norm(value: object) -> object:
        if isinstance(value, ObjectInfo):
            return (value.key, value.size, value.etag, value.storage_class, value.metadata)
        if isinstance(value, tuple | list):
            return [norm(v) for v in value]
        if isinstance(value, set):
            return sorted(value)
        if isinstance(value, datetime):
            return "a time"
        if isinstance(value, ObjectAttrs):
            return value.to_json()
        return value

    def rec(call: Callable[[], object]) -> None:
        try:
            result = call()
            out.append(norm(list(result) if inspect.isgenerator(result) else result))
        except TieringError as e:
            out.append(("raised", type(e).__name__, getattr(e, "code", ""), getattr(e, "status", None),
                        re.sub(r", request id [^)]*", "", str(e))))

    body = b"".join(bytes([i % 251]) * 1000 for i in range(MIN_PART_BYTES // 1000 + 1))
    e1 = s.put("t/a", b"one", metadata={"k": "v"})
    steps: list[Callable[[], object]] = [
        lambda: s.put("t/a", b"two", if_none_match=True),
        lambda: s.put("t/a", b"two", if_match=e1),
        lambda: s.put("t/a", b"three", if_match=e1),
        lambda: s.put("t/b", b"b", if_match=e1),
        lambda: s.head("t/a"),
        lambda: s.get("t/a"),
        lambda: s.open("t/a", first_bytes=2).read(),
        lambda: s.open("t/a", start=3).read(),
        lambda: s.open("t/a", if_match=e1).read(),
        lambda: s.describe("t/a"),
        lambda: s.put_object("t/c", b"c" * 100, ATTRS),
        lambda: s.describe("t/c"),
        lambda: s.copy("t/c", "t/d/c", source_etag=md5(b"c" * 100), attrs=ObjectAttrs()),
        lambda: s.describe("t/d/c"),
        lambda: s.transition("t/d/c", etag=md5(b"c" * 100), attrs=ObjectAttrs(), storage_class="STANDARD_IA"),
        lambda: s.list("t/"),
        lambda: s.list("t/", delimiter="/"),
        lambda: s.list_dirs("t/"),
        lambda: s.delete("t/zz"),
        lambda: s.delete("t/zz", if_match=e1),
        lambda: s.delete("t/a", if_match=e1),
        lambda: s.put_json("t/j", {"x": 1}, if_none_match=True),
        lambda: s.put_json("t/j", {"x": 1}, if_none_match=True),
        lambda: s.put_json("t/j", {"x": 2}, if_none_match=True),
        lambda: s.get_json("t/j"),
        lambda: s.get_json("t/a"),
        lambda: s.upload("t/big", io.BytesIO(body), part_bytes=MIN_PART_BYTES, metadata={"m": "1"}),
        lambda: s.upload("t/big", io.BytesIO(body), part_bytes=MIN_PART_BYTES, if_none_match=True),
        lambda: s.list_uploads("t/"),
        lambda: s.head("t/big"),
        lambda: s.download("t/big", io.BytesIO(), etag=md5_of_parts([body[:MIN_PART_BYTES], body[MIN_PART_BYTES:]])),
        lambda: s.delete_many([(o.key, o.etag) for o in s.list("t/d/")]),
        lambda: s.facts("t/"),
        lambda: s.list(""),
    ]
    for step in steps:
        rec(step)
    out.append(dict(sorted(s.requests.items())))
    return out


def test_differential_transcript(store: S3Store) -> None:
    """The same script on moto and on MemoryStore returns the same values, errors and request counts."""
    got, want = _transcript(MemoryStore(BUCKET)), _transcript(store)
    for i, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        assert mine == theirs, f"step {i}"


def test_another_store_sees_the_same_objects_and_counts_its_own_requests(s: ObjectStore) -> None:
    """What a thread of the commit step uses: the same bucket, each store's requests counted apart."""
    other = s.another()
    assert other.bucket == s.bucket
    etag = s.put("k", b"one")
    before = dict(s.requests)
    assert other.get("k") == b"one"
    other.put("k", b"two", if_match=etag)
    assert s.get("k") == b"two"
    assert other.requests == {"GetObject": 1, "PutObject": 1}
    assert s.requests - Counter(before) == Counter({"GetObject": 1})
