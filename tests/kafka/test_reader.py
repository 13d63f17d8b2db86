"""The streaming reader's chunks: read with ``readinto`` (or ``read``), refilled only once no view of them is
alive, so that a batch held by a caller never changes under it, whatever the reader reads after it."""

from __future__ import annotations

import io
import struct
import tracemalloc

import pytest

from tiering.demo.sample import write_segment
from tiering.errors import CorruptBatchError
from tiering.kafka import _walker, reader
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import SPARE_CHUNKS, _Chunks, iter_batches, iter_entries
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment

CHUNK = 4096


class _ReadOnly(io.RawIOBase):
    """A stream with ``read`` and no ``readinto`` (as some HTTP bodies), returning short reads."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def read(self, n: int = -1) -> bytes:
        n = min(n, 1000)  # never more than 1000 bytes a call
        out = self.data[self.pos : self.pos + n]
        self.pos += len(out)
        return out

    readinto = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def segment() -> bytes:
    buf = io.BytesIO()
    write_segment(buf, base_offset=100, kind="json", codec=Codec.SNAPPY, target_bytes=64 * CHUNK, batch_bytes=2048,
                  seed=3)
    return buf.getvalue()


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", CHUNK)


def _bytes_of(stream: io.RawIOBase | io.BytesIO) -> list[bytes]:
    return [bytes(raw.data) for raw in iter_batches(stream)]


@pytest.mark.parametrize("make", [io.BytesIO, _ReadOnly], ids=["readinto", "read only"])
def test_batches_held_by_the_caller_never_change(segment: bytes, make: type) -> None:
    expected = _bytes_of(io.BytesIO(segment))
    held = list(iter_batches(make(segment)))  # every view kept: no chunk may be refilled
    assert len(held) == len(expected) > 40
    assert [bytes(raw.data) for raw in held] == expected
    assert b"".join(expected) == segment
    assert len({id(raw.data.obj) for raw in held}) >= len(segment) // CHUNK  # a chunk of its own for each


def test_a_chunk_nothing_refers_to_is_refilled(segment: bytes) -> None:
    chunks = _Chunks(io.BytesIO(segment))
    seen, taken = set(), []
    while chunks.available(100):
        got = chunks.available(2000)
        seen.add(id(chunks.view.obj))
        taken.append(bytes(chunks.take(got)))  # a copy: the view is dropped at once
    assert b"".join(taken) == segment
    assert len(seen) == 2  # the chunk being read and the one before it (the rest of which it copied)
    assert len(chunks.pool.spare) <= SPARE_CHUNKS


def test_a_view_kept_alive_keeps_its_chunk_out_of_reuse(segment: bytes) -> None:
    chunks = _Chunks(io.BytesIO(segment))
    chunks.available(CHUNK)
    first = chunks.take(CHUNK)
    original = bytes(first)
    for _ in range(10):  # many chunks later, the first is still as it was read
        chunks.available(CHUNK)
        chunks.take(CHUNK)
    assert bytes(first) == original == segment[:CHUNK]
    assert _walker.exported(first.obj)  # type: ignore[arg-type]
    del first
    assert not any(_walker.exported(c) for c in chunks.pool.spare if c is not chunks.view.obj)


def test_views_are_read_only(segment: bytes) -> None:
    raw = next(iter(iter_batches(io.BytesIO(segment))))
    with pytest.raises(TypeError):
        raw.data[0] = 0  # type: ignore[index]


def test_a_batch_larger_than_a_chunk_is_read_whole(segment: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", 64)  # every batch straddles several chunks
    assert _bytes_of(_ReadOnly(segment)) == _bytes_of(io.BytesIO(segment))
    entries = list(iter_entries(io.BytesIO(segment)))
    assert sum(len(e.batches) if isinstance(e, reader.V2Run) else 1 for e in entries) == len(_bytes_of(
        io.BytesIO(segment)))


def test_a_rewrite_through_reused_chunks_equals_one_through_a_single_chunk(segment: bytes,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    options = RewriteOptions(Codec.ZSTD, 3)
    small = io.BytesIO()
    rewrite_segment(io.BytesIO(segment), small, base_offset=100, options=options)
    monkeypatch.setattr(reader, "READ_CHUNK_BYTES", len(segment))
    whole = io.BytesIO()
    rewrite_segment(io.BytesIO(segment), whole, base_offset=100, options=options)
    assert small.getvalue() == whole.getvalue()


def test_exported_says_whether_a_view_is_alive() -> None:
    chunk = bytearray(16)
    assert not _walker.exported(chunk)
    view = memoryview(chunk)[4:8].toreadonly()
    sub = view[1:]
    del view
    assert _walker.exported(chunk)  # a view derived from a view still holds the chunk
    del sub
    assert not _walker.exported(chunk)
    with pytest.raises(TypeError):
        _walker.exported(b"bytes")  # type: ignore[arg-type]


class _RawReadOnly(io.RawIOBase):
    """An io.RawIOBase implementing read() only: its inherited readinto raises NotImplementedError."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self.inner.read(n)


class _Counting:
    """A wrapper that counts what is read through it and hands everything else to the stream it wraps."""

    def __init__(self, inner: io.BytesIO) -> None:
        self.inner, self.count = inner, 0

    def read(self, n: int = -1) -> bytes:
        out = self.inner.read(n)
        self.count += len(out)
        return out

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_streams_with_read_only_are_read_through_read(segment: bytes) -> None:
    expected = _bytes_of(io.BytesIO(segment))
    assert _bytes_of(_RawReadOnly(segment)) == expected  # type: ignore[arg-type]
    counting = _Counting(io.BytesIO(segment))
    assert _bytes_of(counting) == expected  # type: ignore[arg-type]
    assert counting.count == len(segment)  # its read, not the wrapped stream's readinto, did the reading


class _Pipe(io.RawIOBase):
    """A stream of unknown size (no fileno, not seekable), as a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        return self.inner.readinto(b)


def test_a_claimed_length_allocates_nothing_before_its_bytes_arrive() -> None:
    """61 bytes whose header claims a 128 MiB batch, in a stream of unknown size: a clear error and memory
    bounded by what arrived, not by the claim."""
    data = struct.pack(">qi", 0, (128 << 20) - 12) + b"\x00" * 4 + b"\x02" + b"\x00" * 44
    tracemalloc.start()
    try:
        with pytest.raises(CorruptBatchError, match="truncated"):
            list(iter_batches(_Pipe(data)))  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20
