"""Corruption suite: every damaged variant of a small mixed segment must end in an ``InvalidDataError`` that names
the byte position and the batch base offset, from ``verify_segment`` and from ``rewrite_segment`` alike.

The segment (about 2 KB) holds legacy v0 and v1 messages and wrappers copied from the Kafka-written golden
segments (a v0 lz4 wrapper with Kafka's KAFKA-3160 header checksum, a v1 snappy wrapper), v2 batches in every
codec and a control batch (golden batches moved to new offsets), and one v2 batch made by the builder.

What the CRCs cover decides what can be detected:

- v2: CRC-32C over [21, end): attributes to the last record. baseOffset [0, 8), batchLength [8, 12),
  partitionLeaderEpoch [12, 16) and magic [16] are outside it;
- legacy: CRC-32 over [16, end): magic to the end of the value. offset [0, 8) and messageSize [8, 12) are outside.

So a flip in a covered byte or in a stored CRC is always a CRC mismatch (CRC-32/-32C catch every burst of up to
32 bits); a flip of a length or a magic is always caught by the framing or the CRC; a flip of a base offset is
caught exactly when the offsets stop increasing (or leave the segment's range); and a leader epoch flip cannot
be detected at all, by us or by Kafka: it changes only the batch metadata digest.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import pytest

from tests.golden import GOLDEN
from tiering.errors import DecompressionError, InvalidDataError, TieringError
from tiering.kafka.batch import (
    V2_HEADER,
    V2_HEADER_SIZE,
    build_legacy_wrapper,
    build_v2,
    crc_legacy,
    crc_v2,
    parse_legacy_header,
)
from tiering.kafka.builder import BatchSpec, build_batch, encode_record, rebase_batch
from tiering.kafka.codecs import Codec, compress, decompress
from tiering.kafka.reader import iter_batches
from tiering.kafka.records import Record, parse_legacy_message
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment
from tiering.kafka.segment import SegmentSummary, iter_decoded, verify_segment

SEGMENT_BASE = 0
MIB = 1 << 20
INT32_MAX = 2**31 - 1


def _golden_entry(log: str, position: int) -> bytes:
    data = (GOLDEN / "logdir" / log / "00000000000000000000.log").read_bytes()
    (length,) = struct.unpack_from(">i", data, position + 8)
    return data[position : position + 12 + length]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One batch (v2) or legacy log entry of the test segment."""

    position: int
    size: int
    magic: int
    offset_field: int  # bytes [0, 8): v2 baseOffset; legacy: the entry's offset (a wrapper's LAST offset)
    base_offset: int  # Kafka's baseOffset(): for a legacy wrapper its first inner offset
    last_offset: int
    codec: Codec

    @property
    def crc_range(self) -> range:
        start = 21 if self.magic >= 2 else 16
        return range(self.position + start, self.position + self.size)

    @property
    def end(self) -> int:
        return self.position + self.size


@cache
def _segment() -> bytes:
    parts = [
        _golden_entry("legacy-v0-0", 0),  # v0, uncompressed, offset 0
        _golden_entry("legacy-v0-0", 106603),  # v0 lz4 wrapper (KAFKA-3160 checksum), offset 209
        _golden_entry("legacy-v1-0", 254603),  # v1, uncompressed, offset 233
        _golden_entry("legacy-v1-0", 471396),  # v1 snappy wrapper, offset 366
    ]
    offset = 400
    # edge-0: gzip, snappy, lz4, zstd batches of 3 records, and a control batch
    for position in (324437, 324549, 324665, 324774, 326811):
        batch = _golden_entry("edge-0", position)
        parts.append(rebase_batch(batch, offset, 0))
        (last_delta,) = struct.unpack_from(">i", batch, 23)
        offset += last_delta + 1 + 3
    records = [
        Record(offset, 1_700_000_000_000, None, b"v0", ((b"h", None),)),
        Record(offset + 1, 1_700_000_000_001, b"", None),
        Record(offset + 3, 1_699_999_999_999, b"key", b"value" * 5, ((b"a", b"b"), (b"", b""))),
    ]
    parts.append(build_batch(BatchSpec(offset, partition_leader_epoch=3), records))
    return b"".join(parts)


@cache
def _entries() -> tuple[Entry, ...]:
    out = []
    for decoded in iter_decoded(io.BytesIO(_segment())):
        h = decoded.header
        out.append(Entry(h.position, h.size, h.magic, h.offset, decoded.base_offset, h.last_offset, h.codec))
    return tuple(out)


@cache
def _summary() -> SegmentSummary:
    return verify_segment(io.BytesIO(_segment()), segment_base=SEGMENT_BASE)


def _entry_at(position: int) -> Entry:
    return next(e for e in _entries() if e.position <= position < e.end)


def test_the_segment_is_valid_and_mixed() -> None:
    data = _segment()
    entries = _entries()
    assert len(data) < 4096
    assert entries[-1].end == len(data)
    assert {e.magic for e in entries} == {0, 1, 2}
    assert {e.codec for e in entries if e.magic < 2} == {Codec.NONE, Codec.LZ4, Codec.SNAPPY}
    assert {e.codec for e in entries if e.magic == 2} == set(Codec)
    summary = _summary()
    assert summary.batch_count == len(entries)
    assert summary.control_batch_count == 1
    out = io.BytesIO()
    rewrite_segment(io.BytesIO(data), out, base_offset=SEGMENT_BASE, options=RewriteOptions(codec=Codec.ZSTD))
    assert verify_segment(io.BytesIO(out.getvalue())).records_sha256 == summary.records_sha256


# --- helpers ----------------------------------------------------------------------------------------------


def _flip(data: bytes, position: int, mask: int = 0xFF) -> bytes:
    out = bytearray(data)
    out[position] ^= mask
    return bytes(out)


_REWRITE_CODECS = [Codec.ZSTD, Codec.GZIP, Codec.NONE, Codec.LZ4, Codec.SNAPPY]


def _rewrite(data: bytes, variant: int = 0, **options: object) -> bytes:
    """Rewrite ``data`` (forced) to one of the codecs, chosen by ``variant``; returns the new segment."""
    out = io.BytesIO()
    codec = _REWRITE_CODECS[variant % len(_REWRITE_CODECS)]
    rewrite_segment(io.BytesIO(data), out, base_offset=SEGMENT_BASE,
                    options=RewriteOptions(codec=codec, force=True, **options))  # type: ignore[arg-type]
    return out.getvalue()


def _verify(data: bytes, **kwargs: object) -> SegmentSummary:
    return verify_segment(io.BytesIO(data), segment_base=SEGMENT_BASE, **kwargs)  # type: ignore[arg-type]


def _error(call: Callable[..., object], *args: object, **kwargs: object) -> TieringError | None:
    """The TieringError ``call(*args, **kwargs)`` raises (None when it succeeds); any other exception propagates."""
    try:
        call(*args, **kwargs)
    except TieringError as e:
        return e
    return None


def _check_located(e: TieringError | None, entry: Entry, what: str) -> None:
    assert isinstance(e, InvalidDataError), f"{what}: expected InvalidDataError, got {e!r}"
    assert e.position == entry.position, f"{what}: {e}"
    assert e.base_offset == entry.offset_field, f"{what}: {e}"
    assert f"byte {entry.position}" in str(e), f"{what}: {e}"
    assert f"batch base offset {entry.offset_field}" in str(e), f"{what}: {e}"


def _assert_detected(data: bytes, entry: Entry, what: str, variant: int = 0) -> None:
    """verify (both paths) and rewrite (to a codec chosen by ``variant``) must all fail, naming ``entry``."""
    _check_located(_error(_verify, data), entry, f"verify {what}")
    _check_located(_error(_verify, data, digests=False), entry, f"verify (no digests) {what}")
    _check_located(_error(_rewrite, data, variant), entry, f"rewrite {what}")


# --- flips inside the CRC-covered ranges ----------------------------------------------------------------


def test_flip_every_crc_covered_byte() -> None:
    data = _segment()
    checked = 0
    for entry in _entries():
        for position in entry.crc_range:
            _assert_detected(_flip(data, position), entry, f"flip at byte {position}", position)
            checked += 1
    assert checked > 1500


def test_flip_single_bits_in_crc_covered_headers() -> None:
    """Every single-bit flip of the covered header fields (v2 attributes..recordsCount, legacy magic..lengths)."""
    data = _segment()
    for entry in _entries():
        covered = range(entry.position + 21, entry.position + 61) if entry.magic >= 2 else range(
            entry.position + 16, entry.position + (30 if entry.magic == 1 else 22))
        for position in covered:
            for bit in range(8):
                _assert_detected(_flip(data, position, 1 << bit), entry, f"bit {bit} of byte {position}", bit)


# --- flips in the header before the CRC range -------------------------------------------------------------


def test_flip_stored_crc() -> None:
    data = _segment()
    for entry in _entries():
        crc_at = entry.position + (17 if entry.magic >= 2 else 12)
        for position in range(crc_at, crc_at + 4):
            for mask in (0xFF, 0x01, 0x80):
                corrupt = _flip(data, position, mask)
                _assert_detected(corrupt, entry, f"crc byte {position} ^ {mask:#x}", position)
                e = _error(_verify, corrupt)
                assert "CRC mismatch" in str(e)


def test_flip_length_field() -> None:
    """batchLength / messageSize: too small, past the end, or framing the wrong bytes: always caught here."""
    data = _segment()
    for entry in _entries():
        for position in range(entry.position + 8, entry.position + 12):
            for mask in [0xFF] + [1 << bit for bit in range(8)]:
                _assert_detected(_flip(data, position, mask), entry, f"length byte {position} ^ {mask:#x}", mask)


def test_flip_magic() -> None:
    """The v2 magic sits outside the CRC; any other value must still be refused (Kafka: "Invalid magic found in
    record"), never read as a v2 batch. (Legacy magics are CRC-covered: test_flip_every_crc_covered_byte.)"""
    data = _segment()
    for entry in _entries():
        if entry.magic == 2:
            for mask in [0xFF] + [1 << bit for bit in range(8)]:
                _assert_detected(_flip(data, entry.position + 16, mask), entry, f"magic ^ {mask:#x}", mask)


def test_flip_magic_behind_a_valid_crc() -> None:
    """A magic other than 0, 1 or 2 is refused even when the CRC matches (a legacy entry's CRC covers its magic,
    so this is a writer bug rather than bit rot); so is a legacy magic changed to the other legacy magic, whose
    layout differs."""
    data = _segment()
    for entry in _entries():
        if entry.magic == 2:
            continue
        for mask in [0xFF, 0x80, 0x02, 0x04, 0x01]:
            corrupt = bytearray(_flip(data, entry.position + 16, mask))
            _fix_crc(corrupt, entry)
            _assert_detected(bytes(corrupt), entry, f"legacy magic ^ {mask:#x} with a fixed CRC", mask)


def test_flip_leader_epoch_is_undetectable() -> None:
    """partitionLeaderEpoch is outside the v2 CRC: Kafka cannot tell either. The segment stays valid; only the
    batch metadata digest changes, and a rewrite carries the flipped epoch through."""
    data = _segment()
    original = _summary()
    for index, entry in enumerate(_entries()):
        if entry.magic < 2:
            continue
        (epoch,) = struct.unpack_from(">i", data, entry.position + 12)
        for position in range(entry.position + 12, entry.position + 16):
            for mask in (0xFF, 0x01, 0x80):
                corrupt = _flip(data, position, mask)
                (flipped,) = struct.unpack_from(">i", corrupt, entry.position + 12)
                assert flipped != epoch
                summary = _verify(corrupt)
                assert summary.records_sha256 == original.records_sha256
                assert summary.batches_sha256 != original.batches_sha256
                assert _verify(corrupt, digests=False).record_count == original.record_count
                rewritten = _rewrite(corrupt, position)
                assert _verify(rewritten).batches_sha256 == summary.batches_sha256
                epochs = [b.header.partition_leader_epoch for b in iter_decoded(io.BytesIO(rewritten))]
                assert epochs[index] == flipped


def _base_offset_cases() -> Iterator[tuple[Entry, int, bytes, int, int]]:
    """(entry, flipped offset field, corrupt segment, new base offset, new last offset) per base offset flip."""
    data = _segment()
    for entry in _entries():
        for position in range(entry.position, entry.position + 8):
            for mask in [0xFF] + [1 << bit for bit in range(8)]:
                corrupt = _flip(data, position, mask)
                (field,) = struct.unpack_from(">q", corrupt, entry.position)
                shift = field - entry.offset_field
                yield entry, field, corrupt, entry.base_offset + shift, entry.last_offset + shift


def _order_holds(entry: Entry, new_base: int, new_last: int) -> bool:
    """Kafka's rule across batches: each batch starts above the previous one's last offset, none below the
    segment's base offset."""
    entries = _entries()
    i = entries.index(entry)
    if new_base < SEGMENT_BASE:
        return False
    if i > 0 and new_base <= entries[i - 1].last_offset:
        return False
    return not (i + 1 < len(entries) and entries[i + 1].base_offset <= new_last)


def _expected_offset_error(entry: Entry, field: int, new_base: int) -> tuple[int, int] | None:
    """(position, base offset) the error must name after ``entry``'s offset field became ``field``, or None."""
    entries = _entries()
    i = entries.index(entry)
    if entry.magic == 0 and entry.codec is not Codec.NONE and field != entry.offset_field:
        return entry.position, field  # a v0 wrapper's offset must be its last (absolute) inner offset
    if new_base < SEGMENT_BASE or (i > 0 and new_base <= entries[i - 1].last_offset):
        return entry.position, new_base
    if entry.last_offset + field - entry.offset_field - SEGMENT_BASE > INT32_MAX:
        return entry.position, new_base  # beyond the int32 offsets of the indexes, refused at that batch
    if i + 1 < len(entries) and entries[i + 1].base_offset <= entry.last_offset + field - entry.offset_field:
        return entries[i + 1].position, entries[i + 1].base_offset
    return None


def test_flip_base_offset_is_judged_by_offset_order() -> None:
    """The offset field is outside every CRC. A flipped one is detectable only through its consequences:
    offsets that no longer increase (reported at the batch where they stop increasing), one below the segment's
    base, or (v0 wrappers, whose inner offsets are absolute) a wrapper offset that differs from its last inner
    message's. Otherwise the segment is valid and reads (and rewrites) with the flipped offsets: Kafka has no way
    to tell either."""
    allowed = refused = 0
    for entry, field, corrupt, new_base, new_last in _base_offset_cases():
        if new_last - SEGMENT_BASE > INT32_MAX and _order_holds(entry, new_base, new_last):
            continue  # see test_base_offset_beyond_the_index_range_is_refused
        what = f"offset of the batch at byte {entry.position} flipped to {field}"
        expected = _expected_offset_error(entry, field, new_base)
        if expected is not None:
            refused += 1
            position, base_offset = expected
            for e in (_error(_verify, corrupt), _error(_verify, corrupt, digests=False),
                      _error(_rewrite, corrupt, field)):
                assert isinstance(e, InvalidDataError), f"{what}: {e!r}"
                assert (e.position, e.base_offset) == (position, base_offset), f"{what}: {e}"
                assert f"byte {position}, batch base offset {base_offset}" in str(e), f"{what}: {e}"
            continue
        allowed += 1
        summary = _verify(corrupt)
        assert summary.records_sha256 != _summary().records_sha256, what
        decoded = list(iter_decoded(io.BytesIO(corrupt)))
        index = _entries().index(entry)
        assert decoded[index].base_offset == new_base, what
        assert decoded[index].header.last_offset == new_last, what
        rewritten = _rewrite(corrupt, field)
        assert _verify(rewritten).records_sha256 == summary.records_sha256, what
    assert allowed > 20
    assert refused > 100


def test_base_offset_beyond_the_index_range_is_refused() -> None:
    """A last batch moved more than 2**31 - 1 offsets past the segment's base cannot be indexed (Kafka's
    LogSegment.recover throws IndexOffsetOverflowException): verify and rewrite must both refuse it, whatever
    the batch's timestamps (rewrite refuses only when the batch happens to get an index entry)."""
    cases = [c for c in _base_offset_cases() if c[4] - SEGMENT_BASE > INT32_MAX and _order_holds(c[0], c[3], c[4])]
    assert cases
    for entry, field, corrupt, _, _ in cases:
        what = f"offset of the batch at byte {entry.position} flipped to {field}"
        for e in (_error(_verify, corrupt), _error(_rewrite, corrupt, field)):
            assert isinstance(e, InvalidDataError), what
            assert e.position == entry.position, f"{what}: {e}"


# --- damage behind a valid CRC ----------------------------------------------------------------------------


def _fix_crc(data: bytearray, entry: Entry) -> None:
    batch = memoryview(data)[entry.position : entry.end]
    if entry.magic >= 2:
        struct.pack_into(">I", batch, 17, crc_v2(batch))
    else:
        struct.pack_into(">I", batch, 12, crc_legacy(batch))


def test_damage_behind_a_valid_crc_gets_one_verdict() -> None:
    """A writer bug rather than bit rot: bytes changed and the CRC recomputed. Header sanity, decompression and
    the record walk decide; the digest path (pure Python), the fast path (compiled walker) and the rewriter must
    agree, and any error is an InvalidDataError naming the batch (or the next one, when a changed
    lastOffsetDelta makes the offsets stop increasing there)."""
    data = _segment()
    entries = _entries()
    verdicts = {True: 0, False: 0}
    for i, entry in enumerate(entries):
        start = entry.crc_range.start + (0 if entry.magic >= 2 else 1)  # legacy magic: test_flip_magic_behind...
        for position in range(start, entry.end):
            corrupt = bytearray(_flip(data, position))
            _fix_crc(corrupt, entry)
            what = f"flip at byte {position} with a fixed CRC"
            slow = _error(_verify, bytes(corrupt))
            fast = _error(_verify, bytes(corrupt), digests=False)
            rewrite = _error(_rewrite, bytes(corrupt), position)
            assert (slow is None) == (fast is None) == (rewrite is None), f"{what}: {slow!r} {fast!r} {rewrite!r}"
            verdicts[slow is None] += 1
            if slow is None or fast is None or rewrite is None:
                continue
            for e in (slow, fast, rewrite):
                assert isinstance(e, InvalidDataError), f"{what}: {e!r}"
                assert e.position in (entry.position, entries[min(i + 1, len(entries) - 1)].position), f"{what}: {e}"
                assert e.base_offset is not None, f"{what}: {e}"
                assert f"byte {e.position}, batch base offset {e.base_offset}" in str(e), f"{what}: {e}"
            assert slow.position == fast.position == rewrite.position, f"{what}: {slow} / {fast} / {rewrite}"
    assert verdicts[True] > 0
    assert verdicts[False] > 0


# --- truncation -------------------------------------------------------------------------------------------


def _check_truncation(length: int, e: TieringError | None, summary: SegmentSummary | None) -> None:
    starts = [entry.position for entry in _entries()]
    if length in starts:
        assert e is None, f"prefix of {length} bytes is a valid segment: {e}"
        assert summary is not None
        assert summary.batch_count == starts.index(length)
        return
    entry = _entry_at(length)
    assert isinstance(e, InvalidDataError), f"prefix of {length} bytes: {e!r}"
    assert e.position == entry.position, f"prefix of {length} bytes: {e}"
    assert f"byte {entry.position}" in str(e)
    if length - entry.position >= 17:  # the reader saw the whole prefix up to the magic
        assert e.base_offset == entry.offset_field, f"prefix of {length} bytes: {e}"
        assert f"batch base offset {entry.offset_field}" in str(e)


def test_truncate_at_every_length_in_memory() -> None:
    data = _segment()
    valid = []
    for length in range(len(data)):
        prefix = data[:length]
        summary = None
        e = _error(_verify, prefix)
        if e is None:
            summary = _verify(prefix)
            valid.append(length)
        _check_truncation(length, e, summary)
        if length % 7 == 0:
            rewrite_error = _error(_rewrite, prefix, length)
            assert (rewrite_error is None) == (e is None), f"prefix of {length} bytes: {rewrite_error!r}"
            if e is not None:
                assert rewrite_error.position == e.position  # type: ignore[union-attr]
    assert valid == [entry.position for entry in _entries()]


def test_truncate_at_every_length_on_disk(tmp_path: Path) -> None:
    """With a real file the reader knows the size: a length past the end is refused before reading it."""
    data = _segment()
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(data)
    with path.open("r+b") as f:
        for length in reversed(range(len(data))):
            f.truncate(length)
            f.seek(0)
            e = _error(verify_segment, f, segment_base=SEGMENT_BASE)
            summary = None
            if e is None:
                f.seek(0)
                summary = verify_segment(f, segment_base=SEGMENT_BASE)
            _check_truncation(length, e, summary)


# --- absurd lengths ---------------------------------------------------------------------------------------


def _with_length(data: bytes, entry: Entry, length: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(">i", out, entry.position + 8, length)
    return bytes(out)


def _absurd_cases() -> list[tuple[int, int]]:
    """(entry index, length field) pairs: huge, negative, zero, one below each magic's minimum."""
    cases = []
    for i, entry in enumerate(_entries()):
        minimum = {0: 14, 1: 22, 2: 49}[entry.magic]
        for length in (INT32_MAX, 2**30, -1, -(2**31), 0, minimum - 1):
            cases.append((i, length))
    return cases


@pytest.mark.parametrize(("index", "length"), _absurd_cases())
def test_absurd_length_is_refused_before_allocating(index: int, length: int, tmp_path: Path) -> None:
    entry = _entries()[index]
    corrupt = _with_length(_segment(), entry, length)
    path = tmp_path / "segment.log"
    path.write_bytes(corrupt)
    tracemalloc.start()
    try:  # (a small decompression limit: what is measured here is the reader's allocation)
        in_memory = _error(_verify, corrupt, limit=MIB)
        with path.open("rb") as f:
            on_disk = _error(verify_segment, f, segment_base=SEGMENT_BASE, limit=MIB)
        rewritten = _error(_rewrite, corrupt, decompression_limit=MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for e in (in_memory, on_disk, rewritten):
        _check_located(e, entry, f"length {length}")
        assert str(length) in str(e) or str(length + 12) in str(e)
    assert peak < 4 * MIB


def test_max_batch_bytes_is_configurable() -> None:
    data = _segment()
    biggest = max(_entries(), key=lambda e: e.size)
    e = _error(_rewrite, data, max_batch_bytes=biggest.size - 1)
    _check_located(e, biggest, "max_batch_bytes")
    assert "maximum" in str(e)
    rewritten = _rewrite(data, max_batch_bytes=biggest.size)
    assert _verify(rewritten).records_sha256 == _summary().records_sha256


# --- decompression bombs behind valid CRCs ----------------------------------------------------------------

BOMB = bytes(32 * MIB)


@cache
def _bombed(kind: str) -> tuple[bytes, Entry]:
    """The segment with one batch's compressed payload replaced by 32 MiB of zeros in ``kind`` (valid CRC)."""
    data = _segment()
    if kind.startswith("v2-"):
        codec = Codec[kind[3:].upper()]
        entry = next(e for e in _entries() if e.magic == 2 and e.codec is codec)
        header, payload = build_v2(data[entry.position : entry.end], codec, compress(codec, BOMB, level=1
                                                                                          if codec is Codec.GZIP
                                                                                          else None))
        batch = header + payload
    else:
        magic, codec = int(kind[1]), Codec[kind.split("-")[1].upper()]
        entry = next(e for e in _entries() if e.magic == magic and e.codec is not Codec.NONE)
        original = data[entry.position : entry.end]
        h = parse_legacy_header(original, 0)
        level = 1 if codec is Codec.GZIP else None
        batch = build_legacy_wrapper(original, h, codec, compress(codec, BOMB, level=level, magic=magic))
    bombed = data[: entry.position] + batch + data[entry.end :]
    new = dataclasses.replace(entry, size=len(batch), codec=codec)
    return bombed, new


BOMB_KINDS = ["v2-gzip", "v2-snappy", "v2-lz4", "v2-zstd", "v1-gzip", "v1-lz4", "v0-snappy", "v0-lz4"]


@pytest.mark.parametrize("kind", BOMB_KINDS)
def test_decompression_bomb_inside_a_valid_batch(kind: str) -> None:
    bombed, entry = _bombed(kind)
    assert len(bombed) < 4 * MIB
    assert entry.position in [b.header.position for b in iter_batches(io.BytesIO(bombed))]  # every CRC holds
    tracemalloc.start()
    try:
        errors = [
            _error(_verify, bombed, limit=MIB),
            _error(_verify, bombed, limit=MIB, digests=False),
            _error(_rewrite, bombed, decompression_limit=MIB),
        ]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for e in errors:
        assert isinstance(e, DecompressionError), repr(e)
        _check_located(e, entry, kind)
        assert str(MIB) in str(e), str(e)  # names the configured limit
    assert peak < 16 * MIB


@pytest.mark.parametrize("kind", BOMB_KINDS)
def test_decompressed_bomb_is_refused_as_records(kind: str) -> None:
    """Under a limit above its size the batch decompresses, and its 32 MiB of zeros are not records (nor inner
    messages): the error still names the batch in the file."""
    bombed, entry = _bombed(kind)
    for e in (_error(_verify, bombed, limit=64 * MIB), _error(_verify, bombed, limit=64 * MIB, digests=False)):
        assert isinstance(e, InvalidDataError), repr(e)
        assert not isinstance(e, DecompressionError), repr(e)
        _check_located(e, entry, f"{kind} decompressed")


def test_inner_message_errors_name_the_wrapper() -> None:
    """A wrapper whose inner message set is damaged (CRC recomputed, so only the inner framing can tell): the
    error names the wrapper's byte position and offset in the segment, not positions or offsets inside the
    decompressed inner message set."""
    data = _segment()
    for entry in _entries():
        if entry.magic == 2 or entry.codec is Codec.NONE:
            continue
        original = data[entry.position : entry.end]
        h = parse_legacy_header(original, 0)
        inner = decompress(entry.codec, parse_legacy_message(original, h).value or b"", magic=entry.magic)
        for damage in (bytes(inner[:8]) + b"\x7f\xff\xff\xff" + bytes(inner[12:]),  # inner messageSize
                       bytes(inner[:16]) + b"\x05" + bytes(inner[17:]),  # inner magic
                       bytes(inner[:17]) + bytes([inner[17] | 0x07]) + bytes(inner[18:])):  # inner codec
            wrapper = build_legacy_wrapper(original, h, entry.codec,
                                           compress(entry.codec, damage, magic=entry.magic))
            corrupt = data[: entry.position] + wrapper + data[entry.end :]
            moved = dataclasses.replace(entry, size=len(wrapper))
            _assert_detected(corrupt, moved, f"inner damage in the wrapper at byte {entry.position}")


# --- several problems: the first one in file order wins ---------------------------------------------------


def test_the_first_problem_in_file_order_is_reported() -> None:
    bombed, bomb_entry = _bombed("v2-zstd")
    entries = [e for e in _entries() if e.position > bomb_entry.position]
    later = entries[-1]
    shift = bomb_entry.size - next(e for e in _entries() if e.position == bomb_entry.position).size
    corrupt = _flip(bombed, later.position + shift + 40)  # a CRC mismatch in the last batch
    for e in (_error(_verify, corrupt, limit=MIB),
              _error(_rewrite, corrupt, decompression_limit=MIB)):
        assert isinstance(e, DecompressionError), repr(e)
        assert e.position == bomb_entry.position


# --- found in review: CRC-valid values at the edges of int64 ---------------------------------------


def test_last_offset_overflowing_int64_is_invalid_data() -> None:
    top = (1 << 63) - 1
    batch = bytearray(build_batch(BatchSpec(top, last_offset_delta=1), [Record(top, 1000, b"k", b"v")]))
    struct.pack_into(">I", batch, 17, crc_v2(batch))
    for digests in (True, False):
        with pytest.raises(InvalidDataError, match="overflows int64"):
            verify_segment(io.BytesIO(bytes(batch)), digests=digests)


def test_record_timestamps_wrap_around_like_java() -> None:
    """Java adds baseTimestamp and the delta in int64 arithmetic; a CRC-valid batch may wrap."""
    base_ts = 1 << 62
    records = encode_record(Record(0, base_ts, None, b"a"), 0, base_ts) + encode_record(
        Record(1, base_ts + (1 << 62), None, b"b"), 0, base_ts)  # the second delta is 2^62: base + delta wraps
    header = bytearray(V2_HEADER.pack(0, V2_HEADER_SIZE - 12 + len(records), 0, 2, 0, 0, 1, base_ts, base_ts,
                                      -1, -1, -1, 2))
    batch = header + records
    struct.pack_into(">I", batch, 17, crc_v2(batch))
    decoded = next(iter_decoded(io.BytesIO(bytes(batch))))
    assert [r.timestamp for r in decoded.records] == [base_ts, -(1 << 63)]
    assert verify_segment(io.BytesIO(bytes(batch))).record_count == 2
