"""The suites' independent reader of a ``.log``'s records: kafka-python's (a client library that shares no
code with the package), for the judges that say a rewritten segment holds its original's records."""

from __future__ import annotations

from typing import Any

from kafka.record.legacy_records import LegacyRecord
from kafka.record.memory_records import MemoryRecords

Record = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]


def records(log: bytes) -> list[Record]:
    """Every record of ``log`` as kafka-python reads it (offset, timestamp, key, value, headers), control
    records included; an invalid CRC, or bytes that belong to no whole batch, is an AssertionError."""
    out: list[Record] = []
    consumed = 0
    for batch in MemoryRecords(log):
        assert batch.validate_crc(), f"kafka-python: a batch with a bad CRC at byte {consumed}"
        size = batch.size_in_bytes
        for r in batch:
            if isinstance(r, LegacyRecord):
                assert r.validate_crc(), f"kafka-python: a message with a bad CRC at offset {r.offset}"
            out.append(_record(r))
        consumed += size
    assert consumed == len(log), f"kafka-python read {consumed} of {len(log)} bytes"
    return out


def _record(r: Any) -> Record:
    return (r.offset, -1 if r.timestamp is None else r.timestamp, r.key, r.value, tuple(r.headers))
