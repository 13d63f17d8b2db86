"""Reusable byte buffers: the reader's chunks and the rewriter's output buffers come from here."""

from __future__ import annotations

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
