"""What a Kafka broker restoring a partition from the bucket would load, by the rules of Kafka's
``LogLoader.load`` (read in apache/kafka, ``storage/.../log/LogLoader.java``; the same in 3.9's Scala):

1. every ``.cleaned`` file is deleted, and with it every ``.swap`` file at or above the smallest ``.cleaned``
   offset (an unfinished split);
2. the remaining ``.log.swap`` files cover a range, from the smallest base offset to the largest next offset
   (read from their batches); every other file whose offset lies in it is deleted;
3. every ``.swap`` file is renamed to its final name.

A test holds the result to the partition's original batches: every offset exactly once, in order, and
every index present equal to the rebuild of the ``.log`` beside it (a broker trusts an index it finds;
a missing one it rebuilds).
"""

from __future__ import annotations

import io
import re

from tests.reference_index import rebuild
from tiering.kafka.files import CLEANED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.reader import iter_batches
from tiering.kafka.segment import verify_segment
from tiering.storage.objects import ObjectStore

_NAME = re.compile(r"([0-9]{20})(\..+)")


def _batches(data: bytes) -> list[tuple[int, int]]:
    return [(raw.header.offset, raw.header.last_offset) for raw in iter_batches(io.BytesIO(data), verify_crc=True)]


def loaded_files(store: ObjectStore, partition_prefix: str) -> dict[str, bytes]:
    """The partition's files by name after a broker's load of a copy of the bucket as it is now."""
    files = {info.key[len(partition_prefix):]: store.get(info.key) for info in store.list(partition_prefix)
             if "/" not in info.key[len(partition_prefix):]}
    offset = {name: int(m.group(1)) for name in files if (m := _NAME.fullmatch(name))}
    cleaned = [offset[n] for n in files if n.endswith(CLEANED_SUFFIX)]
    lowest_cleaned = min(cleaned, default=None)
    for name in list(files):
        if name.endswith(CLEANED_SUFFIX) or (name.endswith(SWAP_SUFFIX) and lowest_cleaned is not None
                                              and offset[name] >= lowest_cleaned):
            del files[name]
    log_swaps = [n for n in files if n.endswith(LOG_SUFFIX + SWAP_SUFFIX)]
    if log_swaps:
        low = min(offset[n] for n in log_swaps)
        high = max((_batches(files[n]) or [(offset[n], offset[n] - 1)])[-1][1] + 1 for n in log_swaps)
        for name in list(files):
            if not name.endswith(SWAP_SUFFIX) and name in offset and low <= offset[name] < high:
                del files[name]
    for name in [n for n in files if n.endswith(SWAP_SUFFIX)]:
        files[name.removesuffix(SWAP_SUFFIX)] = files.pop(name)
    return files


def check_loaded(store: ObjectStore, partition_prefix: str, batches: list[tuple[int, int]]) -> dict[str, bytes]:
    """Assert that a broker's load of the bucket now holds exactly ``batches`` (first and last offsets, in
    order), each once, and that every index present fits its ``.log``. The loaded files come back."""
    files = loaded_files(store, partition_prefix)
    logs = sorted(n for n in files if n.endswith(LOG_SUFFIX))
    seen: list[tuple[int, int]] = []
    for name in logs:
        base = int(name[:20])
        seen += _batches(files[name])
        verify_segment(io.BytesIO(files[name]), segment_base=base)  # every batch whole, its CRC right
        for suffix, want in zip((INDEX_SUFFIX, TIME_INDEX_SUFFIX), rebuild(files[name], base), strict=True):
            index = name.removesuffix(LOG_SUFFIX) + suffix
            assert files.get(index, want) == want, f"{index} does not fit the .log beside it"
    assert seen == batches, f"a broker restoring now would load other batches: {seen[:3]}... vs {batches[:3]}..."
    return files
