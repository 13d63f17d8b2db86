"""Codecs: both directions, the exact framing Kafka's Java client writes, what else we must read, bombs, levels."""

from __future__ import annotations

import gzip
import itertools
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib
from functools import cache
from pathlib import Path

import lz4.block
import lz4.frame
import pytest
import snappy
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.golden import GOLDEN
from tiering.errors import ConfigError, DecompressionError
from tiering.kafka.batch import LEGACY_ENTRY_PREFIX, LOG_OVERHEAD, parse_legacy_header
from tiering.kafka.codecs import (
    DEFAULT_LEVEL,
    LEVEL_RANGE,
    XERIAL_BLOCK_SIZE,
    XERIAL_MAGIC,
    XERIAL_VERSION,
    Codec,
    check_level,
    compress,
    decompress,
)
from tiering.kafka.records import parse_legacy_message

COMPRESSED = [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD]
MIB = 1 << 20


def _sample(n: int, seed: int = 7) -> bytes:
    """Compressible but not trivial: JSON-ish lines with random numbers."""
    rng = random.Random(seed)
    out = bytearray()
    while len(out) < n:
        out += b'{"user": %d, "event": "click", "page": "/p/%d"}\n' % (rng.randrange(10**6), rng.randrange(500))
    return bytes(out[:n])


SIZES = [0, 1, 100, XERIAL_BLOCK_SIZE - 1, XERIAL_BLOCK_SIZE, XERIAL_BLOCK_SIZE + 1, 65536, 65537, 300_000]


# --- both directions ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.label)
@pytest.mark.parametrize("size", SIZES)
def test_round_trip(codec: Codec, size: int) -> None:
    data = _sample(size)
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    if codec is Codec.NONE:
        assert packed == data


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4], ids=lambda c: c.label)
@pytest.mark.parametrize("magic", [0, 1])
def test_round_trip_legacy_magic(codec: Codec, magic: int) -> None:
    data = _sample(150_000)
    assert decompress(codec, compress(codec, data, magic=magic), magic=magic) == data


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
def test_round_trip_random_bytes_and_memoryview(codec: Codec) -> None:
    data = os.urandom(100_000)  # incompressible
    packed = compress(codec, memoryview(data))
    assert decompress(codec, memoryview(packed)) == data


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
def test_every_level_round_trips(codec: Codec) -> None:
    data = _sample(20_000)
    if codec in LEVEL_RANGE:
        low, high = LEVEL_RANGE[codec]
        levels: list[int | None] = [None, low, DEFAULT_LEVEL[codec], high]
        if codec is Codec.ZSTD:
            levels += [-5, 1, 19]
    else:
        levels = [None]
    for level in levels:
        assert decompress(codec, compress(codec, data, level=level)) == data


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), data=st.binary(max_size=5000))
def test_round_trip_hypothesis(codec: Codec, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


# --- gzip -----------------------------------------------------------------------------------------


def test_gzip_writes_one_member_readable_by_the_stdlib() -> None:
    data = _sample(200_000)
    packed = compress(Codec.GZIP, data)
    assert packed[:3] == b"\x1f\x8b\x08"
    assert gzip.decompress(packed) == data
    d = zlib.decompressobj(31)
    assert d.decompress(packed) == data
    assert d.eof
    assert d.unused_data == b""


def test_gzip_reads_multi_member_streams() -> None:
    parts = [_sample(5000, seed=1), b"", _sample(70_000, seed=2), b"tail"]
    stream = b"".join(gzip.compress(p) for p in parts)
    assert decompress(Codec.GZIP, stream) == b"".join(parts)
    ours = b"".join(compress(Codec.GZIP, p) for p in parts)
    assert decompress(Codec.GZIP, ours) == b"".join(parts)


def test_gzip_reads_what_java_writes() -> None:
    """java.util.zip.GZIPOutputStream: a 10-byte header with no flags, mtime 0, then deflate."""
    data = _sample(10_000)
    raw = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = raw.compress(data) + raw.flush()
    java = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x00" + body + struct.pack("<II", zlib.crc32(data), len(data))
    assert decompress(Codec.GZIP, java) == data


def test_gzip_multi_member_is_bounded_by_the_limit_across_members() -> None:
    member = gzip.compress(bytes(600_000))
    with pytest.raises(DecompressionError, match="limit"):
        decompress(Codec.GZIP, member + member, limit=MIB)
    assert len(decompress(Codec.GZIP, member + member, limit=1_200_000)) == 1_200_000


def test_gzip_output_of_exactly_the_limit_is_accepted() -> None:
    data = _sample(50_000)
    assert decompress(Codec.GZIP, compress(Codec.GZIP, data), limit=len(data)) == data
    with pytest.raises(DecompressionError):
        decompress(Codec.GZIP, compress(Codec.GZIP, data), limit=len(data) - 1)


# --- snappy ---------------------------------------------------------------------------------------


def _xerial_blocks(packed: bytes) -> list[bytes]:
    magic, version, compatible = struct.unpack_from(">8sii", packed, 0)
    assert (magic, version, compatible) == (XERIAL_MAGIC, XERIAL_VERSION, XERIAL_VERSION)
    blocks = []
    pos = 16
    while pos < len(packed):
        (n,) = struct.unpack_from(">i", packed, pos)
        blocks.append(packed[pos + 4 : pos + 4 + n])
        pos += 4 + n
    assert pos == len(packed)
    return blocks


def test_snappy_writes_xerial_framing_with_32k_blocks() -> None:
    assert XERIAL_MAGIC == b"\x82SNAPPY\x00"
    assert XERIAL_VERSION == 1
    assert XERIAL_BLOCK_SIZE == 32 * 1024
    data = _sample(100_000)
    packed = compress(Codec.SNAPPY, data)
    assert packed[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"
    blocks = [snappy.uncompress(b) for b in _xerial_blocks(packed)]
    assert [len(b) for b in blocks] == [32768, 32768, 32768, 100_000 - 3 * 32768]
    assert b"".join(blocks) == data


def test_snappy_empty_input_is_header_only() -> None:
    packed = compress(Codec.SNAPPY, b"")
    assert packed == b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01"
    assert decompress(Codec.SNAPPY, packed) == b""


def test_snappy_reads_raw_snappy() -> None:
    data = _sample(100_000)
    raw = snappy.compress(data)
    assert raw[:8] != XERIAL_MAGIC
    assert decompress(Codec.SNAPPY, raw) == data


def test_snappy_reads_xerial_written_by_others() -> None:
    """snappy-java's SnappyOutputStream may flush blocks of any size; compatible version 1."""
    data = _sample(90_000)
    cuts = [0, 10, 5000, 40_000, 90_000]
    out = bytearray(b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1))
    for a, b in itertools.pairwise(cuts):
        block = snappy.compress(data[a:b])
        out += struct.pack(">i", len(block)) + block
    assert decompress(Codec.SNAPPY, bytes(out)) == data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        if n < 0x80:
            out.append(n)
            return bytes(out)
        out.append(n & 0x7F | 0x80)
        n >>= 7


def _relabel(raw: bytes, declared: int) -> bytes:
    """A raw snappy block whose leading length varint is replaced by ``declared``."""
    i = 0
    while raw[i] & 0x80:
        i += 1
    return _varint(declared) + raw[i + 1 :]


@pytest.mark.parametrize("declared", [0, 99, 101, 5000, 199_229_439, 2**32 - 1])
def test_snappy_lying_length_prefix_is_a_clear_error(declared: int) -> None:
    raw = snappy.compress(_sample(100))
    liar = _relabel(raw, declared)
    started = time.perf_counter()
    with pytest.raises(DecompressionError) as info:
        decompress(Codec.SNAPPY, liar)
    assert time.perf_counter() - started < 1.0
    assert "snappy" in str(info.value)
    # A clear error says what is wrong, not only which codec failed.
    assert info.value.message.split(":", 1)[-1].strip() or info.value.found is not None


def test_snappy_length_prefix_beyond_the_limit_is_refused_before_decoding() -> None:
    liar = _relabel(snappy.compress(b"x" * 100), 5 * MIB)
    with pytest.raises(DecompressionError, match="limit") as info:
        decompress(Codec.SNAPPY, liar, limit=MIB)
    assert str(5 * MIB) in str(info.value)


def test_snappy_malformed_length_prefix() -> None:
    with pytest.raises(DecompressionError, match="length prefix"):
        decompress(Codec.SNAPPY, b"\xff\xff\xff\xff\xff\xff")


@pytest.mark.parametrize("block_length", [-1, -(2**31), 10**6])
def test_snappy_xerial_block_length_outside_the_payload(block_length: int) -> None:
    block = snappy.compress(b"hello")
    payload = XERIAL_MAGIC + struct.pack(">iii", 1, 1, block_length) + block
    with pytest.raises(DecompressionError, match="overruns"):
        decompress(Codec.SNAPPY, payload)


@pytest.mark.parametrize("cut", [1, 2, 3, 9, 17, 18, 19])
def test_snappy_xerial_truncated(cut: int) -> None:
    packed = compress(Codec.SNAPPY, _sample(40_000))
    with pytest.raises(DecompressionError):
        decompress(Codec.SNAPPY, packed[: 16 + cut] if cut < 16 else packed[:-cut])


# --- lz4 ------------------------------------------------------------------------------------------


def _lz4_blocks(frame: bytes, header_size: int = 7) -> list[tuple[bool, bytes]]:
    """(stored uncompressed, bytes) of every block of a frame without block checksums."""
    pos = header_size
    blocks = []
    while True:
        (word,) = struct.unpack_from("<I", frame, pos)
        pos += 4
        if word == 0:
            break
        n = word & 0x7FFFFFFF
        blocks.append((bool(word & 0x80000000), frame[pos : pos + n]))
        pos += n
    assert pos == len(frame)  # no content checksum
    return blocks


def test_lz4_frame_descriptor_is_kafkas() -> None:
    packed = compress(Codec.LZ4, _sample(10_000))
    assert packed[:4] == b"\x04\x22\x4d\x18"
    flg, bd = packed[4], packed[5]
    assert flg == 0x60  # version 01, independent blocks, no block checksum, no content size/checksum, no dict
    assert bd == 0x40  # 64 KiB maximum block size
    assert packed[6] == (xxhash.xxh32_intdigest(packed[4:6]) >> 8) & 0xFF  # the right checksum for v1/v2
    info = lz4.frame.get_frame_info(packed)
    assert info["block_size"] == 65536
    assert not info["block_linked"]
    assert not info["content_checksum"]
    assert not info["block_checksum"]
    assert info["content_size"] == 0  # not stored


def test_lz4_blocks_are_independent_and_at_most_64k() -> None:
    rng = random.Random(3)
    chunk = bytes(rng.randrange(256) for _ in range(40_000))
    data = chunk * 6  # repeats across block boundaries: a linked-block encoder would refer back
    packed = compress(Codec.LZ4, data)
    blocks = _lz4_blocks(packed)
    assert len(blocks) == 4  # ceil(240000 / 65536)
    out = bytearray()
    for stored, block in blocks:
        out += block if stored else lz4.block.decompress(block, uncompressed_size=65536)
    assert bytes(out) == data
    assert decompress(Codec.LZ4, packed) == data
    assert lz4.frame.decompress(packed) == data


def test_lz4_reads_frames_written_with_other_settings() -> None:
    data = _sample(200_000)
    for kwargs in [
        {},
        {"block_linked": True, "content_checksum": True, "store_size": True},
        {"block_size": lz4.frame.BLOCKSIZE_MAX4MB, "block_checksum": True},
    ]:
        assert decompress(Codec.LZ4, lz4.frame.compress(data, **kwargs)) == data


def _kafka3160_checksum(frame: bytes) -> int:
    """KAFKA-3160: Kafka 0.8/0.9 hashed the magic too: xxh32 over magic + descriptor."""
    return (xxhash.xxh32_intdigest(frame[:6]) >> 8) & 0xFF


def test_lz4_v0_writes_kafkas_broken_header_checksum() -> None:
    data = _sample(1000)
    v0 = compress(Codec.LZ4, data, magic=0)
    v1 = compress(Codec.LZ4, data, magic=1)
    right = (xxhash.xxh32_intdigest(v1[4:6]) >> 8) & 0xFF
    broken = _kafka3160_checksum(v0)
    assert right != broken  # precondition: the two are distinguishable for this descriptor
    assert v1[6] == right
    assert v0[6] == broken
    assert v0[:6] == v1[:6]
    assert v0[7:] == v1[7:]


def test_lz4_v0_reads_the_broken_checksum_and_the_right_one() -> None:
    data = _sample(100_000)
    v0 = compress(Codec.LZ4, data, magic=0)
    assert decompress(Codec.LZ4, v0, magic=0) == data
    # A v0 reader ignores the descriptor checksum (like Kafka): a correct one is fine too.
    assert decompress(Codec.LZ4, compress(Codec.LZ4, data, magic=1), magic=0) == data


@pytest.mark.parametrize("magic", [1, 2])
def test_lz4_v1_v2_reject_a_wrong_header_checksum(magic: int) -> None:
    v0 = compress(Codec.LZ4, _sample(1000), magic=0)
    with pytest.raises(DecompressionError, match=r"(?i)checksum"):
        decompress(Codec.LZ4, v0, magic=magic)
    frame = bytearray(compress(Codec.LZ4, _sample(1000), magic=magic))
    frame[6] ^= 0x01
    with pytest.raises(DecompressionError, match=r"(?i)checksum"):
        decompress(Codec.LZ4, bytes(frame), magic=magic)


def _golden_legacy_v0_lz4_value() -> bytes:
    """The value of the lz4 wrapper Kafka wrote at byte 106603 of legacy-v0-0 (a v0 message set)."""
    data = (GOLDEN / "logdir" / "legacy-v0-0" / "00000000000000000000.log").read_bytes()
    pos = 106603
    _, size, _, magic, attributes = LEGACY_ENTRY_PREFIX.unpack_from(data, pos)
    assert (magic, attributes & 7) == (0, Codec.LZ4)
    entry = data[pos : pos + LOG_OVERHEAD + size]
    value = parse_legacy_message(entry, parse_legacy_header(entry, pos)).value
    assert value is not None
    return value


def test_lz4_v0_golden_wrapper_carries_the_broken_checksum() -> None:
    value = _golden_legacy_v0_lz4_value()
    assert value[6] == _kafka3160_checksum(value)
    inner = decompress(Codec.LZ4, value, magic=0)
    assert len(inner) > 0
    with pytest.raises(DecompressionError):
        decompress(Codec.LZ4, value, magic=2)
    assert compress(Codec.LZ4, inner, magic=0)[:7] == value[:7]


def test_lz4_trailing_bytes_after_the_frame() -> None:
    packed = compress(Codec.LZ4, b"abc" * 100)
    with pytest.raises(DecompressionError):
        decompress(Codec.LZ4, packed + b"\x00\x01")


# --- zstd -----------------------------------------------------------------------------------------


def test_zstd_frame_has_no_content_size_and_no_checksum() -> None:
    packed = compress(Codec.ZSTD, _sample(100_000))
    assert packed[:4] == b"\x28\xb5\x2f\xfd"
    descriptor = packed[4]
    assert descriptor & 0xC0 == 0  # Frame_Content_Size_flag 0 ...
    assert descriptor & 0x20 == 0  # ... and not single segment: no content size field at all
    assert descriptor & 0x04 == 0  # no content checksum
    params = zstandard.get_frame_parameters(packed)
    assert params.content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert not params.has_checksum


def test_zstd_reads_concatenated_frames() -> None:
    parts = [_sample(1000, seed=1), _sample(200_000, seed=2), b"", b"z"]
    stream = b"".join(compress(Codec.ZSTD, p) for p in parts)
    assert decompress(Codec.ZSTD, stream) == b"".join(parts)


def test_zstd_reads_frames_with_content_size_and_checksum() -> None:
    data = _sample(300_000)
    c = zstandard.ZstdCompressor(level=5, write_content_size=True, write_checksum=True)
    assert decompress(Codec.ZSTD, c.compress(data) + c.compress(data)) == data + data


def test_zstd_magic_below_2_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        compress(Codec.ZSTD, b"x", magic=1)


# --- damaged payloads -----------------------------------------------------------------------------


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
def test_empty_payload(codec: Codec) -> None:
    with pytest.raises(DecompressionError):
        decompress(codec, b"")


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
@pytest.mark.parametrize("cut", [1, 3, 8, 0.5])
def test_truncated_payload(codec: Codec, cut: float) -> None:
    """A payload that ends early is an error, never a shorter output."""
    data = _sample(50_000)
    packed = compress(codec, data)
    keep = int(len(packed) * cut) if cut < 1 else len(packed) - int(cut)
    with pytest.raises(DecompressionError):
        decompress(codec, packed[:keep])


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), magic=st.sampled_from([0, 1, 2]), data=st.binary(max_size=300))
def test_garbage_is_a_decompression_error_or_bytes(codec: Codec, magic: int, data: bytes) -> None:
    try:
        out = decompress(codec, data, magic=magic, limit=MIB)
    except DecompressionError:
        return
    assert isinstance(out, bytes)
    assert len(out) <= MIB


@settings(max_examples=200, deadline=None)
@given(codec=st.sampled_from(COMPRESSED), where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_damaged_payload_is_a_decompression_error_or_bytes(codec: Codec, where: float, mask: int) -> None:
    packed = bytearray(compress(codec, _sample(20_000)))
    packed[int(where * len(packed))] ^= mask
    try:
        out = decompress(codec, bytes(packed), limit=MIB)
    except DecompressionError:
        return
    assert isinstance(out, bytes)


# --- decompression limit --------------------------------------------------------------------------

BOMB_SIZE = 100 * MIB


@cache
def _bomb(kind: str) -> bytes:
    """100 MiB of zeros compressed by ``kind`` (a codec label, or "snappy-raw")."""
    zeros = bytes(BOMB_SIZE)
    if kind == "snappy-raw":
        return bytes(snappy.compress(zeros))
    if kind == "gzip":
        return compress(Codec.GZIP, zeros, level=1)
    return compress(Codec[kind.upper()], zeros)


BOMBS = ["gzip", "snappy", "snappy-raw", "lz4", "zstd"]


@pytest.mark.parametrize("kind", BOMBS)
def test_bomb_stops_at_the_limit_quickly_and_small(kind: str) -> None:
    payload = _bomb(kind)
    codec = Codec.SNAPPY if kind == "snappy-raw" else Codec[kind.upper()]
    tracemalloc.start()
    try:
        started = time.perf_counter()
        with pytest.raises(DecompressionError, match="limit") as info:
            decompress(codec, payload, limit=MIB)
        elapsed = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 2.0
    assert peak < 8 * MIB + 2 * len(payload)
    assert str(MIB) in str(info.value)  # names the configured limit


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.label)
def test_small_payload_does_not_reserve_the_whole_limit(codec: Codec) -> None:
    """Decoding 12 KB must cost about 12 KB, not the 256 MiB default limit: several batches decode at once on
    the rewriter's threads, and under an address-space limit such a reservation is a MemoryError."""
    data = b"hello world " * 1000
    packed = compress(codec, data)
    tracemalloc.start()
    try:
        for magic in ([0, 2] if codec is Codec.LZ4 else [2]):
            assert decompress(codec, compress(codec, data, magic=magic), magic=magic) == data
        assert decompress(codec, packed) == data
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * MIB


@pytest.mark.parametrize("kind", BOMBS)
def test_bomb_under_a_big_enough_limit_decodes(kind: str) -> None:
    codec = Codec.SNAPPY if kind == "snappy-raw" else Codec[kind.upper()]
    out = decompress(codec, _bomb(kind), limit=BOMB_SIZE)
    assert len(out) == BOMB_SIZE
    assert out.count(0) == BOMB_SIZE
    with pytest.raises(DecompressionError):
        decompress(codec, _bomb(kind), limit=BOMB_SIZE - 1)


_RSS_PROBE = """
import resource, sys
from tiering.errors import DecompressionError
from tiering.kafka.codecs import Codec, decompress
payloads = [(Codec[name], open(path, "rb").read()) for name, path in zip(sys.argv[1::2], sys.argv[2::2])]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
for codec, payload in payloads:
    try:
        decompress(codec, payload, limit=1 << 20)
    except DecompressionError:
        pass
    else:
        raise SystemExit("no error")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def test_bombs_do_not_grow_the_resident_set(tmp_path: Path) -> None:
    """In a fresh process (so that nothing else set the peak), all bombs together stay far below their size."""
    args = []
    for kind in BOMBS:
        path = tmp_path / kind
        path.write_bytes(_bomb(kind))
        args += ["SNAPPY" if kind == "snappy-raw" else kind.upper(), str(path)]
    done = subprocess.run([sys.executable, "-c", _RSS_PROBE, *args], capture_output=True, text=True, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    grown_kib = int(done.stdout.strip())
    assert grown_kib < 32 * 1024  # KiB on Linux: well under the 100 MiB a full decode would touch


# --- levels ---------------------------------------------------------------------------------------


def test_check_level_defaults_are_kafkas() -> None:
    assert check_level(Codec.GZIP, None) == 6
    assert check_level(Codec.LZ4, None) == 9
    assert check_level(Codec.ZSTD, None) == 3
    assert check_level(Codec.NONE, None) is None
    assert check_level(Codec.SNAPPY, None) is None


@pytest.mark.parametrize(("codec", "level"), [
    (Codec.GZIP, 1), (Codec.GZIP, 9), (Codec.LZ4, 1), (Codec.LZ4, 17), (Codec.ZSTD, -131072), (Codec.ZSTD, 22),
    (Codec.ZSTD, 0),
])
def test_check_level_accepts_the_range(codec: Codec, level: int) -> None:
    assert check_level(codec, level) == level


@pytest.mark.parametrize(("codec", "level"), [
    (Codec.GZIP, 0), (Codec.GZIP, 10), (Codec.GZIP, -1), (Codec.LZ4, 0), (Codec.LZ4, 18), (Codec.ZSTD, 23),
    (Codec.ZSTD, -131073), (Codec.NONE, 1), (Codec.SNAPPY, 1), (Codec.SNAPPY, 0),
])
def test_check_level_errors_are_config_errors(codec: Codec, level: int) -> None:
    with pytest.raises(ConfigError) as info:
        check_level(codec, level)
    assert info.value.found == level
    with pytest.raises(ConfigError):
        compress(codec, b"data", level=level)


def test_codec_parse() -> None:
    assert Codec.parse(" ZSTD ") is Codec.ZSTD
    assert [Codec.parse(c.label) for c in Codec] == list(Codec)
    with pytest.raises(ConfigError, match="unknown codec"):
        Codec.parse("brotli")


# --- found in review: work bounded on junk that Kafka's writer never produces ---------------------


def test_many_gzip_members_decode_in_linear_time() -> None:
    """Thousands of tiny members: zlib's leftover copies must stay small (was quadratic)."""
    payload = gzip.compress(b"x") * 40_000
    assert decompress(Codec.GZIP, payload) == b"x" * 40_000


def test_too_many_zstd_frames_are_refused() -> None:
    empty_frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"")
    with pytest.raises(DecompressionError, match="too many zstd frames"):
        decompress(Codec.ZSTD, empty_frame * 5000)
    assert decompress(Codec.ZSTD, empty_frame * 100) == b""


def test_zstd_frame_declaring_size_zero_but_holding_data_is_refused() -> None:
    """A frame whose walk bounds its output at 0 is still decoded (and must really be empty)."""
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b""))
    # Turn its empty raw block (3-byte header: last=1, type raw, size 0) into an RLE block of size 5.
    header_at = len(frame) - 3
    frame[header_at : header_at + 3] = ((5 << 3) | (1 << 1) | 1).to_bytes(3, "little")
    frame.append(0x41)
    with pytest.raises(DecompressionError):
        decompress(Codec.ZSTD, bytes(frame))
