"""Reusable byte buffers: the reader's chunks and the rewriter's output buffers come from here; and the
cyclic garbage collector held off while a segment's batches stream through."""

from __future__ import annotations

import gc
import io
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from tiering.kafka import _walker


class BufferPool:
    """Bytearrays of ``size`` bytes, handed out again once no view of them is alive (``_walker.exported``
    tells: every memoryview derived from a bytearray holds its export until released), so nothing that can
    still see a buffer's bytes sees them change. A buffer reused stays in cache; a fresh one each time is
    zeroed and faulted in page by page. At most ``keep`` are kept, and only as many as were in use at once."""

    def __init__(self, size: int, keep: int) -> None:
        self.size = size
        self.keep = keep
        self.spare: list[bytearray] = []

    def take(self, n: int = 0) -> bytearray:
        """A buffer of at least ``n`` bytes: a spare one no view of which is alive, else a new one (one larger
        than ``size``, for a single oversized item, is never kept)."""
        if n <= self.size:
            for buf in self.spare:
                if not _walker.exported(buf):
                    return buf
        buf = bytearray(max(n, self.size))
        if len(buf) == self.size and len(self.spare) < self.keep:
            self.spare.append(buf)
        return buf


class ChunkStream(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (one stage's output read as the next one's file)."""

    def __init__(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        super().__init__()
        self._chunks = iter(chunks)
        self._view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._view:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._view = memoryview(chunk).cast("B")
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n


class _Collector:
    """Python's cyclic garbage collector, paused by nested and concurrent blocks: the last one out restores
    the state the first one found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holds = 0
        self.was_enabled = False

    @contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            if self.holds == 0:
                self.was_enabled = gc.isenabled()
                gc.disable()
            self.holds += 1
        try:
            yield
        finally:
            with self.lock:
                self.holds -= 1
                if self.holds == 0 and self.was_enabled:
                    gc.enable()


_COLLECTOR = _Collector()


def collector_paused() -> AbstractContextManager[None]:
    """Python's cyclic garbage collector off for the block, as it was after it (see :class:`_Collector`).

    A segment streams through as millions of small objects (headers, views, sections) that hold no
    reference cycles, and reference counting frees each of them. The collector would still trace every one
    alive at each collection, again and again: a re-batching run holds a megabyte of one-record batches
    before it merges them. Cycles made meanwhile (an exception's traceback) are collected afterwards."""
    return _COLLECTOR.paused()
