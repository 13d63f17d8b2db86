"""Key compaction at rest: one pass of Kafka's log cleaner (``cleanup.policy=compact``) over a partition's
archived segments, with the cleaner's own rules. Pure: segment streams and ``.txnindex`` entries in, cleaned
segment bytes and figures out. Each rule names the code it restates (Kafka 4.3, ``Cleaner`` /
``LogCleaner``, ``CleanedTransactionMetadata``, ``MemoryRecords.filterTo``); docs/key-compaction.md has
them with the reasons.

**What is cleaned** (``LogCleanerManager.cleanableOffsets``): the segments below the first uncleanable
offset, which is the smallest of the active segment's base offset, the first unstable offset (the first
offset of the oldest transaction without a marker), and the base offset of the first segment holding a
record younger than ``min_compaction_lag_ms``; rounded down to a segment's base offset. The active segment
is never cleaned, only read for the producers' state.

**The key map** (``buildOffsetMapForSegment``): over the cleaned range, each key's latest offset. Control
batches and the batches of aborted transactions are not in it; records without a key are not either.
``latest_offset`` is the range's last offset.

**A record is kept** (``shouldRetainRecord``) when it lies past the map's latest offset; else, when it has
a key, it is its key's latest and it has a value or its batch's delete horizon has not passed (a batch
without a horizon keeps its tombstones on this pass). A record without a key is dropped.

**Transactions** (``CleanedTransactionMetadata``): a transactional batch of an aborted transaction (from the
``.txnindex``) is dropped with its records; an ABORT marker is kept while this pass saw its transaction's
data (and its ``.txnindex`` entry goes into the cleaned segment's), else it may go; a COMMIT marker may go
when this pass saw no batch of its transaction. A marker that may go is stamped with a delete horizon
first, and removed on a later pass at or after it.

**A batch** (``checkBatchRetention``, ``filterTo``): a producer's last data batch in the log, and the
batch ending at the first uncleanable offset, are kept even when no record of them is (as a header without
records: same offsets, producer, epoch and sequence, so a broker restores its producer state and the log end
offset); any other batch without a record left is dropped. A batch that loses no record and needs no
horizon is copied byte for byte; any other is rebuilt with the same base offset and last offset (so
sequences and offset gaps survive), its records unchanged, and stamped with ``now + delete.retention.ms``
as its delete horizon (``baseTimestamp``, attribute bit 0x40) when it keeps a tombstone or a marker that
may go and has no horizon yet.

Unlike the broker: every producer's last batch is kept (a broker forgets producers idle for
``producer.id.expiration.ms``); neighbours are cleaned into one segment as the broker groups them only with
``CleanOptions.merge`` (the topic's ``segment.bytes``), else each into one of its own; legacy (magic 0/1)
entries are refused; a rebuilt batch takes ``codec`` (the broker: the batch's own codec at its default level).
"""

from __future__ import annotations

import heapq
import io
import itertools
import math
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Final, Protocol

from tiering.errors import ConfigError, CorruptBatchError, TieringError, UnsupportedError
from tiering.kafka import _keymap
from tiering.kafka.batch import BatchHeader, TimestampType, parse_v2_header, timestamp_base
from tiering.kafka.builder import BatchSpec, assemble_batch, build_batch
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec
from tiering.kafka.index import (
    DEFAULT_INDEX_INTERVAL_BYTES,
    AbortedTxn,
    BatchPosition,
    Indexes,
    build_indexes,
    encode_txn_index,
)
from tiering.kafka.merge import Limits, Sizes, group_by_size
from tiering.kafka.reader import RawBatch, iter_batches
from tiering.kafka.records import Engine
from tiering.kafka.segment import DecodedBatch, OffsetOrder, decode_batch, decode_located, payload_of

DEFAULT_DELETE_RETENTION_MS: Final = 86_400_000  # Kafka's delete.retention.ms
# The broker's key map (SkimpyOffsetMap): a slot per key, its 16-byte MD5 and an 8-byte offset, in a buffer of
# log.cleaner.dedupe.buffer.size bytes a cleaner thread (at most 2 GiB); a pass stops mapping keys once they
# fill log.cleaner.io.buffer.load.factor of the slots.
KEY_MAP_SLOT_BYTES: Final = 24
KEY_MAP_LOAD_FACTOR: Final = 0.9
DEFAULT_KEY_MAP_BYTES: Final = 128 * 1024 * 1024  # log.cleaner.dedupe.buffer.size's default
_KEY_MAP_MAX_BYTES: Final = 2**31 - 1


def keys_in_map(map_bytes: int) -> int:
    """The distinct keys a pass maps before its key map is full, with ``map_bytes`` of it: where a broker's
    cleaner with that dedupe buffer a thread ends the same pass."""
    slots = min(map_bytes, _KEY_MAP_MAX_BYTES) // KEY_MAP_SLOT_BYTES
    return int(slots * KEY_MAP_LOAD_FACTOR)


DEFAULT_MAX_KEYS: Final = keys_in_map(DEFAULT_KEY_MAP_BYTES)  # a broker's default cleaner thread's pass
NO_PRODUCER: Final = -1
ABORT, COMMIT = 0, 1  # control record types (the key's second int16)
@dataclass(frozen=True, slots=True)
class CleanOptions:
    now_ms: int  # the pass's clock: delete horizons stamped now expire at now + delete_retention_ms
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    min_compaction_lag_ms: int = 0  # from the newest record of the partition
    first_dirty_offset: int = 0  # where the key map starts: the previous pass's end (Kafka's checkpoint)
    # the key map's bound (None: none): a full map ends the pass early, the rest on the next one
    max_keys: int | None = DEFAULT_MAX_KEYS
    codec: Codec | None = None  # a rebuilt batch's codec (None: its own)
    level: int | None = None
    index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES
    decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT
    # the topic's segment.bytes and segment.index.bytes: neighbours are cleaned into one segment as the broker
    # groups them (tiering.kafka.merge.group_by_size); None: each segment into one of its own
    merge: Limits | None = None
    engine: Engine = Engine.NATIVE  # the record work: compiled (_keymap.c) or the Python reference


@dataclass(frozen=True, slots=True)
class Segment:
    """One segment of the partition: its base offset, a way to read its ``.log`` (called once per pass), the
    entries of its ``.txnindex``, and the bytes of its files (what the cleaner groups neighbours by)."""

    base_offset: int
    open: Callable[[], BinaryIO]
    aborted: tuple[AbortedTxn, ...] = ()
    name: str = ""
    log_bytes: int = 0
    index_bytes: int = 0
    time_index_bytes: int = 0


class OffsetMap(Protocol):
    """The key map of a pass: each key's latest offset, full at its bound (``_keymap.KeyMap`` compiled, keyed
    by the key's MD5 as the broker's; :class:`DictMap` the reference)."""

    def __len__(self) -> int: ...
    @property
    def full(self) -> bool: ...
    def get(self, key: bytes | bytearray | memoryview, default: int = -1) -> int: ...
    def put(self, key: bytes | bytearray | memoryview, offset: int) -> None: ...


class DictMap:
    """The Python reference's key map: a dict of the keys themselves, full at ``max_keys`` (None: never)."""

    def __init__(self, max_keys: int | None) -> None:
        self._offsets: dict[bytes, int] = {}
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._offsets)

    @property
    def full(self) -> bool:
        return self._max_keys is not None and len(self._offsets) >= self._max_keys

    def get(self, key: bytes | bytearray | memoryview, default: int = -1) -> int:
        return self._offsets.get(bytes(key), default)

    def put(self, key: bytes | bytearray | memoryview, offset: int) -> None:
        self._offsets[bytes(key)] = offset


_SLOTS_MAX: Final = _KEY_MAP_MAX_BYTES // KEY_MAP_SLOT_BYTES


# A 4 KiB page holds 170 slots: with a key for each 64 slots, nearly every page is touched (1 - e^-2.7).
_SLOTS_PER_KEY_FOR_HUGE_PAGES: Final = 64


_MAX_KEYS_LIMIT: Final = int(_SLOTS_MAX * KEY_MAP_LOAD_FACTOR)  # what the broker's largest map (2 GiB) holds


def new_key_map(options: CleanOptions, records: int = 0) -> OffsetMap:
    """An empty key map for a pass with ``options``: the compiled one sized as the broker's map that holds
    ``max_keys`` (at most a 2 GiB map's keys, the broker's bound, for both engines), growing without a bound;
    or the reference. ``records``: how many records the pass may map (an upper bound on its keys): when they
    would touch most of the table's pages anyway, it asks for huge pages."""
    capacity = None if options.max_keys is None else min(options.max_keys, _MAX_KEYS_LIMIT)
    if options.engine is Engine.PYTHON:
        return DictMap(capacity)
    if capacity is None:
        return _keymap.KeyMap(0, -1)
    slots = min(_SLOTS_MAX, max(capacity + 1, math.ceil(capacity / KEY_MAP_LOAD_FACTOR)))
    return _keymap.KeyMap(slots, capacity, huge_pages=records * _SLOTS_PER_KEY_FOR_HUGE_PAGES >= slots)


@dataclass
class PartitionFacts:
    """What the first pass learns: the cleaned range's end, each producer's last data batch, the key map."""

    upper: int  # the first uncleanable offset (a segment's base offset)
    cleaned: int  # how many of the segments (from the first) are cleaned: those below end_offset
    producer_last: dict[int, int]  # producer id -> the last offset of its last data batch in the log
    key_map: OffsetMap  # key -> its latest offset in the cleaned range (aborted data left out)
    latest_offset: int  # the cleaned range's last offset

    @property
    def end_offset(self) -> int:
        """Where the next pass's key map starts (``upper`` unless the map filled up)."""
        return self.latest_offset + 1


@dataclass
class CleanStats:
    records_in: int = 0
    records_out: int = 0
    keys: int = 0
    batches_in: int = 0
    batches_out: int = 0
    batches_copied: int = 0  # byte for byte
    batches_emptied: int = 0  # kept as a header without records (a producer's last, or the range's last)
    no_key_dropped: int = 0
    superseded_dropped: int = 0
    tombstones_stamped: int = 0  # tombstones kept in a batch stamped with a delete horizon on this pass
    tombstones_dropped: int = 0  # tombstones whose horizon had passed
    aborted_records_dropped: int = 0
    markers_stamped: int = 0
    markers_dropped: int = 0
    bytes_in: int = 0
    bytes_out: int = 0

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class CleanedSegment:
    base_offset: int
    log: bytes | None  # None: written to the sink :func:`clean` was given
    size: int
    indexes: Indexes
    txn_index: bytes  # the aborted transactions whose ABORT markers this segment keeps
    sources: tuple[int, ...]  # the base offsets of the segments it replaces (its own first)


class _Txns:
    """``CleanedTransactionMetadata``: aborted transactions met in offset order, per producer."""

    def __init__(self) -> None:
        self.pending: list[AbortedTxn] = []  # a heap by first offset
        self.aborted: dict[int, list[object]] = {}  # producer -> [its AbortedTxn, last batch offset seen or None]
        self.committed: set[int] = set()  # producers with a transactional batch seen since their last marker
        self.kept: list[AbortedTxn] = []  # for the cleaned segment's .txnindex

    def add(self, entries: Sequence[AbortedTxn]) -> None:
        for e in entries:
            heapq.heappush(self.pending, e)

    def _upto(self, offset: int) -> None:
        while self.pending and self.pending[0].first_offset <= offset:
            e = heapq.heappop(self.pending)
            self.aborted.setdefault(e.producer_id, [e, None])

    def on_batch(self, h: BatchHeader) -> bool:
        """True when this data batch belongs to an aborted transaction."""
        self._upto(h.last_offset)
        if not h.is_transactional:
            return False
        state = self.aborted.get(h.producer_id)
        if state is not None:
            state[1] = h.last_offset
            return True
        self.committed.add(h.producer_id)
        return False

    def on_marker(self, batch: DecodedBatch) -> bool:
        """True when this control batch may go (its transaction's data is gone)."""
        h = batch.header
        self._upto(h.last_offset)
        if not batch.records:
            return True
        key = batch.records[0].key
        kind = struct.unpack_from(">h", key, 2)[0] if key is not None and len(key) >= 4 else None
        if kind == ABORT:
            state = self.aborted.pop(h.producer_id, None)
            if state is not None and state[1] is not None:
                entry = state[0]
                assert isinstance(entry, AbortedTxn)
                self.kept.append(entry)
                return False
            return True
        if kind == COMMIT:
            if h.producer_id in self.committed:
                self.committed.discard(h.producer_id)
                return False
            return True
        return False


def _batches(seg: Segment) -> Iterator[RawBatch]:
    """A segment's batches in order, each checked to follow the last and to be magic v2."""
    order = OffsetOrder(seg.base_offset, seg.name or None)
    with seg.open() as f:
        for raw in iter_batches(f, path=seg.name or None):
            h = raw.header
            order.check(h, h.offset)
            if h.magic < 2:
                raise UnsupportedError("key compaction reads magic v2 batches only", path=seg.name or None,
                                       expected="magic 2", found=f"magic {h.magic} at offset {h.offset}")
            yield raw


def _section(raw: RawBatch, options: CleanOptions) -> bytes | memoryview | None:
    """A data batch's records section for the compiled engine, or None where the Python reference decides
    (a payload that does not decompress: the reference then names the problem)."""
    if raw.header.records_count is None:
        return None
    try:
        return payload_of(raw, options.decompression_limit)
    except TieringError:
        return None


def _decoded(raw: RawBatch, seg: Segment, options: CleanOptions) -> DecodedBatch:
    return decode_located(raw, path=seg.name or None, limit=options.decompression_limit)


def _map_batch(raw: RawBatch, seg: Segment, key_map: OffsetMap, start: int, latest: int,
               options: CleanOptions) -> tuple[int, bool]:
    """A data batch's keys put in the map (``buildOffsetMapForSegment``): the offset of the last one put (else
    ``latest``), and whether the map filled up before the batch's end."""
    h = raw.header
    if isinstance(key_map, _keymap.KeyMap) and (section := _section(raw, options)) is not None:
        done = key_map.map_v2(section, h.offset, h.last_offset - h.offset, h.records_count or 0, start)
        if done is not None:
            puts, last, full = done
            return (last if puts else latest), full
    for r in _decoded(raw, seg, options).records:
        if r.key is None or r.offset < start:
            continue
        if key_map.full:
            return latest, True  # the pass ends at the last offset mapped
        key_map.put(r.key, r.offset)
        latest = r.offset
    return latest, False


def _is_abort(raw: RawBatch, options: CleanOptions) -> bool:
    batch = decode_batch(raw, limit=options.decompression_limit)
    key = batch.records[0].key if batch.records else None
    return key is not None and len(key) >= 4 and struct.unpack_from(">h", key, 2)[0] == ABORT


def survey(segments: Sequence[Segment], options: CleanOptions) -> PartitionFacts:
    """The first pass. ``segments``: all of the partition's, in offset order, the last one active."""
    if not segments:
        raise ConfigError("a partition without segments", expected="at least its active segment")
    producer_last: dict[int, int] = {}
    open_txn: dict[int, int] = {}  # producer -> first offset of its transaction without a marker yet
    newest = -1
    seg_max: list[int] = []
    seg_records: list[int] = []
    prev_last: int | None = None
    listed = {(e.producer_id, e.last_offset) for s in segments for e in s.aborted}
    for seg in segments:
        top = -1
        records = 0
        order = OffsetOrder(seg.base_offset, seg.name or None)
        order.prev_last = prev_last  # offsets increase across segments too
        with seg.open() as f:
            for raw in iter_batches(f, path=seg.name or None):
                h = raw.header
                order.check(h, h.offset)
                top = max(top, h.max_timestamp)
                records += h.records_count or 0
                if h.producer_id == NO_PRODUCER:
                    continue
                if h.is_control:
                    if (open_txn.pop(h.producer_id, None) is not None and _is_abort(raw, options)
                            and (h.producer_id, h.offset) not in listed):
                        raise CorruptBatchError(
                            "an ABORT marker whose transaction no .txnindex entry names: its aborted records "
                            "cannot be told from committed ones (is the segment's .txnindex missing?)",
                            path=seg.name or None, base_offset=h.offset,
                            expected=f"an entry for producer {h.producer_id} ending at offset {h.offset}",
                            found="none")
                    continue
                producer_last[h.producer_id] = h.last_offset
                if h.is_transactional:
                    open_txn.setdefault(h.producer_id, h.offset)
        prev_last = order.prev_last
        seg_max.append(top)
        seg_records.append(records)
        newest = max(newest, top)
    bases = [s.base_offset for s in segments]
    limit = bases[-1]  # the active segment's base offset
    if open_txn:
        limit = min(limit, *open_txn.values())
    start = options.first_dirty_offset
    if options.min_compaction_lag_ms > 0:  # the first dirty segment holding a record too young
        young = [s.base_offset for i, (s, top) in enumerate(zip(segments[:-1], seg_max[:-1], strict=True))
                 if bases[i + 1] > start and top > newest - options.min_compaction_lag_ms]
        if young:
            limit = min(limit, young[0])
    # Rounded down to the base offset of the segment holding it (an open transaction may start inside one).
    upper = max(b for b in bases if b <= limit) if limit >= bases[0] else bases[0]
    key_map = new_key_map(options, sum(n for i, n in enumerate(seg_records[:-1]) if bases[i] < upper))
    txns = _Txns()
    txns.add(_overlapping([e for s in segments for e in s.aborted], start, upper))
    latest = start - 1  # nothing mapped: the pass ends where it started
    full = False
    for i, seg in enumerate(segments[:-1]):
        if seg.base_offset >= upper or full:
            break
        if bases[i + 1] <= start:
            continue  # cleaned by an earlier pass
        for raw in _batches(seg):
            h = raw.header
            if h.is_control:
                txns.on_marker(_decoded(raw, seg, options))
            elif txns.on_batch(h):
                _decoded(raw, seg, options)  # aborted: not mapped, but read as the cleaner reads it
            else:
                latest, full = _map_batch(raw, seg, key_map, start, latest, options)
            if full:
                break
            if h.last_offset >= start:
                latest = max(latest, h.last_offset)
        if not full:
            latest = max(latest, bases[i + 1] - 1)  # past the offsets a segment leaves unused
    cleaned = sum(1 for b in bases[:-1] if b <= latest) if latest >= start else 0
    return PartitionFacts(upper, cleaned, producer_last, key_map, latest)


def clean(segments: Sequence[Segment], facts: PartitionFacts, options: CleanOptions,
          stats: CleanStats | None = None, *,
          sink: Callable[[int], BinaryIO] | None = None) -> Iterator[CleanedSegment]:
    """The second pass: each cleaned segment, in offset order (``facts``: from :func:`survey`); with
    ``options.merge``, one for each group of neighbours the broker's cleaner would clean together. With ``sink``
    (a base offset -> a new writable file, closed when the segment is done) the new ``.log`` is written there
    as it is made, so memory holds one batch of it, not the segment; without, it is returned in ``log``."""
    stats = stats if stats is not None else CleanStats()
    stats.keys = len(facts.key_map)
    txns = _Txns()
    every = [e for s in segments for e in s.aborted]
    next_base = {s.base_offset: n.base_offset for s, n in itertools.pairwise(segments)}
    for group in _groups(segments[:facts.cleaned], facts.upper, options.merge):
        base = group[0].base_offset
        txns.kept = []
        out = sink(base) if sink is not None else io.BytesIO()
        positions: list[BatchPosition] = []
        size = 0
        for seg in group:
            txns.add(_overlapping(every, seg.base_offset, next_base[seg.base_offset]))
            for raw in _batches(seg):
                stats.batches_in += 1
                stats.bytes_in += len(raw.data)
                built = _clean_raw(raw, seg, facts, txns, options, stats)
                if built is None:
                    continue
                h = parse_v2_header(built, size)
                positions.append(BatchPosition(size, h.last_offset, h.max_timestamp))
                out.write(built)
                size += len(built)
                stats.batches_out += 1
        stats.bytes_out += size
        log = out.getvalue() if isinstance(out, io.BytesIO) else None
        out.close()
        yield CleanedSegment(base, log, size, build_indexes(base, positions, options.index_interval_bytes),
                             encode_txn_index(txns.kept), tuple(s.base_offset for s in group))


def _groups(segments: Sequence[Segment], upper: int, limits: Limits | None) -> list[list[Segment]]:
    """The cleaned segments in the groups the broker's cleaner cleans together (``groupSegmentsBySize`` with
    the first uncleanable offset ``upper``), or each alone without ``limits``."""
    if limits is None:
        return [[s] for s in segments]
    by_base = {s.base_offset: s for s in segments}
    sizes = [Sizes(s.base_offset, s.log_bytes, s.index_bytes, s.time_index_bytes) for s in segments]
    return [[by_base[z.base_offset] for z in group] for group in group_by_size(sizes, limits, upper)]


def _overlapping(entries: Sequence[AbortedTxn], start: int, end: int) -> list[AbortedTxn]:
    """``collectAbortedTransactions(start, end)``: the aborted transactions with data or marker in [start, end),
    whichever segment's ``.txnindex`` holds them (the one of their ABORT marker)."""
    return [e for e in entries if e.last_offset >= start and e.first_offset < end]


def _clean_raw(raw: RawBatch, seg: Segment, facts: PartitionFacts, txns: _Txns, options: CleanOptions,
               stats: CleanStats) -> bytes | memoryview | None:
    """One batch cleaned: its bytes in the cleaned segment, or None when it goes. A data batch outside an
    aborted transaction goes through the compiled filter where it vouches for the batch; every other batch
    (markers, aborted data, what the filter leaves) is decoded and goes through the reference."""
    h = raw.header
    aborted = not h.is_control and txns.on_batch(h)
    if not h.is_control and not aborted and isinstance(facts.key_map, _keymap.KeyMap):
        section = _section(raw, options)
        if section is not None:
            ts, log_append = timestamp_base(h)
            horizon = h.delete_horizon_ms
            filtered = facts.key_map.filter_v2(
                section, h.offset, ts, log_append, h.last_offset - h.offset, h.records_count or 0,
                facts.latest_offset, horizon is not None and options.now_ms >= horizon, horizon is not None,
                horizon if horizon is not None else options.now_ms + options.delete_retention_ms)
            if filtered is not None:
                return _rebuilt(raw, filtered, facts, options, stats)
    batch = _decoded(raw, seg, options)
    stats.records_in += len(batch.records)
    return _clean_batch(batch, facts, txns, options, stats, aborted=aborted)


def _rebuilt(raw: RawBatch, filtered: tuple[int, int, int, int, int, bytes | None, int, int], facts: PartitionFacts,
             options: CleanOptions, stats: CleanStats) -> bytes | memoryview | None:
    """A data batch from what the compiled filter kept of it (see ``_keymap.c``), as :func:`_clean_batch`
    builds it."""
    h = raw.header
    kept, superseded, no_key, tombstones_dropped, tombstones, section, base_ts, max_ts = filtered
    stats.records_in += h.records_count or 0
    stats.no_key_dropped += no_key
    stats.superseded_dropped += superseded
    stats.tombstones_dropped += tombstones_dropped
    stats.records_out += kept
    if kept == 0:
        return _emptied(h, facts, stats)
    if section is None:
        stats.batches_copied += 1
        return raw.data
    horizon = h.delete_horizon_ms
    if horizon is None and tombstones:
        horizon = options.now_ms + options.delete_retention_ms
        stats.tombstones_stamped += tombstones
    return assemble_batch(_spec(h, options, horizon), section, kept, base_ts, max_ts, 0)


def _keeps_empty(h: BatchHeader, facts: PartitionFacts) -> bool:
    """Whether a batch stays as a header when none of its records does: a producer's last data batch, or the
    batch ending at the first uncleanable offset."""
    return ((h.producer_id != NO_PRODUCER and not h.is_control
             and facts.producer_last.get(h.producer_id) == h.last_offset)
            or h.last_offset + 1 == facts.upper)


def _emptied(h: BatchHeader, facts: PartitionFacts, stats: CleanStats) -> bytes | None:
    """A batch none of whose records stays: its header alone where it must stay, else nothing."""
    if not _keeps_empty(h, facts):
        return None
    stats.batches_emptied += 1
    return build_batch(BatchSpec(
        h.offset, Codec.NONE, None, h.partition_leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence,
        h.is_transactional, h.is_control,
        log_append_time=h.max_timestamp if h.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
        last_offset_delta=h.last_offset - h.offset, max_timestamp=h.max_timestamp), [])


def _spec(h: BatchHeader, options: CleanOptions, horizon: int | None) -> BatchSpec:
    """A rebuilt batch's header: the original's, with ``horizon`` and the pass's codec for a data batch."""
    codec, level = (h.codec, None) if options.codec is None or h.is_control else (options.codec, options.level)
    return BatchSpec(
        h.offset, codec, level, h.partition_leader_epoch, h.producer_id, h.producer_epoch, h.base_sequence,
        h.is_transactional, h.is_control,
        log_append_time=h.max_timestamp if h.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
        last_offset_delta=h.last_offset - h.offset, delete_horizon_ms=horizon)


def _clean_batch(batch: DecodedBatch, facts: PartitionFacts, txns: _Txns, options: CleanOptions,
                 stats: CleanStats, *, aborted: bool) -> bytes | memoryview | None:
    """The reference: one decoded batch cleaned (``aborted``: a data batch of an aborted transaction)."""
    h = batch.header
    horizon = h.delete_horizon_ms
    if h.is_control:
        may_go = txns.on_marker(batch)
        discard = may_go and horizon is not None and horizon <= options.now_ms
    else:
        may_go = False
        discard = aborted
    if discard and not _keeps_empty(h, facts):
        _count_dropped(batch, stats, aborted=not h.is_control)
        return None
    kept = []
    tombstones = 0
    for r in batch.records:
        if discard:
            keep = False
        elif h.is_control or r.offset > facts.latest_offset:
            keep = True
        elif r.key is None:
            keep = False
            stats.no_key_dropped += 1
        else:
            latest = r.offset >= facts.key_map.get(r.key, -1)
            keep = latest and (r.value is not None or horizon is None or options.now_ms < horizon)
            if not keep:
                if not latest:
                    stats.superseded_dropped += 1
                else:
                    stats.tombstones_dropped += 1
        if keep:
            kept.append(r)
            tombstones += r.value is None and not h.is_control
    if discard and not h.is_control:  # the aborted records go; a marker kept as a header is not counted
        _count_dropped(batch, stats, aborted=True)
    stats.records_out += len(kept)
    if not kept:
        return _emptied(h, facts, stats)
    stamp = (tombstones > 0 or (may_go and h.is_control)) and horizon is None
    if len(kept) == len(batch.records) and not stamp:
        stats.batches_copied += 1
        return batch.raw.data
    if stamp:
        horizon = options.now_ms + options.delete_retention_ms
        stats.tombstones_stamped += tombstones
        stats.markers_stamped += h.is_control
    return build_batch(_spec(h, options, horizon), kept)


def _count_dropped(batch: DecodedBatch, stats: CleanStats, *, aborted: bool) -> None:
    if aborted:
        stats.aborted_records_dropped += len(batch.records)
    else:
        stats.markers_dropped += 1
