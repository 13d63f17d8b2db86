"""The test suites' own rebuild of a segment's ``.index`` and ``.timeindex``, written from Kafka's
``LogSegment.recover`` and sharing no code with the package: the judges of the S3, crash and pipeline suites
hold the indexes the package puts in place to it, so that a mistake in the package's index builder is not
repeated by the judge. ``tests/kafka/test_reference_index.py`` holds it to the indexes Kafka's own recovery
wrote for the golden segments.

Kafka's rule, batch by batch (``position``: where the batch starts in the ``.log``): the largest timestamp
so far and the last offset of the batch that carried it are kept; when ``position`` is more than
``index.interval.bytes`` past the last entry's position, an ``.index`` entry (the batch's last offset
relative to the base, ``position``) and a ``.timeindex`` entry (the largest timestamp so far and its offset,
only if larger than the last time entry) are appended. After the last batch the largest timestamp is
appended once more (if larger). A legacy message (magic 0 or 1; a compressed one wraps others) counts as a
batch ending at its own offset, with its own timestamp (magic 0: none).
"""

from __future__ import annotations

import struct
from typing import Final

DEFAULT_INTERVAL: Final = 4096
_HEADER: Final = struct.Struct(">qiibIhiqq")  # base offset, length, leader epoch, magic, crc, attributes,
# last offset delta, base timestamp, max timestamp
_START: Final = struct.Struct(">qi")  # every batch's and legacy message's offset and length
_LEGACY_TS: Final = struct.Struct(">q")  # a magic 1 message's timestamp, after crc, magic and attributes
NO_TIMESTAMP: Final = -1


def _entry(log: bytes, position: int) -> tuple[int, int, int]:
    """The offset, length and magic every batch and legacy message starts with."""
    if len(log) - position < 17:
        raise ValueError(f"a batch header cut short at byte {position}")
    offset, length = _START.unpack_from(log, position)
    magic = log[position + 16]
    if magic not in (0, 1, 2) or (magic == 2 and len(log) - position < _HEADER.size):
        raise ValueError(f"not a batch at byte {position}: magic {magic}")
    return offset, length, magic


def rebuild(log: bytes, base_offset: int, interval: int = DEFAULT_INTERVAL) -> tuple[bytes, bytes]:
    """The ``.index`` and ``.timeindex`` Kafka's recovery writes for ``log``, a segment at ``base_offset``."""
    offsets, times = bytearray(), bytearray()
    max_ts, max_ts_offset = NO_TIMESTAMP, base_offset
    last_entry, last_time = 0, NO_TIMESTAMP
    position = 0
    while position < len(log):
        last, length, magic = _entry(log, position)
        if magic == 2:
            first, _, _, _, _, _, last_delta, _, batch_max_ts = _HEADER.unpack_from(log, position)
            last = first + last_delta
        else:  # a legacy message (a compressed one wraps others): its own offset and timestamp (v0: none)
            batch_max_ts = _LEGACY_TS.unpack_from(log, position + 18)[0] if magic == 1 else NO_TIMESTAMP
        if batch_max_ts > max_ts:
            max_ts, max_ts_offset = batch_max_ts, last
        if position - last_entry > interval:
            offsets += struct.pack(">ii", last - base_offset, position)
            if max_ts > last_time:
                times += struct.pack(">qi", max_ts, max_ts_offset - base_offset)
                last_time = max_ts
            last_entry = position
        position += 12 + length
    if position != len(log):
        raise ValueError(f"the last batch runs past the end of the log ({position} > {len(log)})")
    if max_ts > last_time:
        times += struct.pack(">qi", max_ts, max_ts_offset - base_offset)
    return bytes(offsets), bytes(times)
