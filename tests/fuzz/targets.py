"""Fuzz targets for the compiled code that reads segment bytes, each compared with its Python reference.

A target takes one input (bytes) and raises on a finding: a verdict or a result that differs from the
reference's. Crashes, sanitizer reports (AddressSanitizer, UndefinedBehaviorSanitizer) and hangs are the
fuzzer's to catch (``tests/fuzz/run.py`` runs these under libFuzzer through atheris, with the modules built
with both sanitizers). The same targets replay the regression inputs and seeds in the ordinary test run.

Input layouts (a small fixed prefix of parameters, then the bytes under test, so that seeds made from real
records sections keep their meaning):

- ``walk``, ``digest``, ``keymap``: count u16 LE | last offset delta u16 LE | flags u8 | records section.
  flags: bit 0 LogAppendTime, bit 1 base offset near the end of int64, bit 2 timestamp near int64's ends
  (bit 3: which end); for ``keymap`` also bit 4 tombstones past their horizon, bit 5 the batch has a
  horizon, bits 6-7 where the key map starts (0-3 offsets past the base offset).
- ``merge``: flags u8 | cut 1 u16 LE | cut 2 u16 LE | the sections, concatenated and cut in up to three.
- ``scan``: a segment's bytes (batches back to back).
- ``proof``: pairs u8 | per pair, new length u16 LE and original length u16 LE | the bytes, each pair's new
  (zstd) bytes then its original bytes (lengths cut to what is there).
- ``zstd``: limit u16 LE (in units of 64 bytes; 0xFFFF: 1 GiB) | a zstd records section.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import struct
from collections.abc import Callable
from typing import Final

from tiering.errors import TieringError
from tiering.kafka import _keymap, _proof, _records, _walker
from tiering.kafka.batch import BatchHeader, TimestampType, parse_v2_header
from tiering.kafka.builder import BatchSpec, build_batch, encode_record
from tiering.kafka.codecs import Codec, zstd_reference
from tiering.kafka.reader import iter_batches
from tiering.kafka.records import Record, decode_v2
from tiering.kafka.rewrite import _first_unproven
from tiering.kafka.segment import DecodedBatch, Digests

INT64_MAX: Final = (1 << 63) - 1
_HEADER = parse_v2_header(build_batch(BatchSpec(0), [Record(0, 1, None, None)]), 0)


class Finding(AssertionError):
    """The compiled code and its reference disagree."""


class Unavailable(RuntimeError):
    """The compiled code under test did not load here: the target cannot run (never a pass)."""


NEEDS_LIBZSTD: Final = ("proof", "zstd")  # the targets of _proof, which loads libzstd at run time


def _require_proof() -> None:
    if not _proof.available():
        raise Unavailable("the compiled zstd proof did not load (no libzstd here): the proof and zstd targets "
                          "cannot run")


def _params(data: bytes) -> tuple[int, int, int, int, bool, bytes]:
    """(count, last offset delta, base offset, timestamp, LogAppendTime, section) of a walk/digest input."""
    count, last = struct.unpack_from("<HH", data)
    flags = data[4]
    base = INT64_MAX - 70_000 if flags & 2 else 1_000
    ts = (INT64_MAX - 5 if flags & 8 else -INT64_MAX + 5) if flags & 4 else 1_700_000_000_000
    return count, last, base, ts, bool(flags & 1), data[5:]


def _header(count: int, last: int, base: int, ts: int, log_append: bool) -> BatchHeader:
    return _HEADER._replace(
        offset=base, last_offset=base + last, records_count=count, base_timestamp=ts, max_timestamp=ts,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME)


def _reference(count: int, last: int, base: int, ts: int, log_append: bool,
               section: bytes) -> list[Record] | None:
    try:
        return decode_v2(_header(count, last, base, ts, log_append), section)
    except TieringError:
        return None


def has_wide_varlong(section: bytes) -> bool:
    """Whether nine continuation bytes are followed by a last byte holding bits past the 64th: a timestamp
    delta Java reads modulo 2^64 and the reference reads whole, so the compiled code leaves it to the
    reference."""
    return any(all(b & 0x80 for b in section[i:i + 9]) and 2 <= section[i + 9] < 0x80
               for i in range(len(section) - 9))


def walk(data: bytes) -> None:
    """_walker.walk_v2, fast and careful, against records.decode_v2: the same verdict and count."""
    if len(data) < 5:
        return
    count, last, base, ts, log_append, section = _params(data)
    verdicts = []
    for fast in (True, False):
        try:
            verdicts.append(_walker.walk_v2(section, count, last, fast))
        except ValueError:
            verdicts.append(None)
    records = _reference(count, last, base, ts, log_append, section)
    expected = None if records is None else len(records)
    if verdicts != [expected, expected]:
        raise Finding(f"walk_v2 fast/careful {verdicts}, decode_v2 {expected}")


def digest(data: bytes) -> None:
    """_records.digest_v2 against the bytes segment.Digests hashes for decode_v2's records."""
    if len(data) < 5:
        return
    count, last, base, ts, log_append, section = _params(data)
    encoded = _records.digest_v2(section, base, ts, log_append, count, last)
    records = _reference(count, last, base, ts, log_append, section)
    if records is None:
        if encoded is not None:
            raise Finding("digest_v2 vouched for a section decode_v2 rejects")
        return
    if encoded is None:
        if not has_wide_varlong(section) and not _offset_overflows(records):
            raise Finding("digest_v2 refused a section decode_v2 reads")
        return
    h = _header(count, last, base, ts, log_append)
    raw = type("Raw", (), {"header": h})()
    mine, theirs = Digests(), Digests()
    mine.update_encoded(h, len(records), encoded)
    theirs.update(DecodedBatch(raw, records, len(section)))  # type: ignore[arg-type]
    if mine.records_sha256 != theirs.records_sha256:
        raise Finding("digest_v2's input differs from the reference's records")


def _offset_overflows(records: list[Record]) -> bool:
    return any(r.offset > INT64_MAX for r in records)


def merge(data: bytes) -> None:
    """_records.merge_v2 against builder.encode_record over decode_v2's records of each section."""
    if len(data) < 5:
        return
    flags = data[0]
    body = data[5:]
    cuts = sorted({min(c, len(body)) for c in struct.unpack_from("<HH", data, 1)})
    edges = [0, *cuts, len(body)]
    sections = [body[a:b] for a, b in itertools.pairwise(edges)][: 1 + flags % 3]
    log_append = bool(flags & 4)
    bases = []
    offset = INT64_MAX - 200_000 if flags & 8 else 0
    for i, _ in enumerate(sections):
        ts = 1_700_000_000_000 + ((0, INT64_MAX // 2, -INT64_MAX // 2)[i] if flags & 16 else i * 1_000)
        bases.append((offset, ts, 65_535))
        offset = min(offset + 65_536 + (1 << 31 if flags & 32 and i == 0 else 0), INT64_MAX - 65_535)
    result = _records.merge_v2(sections, bases, log_append, bases[0][0])
    decoded = []
    for section, (base, ts, last) in zip(sections, bases, strict=True):
        records = _reference(_count(section), last, base, ts, log_append, section)
        if records is None:
            if result is not None:
                raise Finding("merge_v2 merged a section decode_v2 rejects")
            return
        decoded.extend(records)
    if result is None:
        if not any(has_wide_varlong(s) for s in sections) and not _out_of_range(decoded, bases[0][0]):
            raise Finding("merge_v2 refused sections the reference reads and can encode")
        return
    first = decoded[0].timestamp if decoded else 0
    expected = (b"".join(encode_record(r, bases[0][0], first) for r in decoded), len(decoded), first,
                max((r.timestamp for r in decoded), default=-1))
    if result != expected:
        raise Finding("merge_v2's merged section differs from the reference's")


def _count(section: bytes) -> int:
    """The number of records decode_v2 would find (a count that never fails the check by itself)."""
    try:
        return len(decode_v2(_HEADER._replace(last_offset=65_535, records_count=None), section))
    except TieringError:
        return -1


def _out_of_range(records: list[Record], base: int) -> bool:
    first = records[0].timestamp if records else 0
    return any(not 0 <= r.offset - base <= 0x7FFFFFFF or r.offset > INT64_MAX
               or not -(1 << 63) <= r.timestamp - first <= INT64_MAX for r in records)


def scan(data: bytes) -> None:
    """_walker.scan_v2 against the Python reader: every row it gives is a batch the reader reads at the same
    place with the same fields, in order."""
    rows = _walker.scan_v2(data, 0, len(data))
    if not rows:
        return
    reference = []
    try:
        for raw in iter_batches(io.BytesIO(data)):
            if len(reference) == len(rows):
                break
            h = raw.header
            reference.append((h.position, h.size, h.offset, h.last_offset, h.max_timestamp, h.attributes,
                              h.records_count))
    except TieringError:
        pass
    if [tuple(r) for r in rows] != reference[: len(rows)] or len(reference) < len(rows):
        raise Finding(f"scan_v2 rows {rows[:3]}... differ from the reader's {reference[:3]}...")


def proof_input(news: list[bytes], originals: list[bytes]) -> bytes:
    """A ``proof`` input from its pairs (seeds, regressions)."""
    head = struct.pack("<B", len(news)) + b"".join(struct.pack("<HH", len(n), len(o))
                                                   for n, o in zip(news, originals, strict=True))
    return head + b"".join(n + o for n, o in zip(news, originals, strict=True))


def _pairs(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """A ``proof`` input's (news, originals); pairs whose lengths are not all there are left out."""
    count = min(data[0], 8, (len(data) - 1) // 4)
    lengths = [struct.unpack_from("<HH", data, 1 + 4 * i) for i in range(count)]
    body, pos = data[1 + 4 * count:], 0
    news, originals = [], []
    for n, o in lengths:
        news.append(body[pos:pos + n])
        originals.append(body[pos + n:pos + n + o])
        pos += n + o
    return news, originals


def proof(data: bytes) -> None:
    """_proof.first_mismatch and _proof.ProofThread against rewrite's Python proof (the zstandard package):
    the same first batch whose bytes do not decode to its original, or -1."""
    _require_proof()
    if not data:
        return
    news, originals = _pairs(data)
    if not news or not all(originals):  # a v2 batch's records section is never empty
        return
    expected = _first_unproven(Codec.ZSTD, news, originals)
    direct = _proof.first_mismatch(news, originals)
    thread = _proof.ProofThread()
    try:
        thread.submit(news, originals)
        threaded = thread.result()
    finally:
        thread.close()
    if not direct == threaded == expected:
        raise Finding(f"first_mismatch {direct}, ProofThread {threaded}, the zstandard package's proof {expected}")


def zstd_input(section: bytes, limit: int) -> bytes:
    """A ``zstd`` input: ``section`` decoded within ``limit`` bytes (rounded up to the layout's unit)."""
    units = 0xFFFF if limit >= 0xFFFE * 64 else -(-limit // 64)
    return struct.pack("<H", units) + section


def zstd(data: bytes) -> None:
    """_proof.decompress against codecs.zstd_reference (the zstandard package behind a frame walk in Python): the
    compiled answer, where it gives one, is the reference's bytes, and it gives none where the reference
    refuses the section."""
    _require_proof()
    if len(data) < 2:
        return
    (units,) = struct.unpack_from("<H", data)
    limit = 1 << 30 if units == 0xFFFF else units * 64
    section = data[2:]
    try:
        expected: bytes | None = zstd_reference(section, limit)
    except TieringError:
        expected = None
    got = _proof.decompress(section, limit)
    if got is not None and got != expected:
        raise Finding(f"_proof.decompress answered {len(got)} bytes where the reference "
                      + ("refused the section" if expected is None else f"decoded {len(expected)} other bytes"))


_MAP_CAPACITY: Final = 3  # small: the map fills up inside a section now and then
_NEW_HORIZON: Final = 1_800_000_000_000


def _md5(key: bytes) -> bytes:
    return hashlib.md5(key).digest()


def _map_reference(records: list[Record], start: int) -> tuple[dict[bytes, int], tuple[int, int, bool]]:
    """buildOffsetMapForSegment over decode_v2's records: the map by MD5, and (puts, last put or -1, full)."""
    offsets: dict[bytes, int] = {}
    puts, last = 0, -1
    for r in records:
        if r.key is None or r.offset < start:
            continue
        if len(offsets) >= _MAP_CAPACITY:
            return offsets, (puts, last, True)
        offsets[_md5(r.key)] = last = r.offset
        puts += 1
    return offsets, (puts, last, False)


def _filter_reference(records: list[Record], base: int, offsets: dict[bytes, int], latest: int, drop: bool,
                      has_horizon: bool, horizon: int) -> tuple[object, ...] | None:
    """shouldRetainRecord and the rebuilt section as keycompact's reference writes it; None where a record to
    re-encode has a timestamp delta outside int64 (the compiled filter leaves that to the reference)."""
    kept: list[Record] = []
    superseded = no_key = dropped = 0
    for r in records:
        if r.offset > latest:
            kept.append(r)
        elif r.key is None:
            no_key += 1
        elif r.offset < offsets.get(_md5(r.key), -1):
            superseded += 1
        elif r.value is None and drop:
            dropped += 1
        else:
            kept.append(r)
    tombstones = sum(r.value is None for r in kept)
    stamp = not has_horizon and tombstones > 0
    base_ts = horizon if has_horizon or stamp else (kept[0].timestamp if kept else 0)
    copied = len(kept) == len(records) and not stamp
    if not copied and any(not -(1 << 63) <= r.timestamp - base_ts <= INT64_MAX for r in kept):
        return None
    section = None if copied else b"".join(encode_record(r, base, base_ts) for r in kept)
    return (len(kept), superseded, no_key, dropped, tombstones, section, base_ts,
            max((r.timestamp for r in kept), default=-1))


def keymap(data: bytes) -> None:
    """_keymap.KeyMap's map_v2 and filter_v2 against buildOffsetMapForSegment and shouldRetainRecord over
    decode_v2's records (keys by MD5, as the broker's map): the same puts and pass end, the same records
    kept, counted and re-encoded."""
    if len(data) < 5:
        return
    count, last, base, ts, log_append, section = _params(data)
    flags = data[4]
    drop, has_horizon, start = bool(flags & 16), bool(flags & 32), base + (flags >> 6)
    horizon = ts + 1000 if has_horizon and ts < INT64_MAX - 1000 else _NEW_HORIZON
    m = _keymap.KeyMap(8, _MAP_CAPACITY)
    mapped = m.map_v2(section, base, last, count, start)
    records = _reference(count, last, base, ts, log_append, section)
    if records is None or mapped is None:
        if mapped is not None:
            raise Finding("map_v2 vouched for a section decode_v2 rejects")
        if records is not None and not has_wide_varlong(section) and not _offset_overflows(records):
            raise Finding("map_v2 refused a section decode_v2 reads")
        if len(m):
            raise Finding(f"map_v2 refused the section but left {len(m)} keys in the map")
        return
    offsets, expected = _map_reference(records, start)
    if mapped != expected or len(m) != len(offsets):
        raise Finding(f"map_v2 {mapped} with {len(m)} keys, the reference {expected} with {len(offsets)}")
    for r in records:
        if r.key is not None and m.get(r.key) != offsets.get(_md5(r.key), -1):
            raise Finding(f"the map gives {m.get(r.key)} for key {r.key!r}, the reference {offsets.get(_md5(r.key))}")
    latest = base + last // 2
    filtered = m.filter_v2(section, base, ts, log_append, last, count, latest, drop, has_horizon, horizon)
    want = _filter_reference(records, base, offsets, latest, drop, has_horizon, horizon)
    if filtered != want:
        raise Finding(f"filter_v2 {filtered}, the reference {want}")


TARGETS: Final[dict[str, Callable[[bytes], None]]] = {"walk": walk, "digest": digest, "merge": merge, "scan": scan,
                                                      "proof": proof, "keymap": keymap, "zstd": zstd}
