"""WriteAside, the dry run's store: the bucket read as it is, the run's documents in memory, any other write
refused before it reaches the bucket."""

from __future__ import annotations

import io
from collections import Counter

import pytest

from tiering.errors import ConfigError
from tiering.storage.aside import DryRunWrite, WriteAside
from tiering.storage.memory import MemoryStore
from tiering.storage.objects import ObjectAttrs, ObjectNotFound, ObjectStore

ASIDE = "p/_tiering/runs/r1/"


def _bucket() -> MemoryStore:
    bucket = MemoryStore("b")
    for key in ("p/t-0/00000000000000000000.log", "p/t-0/00000000000000000100.log", "p/_tiering/state/t-0.json",
                f"{ASIDE}scan/manifest.json", "q/other"):
        bucket.put(key, key.encode())
    bucket.requests.clear()
    return bucket


def _contents(store: MemoryStore) -> dict[str, bytes]:
    """Every object's bytes, without counting the requests that read them."""
    counted = Counter(store.requests)
    contents = {info.key: store.get(info.key) for info in store.list("")}
    store.requests.clear()
    store.requests.update(counted)
    return contents


def test_reads_pass_through_and_the_run_s_documents_stay_in_memory() -> None:
    bucket = _bucket()
    before = _contents(bucket)
    aside = WriteAside(bucket, ASIDE)
    assert isinstance(aside, ObjectStore)
    assert aside.get("p/t-0/00000000000000000000.log") == b"p/t-0/00000000000000000000.log"
    assert aside.requests is bucket.requests
    assert bucket.requests["GetObject"] == 1
    with pytest.raises(ObjectNotFound):
        aside.get(f"{ASIDE}scan/manifest.json")  # the bucket's copy is hidden: memory stands for it
    aside.put_json(f"{ASIDE}plan/manifest.json", {"a": 1})
    with aside.writer(f"{ASIDE}plan/chunk-00000.jsonl") as out:
        out.write(b"line\n")
        out.finish()
    aside.upload(f"{ASIDE}usage/scan.json", io.BytesIO(b"{}"))
    assert aside.get_json(f"{ASIDE}plan/manifest.json")[0] == {"a": 1}
    assert aside.get(f"{ASIDE}plan/chunk-00000.jsonl") == b"line\n"
    assert [i.key for i in aside.list(ASIDE)] == [f"{ASIDE}plan/chunk-00000.jsonl", f"{ASIDE}plan/manifest.json",
                                                   f"{ASIDE}usage/scan.json"]
    assert aside.delete_many([(f"{ASIDE}usage/scan.json", aside.head(f"{ASIDE}usage/scan.json").etag)]) == {
        f"{ASIDE}usage/scan.json"}
    aside.delete(f"{ASIDE}plan/manifest.json")
    assert _contents(bucket) == before
    assert set(bucket.requests) == {"GetObject"}  # the memory's requests are not the bucket's


def test_every_other_write_is_refused_before_it_reaches_the_bucket() -> None:
    bucket = _bucket()
    log = "p/t-0/00000000000000000000.log"
    etag = bucket.head(log).etag
    bucket.requests.clear()
    before = _contents(bucket)
    aside = WriteAside(bucket, ASIDE)
    attrs = ObjectAttrs()
    writes = {
        "put": lambda: aside.put(log, b"x"),
        "put_json": lambda: aside.put_json("p/_tiering/state/t-0.json", {}),
        "put_object": lambda: aside.put_object(log, b"x", attrs),
        "upload": lambda: aside.upload(log, io.BytesIO(b"x")),
        "writer": lambda: aside.writer(log),
        "delete": lambda: aside.delete(log),
        "delete_many": lambda: aside.delete_many([(f"{ASIDE}x", '"e"'), (log, etag)]),
        "copy": lambda: aside.copy(log, f"{ASIDE}copy", source_etag=etag, attrs=attrs),
        "copy_over": lambda: aside.copy_over(f"{ASIDE}a", log, source_etag='"e"', if_match=etag, attrs=attrs,
                                             size=1),
        "transition": lambda: aside.transition(log, etag=etag, attrs=attrs, storage_class="STANDARD_IA"),
        "abort_upload": lambda: aside.abort_upload(log, "id"),
    }
    for name, write in writes.items():
        with pytest.raises(DryRunWrite, match=r"^s3://b/\S+: a dry run writes nothing to the bucket: refused ") as e:
            write()
        assert e.value.retryable is False, name
        assert e.value.expected == f"a key below {ASIDE}", name
    assert _contents(bucket) == before
    assert bucket.requests == Counter()


def test_listings_merge_the_bucket_and_the_memory_in_key_order() -> None:
    bucket = _bucket()
    aside = WriteAside(bucket, ASIDE)
    assert list(aside.list_dirs("p/_tiering/runs/")) == []  # the bucket's run of the same id is not seen
    aside.put(f"{ASIDE}plan/manifest.json", b"{}")
    assert [i.key for i in aside.list("p/")] == [
        f"{ASIDE}plan/manifest.json", "p/_tiering/state/t-0.json", "p/t-0/00000000000000000000.log",
        "p/t-0/00000000000000000100.log"]
    assert list(aside.list_dirs("p/_tiering/runs/")) == [ASIDE]  # once, though both hold it
    assert list(aside.list_dirs(ASIDE)) == [f"{ASIDE}plan/"]  # the bucket's scan/ is hidden
    assert list(aside.list_dirs("p/")) == ["p/_tiering/", "p/t-0/"]
    assert [i.key for i in aside.list("q/")] == ["q/other"]


def test_another_shares_the_memory_and_another_bucket_is_read_only_too() -> None:
    bucket = _bucket()
    aside = WriteAside(bucket, ASIDE)
    twin = aside.another()
    twin.put(f"{ASIDE}x", b"1")
    assert aside.get(f"{ASIDE}x") == b"1"
    assert aside.for_bucket("b") is aside
    with pytest.raises(DryRunWrite):
        twin.put("p/t-0/00000000000000000000.log", b"x")


def test_the_keys_set_aside_are_a_directory() -> None:
    with pytest.raises(ConfigError, match="a prefix ending in '/'"):
        WriteAside(MemoryStore("b"), "p/_tiering/runs/r1")
