"""How old a segment's records are: the newest record timestamp of a segment on S3, read cheaply."""

from __future__ import annotations

from typing import Final

from tiering.kafka.reader import iter_batches
from tiering.plan.document import PlannedSegment
from tiering.storage.objects import ObjectStore

INDEX_ENTRY_BYTES: Final = 8
TIME_INDEX_ENTRY_BYTES: Final = 12


def max_timestamp(store: ObjectStore, seg: PlannedSegment) -> tuple[int | None, str]:
    """The segment's newest record timestamp (ms) and how it was found: the larger of the ``.timeindex``'s
    last entry (Kafka's running maximum, appended again when a segment rolls) and the batches after the last
    ``.index`` entry (records appended since); the whole ``.log``, streamed, when there is no ``.index``."""
    assert seg.log is not None
    newest, how = -1, []
    if seg.timeindex is not None and seg.timeindex.size >= TIME_INDEX_ENTRY_BYTES:
        with store.open(seg.timeindex.key, start=seg.timeindex.size - TIME_INDEX_ENTRY_BYTES) as body:
            newest = int.from_bytes(body.read()[:8], "big", signed=True)
        how.append(".timeindex's last entry")
    start = 0
    if seg.index is not None and seg.index.size >= INDEX_ENTRY_BYTES:
        with store.open(seg.index.key, start=seg.index.size - INDEX_ENTRY_BYTES) as body:
            position = int.from_bytes(body.read()[4:8], "big")
        if 0 <= position < seg.log.size:
            start = position
            how.append("the batches after the last .index entry")
    if start == 0:
        how.append("every batch of the .log (no usable .index)")
    with store.open(seg.log.key, start=start, if_match=seg.log.etag) as body:
        for raw in iter_batches(body, path=f"s3://{store.bucket}/{seg.log.key}", size=seg.log.size - start):
            newest = max(newest, raw.header.max_timestamp)
    if newest < 0:
        return None, "no record timestamps (magic v0 or empty)"
    return newest, " and ".join(how)
