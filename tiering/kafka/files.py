"""Segment file names, as Kafka's LogFileUtils names them: ``<20-digit base offset>.<suffix>``."""

from __future__ import annotations

import re
from typing import Final

LOG_SUFFIX: Final = ".log"
INDEX_SUFFIX: Final = ".index"
TIME_INDEX_SUFFIX: Final = ".timeindex"
TXN_INDEX_SUFFIX: Final = ".txnindex"
SNAPSHOT_SUFFIX: Final = ".snapshot"
# A broker's log directory on load (Kafka's LogLoader): a file ending ``.swap`` is the new version of a segment
# file; the segments whose base offset lies within the range the ``.log.swap`` files cover are deleted and the
# swap files renamed. A ``.cleaned`` file at offset N makes every swap file at N or above void (an unfinished
# split of a segment into several): they are deleted instead.
SWAP_SUFFIX: Final = ".swap"
CLEANED_SUFFIX: Final = ".cleaned"
SEGMENT_SUFFIXES: Final = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, SNAPSHOT_SUFFIX)
# Exactly what Kafka writes: twenty ASCII digits (``\d`` would also take other scripts' digits, which
# ``int()`` accepts) and a lower-case suffix.
_SEGMENT_NAME: Final = re.compile(r"([0-9]{20})(\.[a-z]+)")


def segment_name(base_offset: int, suffix: str) -> str:
    if base_offset < 0:
        raise ValueError(f"negative base offset {base_offset}")
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a segment file name, or None when the name is not one."""
    m = _SEGMENT_NAME.fullmatch(name)
    if m is None or m.group(2) not in SEGMENT_SUFFIXES:
        return None
    return int(m.group(1)), m.group(2)
