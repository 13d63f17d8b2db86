"""The allocator setting of the processes that rewrite segments: the CLI and Spark's Python workers.

A rewrite holds a group of batches (their records and new bytes, a few MiB) until the group is proven
and written, then frees them all at once. glibc's allocator then hands the top of its heap back to the
kernel (its default trim threshold is 128 KiB), and the next group takes it back page by page: a page
fault and a zeroed page for every 4 KiB, for every group. Measured here, holding 4 MiB groups that way cost
a loop of CRC + decompress + compress 13-15% of its speed; with freed memory kept, 1-3%. So the entry
points (``tiering`` CLI, the Spark daemon and tasks, the benchmark) keep up to ``TRIM_THRESHOLD_BYTES`` of
freed memory for reuse and serve allocations up to ``MMAP_THRESHOLD_BYTES`` from the heap (a fresh mmap
per large buffer would fault the same way). It is process-wide, so the library functions never set it.
"""

from __future__ import annotations

from typing import Final

from tiering.kafka import _walker

TRIM_THRESHOLD_BYTES: Final = 64 << 20
MMAP_THRESHOLD_BYTES: Final = 32 << 20  # glibc's ceiling for this threshold on 64-bit systems


def keep_freed_memory() -> bool:
    """Apply the setting to this process (idempotent); False where the allocator is not glibc's."""
    return _walker.keep_freed_memory(TRIM_THRESHOLD_BYTES, MMAP_THRESHOLD_BYTES)
