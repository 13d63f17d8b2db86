"""Streaming reader of a segment's batches: one batch in memory at a time, whatever the segment's size.

Each entry starts with ``offset int64 | length int32`` and has its magic byte at offset 16, so the
reader reads 17 bytes, checks the length against the magic's minimum, the bytes left in the stream and
a ceiling, then reads the rest of the batch and checks its header and CRC.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Final

from tiering.errors import CorruptBatchError, TieringError, UnsupportedError
from tiering.kafka.batch import (
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_OVERHEAD,
    BatchHeader,
    check_crc,
    entry_size_bounds,
    parse_legacy_header,
    parse_v2_header,
    read_prefix,
)

DEFAULT_MAX_BATCH_BYTES: Final = 128 * 1024 * 1024
"""Largest batch accepted when the stream's size is unknown (Kafka's message.max.bytes is 1 MiB by default)."""


@dataclass(frozen=True, slots=True)
class RawBatch:
    """One batch as it sits in the file: its parsed header and its bytes (log overhead included)."""

    header: BatchHeader
    data: memoryview


def _read_exact(stream: BinaryIO, buf: memoryview) -> int:
    got = 0
    while got < len(buf):
        n = stream.readinto(buf[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def stream_size(stream: BinaryIO) -> int | None:
    """Bytes left in ``stream`` when it can tell (a regular file), else None."""
    try:
        fd = stream.fileno()
        return os.fstat(fd).st_size - stream.tell()
    except (OSError, AttributeError, ValueError):
        return None


def iter_batches(
    stream: BinaryIO,
    *,
    path: str | None = None,
    size: int | None = None,
    verify_crc: bool = True,
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
) -> Iterator[RawBatch]:
    """Yield every batch of a segment stream, checking headers (and CRCs) as it goes.

    ``size`` is the number of bytes the stream holds (found from the file when None and possible): a
    length pointing past it is reported before anything is allocated.
    """
    if size is None:
        size = stream_size(stream)
    position = 0
    prefix = bytearray(HEADER_SIZE_UP_TO_MAGIC)
    while True:
        got = _read_exact(stream, memoryview(prefix))
        if got == 0:
            return
        if got < HEADER_SIZE_UP_TO_MAGIC:
            raise CorruptBatchError("truncated batch header at the end of the segment", path=path, position=position,
                                    expected=f"{HEADER_SIZE_UP_TO_MAGIC} bytes", found=f"{got} bytes")
        offset, length, magic = read_prefix(prefix)
        try:
            minimum = entry_size_bounds(magic)
        except UnsupportedError as e:
            raise CorruptBatchError(e.message, path=path, position=position, base_offset=offset,
                                    expected=e.expected, found=e.found) from None
        total = length + LOG_OVERHEAD
        if length < 0 or total < minimum:
            raise CorruptBatchError("batch length below the minimum for its magic", path=path, position=position,
                                    base_offset=offset, expected=f">= {minimum - LOG_OVERHEAD}", found=length)
        if size is not None and position + total > size:
            raise CorruptBatchError("batch runs past the end of the segment", path=path, position=position,
                                    base_offset=offset, expected=f"<= {size - position} bytes",
                                    found=f"{total} bytes")
        if total > max_batch_bytes:
            raise CorruptBatchError("batch larger than the configured maximum", path=path, position=position,
                                    base_offset=offset, expected=f"<= {max_batch_bytes} bytes", found=total)
        buf = bytearray(total)
        buf[:HEADER_SIZE_UP_TO_MAGIC] = prefix
        view = memoryview(buf)
        got = _read_exact(stream, view[HEADER_SIZE_UP_TO_MAGIC:])
        if got < total - HEADER_SIZE_UP_TO_MAGIC:
            raise CorruptBatchError("batch is truncated", path=path, position=position, base_offset=offset,
                                    expected=f"{total} bytes", found=f"{got + HEADER_SIZE_UP_TO_MAGIC} bytes")
        data = view.toreadonly()
        try:
            header = parse_v2_header(data, position) if magic >= 2 else parse_legacy_header(data, position)
            if verify_crc:
                check_crc(header, data)
        except TieringError as e:
            raise e.located(path=path, position=position, base_offset=offset) from None
        yield RawBatch(header, data)
        position += total
