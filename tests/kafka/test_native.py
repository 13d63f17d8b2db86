"""The compiled hot-path helpers of ``_walker`` against independent references: the ``crc32c`` package for
CRC-32C, ``batch.parse_v2_header``/``check_crc``/``build_v2`` (the Python reading of the field table) for the
scanner and the header rebuild, Kafka-written golden segments for real batches."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.golden import GOLDEN
from tiering.errors import TieringError
from tiering.kafka import _walker
from tiering.kafka.batch import LENGTH_OFFSET, V2_HEADER_SIZE, build_v2, check_crc, parse_v2_header
from tiering.kafka.codecs import Codec
from tiering.kafka.reader import DEFAULT_MAX_BATCH_BYTES, iter_batches

_V2_GOLDEN = sorted(p for p in (GOLDEN / "logdir").glob("*/*.log") if p.read_bytes()[16:17] == b"\x02")


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 3000), st.integers(0, 2**32 - 1))
def test_crc32c_equals_the_reference_package(data: bytes, split: int, seed: int) -> None:
    for fn in (_walker.crc32c, _walker.crc32c_portable):
        assert fn(data) == crc32c.crc32c(data)
        assert fn(data, seed) == crc32c.crc32c(data, seed)
        assert fn(data[split:], fn(data[:split])) == crc32c.crc32c(data)  # continues a running CRC
        assert fn(memoryview(data)[1:]) == crc32c.crc32c(data[1:])  # unaligned starts


@pytest.mark.parametrize("size", [767, 768, 769, 3 * 256 * 7 + 5, 24575, 24576, 24577, 3 * 8192 * 3 + 100, 1 << 20])
def test_crc32c_three_lanes_at_their_boundaries(size: int) -> None:
    """Long buffers run as three interleaved lanes (of 8192 and 256 bytes) combined by a shift: every boundary."""
    data = bytes((i * 131 + 7) & 0xFF for i in range(size + 3))
    for start in range(3):  # unaligned starts shift where the lanes begin
        chunk = data[start : start + size]
        assert _walker.crc32c(chunk) == crc32c.crc32c(chunk) == _walker.crc32c_portable(chunk)


def test_crc32c_check_value() -> None:
    assert _walker.crc32c(b"123456789") == _walker.crc32c_portable(b"123456789") == 0xE3069283  # RFC 3720


def _expected(data: bytes) -> list[tuple[int, int, int, int, int, int, int]]:
    out = []
    for raw in iter_batches(io.BytesIO(data)):
        h = raw.header
        if h.magic < 2:
            break
        out.append((h.position, h.size, h.offset, h.last_offset, h.max_timestamp, h.attributes, h.records_count))
    return out


@pytest.mark.parametrize("path", _V2_GOLDEN, ids=lambda p: p.parent.name)
def test_scan_v2_reads_every_golden_batch_as_the_python_reader_does(path: Path) -> None:
    data = path.read_bytes()
    assert _walker.scan_v2(data, 0, DEFAULT_MAX_BATCH_BYTES) == _expected(data)


def _two_batches() -> bytes:
    data = (GOLDEN / "logdir" / "events-snappy-0" / "00000000000000000000.log").read_bytes()
    batches = _expected(data)
    assert len(batches) >= 2
    end = batches[1][0] + batches[1][1]
    return data[:end]


def test_scan_v2_stops_before_a_batch_with_a_bad_crc_and_the_reader_reports_it() -> None:
    data = bytearray(_two_batches())
    second = _walker.scan_v2(bytes(data), 0, DEFAULT_MAX_BATCH_BYTES)[1][0]
    data[second + 17] ^= 0x01  # the stored CRC
    found = _walker.scan_v2(bytes(data), 0, DEFAULT_MAX_BATCH_BYTES)
    assert [b[0] for b in found] == [0]
    with pytest.raises(TieringError, match="CRC mismatch") as e:
        list(iter_batches(io.BytesIO(bytes(data))))
    assert e.value.position == second


@pytest.mark.parametrize("cut", [1, 17, V2_HEADER_SIZE - 1, V2_HEADER_SIZE + 3])
def test_scan_v2_stops_before_an_incomplete_batch(cut: int) -> None:
    data = _two_batches()
    first_end = _walker.scan_v2(data, 0, DEFAULT_MAX_BATCH_BYTES)[0][1]
    found = _walker.scan_v2(data[: first_end + cut], 0, DEFAULT_MAX_BATCH_BYTES)
    assert [b[0] for b in found] == [0]


def test_scan_v2_stops_at_legacy_entries_oversized_batches_and_bad_headers() -> None:
    data = _two_batches()
    first_size = _walker.scan_v2(data, 0, DEFAULT_MAX_BATCH_BYTES)[0][1]
    assert _walker.scan_v2(data, 0, first_size - 1) == []  # larger than the ceiling
    for legacy in ("legacy-v0-0", "legacy-v1-0"):
        assert _walker.scan_v2((GOLDEN / "logdir" / legacy / "00000000000000000000.log").read_bytes(), 0,
                               DEFAULT_MAX_BATCH_BYTES) == []
    for offset, value, what in [(57, -1, "negative recordsCount"), (23, -1, "negative lastOffsetDelta"),
                                (LENGTH_OFFSET, 10, "length below the header")]:
        bad = bytearray(data)
        struct.pack_into(">i", bad, offset, value)
        bad[17:21] = struct.pack(">I", crc32c.crc32c(bytes(bad[21:first_size])))  # a valid CRC: only the field is bad
        assert _walker.scan_v2(bytes(bad), 0, DEFAULT_MAX_BATCH_BYTES) == [], what
    assert _walker.scan_v2(data, len(data), DEFAULT_MAX_BATCH_BYTES) == []
    assert [b[0] for b in _walker.scan_v2(data, first_size, DEFAULT_MAX_BATCH_BYTES)] == [first_size]


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=5000), st.sampled_from(list(Codec)), st.integers(0, 100), st.integers(0, 100))
def test_put_v2_equals_the_python_rebuild(payload: bytes, codec: Codec, at: int, slack: int) -> None:
    data = _two_batches()
    size = _walker.scan_v2(data, 0, DEFAULT_MAX_BATCH_BYTES)[0][1]
    batch = data[:size]
    out = bytearray(b"\xaa" * (at + V2_HEADER_SIZE + len(payload) + slack))
    end = _walker.put_v2(out, at, batch, int(codec), payload)
    assert end == at + V2_HEADER_SIZE + len(payload)
    assert bytes(out[at:end]) == b"".join(build_v2(batch, codec, payload))
    assert out[:at] == b"\xaa" * at  # nothing written outside
    assert out[end:] == b"\xaa" * slack
    check_crc(parse_v2_header(bytes(out[at:end]), 0), bytes(out[at:end]))  # a valid batch


def test_put_v2_refuses_bad_arguments() -> None:
    batch = _two_batches()[:V2_HEADER_SIZE]
    with pytest.raises(ValueError, match="61 bytes"):
        _walker.put_v2(bytearray(100), 0, b"\x00" * 60, 4, b"")
    with pytest.raises(ValueError, match="codec"):
        _walker.put_v2(bytearray(100), 0, batch, 5, b"")
    with pytest.raises(ValueError, match="do not fit"):
        _walker.put_v2(bytearray(100), 40, batch, 4, b"")  # 61 bytes from 40 pass the end
    with pytest.raises(ValueError, match="do not fit"):
        _walker.put_v2(bytearray(100), -1, batch, 4, b"")
    with pytest.raises(TypeError):
        _walker.put_v2(b"\x00" * 100, 0, batch, 4, b"")  # not writable


def test_first_difference() -> None:
    a = [b"abc", b"", b"xyz" * 1000]
    assert _walker.first_difference(a, [bytearray(x) for x in a]) == -1
    assert _walker.first_difference(a, [b"abc", b"", b"xyz" * 999 + b"xyQ"]) == 2
    assert _walker.first_difference(a, [b"abc", b"\x00", a[2]]) == 1  # length differs
    assert _walker.first_difference([], []) == -1
    with pytest.raises(ValueError, match="different lengths"):
        _walker.first_difference(a, a[:2])
    with pytest.raises(TypeError):
        _walker.first_difference([1], [b"x"])
