"""Key compaction's rules one by one (tiering/kafka/keycompact.py), on segments built here; the broker's own
cleaner is the reference in tests/kafka_broker/test_keycompact.py."""

from __future__ import annotations

import io
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kafka.passes import compact_partition
from tiering.errors import CorruptBatchError, UnsupportedError
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.index import AbortedTxn, BatchPosition, build_indexes, encode_txn_index, parse_txn_index
from tiering.kafka.keycompact import CleanOptions, CleanStats, Segment
from tiering.kafka.merge import Limits
from tiering.kafka.records import Record
from tiering.kafka.segment import iter_decoded

T0 = 1_790_000_000_000
NOW = T0 + 3_600_000
DAY = 86_400_000


def rec(offset: int, key: bytes | None, value: bytes | None = b"v") -> Record:
    return Record(offset, T0 + offset, key, value, ())


def marker(offset: int, pid: int, commit: bool) -> bytes:
    key = b"\x00\x00\x00" + (b"\x01" if commit else b"\x00")
    return build_batch(BatchSpec(offset, Codec.NONE, producer_id=pid, producer_epoch=0, transactional=True,
                                 control=True), [Record(offset, T0 + offset, key, b"\x00\x00\x00\x00\x00\x00", ())])


def seg(base: int, *batches: bytes, aborted: tuple[AbortedTxn, ...] = ()) -> Segment:
    data = b"".join(batches)
    return Segment(base, lambda: io.BytesIO(data), aborted, f"t-0/{base:020d}.log")


def batch(base: int, *records: Record, pid: int = -1, seq: int = -1, txn: bool = False) -> bytes:
    return build_batch(BatchSpec(base, Codec.NONE, producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                                 base_sequence=seq, transactional=txn), list(records))


ACTIVE = seg(1000, batch(1000, rec(1000, b"a", b"active")))


def run(*segments: Segment, now: int = NOW, **options: Any) -> tuple[list[list[Any]], CleanStats, list[Any]]:
    """Compacted: per cleaned segment, its batches (decoded); the stats; the cleaned segments."""
    stats = CleanStats()
    _, cleaned = compact_partition(list(segments), CleanOptions(now_ms=now, **options), stats)
    return [list(iter_decoded(io.BytesIO(c.log))) for c in cleaned], stats, cleaned


def records(batches: list[Any]) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for b in batches for r in b.records]


def again(cleaned: list[Any], *rest: Segment, now: int) -> tuple[list[list[Any]], CleanStats, list[Any]]:
    """A later pass over a pass's output."""
    segs = [Segment(c.base_offset, lambda d=c.log: io.BytesIO(d), tuple(parse_txn_index(c.txn_index)))
            for c in cleaned]
    return run(*segs, *rest, now=now)


def test_the_latest_value_of_each_key_stays_superseded_ones_and_records_without_a_key_go() -> None:
    out, stats, _ = run(seg(0, batch(0, rec(0, b"a"), rec(1, b"b"), rec(2, None)), batch(3, rec(3, b"a", b"a2"))),
                        seg(4, batch(4, rec(4, b"c"), rec(5, b"b", b"b2"))), ACTIVE)
    assert [records(b) for b in out] == [[(3, b"a", b"a2")], [(4, b"c", b"v"), (5, b"b", b"b2")]]
    assert (stats.superseded_dropped, stats.no_key_dropped, stats.keys) == (2, 1, 3)


def test_a_batch_that_loses_nothing_is_copied_byte_for_byte_and_keeps_its_offsets_when_rebuilt() -> None:
    kept = batch(0, rec(0, b"k1"), rec(1, b"k2"))
    shrunk = batch(2, rec(2, b"c"), rec(3, b"d"), rec(4, b"e"))
    last = batch(5, rec(5, b"c", b"c2"))
    out, stats, cleaned = run(seg(0, kept, shrunk, last), ACTIVE)
    assert cleaned[0].log.startswith(kept)
    assert cleaned[0].log.endswith(last)
    assert stats.batches_copied == 2
    rebuilt = out[0][1].header
    assert (rebuilt.offset, rebuilt.last_offset, len(out[0][1].records)) == (2, 4, 2)
    assert records([out[0][1]]) == [(3, b"d", b"v"), (4, b"e", b"v")]


def test_a_tombstone_is_stamped_with_a_horizon_then_dropped_once_it_passed() -> None:
    out, stats, cleaned = run(seg(0, batch(0, rec(0, b"a"), rec(1, b"b")), batch(2, rec(2, b"a", None))), ACTIVE)
    assert records(out[0]) == [(1, b"b", b"v"), (2, b"a", None)]
    stamped = out[0][-1].header
    assert stamped.delete_horizon_ms == NOW + DAY
    assert out[0][-1].records[0].timestamp == T0 + 2  # the record keeps its time: its delta is from the horizon
    assert stats.tombstones_stamped == 1
    before, _, _ = again(cleaned, ACTIVE, now=NOW + DAY - 1)
    assert records(before[0]) == [(1, b"b", b"v"), (2, b"a", None)]
    after, stats, _ = again(cleaned, ACTIVE, now=NOW + DAY)
    assert records(after[0]) == [(1, b"b", b"v")]
    assert stats.tombstones_dropped == 1


def test_aborted_data_goes_and_its_marker_stays_until_a_later_pass_then_goes_after_its_horizon() -> None:
    aborted = AbortedTxn(first_offset=1, producer_id=5, last_offset=3, last_stable_offset=1)
    s0 = seg(0, batch(0, rec(0, b"a")), batch(1, rec(1, b"b"), rec(2, b"c"), pid=5, seq=0, txn=True),
             marker(3, 5, commit=False), batch(4, rec(4, b"d"), pid=6, seq=0), aborted=(aborted,))
    s1 = seg(5, batch(5, rec(5, b"e"), pid=5, seq=2, txn=True), marker(6, 5, commit=True))

    def shape(batches: list[Any]) -> list[tuple[int, bool, int, bool]]:
        return [(b.header.offset, b.header.is_control, len(b.records), b.header.delete_horizon_ms is not None)
                for b in batches]

    out, stats, cleaned = run(s0, s1, ACTIVE)
    assert shape(out[0]) == [(0, False, 1, False), (3, True, 1, False), (4, False, 1, False)]
    assert shape(out[1]) == [(5, False, 1, False), (6, True, 1, False)]  # committed: its marker stays
    assert stats.aborted_records_dropped == 2
    assert parse_txn_index(cleaned[0].txn_index) == [aborted]  # the marker is kept, so is its entry
    second, stats, cleaned2 = again(cleaned, ACTIVE, now=NOW + 1)
    assert shape(second[0]) == [(0, False, 1, False), (3, True, 1, True), (4, False, 1, False)]
    assert second[0][1].header.delete_horizon_ms == NOW + 1 + DAY  # no data left: stamped, goes later
    assert stats.markers_stamped == 1
    assert parse_txn_index(cleaned2[0].txn_index) == []
    third, stats, _ = again(cleaned2, ACTIVE, now=NOW + 1 + DAY)
    assert shape(third[0]) == [(0, False, 1, False), (4, False, 1, False)]
    assert stats.markers_dropped == 1


def test_an_aborted_batch_that_is_its_producer_s_last_stays_as_a_header_and_keeps_its_marker() -> None:
    aborted = AbortedTxn(first_offset=1, producer_id=5, last_offset=3, last_stable_offset=1)
    s0 = seg(0, batch(0, rec(0, b"a")), batch(1, rec(1, b"b"), rec(2, b"c"), pid=5, seq=0, txn=True),
             marker(3, 5, commit=False), aborted=(aborted,))
    out, _, cleaned = run(s0, ACTIVE)
    assert [(b.header.offset, b.header.last_offset, len(b.records)) for b in out[0]] == [(0, 0, 1), (1, 2, 0),
                                                                                         (3, 3, 1)]
    again_, _, _ = again(cleaned, ACTIVE, now=NOW + 2 * DAY)  # the header still belongs to the transaction
    assert [b.header.offset for b in again_[0]] == [0, 1, 3]


def test_a_producer_s_last_batch_and_the_range_s_last_batch_stay_as_headers_without_records() -> None:
    s0 = seg(0, batch(0, rec(0, b"a"), rec(1, b"b"), pid=7, seq=10), batch(2, rec(2, b"x")))
    s1 = seg(3, batch(3, rec(3, b"a", b"a2"), rec(4, b"b", b"b2")), batch(5, rec(5, b"x", b"x2")))
    out, stats, _ = run(s0, s1, seg(6, batch(6, rec(6, b"z"), pid=8, seq=0)))
    first = out[0]
    assert [(b.header.offset, b.header.last_offset, len(b.records)) for b in first] == [(0, 1, 0)]
    h = first[0].header
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.codec, h.base_timestamp, h.max_timestamp) == (
        7, 0, 10, Codec.NONE, -1, T0 + 1)
    assert stats.batches_emptied == 1
    assert records(out[1]) == [(3, b"a", b"a2"), (4, b"b", b"b2"), (5, b"x", b"x2")]


def test_the_batch_ending_at_the_first_uncleanable_offset_stays_even_when_emptied() -> None:
    out, _, _ = run(seg(0, batch(0, rec(0, b"a"))), seg(1, batch(1, rec(1, b"a", b"a2")), batch(2, rec(2, None))),
                    seg(3, batch(3, rec(3, b"q"))))
    assert [(b.header.offset, len(b.records)) for b in out[1]] == [(1, 1), (2, 0)]


def test_an_open_transaction_and_min_compaction_lag_end_the_cleaned_range() -> None:
    s0 = seg(0, batch(0, rec(0, b"a")))
    s1 = seg(1, batch(1, rec(1, b"a", b"a2"), pid=9, seq=0, txn=True))  # never committed nor aborted
    s2 = seg(2, batch(2, rec(2, b"a", b"a3")))
    out, _, _ = run(s0, s1, s2, ACTIVE)
    assert len(out) == 1  # only the segment below the open transaction's
    young = seg(2, build_batch(BatchSpec(2), [Record(2, T0 + 10 * DAY, b"a", b"new", ())]))
    out, _, _ = run(s0, seg(1, batch(1, rec(1, b"b"))), young, ACTIVE, min_compaction_lag_ms=DAY)
    assert len(out) == 2


def test_txn_index_round_trip_and_a_torn_file_is_an_error() -> None:
    entries = [AbortedTxn(5, 9, 12, 5), AbortedTxn(20, 3, 30, 20)]
    assert parse_txn_index(encode_txn_index(entries)) == entries
    with pytest.raises(CorruptBatchError, match="34-byte"):
        parse_txn_index(encode_txn_index(entries)[:-1])


def test_legacy_batches_are_refused() -> None:
    from tests.golden import SEGMENTS, log_path

    legacy = next(s for s in SEGMENTS if 2 not in s["magics"])
    data = log_path(legacy).read_bytes()
    active = seg(1 << 40, batch(1 << 40, rec(1 << 40, b"a")))
    with pytest.raises(UnsupportedError, match="magic v2"):
        run(Segment(legacy["base_offset"], lambda: io.BytesIO(data)), active)


def test_a_full_key_map_ends_the_pass_early_and_the_next_pass_goes_on_from_there() -> None:
    """As Kafka's dedupe buffer: a map of two keys is full, so the next keyed record (even of a key it holds)
    ends the pass at the last offset mapped; the records past it stay as they are, and a pass from that
    offset on cleans the rest."""
    s0 = seg(0, batch(0, rec(0, b"a"), rec(1, b"b")), batch(2, rec(2, b"a", b"a2"), rec(3, b"c")))
    s1 = seg(4, batch(4, rec(4, b"c", b"c2"), rec(5, b"b", b"b2")))
    stats = CleanStats()
    facts, cleaned = compact_partition([s0, s1, ACTIVE], CleanOptions(now_ms=NOW, max_keys=2), stats)
    assert (facts.end_offset, len(facts.key_map)) == (2, 2)
    assert [c.base_offset for c in cleaned] == [0]
    assert records(list(iter_decoded(io.BytesIO(cleaned[0].log)))) == [(0, b"a", b"v"), (1, b"b", b"v"),
                                                                      (2, b"a", b"a2"), (3, b"c", b"v")]
    rest = [Segment(0, lambda: io.BytesIO(cleaned[0].log)), s1, ACTIVE]
    facts, cleaned = compact_partition(rest, CleanOptions(now_ms=NOW, first_dirty_offset=facts.end_offset))
    assert facts.end_offset == 1000
    assert [records(list(iter_decoded(io.BytesIO(c.log)))) for c in cleaned] == [
        [(2, b"a", b"a2")], [(4, b"c", b"c2"), (5, b"b", b"b2")]]


def test_a_segment_whose_batches_lie_below_its_name_or_overlap_the_previous_one_is_an_error() -> None:
    with pytest.raises(CorruptBatchError, match="below the segment's base offset") as e:
        run(seg(0, batch(0, rec(0, b"a"))), seg(5, batch(3, rec(3, b"a"))), ACTIVE)
    assert e.value.path == "t-0/00000000000000000005.log"
    with pytest.raises(CorruptBatchError, match="do not increase"):
        run(seg(0, batch(0, rec(0, b"a")), batch(4, rec(4, b"b"))), seg(3, batch(3, rec(3, b"a"))), ACTIVE)


def test_an_open_transaction_inside_a_segment_keeps_that_whole_segment_out() -> None:
    """The first unstable offset is rounded down to its segment's base offset: a committed value may not be
    superseded by a value of a transaction that may still abort."""
    s0 = seg(0, batch(0, rec(0, b"a")), batch(5, rec(5, b"a", b"a2"), pid=9, seq=0, txn=True))
    stats = CleanStats()
    facts, cleaned = compact_partition([s0, seg(10, batch(10, rec(10, b"b")))], CleanOptions(now_ms=NOW), stats)
    assert (facts.upper, facts.end_offset, cleaned) == (0, 0, [])


def test_a_pass_with_nothing_dirty_cleans_nothing_and_ends_where_it_started() -> None:
    facts, cleaned = compact_partition([seg(0, batch(0, rec(0, b"a"))), ACTIVE],
                                       CleanOptions(now_ms=NOW, first_dirty_offset=1000))
    assert (facts.end_offset, cleaned) == (1000, [])


def _consumer_view(segments: list[list[Any]], aborted: set[int]) -> dict[bytes, tuple[int, bytes | None]]:
    """What a compacted topic means to a reader: each key's latest record outside aborted transactions
    (offset, value); computed from the decoded batches, independently of the cleaner."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for batches in segments:
        for b in batches:
            if b.header.is_control:
                continue
            for r in b.records:
                if r.key is not None and r.offset not in aborted:
                    latest[r.key] = (r.offset, r.value)
    return latest


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans(), st.sampled_from(["plain", "idem", "commit", "abort"])),
                min_size=1, max_size=40), st.integers(1, 6), st.integers(0, 2))
def test_every_key_keeps_its_latest_record_and_nothing_is_invented(updates: list[tuple[int, bool, str]],
                                                                   per_segment: int, passes: int) -> None:
    """Random partitions (keys updated by a plain, an idempotent and a transactional producer; tombstones;
    committed and aborted transactions), cleaned ``passes + 1`` times a day apart: every record left is one of
    the source's, unchanged; no aborted record is left; each key's latest record outside aborted transactions
    stays (a tombstone may go once its horizon passed: then no older value of its key is left either)."""
    batches: list[bytes] = []
    aborted_offsets: set[int] = set()
    aborted: list[AbortedTxn] = []
    source: dict[int, tuple[bytes, bytes | None]] = {}
    offset, seqs = 0, {1: 0, 2: 0}
    for key, tombstone, kind in updates:
        value = None if tombstone else b"v%d" % offset
        r = Record(offset, T0 + offset, b"k%d" % key, value, ())
        source[offset] = (b"k%d" % key, value)
        if kind in ("plain", "idem"):
            pid = 1 if kind == "idem" else -1
            batches.append(batch(offset, r, pid=pid, seq=seqs[1] if pid == 1 else -1))
            seqs[1] += pid == 1
            offset += 1
            continue
        batches.append(batch(offset, r, pid=2, seq=seqs[2], txn=True))
        seqs[2] += 1
        batches.append(marker(offset + 1, 2, commit=kind == "commit"))
        if kind == "abort":
            aborted_offsets.add(offset)
            aborted.append(AbortedTxn(offset, 2, offset + 1, offset))
        offset += 2
    segs: list[Segment] = []
    for i in range(0, len(batches), per_segment):
        group = batches[i:i + per_segment]
        base = next(iter_decoded(io.BytesIO(group[0]))).header.offset
        last = next(iter_decoded(io.BytesIO(group[-1]))).header.last_offset
        segs.append(seg(base, *group, aborted=tuple(a for a in aborted if base <= a.last_offset <= last)))
    active = seg(offset, batch(offset, rec(offset, b"other")))
    want = _consumer_view([list(iter_decoded(io.BytesIO(b))) for b in batches], aborted_offsets)
    out, _, cleaned = run(*segs, active)
    for p in range(passes):
        out, _, cleaned = again(cleaned, *segs[len(cleaned):], active, now=NOW + (p + 1) * DAY)
    left = [r for batches_ in out for b in batches_ if not b.header.is_control for r in b.records]
    assert all(source[r.offset] == (r.key, r.value) for r in left)  # nothing invented or changed
    assert not {r.offset for r in left} & aborted_offsets
    cleaned_to = segs[len(cleaned)].base_offset if len(cleaned) < len(segs) else offset
    got = _consumer_view(out, aborted_offsets)
    for key, (at, value) in want.items():
        if at >= cleaned_to:
            continue  # past the cleaned range (an open transaction ended it): not in ``out``
        if value is None and key not in got:
            assert passes > 0  # a tombstone goes only on a pass after the one that stamped it
            continue
        assert got.get(key) == (at, value), (key, at)


def test_an_abort_marker_without_its_txn_index_entry_is_an_error_not_a_guess() -> None:
    """Without the .txnindex entry the aborted records would be taken for committed ones, and could even
    supersede a committed value: the pass refuses, naming the segment and the marker."""
    s0 = seg(0, batch(0, rec(0, b"a")), batch(1, rec(1, b"a", b"aborted"), pid=5, seq=0, txn=True),
             marker(2, 5, commit=False))
    with pytest.raises(CorruptBatchError, match=r"ABORT marker whose transaction no \.txnindex entry") as e:
        run(s0, ACTIVE)
    assert (e.value.path, e.value.base_offset) == ("t-0/00000000000000000000.log", 2)
    committed = seg(0, batch(0, rec(0, b"a")), batch(1, rec(1, b"a", b"c"), pid=5, seq=0, txn=True),
                    marker(2, 5, commit=True))
    assert records(run(committed, ACTIVE)[0][0])[0] == (1, b"a", b"c")  # a COMMIT needs no entry


def test_neighbours_are_cleaned_into_one_segment_as_the_broker_groups_them() -> None:
    """With the topic's segment.bytes, neighbours whose sources fit it are cleaned into one segment named by
    the first (the broker's groupSegmentsBySize, by the sources' sizes); its log is the per-segment pass's logs
    one after the other, its .txnindex their entries, its indexes built over the whole; a source too large to
    join starts a group of its own. (tests/kafka_broker/test_keycompact.py holds this to Kafka's cleaner.)"""
    aborted = AbortedTxn(first_offset=1, producer_id=5, last_offset=3, last_stable_offset=1)
    parts = [[batch(0, rec(0, b"a")), batch(1, rec(1, b"b"), pid=5, seq=0, txn=True), marker(3, 5, commit=False)],
             [batch(4, rec(4, b"a", b"x" * 200)), batch(5, rec(5, b"c"))],
             [batch(6, rec(6, b"b")), batch(7, rec(7, b"d"))]]
    logs = [b"".join(p) for p in parts]
    sized = [Segment(base, lambda d=data: io.BytesIO(d), (aborted,) if base == 0 else (), "", len(data), 8, 12)
             for base, data in zip((0, 4, 6), logs, strict=True)]
    _, _, alone = run(*sized, ACTIVE)
    limit = sized[0].log_bytes + sized[1].log_bytes
    _, _, grouped = run(*sized, ACTIVE, merge=Limits(segment_bytes=limit))
    assert [c.sources for c in alone] == [(0,), (4,), (6,)]
    assert [c.sources for c in grouped] == [(0, 4), (6,)]  # 0 and 4 fill segment.bytes; 6 would pass it
    assert grouped[0].log == alone[0].log + alone[1].log
    assert grouped[1].log == alone[2].log
    assert parse_txn_index(grouped[0].txn_index) == [aborted]
    positions = [BatchPosition(b.header.position, b.header.last_offset, b.header.max_timestamp)
                 for b in iter_decoded(io.BytesIO(grouped[0].log or b""))]
    assert grouped[0].indexes == build_indexes(0, positions)
    _, _, tight = run(*sized, ACTIVE, merge=Limits(segment_bytes=limit, index_bytes=15))  # 8 + 8 > 15
    assert [c.sources for c in tight] == [(0,), (4,), (6,)]
