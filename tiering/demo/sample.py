"""Sample segments for the demo and the benchmark: realistic values, batches laid out as Kafka's producer does.

Three kinds of values: ``json`` (click-stream events with ids, enums, numbers and URLs), ``logs``
(application log lines) and ``random`` (incompressible bytes, like already-encrypted payloads). A segment
is written from a few dozen encoded template batches rebased to successive offsets and timestamps
(records hold only deltas), so gigabytes can be generated quickly while every batch stays valid.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import BinaryIO, Final

from tiering.kafka.builder import BatchSpec, build_batch, rebase_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.records import Record

KINDS: Final = ("json", "logs", "random")
BASE_TIMESTAMP_MS: Final = 1_763_800_000_000  # 2025-11-22, an arbitrary fixed start
TEMPLATE_BATCHES: Final = 48

_EVENT_TYPES: Final = ("page_view", "add_to_cart", "checkout", "search", "login", "logout", "click")
_COUNTRIES: Final = ("DE", "FR", "US", "GB", "NL", "ES", "IT", "PL", "SE", "BR", "IN", "JP")
_LEVELS: Final = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")
_LOGGERS: Final = ("c.e.orders.OrderService", "c.e.http.RequestLog", "c.e.cache.RedisCache", "c.e.db.Pool")
_PATHS: Final = ("/api/v1/orders", "/api/v1/cart", "/api/v2/search", "/products", "/checkout", "/login")


def _json_value(rng: random.Random, ts: int) -> tuple[bytes | None, bytes]:
    user = rng.randrange(1, 200_000)
    event = {
        "event_id": f"{rng.getrandbits(64):016x}",
        "type": rng.choice(_EVENT_TYPES),
        "user_id": user,
        "session": f"{rng.getrandbits(48):012x}",
        "ts": ts,
        "country": rng.choice(_COUNTRIES),
        "path": f"{rng.choice(_PATHS)}/{rng.randrange(1, 5000)}",
        "amount": round(rng.uniform(0, 500), 2),
        "items": [rng.randrange(1000, 9999) for _ in range(rng.randrange(0, 4))],
        "ua": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36",
    }
    return str(user).encode(), json.dumps(event, separators=(",", ":")).encode()


def _log_value(rng: random.Random, ts: int) -> tuple[bytes | None, bytes]:
    line = (f"{ts} {rng.choice(_LEVELS)} [worker-{rng.randrange(16)}] {rng.choice(_LOGGERS)} - handled "
            f"{rng.choice(_PATHS)} id={rng.getrandbits(40):010x} status={rng.choice((200, 200, 201, 404, 500))} "
            f"in {rng.randrange(1, 900)} ms")
    return None, line.encode()


def _random_value(rng: random.Random, ts: int) -> tuple[bytes | None, bytes]:
    return None, rng.randbytes(rng.randrange(200, 800))


_VALUES: Final[dict[str, Callable[[random.Random, int], tuple[bytes | None, bytes]]]] = {
    "json": _json_value,
    "logs": _log_value,
    "random": _random_value,
}


@dataclass(frozen=True, slots=True)
class SampleSegment:
    base_offset: int
    next_offset: int
    bytes_written: int
    batches: int


def _templates(kind: str, codec: Codec, batch_bytes: int, seed: int) -> list[tuple[bytes, int, int]]:
    """(batch at base offset 0, record count, time span in ms) for a few distinct batches."""
    rng = random.Random(seed)  # noqa: S311 - reproducible sample data, not secrets
    values = _VALUES[kind]
    out = []
    for _ in range(TEMPLATE_BATCHES):
        records: list[Record] = []
        size = 0
        ts = BASE_TIMESTAMP_MS
        while size < batch_bytes:
            ts += rng.randrange(0, 40)
            key, value = values(rng, ts)
            records.append(Record(len(records), ts, key, value, ((b"source", b"sample"),) if kind == "json" else ()))
            size += len(value) + 20
        batch = build_batch(BatchSpec(0, codec=codec, partition_leader_epoch=1), records)
        out.append((batch, len(records), ts - BASE_TIMESTAMP_MS + 1))
    return out


def write_segment(dst: BinaryIO, *, base_offset: int, kind: str, codec: Codec, target_bytes: int,
                  batch_bytes: int = 16 * 1024, seed: int = 0, shift_ms: int = 0) -> SampleSegment:
    """Write batches of ``kind`` values compressed with ``codec`` until ``target_bytes`` are written.

    ``batch_bytes`` is the uncompressed size of each batch's records (a producer's ``batch.size``); record
    timestamps start at ``BASE_TIMESTAMP_MS + shift_ms``.
    """
    if kind not in _VALUES:
        raise ValueError(f"unknown sample kind {kind!r}; expected one of {', '.join(KINDS)}")
    templates = _templates(kind, codec, batch_bytes, seed)
    offset, written, batches, clock = base_offset, 0, 0, shift_ms
    while written < target_bytes:
        template, count, span = templates[batches % len(templates)]
        batch = rebase_batch(template, offset, clock)
        dst.write(batch)
        written += len(batch)
        offset += count
        clock += span
        batches += 1
    return SampleSegment(base_offset, offset, written, batches)
