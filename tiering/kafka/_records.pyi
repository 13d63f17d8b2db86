"""Type stub of the compiled record layer (see _records.c)."""

from collections.abc import Sequence

def digest_v2(section: bytes | bytearray | memoryview, base_offset: int, timestamp: int, log_append: bool,
              expected_count: int, last_offset_delta: int) -> bytes | None: ...
def merge_v2(sections: Sequence[bytes | bytearray | memoryview], bases: Sequence[tuple[int, int, int]],
             log_append: bool, base_offset: int) -> tuple[bytes, int, int, int] | None: ...
