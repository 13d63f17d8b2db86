"""StreamUpload: what is written goes to S3 while it is written, in parts of a fixed size with a bounded number
in flight; a single PUT when it all fits in one part; aborted whenever it is not finished; checked by the
CRC-32C S3 reports for what it stored."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.s3.hooks import Step
from tiering.errors import ProofError, StorageError
from tiering.storage.memory import MemoryStore
from tiering.storage.objects import MIN_PART_BYTES, ChecksumMismatch, crc32c_b64
from tiering.storage.s3 import S3Store


def _write_in_pieces(out: Any, data: bytes, piece: int = 1 << 20) -> None:
    for at in range(0, len(data), piece):
        out.write(memoryview(data)[at:at + piece])


def _upload(store: Any, data: bytes, *, expect_crc: int | None = None) -> None:
    with store.writer("k", part_bytes=MIN_PART_BYTES, checksum=True) as out:
        _write_in_pieces(out, data)
        out.finish(expect_crc=expect_crc)


def test_a_large_object_goes_in_parts_as_it_is_written_with_its_full_object_crc(store: S3Store) -> None:
    data = os.urandom(2 * MIN_PART_BYTES + 12345)
    with store.writer("big", part_bytes=MIN_PART_BYTES, checksum=True) as out:
        _write_in_pieces(out, data)
        assert store.requests["CreateMultipartUpload"] == 1  # parts went out before the end was written
        done = out.finish()
    assert (done.size, done.crc32c) == (len(data), crc32c.crc32c(data))
    assert done.etag.endswith('-3"')
    assert store.get("big") == data
    head = store.client.head_object(Bucket=store.bucket, Key="big", ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32C"], head["ChecksumType"]) == (crc32c_b64(done.crc32c), "FULL_OBJECT")
    used = store.requests
    assert (used["CreateMultipartUpload"], used["UploadPart"], used["CompleteMultipartUpload"]) == (1, 3, 1)


def test_an_object_that_fits_in_one_part_is_a_single_put(store: S3Store) -> None:
    data = os.urandom(MIN_PART_BYTES)  # exactly one part: nothing shows it is not the last until the end
    with store.writer("one", part_bytes=MIN_PART_BYTES, checksum=True) as out:
        _write_in_pieces(out, data)
        etag = out.finish().etag
    assert store.get("one") == data
    assert store.head("one").etag == etag
    assert store.requests["CreateMultipartUpload"] == 0
    assert store.requests["PutObject"] == 1


def test_leaving_the_block_unfinished_aborts_and_leaves_nothing(store: S3Store) -> None:
    data = os.urandom(2 * MIN_PART_BYTES + 1)
    def fail() -> None:
        with store.writer("gone", part_bytes=MIN_PART_BYTES) as out:
            _write_in_pieces(out, data)
            raise RuntimeError("the rewrite failed")

    with pytest.raises(RuntimeError):
        fail()
    assert store.requests["AbortMultipartUpload"] == 1
    assert list(store.list_uploads("")) == []
    assert [o.key for o in store.list("gone")] == []
    with store.writer("skipped", part_bytes=MIN_PART_BYTES) as out:  # not worth keeping: left unfinished
        _write_in_pieces(out, data)
    assert list(store.list_uploads("")) == []
    assert [o.key for o in store.list("skipped")] == []


def test_a_part_s3_refuses_fails_the_upload_and_aborts_it(store: S3Store) -> None:
    def refuse(**_: Any) -> None:
        raise StorageError("upload_part failed with S3 error InternalError (HTTP 500)")
    Step(store, "UploadPart", lambda p: p["PartNumber"] == 2, refuse)
    data = os.urandom(3 * MIN_PART_BYTES + 1)
    with pytest.raises(StorageError, match="InternalError"):
        _upload(store, data)
    assert list(store.list_uploads("")) == []
    assert [o.key for o in store.list("k")] == []


def test_other_bytes_than_the_producer_computed_are_never_completed(store: S3Store) -> None:
    data = os.urandom(MIN_PART_BYTES + 1)
    with pytest.raises(ProofError, match="not the ones produced"):
        _upload(store, data, expect_crc=crc32c.crc32c(data[:-1] + b"x"))
    assert list(store.list_uploads("")) == []
    assert [o.key for o in store.list("k")] == []


class _Slow(MemoryStore):
    """Parts take a while to send; the store notes how many were on their way at once, and how many bytes
    it has received."""

    def __init__(self) -> None:
        super().__init__("b")
        self.sending = self.most = self.received = 0
        self.gate = threading.Lock()

    def _part(self, *args: Any) -> dict[str, Any]:
        with self.gate:
            self.sending += 1
            self.most = max(self.most, self.sending)
        time.sleep(0.05)
        try:
            return super()._part(*args)
        finally:
            with self.gate:
                self.sending -= 1
                self.received += len(args[3])


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_the_writer_never_runs_ahead_of_the_parts_on_their_way(in_flight: int) -> None:
    """Memory: what was written and not yet received by the store stays within the parts in flight, the
    one filling and the one being cut, however fast the writer is."""
    mem = _Slow()
    data = os.urandom(8 * MIN_PART_BYTES + 7)
    ahead = 0
    with mem.writer("k", part_bytes=MIN_PART_BYTES, in_flight=in_flight, checksum=True) as out:
        for at in range(0, len(data), 1 << 20):
            out.write(memoryview(data)[at:at + (1 << 20)])
            with mem.gate:
                ahead = max(ahead, at + (1 << 20) - mem.received)
        out.finish()
    assert mem.get("k") == data
    assert ahead <= (in_flight + 2) * MIN_PART_BYTES
    assert 1 <= mem.most <= in_flight
    if in_flight > 1:
        assert mem.most > 1  # they do overlap


def test_a_store_reporting_another_crc_fails_loudly() -> None:
    class Wrong(MemoryStore):
        def _reported_crc(self, stored: bytes) -> str | None:
            return crc32c_b64(crc32c.crc32c(stored) ^ 1)

    data = os.urandom(2 * MIN_PART_BYTES)
    with pytest.raises(ChecksumMismatch):
        _upload(Wrong("b"), data)


@settings(max_examples=40, deadline=None)
@given(pieces=st.lists(st.integers(min_value=0, max_value=3 * MIN_PART_BYTES), max_size=6),
       seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_any_sequence_of_writes_arrives_whole_in_parts_of_the_set_size(pieces: list[int], seed: int) -> None:
    """The part being filled is reused once the first one went out: writes of any size, across part
    boundaries or exactly on them, arrive byte for byte, and every part but the last has the part size."""
    data = random.Random(seed).randbytes(sum(pieces))
    mem = _Parts()
    with mem.writer("k", part_bytes=MIN_PART_BYTES, checksum=True) as out:
        at = 0
        for n in pieces:
            out.write(data[at : at + n])
            at += n
        out.finish()
    assert mem.get("k") == data
    sizes = [size for _, size in sorted(mem.sizes)]
    assert all(size == MIN_PART_BYTES for size in sizes[:-1])
    assert len(sizes) == (0 if len(data) <= MIN_PART_BYTES else -(-len(data) // MIN_PART_BYTES))


class _Parts(MemoryStore):
    """Records the number and size of each part sent (from the upload's threads)."""

    def __init__(self) -> None:
        super().__init__("bkt")
        self.sizes: list[tuple[int, int]] = []

    def _part(self, key: str, upload_id: str, number: int, data: bytes, checksum: bool) -> dict[str, Any]:
        self.sizes.append((number, len(data)))
        return super()._part(key, upload_id, number, data, checksum)
