"""Seed a bucket with a realistic ``logdir`` tree (for the demo, the tests and the benchmark).

Each partition gets ``segments`` segments of generated batches with the indexes Kafka would have written
for them, plus the partition files a broker keeps beside them; the last segment is the active one.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Final

from tiering.demo.sample import BASE_TIMESTAMP_MS, write_segment
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.index import build_indexes
from tiering.kafka.segment import verify_segment
from tiering.storage.layout import partition_key, segment_key
from tiering.storage.objects import ObjectStore


@dataclass(frozen=True, slots=True)
class GeneratedSegment:
    base_offset: int
    log: bytes
    offset_index: bytes
    time_index: bytes


DEFAULT_START_MS: Final = BASE_TIMESTAMP_MS  # 2025-11-22


def generate_partition(*, segments: int, kind: str, codec: Codec, segment_bytes: int, seed: int = 0,
                       start_ms: int = DEFAULT_START_MS) -> tuple[GeneratedSegment, ...]:
    """Segments of generated batches with the indexes Kafka would have written for them; record timestamps
    start at ``start_ms``."""
    out = []
    base = 0
    for i in range(segments):
        buf = io.BytesIO()
        sample = write_segment(buf, base_offset=base, kind=kind, codec=codec, target_bytes=segment_bytes,
                               seed=seed + i, shift_ms=start_ms - BASE_TIMESTAMP_MS + base)
        data = buf.getvalue()
        summary = verify_segment(io.BytesIO(data), segment_base=base, digests=False)
        indexes = build_indexes(base, summary.batches)
        out.append(GeneratedSegment(base, data, indexes.offset_index, indexes.time_index))
        base = sample.next_offset
    return tuple(out)


@dataclass(frozen=True, slots=True)
class SeededSegment:
    topic: str
    partition: int
    base_offset: int
    log_key: str
    size: int


def upload_partition(store: ObjectStore, prefix: str, topic: str, partition: int,
                     generated: tuple[GeneratedSegment, ...]) -> list[SeededSegment]:
    """Put generated segments and the partition files a broker keeps beside them."""
    out = []
    for g in generated:
        key = segment_key(prefix, topic, partition, g.base_offset, LOG_SUFFIX)
        store.put(key, g.log)
        store.put(segment_key(prefix, topic, partition, g.base_offset, INDEX_SUFFIX), g.offset_index)
        store.put(segment_key(prefix, topic, partition, g.base_offset, TIME_INDEX_SUFFIX), g.time_index)
        out.append(SeededSegment(topic, partition, g.base_offset, key, len(g.log)))
    root = partition_key(prefix, topic, partition)
    store.put(root + "leader-epoch-checkpoint", b"0\n1\n0 0\n")
    store.put(root + "partition.metadata", b"version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
    return out


def seed_partition(store: ObjectStore, prefix: str, topic: str, partition: int, *, segments: int, kind: str,
                   codec: Codec, segment_bytes: int, seed: int = 0) -> list[SeededSegment]:
    generated = generate_partition(segments=segments, kind=kind, codec=codec, segment_bytes=segment_bytes, seed=seed)
    return upload_partition(store, prefix, topic, partition, generated)
