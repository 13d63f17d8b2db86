"""The allocator setting of the rewriting processes (tiering/heap.py): freed memory is kept for reuse
instead of being handed back to the kernel and faulted in again by the next group of batches."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tiering.heap import keep_freed_memory

_PROGRAM = """
import sys
from tiering.heap import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "1" else None
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
blocks = [bytes(16384) for _ in range(2048)]  # 32 MiB in 16 KiB blocks, as a group of batches' records
held = rss()
del blocks
print(applied, held, rss())
"""


def _rss_around_free(setting: bool) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, "1" if setting else "0"], capture_output=True, text=True,
                         check=True).stdout.split()
    if setting and out[0] != "True":
        pytest.skip("the allocator is not glibc's: the setting does not apply")
    return int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_freed_memory_is_kept_with_the_setting_and_returned_without() -> None:
    held, after = _rss_around_free(True)
    assert after > held - (4 << 20)  # kept: the next group reuses it without page faults
    held, after = _rss_around_free(False)
    assert after < held - (16 << 20)  # glibc's default: handed back at once (what the setting avoids)


def test_applying_twice_is_harmless() -> None:
    assert keep_freed_memory() == keep_freed_memory()
