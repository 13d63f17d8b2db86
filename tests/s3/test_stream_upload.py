"""StreamUpload: what is written goes to S3 while it is written, in parts of a fixed size with a bounded number
in flight; a single PUT when it all fits in one part; aborted whenever it is not finished; checked by the
CRC-32C S3 reports for what it stored."""

from __future__ import annotations

import logging
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


def test_parts_go_out_as_the_writers_own_buffers_reused(store: S3Store) -> None:
    """A part is sent as the buffer it was written in: a bytearray, which botocore passes to the socket as it
    is (bytes it would wrap in a BytesIO, read 128 KiB at a time), and which is filled again once its part
    is in: at most three buffers for two parts in flight and the one filling, the last part's among them."""
    sent: dict[int, tuple[type, int, int]] = {}  # part number -> the body's type, identity and length when sent

    def record(params: dict[str, Any], **_: Any) -> None:
        body = params["body"]  # the part number is in the serialized request's query string
        number = int(params["query_string"]["partNumber"])
        sent[number] = (type(body), id(body), len(body))

    store.client.meta.events.register("before-call.s3.UploadPart", record)
    data = os.urandom(6 * MIN_PART_BYTES + 1)
    with store.writer("parts", part_bytes=MIN_PART_BYTES, checksum=True, in_flight=2) as out:
        _write_in_pieces(out, data)
        out.finish()
    assert store.get("parts") == data
    assert sorted(sent) == list(range(1, 8))  # two parts are in flight at once: they may be sent out of order
    assert all(issubclass(kind, bytearray) for kind, _, _ in sent.values())
    assert 2 <= len({sent[n][1] for n in range(1, 7)}) <= 3  # the six full parts
    assert [sent[n][2] for n in range(1, 8)] == [MIN_PART_BYTES] * 6 + [1]


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
        _upload(store, data, expect_crc=crc32c.crc32c(data[:-1] + bytes([data[-1] ^ 1])))
    assert list(store.list_uploads("")) == []
    assert [o.key for o in store.list("k")] == []


class _Slow(MemoryStore):
    """Parts take a while to send; the store notes how many were on their way at once, and how many bytes
    it has received."""

    def __init__(self) -> None:
        super().__init__("b")
        self.sending = self.most = self.received = 0
        self.gate = threading.Lock()
        self.bodies: list[Any] = []  # every part's body, kept alive so that each has an id of its own

    def _part(self, *args: Any) -> dict[str, Any]:
        with self.gate:
            self.sending += 1
            self.most = max(self.most, self.sending)
            self.bodies.append(args[3])
        time.sleep(0.05)  # the writer goes on meanwhile: a buffer filled again too early would show in the data
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
    assert len({id(b) for b in mem.bodies}) <= in_flight + 1  # the parts on their way and the one filling
    assert 1 <= mem.most <= in_flight
    if in_flight > 1:
        assert mem.most > 1  # they do overlap


def test_a_writer_slower_than_the_uploads_fills_two_buffers_in_turn() -> None:
    """A buffer whose part is in is filled again before another is made: where the uploads keep up (a
    compressing rewrite), the writer holds the part filling and the one on its way."""
    mem = _Slow()
    data = os.urandom(6 * MIN_PART_BYTES + 1)
    with mem.writer("k", part_bytes=MIN_PART_BYTES, in_flight=3, checksum=True) as out:
        for at in range(0, len(data), MIN_PART_BYTES):
            out.write(data[at : at + MIN_PART_BYTES])
            deadline = time.monotonic() + 10
            while mem.received < min(at, len(data) - MIN_PART_BYTES - 1) and time.monotonic() < deadline:
                time.sleep(0.01)  # the parts sent so far are in before the next is written
        out.finish()
    assert mem.get("k") == data
    assert len({id(b) for b in mem.bodies}) == 2


@pytest.mark.parametrize("in_flight", [1, 2, 3])
def test_a_part_refused_while_the_writer_waits_for_its_buffer_fails_the_upload(in_flight: int) -> None:
    """The first part fails after the writer has gone on: the failure is raised where the writer waits (for a
    part to arrive or for a buffer), the upload aborted, nothing stored; the writer cannot be used again."""

    class FailsFirst(_Slow):
        def _part(self, *args: Any) -> dict[str, Any]:
            if args[2] == 1:
                time.sleep(0.1)
                raise StorageError("upload_part failed with S3 error SlowDown (HTTP 503)")
            return super()._part(*args)

    mem = FailsFirst()
    data = os.urandom(6 * MIN_PART_BYTES)
    out = mem.writer("k", part_bytes=MIN_PART_BYTES, in_flight=in_flight, checksum=True)

    def write_all() -> None:
        with out:
            _write_in_pieces(out, data)
            out.finish()

    with pytest.raises(StorageError, match="SlowDown"):
        write_all()
    assert list(mem.list_uploads("")) == []
    assert [o.key for o in mem.list("k")] == []
    with pytest.raises(ValueError, match="finished or aborted"):
        out.write(b"more")


def test_botocores_debug_log_names_a_part_by_its_size(store: S3Store, caplog: pytest.LogCaptureFixture) -> None:
    """botocore logs every request's parameters at DEBUG: a part's body appears as its size, not its bytes."""
    data = os.urandom(2 * MIN_PART_BYTES + 1)
    with caplog.at_level(logging.DEBUG, logger="botocore"):
        _upload(store, data)
    made = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Making request for")]
    assert any(f"<part of {MIN_PART_BYTES} bytes>" in m for m in made)
    assert max(len(r.getMessage()) for r in caplog.records) < 20_000
    assert store.get("k") == data


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

    def _part(self, key: str, upload_id: str, number: int, data: bytearray, checksum: bool) -> dict[str, Any]:
        self.sizes.append((number, len(data)))
        return super()._part(key, upload_id, number, data, checksum)
