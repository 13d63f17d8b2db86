"""Key compaction's compiled engine (tiering/kafka/_keymap.c) against its Python reference: the same cleaned
segments byte for byte, the same pass end, key count and statistics, or the same error, on the Kafka-written
segments of tests/data (split into segments at batch boundaries, cleaned twice so that tombstones stamped
by the first pass go in the second), on partitions built here, and on records sections written byte by byte
(non-minimal varints, int64 edges, broken records under a valid CRC, delete horizons). The compiled map's
MD5 is checked against hashlib, and its probing against a bound the broker's would end a pass at."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka.passes import compact_partition
from tests.kafka.test_records_native import INT64, blob, field
from tiering.errors import TieringError
from tiering.kafka import _keymap
from tiering.kafka.batch import CRC_OFFSET, LOG_OVERHEAD, V2_HEADER, V2_HEADER_SIZE, Attr, crc_v2
from tiering.kafka.codecs import Codec
from tiering.kafka.index import parse_txn_index
from tiering.kafka.keycompact import CleanOptions, CleanStats, Segment, new_key_map
from tiering.kafka.reader import iter_batches
from tiering.kafka.records import Engine

DATA = Path(__file__).resolve().parents[1] / "data"
LOGS = sorted(p for p in DATA.rglob("*.log") if "legacy" not in p.parent.name)
T0 = 1_790_000_000_000
DAY = 86_400_000


def _segments(data: bytes, txns: bytes = b"", per_segment: int = 3) -> list[Segment]:
    """A partition from one ``.log``: its batches cut into segments of ``per_segment``, the last one active."""
    raws = list(iter_batches(io.BytesIO(data), verify_crc=False))
    entries = parse_txn_index(txns) if txns else []
    cuts = [raws[i:i + per_segment] for i in range(0, len(raws), per_segment)] or [[]]
    out = []
    for group in cuts:
        base = group[0].header.offset if group else 0
        last = group[-1].header.last_offset if group else -1
        body = b"".join(bytes(r.data) for r in group)
        mine = tuple(e for e in entries if base <= e.last_offset <= last)
        out.append(Segment(base, lambda b=body: io.BytesIO(b), mine, f"t-0/{base:020d}.log", len(body)))
    return out


def _outcome(segments: list[Segment], engine: Engine, **options: Any) -> tuple[str, Any]:
    stats = CleanStats()
    try:
        facts, cleaned = compact_partition(segments, CleanOptions(engine=engine, **options), stats)
    except (TieringError, OverflowError, struct.error) as e:  # what the reference raises, the native must too
        return "error", (type(e).__name__, str(e))
    return "ok", ((facts.upper, facts.cleaned, facts.latest_offset, len(facts.key_map), facts.producer_last),
                  [(c.base_offset, c.log, c.indexes, c.txn_index, c.sources) for c in cleaned], stats.to_json())


def _again(segments: list[Segment], outcome: tuple[str, Any]) -> list[Segment]:
    """The partition after a pass: its cleaned segments, then the rest."""
    cleaned = outcome[1][1]
    segs = [Segment(base, lambda d=log: io.BytesIO(d), tuple(parse_txn_index(txn)), f"t-0/{base:020d}.log", len(log))
            for base, log, _, txn, _ in cleaned]
    return segs + segments[len(cleaned):]


def _same(segments: list[Segment], **options: Any) -> tuple[str, Any]:
    native, python = _outcome(segments, Engine.NATIVE, **options), _outcome(segments, Engine.PYTHON, **options)
    assert native == python
    return native


@pytest.mark.parametrize("log", LOGS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
@pytest.mark.parametrize("options", [{}, {"max_keys": 3}, {"codec": Codec.ZSTD, "level": 1},
                                     {"min_compaction_lag_ms": 1}], ids=["default", "bounded", "zstd", "lag"])
def test_both_engines_clean_kafka_written_segments_alike_over_two_passes(log: Path, options: dict[str, Any]) -> None:
    txn = log.with_suffix(".txnindex")
    segments = _segments(log.read_bytes(), txn.read_bytes() if txn.exists() else b"")
    newest = T0 * 2  # after every record of the fixtures: horizons stamped now pass before the second pass
    first = _same(segments, now_ms=newest, **options)
    if first[0] == "ok" and first[1][1]:
        _same(_again(segments, first), now_ms=newest + 2 * DAY, **options)


def test_the_fixtures_exercise_the_compiled_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the test above: the Kafka-written inputs hold superseded records, tombstones and records without
    a key, and most of their data batches go through the compiled filter rather than the reference."""
    from tiering.kafka import keycompact

    calls = {"compiled": 0, "reference": 0}

    def counted(name: str, f: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return f(*args, **kwargs)
        return call

    monkeypatch.setattr(keycompact, "_rebuilt", counted("compiled", keycompact._rebuilt))
    monkeypatch.setattr(keycompact, "_clean_batch", counted("reference", keycompact._clean_batch))
    stats = CleanStats()
    for log in LOGS:
        txn = log.with_suffix(".txnindex")
        segments = _segments(log.read_bytes(), txn.read_bytes() if txn.exists() else b"")
        try:
            compact_partition(segments, CleanOptions(now_ms=T0 * 2), stats)
        except TieringError:
            continue  # a fixture aborting transactions without its .txnindex: refused by both (above)
    assert stats.superseded_dropped > 0
    assert stats.tombstones_stamped > 0
    assert stats.no_key_dropped > 0
    assert stats.aborted_records_dropped > 0
    assert calls["compiled"] > 4 * calls["reference"] > 0, calls  # the reference: markers and aborted data


# ---- partitions written byte by byte ----------------------------------------------------------------------

@st.composite
def _record(draw: Any, offset_delta: int) -> bytes:
    body = bytes([draw(st.sampled_from([0, 0, 1]))])
    body += draw(field(draw(st.one_of(st.integers(-1000, 1000), st.integers(*INT64))), 10))
    body += draw(field(offset_delta, 5))
    key = draw(st.one_of(st.none(), st.sampled_from([b"", b"a", b"b", b"c"]), st.binary(max_size=4)))
    body += draw(field(-1, 5)) if key is None else draw(field(len(key), 5)) + key
    body += draw(blob())  # the value, null (a tombstone) now and then
    headers = draw(st.lists(st.tuples(blob(nullable=False), blob()), max_size=2))
    body += draw(field(len(headers), 5)) + b"".join(k + v for k, v in headers)
    return draw(field(len(body), 5)) + body


@st.composite
def _batch(draw: Any, base_offset: int, pid: int) -> bytes:
    n = draw(st.integers(0, 4))
    deltas = sorted(draw(st.sets(st.integers(0, 12), min_size=n, max_size=n)))
    section = b"".join(draw(_record(d)) for d in deltas)
    if draw(st.integers(0, 14)) == 0 and section:  # damaged after the CRC was taken
        at = draw(st.integers(0, len(section) - 1))
        section = section[:at] + bytes([section[at] ^ draw(st.integers(1, 255))]) + section[at + 1:]
    attributes = int(Attr.LOG_APPEND_TIME) if draw(st.integers(0, 4)) == 0 else 0
    attributes |= int(Attr.DELETE_HORIZON) if draw(st.integers(0, 4)) == 0 else 0
    base_ts = draw(st.one_of(st.integers(T0 - DAY, T0 + DAY), st.integers(*INT64)))
    max_ts = draw(st.one_of(st.integers(T0 - DAY, T0 + DAY), st.integers(*INT64)))
    last_delta = (deltas[-1] if deltas else 0) + draw(st.integers(0, 2))
    header = bytearray(V2_HEADER.pack(base_offset, V2_HEADER_SIZE - LOG_OVERHEAD + len(section), 0, 2, 0, attributes,
                                      last_delta, base_ts, max_ts, pid, 0 if pid >= 0 else -1, -1, n))
    struct.pack_into(">I", header, CRC_OFFSET, crc_v2(header + section))
    return bytes(header + section)


@st.composite
def _partition(draw: Any) -> bytes:
    offset = draw(st.one_of(st.integers(0, 100), st.integers((1 << 63) - 200, (1 << 63) - 100)))
    out = b""
    for _ in range(draw(st.integers(1, 8))):
        b = draw(_batch(offset, draw(st.sampled_from([-1, -1, 7]))))
        out += b
        offset += struct.unpack_from(">i", b, 23)[0] + 1 + draw(st.integers(0, 2))
    return out


@settings(max_examples=400, deadline=None)
@given(_partition(), st.integers(1, 3), st.sampled_from([None, 1, 2, 5]), st.sampled_from([T0, T0 + 2 * DAY]))
def test_both_engines_clean_hostile_partitions_alike(data: bytes, per_segment: int, max_keys: int | None,
                                                     now: int) -> None:
    segments = _segments(data, per_segment=per_segment)
    first = _same(segments, now_ms=now, max_keys=max_keys)
    if first[0] == "ok" and first[1][1]:
        _same(_again(segments, first), now_ms=now + 2 * DAY, max_keys=max_keys)


# ---- the map itself ---------------------------------------------------------------------------------------

@given(st.binary(max_size=300))
def test_the_map_s_md5_is_hashlib_s(data: bytes) -> None:
    assert _keymap.md5(data) == hashlib.md5(data).digest()


@given(st.lists(st.binary(max_size=70), min_size=1, max_size=11))
def test_keys_hashed_side_by_side_land_where_hashlib_s_md5_says(keys: list[bytes]) -> None:
    """A section's keys are hashed four short ones at a time: each key, short or long, in a full or partial
    group, is found in the map at its own offset and nowhere else."""
    from tiering.kafka.builder import encode_record
    from tiering.kafka.records import Record

    section = b"".join(encode_record(Record(i, T0, k, b"v", ()), 0, T0) for i, k in enumerate(keys))
    m = _keymap.KeyMap(1024, 900)
    assert m.map_v2(section, 0, len(keys) - 1, len(keys), 0) == (len(keys), len(keys) - 1, False)
    latest = {hashlib.md5(k).digest(): i for i, k in enumerate(keys)}
    assert len(m) == len(latest)
    assert all(m.get(k) == latest[hashlib.md5(k).digest()] for k in keys)


def test_a_bounded_map_is_full_at_its_capacity_and_a_growing_one_is_never() -> None:
    bounded = new_key_map(CleanOptions(now_ms=0, max_keys=1000))
    assert isinstance(bounded, _keymap.KeyMap)
    assert bounded.slots >= 1000 / 0.9
    for i in range(1000):
        assert not bounded.full
        bounded.put(b"key-%d" % i, i)
    assert bounded.full
    with pytest.raises(OverflowError):
        bounded.put(b"one more", 1000)
    assert [bounded.get(b"key-%d" % i) for i in (0, 500, 999)] == [0, 500, 999]
    assert bounded.get(b"absent") == -1
    assert bounded.get(b"absent", None) is None  # type: ignore[arg-type]

    huge = _keymap.KeyMap(200_000, 180_000, huge_pages=True)  # its own mapping: the same map
    for i in range(0, 180_000):
        huge.put(b"key-%d" % i, i)
    assert huge.full
    assert [huge.get(b"key-%d" % i) for i in (0, 90_000, 179_999)] == [0, 90_000, 179_999]
    assert isinstance(new_key_map(CleanOptions(now_ms=0, max_keys=1000), records=10**6), _keymap.KeyMap)

    growing = new_key_map(CleanOptions(now_ms=0, max_keys=None))
    assert isinstance(growing, _keymap.KeyMap)
    first_slots = growing.slots
    for i in range(200_000):
        growing.put(b"k%d" % i, i)
    assert not growing.full
    assert len(growing) == 200_000
    assert growing.slots > first_slots
    assert all(growing.get(b"k%d" % i) == i for i in range(0, 200_000, 997))


def test_a_map_without_its_table_is_an_error_not_a_crash() -> None:
    m = _keymap.KeyMap.__new__(_keymap.KeyMap)  # __init__ never ran: no slots
    for call in (lambda: m.get(b"k"), lambda: m.put(b"k", 1), lambda: m.map_v2(b"", 0, 0, 0, 0),
                 lambda: m.filter_v2(b"", 0, 0, False, 0, 0, 0, False, False, 0)):
        with pytest.raises(ValueError, match="no table"):
            call()


def test_both_engines_bound_the_map_at_what_the_broker_s_largest_holds() -> None:
    """A bound past a 2 GiB map's keys is that map's for both engines, so that they end a pass alike."""
    from tiering.kafka.keycompact import DictMap

    huge_bound = CleanOptions(now_ms=0, max_keys=10**9)
    compiled, reference = new_key_map(huge_bound), new_key_map(dataclasses.replace(huge_bound,
                                                                                   engine=Engine.PYTHON))
    assert isinstance(compiled, _keymap.KeyMap)
    assert isinstance(reference, DictMap)
    assert compiled.slots * 24 <= 2**31 - 1
    assert reference._max_keys == int(compiled.slots * 0.9)


def test_the_map_is_sized_in_bytes_as_the_broker_s() -> None:
    """The default bound (the keys a broker's default 128 MiB dedupe buffer maps) fits a table of that size,
    filled to the broker's load factor."""
    from tiering.kafka.keycompact import DEFAULT_KEY_MAP_BYTES, DEFAULT_MAX_KEYS, KEY_MAP_SLOT_BYTES

    m = new_key_map(CleanOptions(now_ms=0))
    assert isinstance(m, _keymap.KeyMap)
    assert m.slots * KEY_MAP_SLOT_BYTES <= DEFAULT_KEY_MAP_BYTES < (m.slots + 1) * KEY_MAP_SLOT_BYTES
    assert DEFAULT_MAX_KEYS <= m.slots * 0.9 < DEFAULT_MAX_KEYS + 1
