"""Key compaction through S3 (moto in-process): each partition cleaned by one pass of the cleaner, each
changed segment swapped by the commit protocol in offset order. The reference is the pure pass over the
same bytes (itself byte-identical to Kafka's cleaner: tests/kafka_broker/test_keycompact.py); the originals
must stay recoverable, a crash at any S3 call must converge on re-run, and a rollback must put them back."""

from __future__ import annotations

import io
import itertools
import re
from dataclasses import replace
from typing import Any

import pytest

from tests.kafka.passes import compact_partition
from tests.kafka.test_keycompact import DAY, NOW, batch, marker, rec
from tests.s3.conftest import PREFIX, context, fresh_store, no_pending
from tests.s3.test_faults import Crash, Faults, crash_points
from tiering.commit.operation import Context, SegmentResult, SwapChoice
from tiering.cost.model import CostOptions
from tiering.cost.prices import load_prices
from tiering.errors import ExitCode
from tiering.kafka.builder import BatchSpec, build_batch
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from tiering.kafka.index import AbortedTxn, encode_txn_index
from tiering.kafka.keycompact import CleanOptions, CleanStats, Segment
from tiering.kafka.merge import Limits
from tiering.kafka.records import Record
from tiering.kafka.rewrite import read_back
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Cause, RunKind, Status, Swap
from tiering.report.publish import assemble
from tiering.report.render import render
from tiering.run import engine
from tiering.run.documents import RunResult
from tiering.run.keycompact import KeyCompaction, KeyCompactOptions
from tiering.run.rollback import rollback
from tiering.storage.layout import run_result_key, segment_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store

TOPIC = "profiles.compacted"
DIRECTORY = f"{TOPIC}-0"
ABORTED = AbortedTxn(first_offset=26, producer_id=5, last_offset=28, last_stable_offset=26)


def _zstd(base: int, *records: Record) -> bytes:
    return build_batch(BatchSpec(base, Codec.ZSTD), list(records))


def partition(*, aborts: bool) -> dict[int, tuple[bytes, bytes]]:
    """Five segments (the last one active): many updates per key, records without a key, a tombstone, an
    idempotent producer, a committed transaction and (with ``aborts``) an aborted one. Base offset ->
    (.log, .txnindex)."""
    s0 = b"".join([_zstd(0, *(rec(i, b"k%d" % i, b"v0-%d" % i) for i in range(10))),
                   batch(10, rec(10, None, b"no key")), batch(11, rec(11, b"k1", b"v1-1"))])
    s1 = [_zstd(20, *(rec(20 + i, b"k%d" % i, b"v2-%d" % i) for i in range(5))), batch(25, rec(25, b"k9", None))]
    if aborts:
        s1 += [batch(26, rec(26, b"k3", b"aborted"), rec(27, b"k4", b"aborted"), pid=5, seq=0, txn=True),
               marker(28, 5, commit=False)]
    s1 += [batch(29, rec(29, b"k5", b"idem"), pid=6, seq=0)]
    s2 = b"".join([batch(40, rec(40, b"k0", b"txn"), rec(41, b"k7", b"txn"), pid=7, seq=0, txn=True),
                   marker(42, 7, commit=True), _zstd(43, *(rec(43 + i, b"k%d" % i, b"v3-%d" % i) for i in range(3))),
                   # the aborting producer goes on: its aborted batch is not its last, so it may go entirely
                   batch(46, rec(46, b"k6", b"p5"), pid=5, seq=2, txn=True), marker(47, 5, commit=True)])
    s3 = _zstd(60, *(rec(60 + i, b"u%d" % i, b"only") for i in range(6)))  # every record its key's latest
    active = batch(80, rec(80, b"k8", b"active"))
    return {0: (s0, b""), 20: (b"".join(s1), encode_txn_index([ABORTED]) if aborts else b""), 40: (s2, b""),
            60: (s3, b""), 80: (active, b"")}


def upload(store: S3Store, parts: dict[int, tuple[bytes, bytes]], prefix: str = PREFIX) -> None:
    for base, (log, txn) in parts.items():
        indexes = read_back(io.BytesIO(log), base_offset=base).indexes
        store.put(segment_key(prefix, TOPIC, 0, base, LOG_SUFFIX), log)
        store.put(segment_key(prefix, TOPIC, 0, base, INDEX_SUFFIX), indexes.offset_index)
        store.put(segment_key(prefix, TOPIC, 0, base, TIME_INDEX_SUFFIX), indexes.time_index)
        if txn:
            store.put(segment_key(prefix, TOPIC, 0, base, TXN_INDEX_SUFFIX), txn)


def expected(parts: dict[int, tuple[bytes, bytes]], now: int, merge: Limits | None = None) -> dict[int, Any]:
    """The pure pass over the same bytes (neighbours cleaned into one within ``merge``): base offset -> cleaned
    segment."""
    from tiering.kafka.index import parse_txn_index

    segments = [Segment(b, lambda log=log: io.BytesIO(log), tuple(parse_txn_index(txn)), "", len(log),
                        len(read_back(io.BytesIO(log), base_offset=b).indexes.offset_index),
                        len(read_back(io.BytesIO(log), base_offset=b).indexes.time_index))
                for b, (log, txn) in sorted(parts.items())]
    _, cleaned = compact_partition(segments, CleanOptions(now_ms=now, merge=merge))
    return {c.base_offset: c for c in cleaned}


def check_cleaned(store: S3Store, want: dict[int, Any], where: object = None) -> None:
    """Every cleaned segment of ``want`` on S3 file by file as the pure pass made it; the neighbours it
    merged away gone."""
    for base, c in want.items():
        assert final(store, base, LOG_SUFFIX) == c.log, (where, base)
        assert final(store, base, INDEX_SUFFIX) == c.indexes.offset_index, (where, base)
        assert final(store, base, TIME_INDEX_SUFFIX) == c.indexes.time_index, (where, base)
        txn = segment_key(PREFIX, TOPIC, 0, base, TXN_INDEX_SUFFIX)
        assert (store.get(txn) if exists(store, txn) else b"") == c.txn_index, (where, base)
        for gone in c.sources[1:]:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                assert not exists(store, segment_key(PREFIX, TOPIC, 0, gone, suffix)), (where, gone, suffix)


def names(store: S3Store) -> set[str]:
    """The partition's file names (its segments' files; the run's own objects are elsewhere)."""
    root = segment_key(PREFIX, TOPIC, 0, 0, LOG_SUFFIX).rsplit("/", 1)[0] + "/"
    return {info.key[len(root):] for info in store.list(root)}


def check_names(store: S3Store, before: set[str], want: dict[int, Any], where: object = None) -> None:
    """The partition holds exactly the files it held ``before`` the pass, less those of every segment the pass
    cleaned or merged away, plus the cleaned segments' files: a lost or a stray file fails."""
    touched = {*want, *(gone for c in want.values() for gone in c.sources[1:])}
    expect = {n for n in before if not n.startswith(tuple(f"{b:020d}." for b in touched))}
    for base, c in want.items():
        expect |= {f"{base:020d}{suffix}" for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)}
        if c.txn_index:
            expect.add(f"{base:020d}{TXN_INDEX_SUFFIX}")
    now = names(store)
    assert now == expect, (where, sorted(now - expect), sorted(expect - now))


def final(store: S3Store, base: int, suffix: str) -> bytes:
    return store.get(segment_key(PREFIX, TOPIC, 0, base, suffix))


def iter_figures(results: list[SegmentResult]) -> dict[str, int]:
    """A run's key-compaction figures, summed over the segments it cleaned (``keys``: over partitions)."""
    total: dict[str, int] = {}
    keys: dict[str, int] = {}
    for r in results:
        figures = (r.stats or {}).get("key_compaction")
        if r.status is not Status.COMPACTED or not isinstance(figures, dict):
            continue
        for k, v in figures.items():
            if k != "keys":
                total[k] = total.get(k, 0) + int(v)
        keys[r.directory] = int(figures.get("keys", 0))
    total["keys"] = sum(keys.values())
    return total


def exists(store: S3Store, key: str) -> bool:
    try:
        store.head(key)
    except ObjectNotFound:
        return False
    return True


def at(now: int) -> KeyCompactOptions:
    """This partition's topic, cleaned at ``now``."""
    return KeyCompactOptions(topics=re.escape(TOPIC), now_ms=now, min_age_minutes=0, merge=None)


def keys_context(store: S3Store, run_id: str = "keys-1", swap: Swap | None = None) -> Context:
    return replace(context(store, run_id), swap=SwapChoice(swap))


def test_a_pass_on_s3_swaps_what_the_pure_pass_makes_and_keeps_the_originals(store: S3Store) -> None:
    parts = partition(aborts=True)
    upload(store, parts)
    want = expected(parts, NOW)
    run = engine.run(store, keys_context(store), KeyCompaction(at(NOW)))

    by_base = {r.base_offset: r for r in run.segments}
    assert {b: by_base[b].status for b in parts} == {0: Status.COMPACTED, 20: Status.COMPACTED,
                                                    40: Status.COMPACTED, 60: Status.SKIPPED, 80: Status.SKIPPED}
    assert by_base[60].cause is Cause.NOTHING_TO_CLEAN
    assert by_base[80].cause is Cause.ACTIVE
    assert run.exit_code() is ExitCode.OK
    assert no_pending(store)
    for base in (0, 20, 40):
        assert final(store, base, LOG_SUFFIX) == want[base].log
        assert final(store, base, INDEX_SUFFIX) == want[base].indexes.offset_index
        assert final(store, base, TIME_INDEX_SUFFIX) == want[base].indexes.time_index
        backup = store.get(f"{PREFIX}/_tiering/backup/keys-1/{DIRECTORY}/{base:020d}.log")
        assert backup == parts[base][0]
    for base in (60, 80):
        assert final(store, base, LOG_SUFFIX) == parts[base][0]
    assert final(store, 20, TXN_INDEX_SUFFIX) == parts[20][1]  # its ABORT marker stays on this pass
    # Independent of the cleaner: what is left of the keys, read back from S3 by the reader.
    from tiering.kafka.segment import iter_decoded
    latest: dict[bytes, bytes | None] = {}
    for base in sorted(parts):
        for b in iter_decoded(io.BytesIO(final(store, base, LOG_SUFFIX))):
            if not b.header.is_control:
                latest.update({r.key: r.value for r in b.records if r.key is not None})
    assert latest[b"k0"] == b"v3-0"
    assert latest[b"k3"] == b"v2-3"
    assert latest[b"k9"] is None
    state = load_state(store, PREFIX, DIRECTORY)
    assert sorted(state.segments) == [0, 20, 40]
    assert all(e.codec is None and e.run_id == "keys-1" for e in state.segments.values())
    doc = RunResult.from_json(store.get_json(run_result_key(PREFIX, "keys-1", RunKind.COMPACT_KEYS))[0], "run")
    assert doc.kind is RunKind.COMPACT_KEYS
    assert doc.settings["now_ms"] == NOW
    assert doc.usage["requests"][DIRECTORY]["CopyObject"] >= 3  # the backups, at least: priced in the report
    assert doc.usage["requests"]["_run"]["ListObjectsV2"] >= 1
    assert doc.usage["compute_seconds"] > 0
    figures = iter_figures(list(run.segments))
    assert figures["aborted_records_dropped"] == 2
    assert figures["no_key_dropped"] == 1
    assert figures["tombstones_stamped"] == 1
    # the latest offsets: k0 43, k1 44, k2 45, k3 23, k4 24, k5 29, k6 46, k7 41, k8 8, k9 25 (the
    # aborted k3 and k4 are not in the map); below them: 0-7 and 9, then 11, 20-22, 40
    assert figures["superseded_dropped"] == 9 + 1 + 3 + 1
    assert figures["bytes_in"] - figures["bytes_out"] == sum(len(parts[b][0]) - len(want[b].log) for b in (0, 20, 40))


def test_later_passes_remove_the_aborted_transaction_s_txnindex_entry_then_its_marker(store: S3Store) -> None:
    """Pass 1 drops the aborted data (the marker and its .txnindex entry stay); pass 2, a day later, stamps the
    marker and the entry goes: the .txnindex (now empty) is removed before the .log is swapped; pass 3 drops
    the marker. Rolling pass 2 back puts the .txnindex back."""
    from tiering.kafka.segment import iter_decoded

    parts = partition(aborts=True)
    upload(store, parts)
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    after_first = {b: (final(store, b, LOG_SUFFIX), parts[b][1] if b == 20 else b"") for b in parts}
    run = engine.run(store, keys_context(store, "keys-2"), KeyCompaction(at(NOW + DAY)))
    assert run.exit_code() is ExitCode.OK
    want = expected(after_first, NOW + DAY)
    assert final(store, 20, LOG_SUFFIX) == want[20].log
    assert want[20].txn_index == b""
    assert not exists(store, segment_key(PREFIX, TOPIC, 0, 20, TXN_INDEX_SUFFIX))
    assert store.get(f"{PREFIX}/_tiering/backup/keys-2/{DIRECTORY}/{20:020d}{TXN_INDEX_SUFFIX}") == parts[20][1]
    marker_batch = [b for b in iter_decoded(io.BytesIO(final(store, 20, LOG_SUFFIX))) if b.header.is_control]
    assert [b.header.delete_horizon_ms for b in marker_batch] == [NOW + 2 * DAY]
    back = rollback(store, keys_context(store, "undo-2"), "keys-2")
    assert back.exit_code() is ExitCode.OK
    assert final(store, 20, TXN_INDEX_SUFFIX) == parts[20][1]
    assert final(store, 20, LOG_SUFFIX) == after_first[20][0]
    engine.run(store, keys_context(store, "keys-3"), KeyCompaction(at(NOW + DAY)))
    run = engine.run(store, keys_context(store, "keys-4"), KeyCompaction(at(NOW + 2 * DAY)))
    assert iter_figures(list(run.segments))["markers_dropped"] >= 1
    assert not [b for b in iter_decoded(io.BytesIO(final(store, 20, LOG_SUFFIX))) if b.header.is_control]
    assert no_pending(store)


def test_a_second_pass_at_the_same_clock_has_nothing_to_clean(store: S3Store) -> None:
    upload(store, partition(aborts=False))
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    run = engine.run(store, keys_context(store, "keys-2"), KeyCompaction(at(NOW)))
    assert {r.cause for r in run.segments} == {Cause.NOTHING_TO_CLEAN, Cause.ACTIVE}, run.segments


def test_rollback_of_a_key_compaction_run_puts_the_originals_back(store: S3Store) -> None:
    parts = partition(aborts=True)
    upload(store, parts)
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    back = rollback(store, keys_context(store, "undo-1"), "keys-1")
    assert back.counts == {"rolled-back": 3}
    for base, (log, _) in parts.items():
        assert final(store, base, LOG_SUFFIX) == log


def test_a_tombstone_is_dropped_once_its_horizon_passed(store: S3Store) -> None:
    upload(store, partition(aborts=False))
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    run = engine.run(store, keys_context(store, "keys-2"), KeyCompaction(at(NOW + DAY)))
    assert iter_figures(list(run.segments))["tombstones_dropped"] == 1
    from tiering.kafka.segment import iter_decoded
    left = {r.key for b in iter_decoded(io.BytesIO(final(store, 20, LOG_SUFFIX))) for r in b.records}
    assert b"k9" not in left


MERGE_LIMITS = Limits(1 << 20, 10 << 20)  # the four sealed segments of partition() clean into one


def _crash_scenario(store: S3Store, crash_at: int | None, mode: str, second: bool,
                    merge: Limits | None = None) -> tuple[list[str], bool]:
    """The first pass over the partition crashed at call ``crash_at``, or (``second``) the pass a day after an
    uninterrupted one, which also removes a .txnindex; then a retry at the same clock. ``merge``: the first
    pass cleans neighbours into one within these bounds."""
    parts = partition(aborts=second)
    upload(store, parts)
    now = NOW
    if second:
        engine.run(store, keys_context(store, "keys-0"), KeyCompaction(at(NOW)))
        parts = {b: (final(store, b, LOG_SUFFIX), parts[b][1]) for b in parts}
        now = NOW + DAY
    before = names(store)
    worker = fresh_store()
    faults = Faults(worker, crash_at, mode)
    crashed = False
    try:
        engine.run(worker, keys_context(worker, swap=Swap.COPY), KeyCompaction(replace(at(now), merge=merge)))
    except Crash:
        crashed = True
    if crashed:
        rerun = fresh_store()
        run = engine.run(rerun, keys_context(rerun, swap=Swap.COPY),
                         KeyCompaction(replace(at(now), merge=merge)))  # a retry
        assert run.exit_code() is ExitCode.OK, [r.to_json() for r in run.segments]
    assert no_pending(store)
    kept = {k.key.rsplit("/", 1)[1]: k.key for k in store.list(f"{PREFIX}/_tiering/backup/keys-1/")}
    # the pass's originals, each kept as it was (a retry must not back up its own output instead)
    logs = [name for name in kept if name.endswith(LOG_SUFFIX)]
    assert logs or crash_at is not None
    for name in logs + [name for name in kept if name.endswith(TXN_INDEX_SUFFIX)]:
        base = int(name[:20])
        assert store.get(kept[name]) == parts[base][0 if name.endswith(LOG_SUFFIX) else 1], (crash_at, mode, name)
    want = expected(parts, now, merge)
    assert merge is None or len(want[0].sources) == 4
    check_names(store, before, want, (crash_at, mode))
    check_cleaned(store, want, (crash_at, mode))
    return faults.calls, crashed


@pytest.mark.parametrize("merge", [None, MERGE_LIMITS], ids=["swapped-in-place", "merged"])
def test_a_pass_that_loses_an_index_fails_the_crash_check(merge: Limits | None, aws_env: None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    from tests.s3.conftest import BUCKET
    from tests.s3.test_faults import plant_a_lost_index as in_place
    from tests.s3.test_merge_s3 import plant_a_lost_index as regrouped
    from tiering.storage.s3 import make_client

    (in_place if merge is None else regrouped)(monkeypatch)
    with mock_aws():
        client = make_client()
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        with pytest.raises(AssertionError, match=r"\[\], \['[0-9]{20}\.timeindex'"):  # none stray, one lost
            _crash_scenario(S3Store(client, BUCKET), None, "none", False, merge)


@pytest.mark.slow
@pytest.mark.parametrize(("second", "merge"), [(False, None), (True, None), (False, MERGE_LIMITS)],
                         ids=["first-pass", "second-pass-txnindex", "first-pass-merged"])
def test_a_crash_at_every_s3_call_then_a_rerun_converges_on_the_same_bytes(second: bool, merge: Limits | None,
                                                                          aws_env: None) -> None:
    """SIGKILL-like crashes (every later request of the process fails too) after each S3 request that changes
    the bucket (and before the first) of a pass that swaps three segments (or cleans four into one, swapped in
    by the merge protocol); a fresh run at the same clock ends with the files one uninterrupted pass makes, no
    journal left, every index matching."""
    from moto import mock_aws

    from tests.s3.conftest import BUCKET
    from tiering.storage.s3 import make_client

    def fresh() -> S3Store:
        client = make_client()
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        return S3Store(client, BUCKET)

    with mock_aws():
        calls, _ = _crash_scenario(fresh(), None, "none", second, merge)
    points = crash_points(calls)
    for at, mode in points:
        with mock_aws():
            _, crashed = _crash_scenario(fresh(), at, mode, second, merge)
        assert crashed, f"no crash at {mode} call {at} ({calls[at]})"
    assert len(points) > 16


def test_a_policy_chooses_the_compacted_topics_and_their_delete_retention(store: S3Store) -> None:
    from tiering.kafka.segment import iter_decoded
    from tiering.plan.policy import parse_policy

    parts = partition(aborts=False)
    upload(store, parts)
    for topic in ("profiles.off", "logs.delete"):
        for base, (log, _) in parts.items():
            store.put(segment_key(PREFIX, topic, 0, base, LOG_SUFFIX), log)
    policy = parse_policy({"cluster": {"compact.enable": True}, "topics": [
        {"regex": r"profiles\..*", "cleanup.policy": "compact", "delete.retention.ms": 60_000},
        {"topic": "profiles.off", "compact.enable": False}]}, "policy.yaml")
    run = engine.run(store, keys_context(store), KeyCompaction(KeyCompactOptions(now_ms=NOW, policy=policy,
                                                                                    min_age_minutes=0, merge=None)))
    assert {r.directory for r in run.segments} == {DIRECTORY}
    assert run.settings["policy"] == "policy.yaml"
    stamped = [b.header.delete_horizon_ms for b in iter_decoded(io.BytesIO(final(store, 20, LOG_SUFFIX)))
               if b.header.delete_horizon_ms is not None]
    assert stamped == [NOW + 60_000]  # the tombstone's batch, by the topic's delete.retention.ms
    for topic in ("profiles.off", "logs.delete"):
        assert all(store.get(segment_key(PREFIX, topic, 0, b, LOG_SUFFIX)) == log for b, (log, _) in parts.items())


def test_a_partition_whose_txnindex_is_missing_is_refused_and_left_as_it_is(store: S3Store) -> None:
    parts = partition(aborts=True)
    upload(store, {b: (log, b"") for b, (log, _) in parts.items()})  # the archive lost the .txnindex
    run = engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    assert run.exit_code() is ExitCode.INVALID
    failed = [r for r in run.segments if r.status is Status.FAILED]
    assert {r.base_offset for r in failed} == {0, 20, 40, 60, 80}
    assert all(r.cause is Cause.INVALID and ".txnindex" in r.reason for r in failed)
    assert all(final(store, b, LOG_SUFFIX) == log for b, (log, _) in parts.items())


def test_a_bounded_key_map_ends_passes_early_and_later_runs_go_on_to_the_same_records(store: S3Store) -> None:
    """As the broker's dedupe buffer: with a map of 4 keys a pass ends where it filled up, the partition keeps
    that offset, and the next run's map starts there; once a pass covers the range the checkpoint is
    cleared. The records left are those one unbounded pass leaves."""
    from tiering.kafka.segment import iter_decoded

    def left(logs: list[bytes]) -> set[tuple[int, bytes | None, bytes | None]]:
        return {(r.offset, r.key, r.value) for log in logs for b in iter_decoded(io.BytesIO(log))
                if not b.header.is_control for r in b.records}

    parts = partition(aborts=False)
    upload(store, parts)
    want = expected(parts, NOW)
    checkpoints = []
    for i in range(12):
        run = engine.run(store, keys_context(store, f"bounded-{i}"),
                         KeyCompaction(KeyCompactOptions(topics=re.escape(TOPIC), now_ms=NOW, max_keys=4,
                                                         min_age_minutes=0, merge=None)))
        assert run.exit_code() is ExitCode.OK
        checkpoints.append(load_state(store, PREFIX, DIRECTORY).keys_checkpoint)
        if checkpoints[-1] is None:
            break
    assert len(checkpoints) >= 3, checkpoints
    assert checkpoints[-1] is None
    assert all(a < b for a, b in itertools.pairwise(checkpoints[:-1]))  # it went on each time
    assert left([final(store, b, LOG_SUFFIX) for b in (0, 20, 40, 60)]) == left([want[b].log for b in (0, 20, 40, 60)])


def test_a_retry_with_the_same_run_id_keeps_the_originals_in_the_backups(store: S3Store) -> None:
    """A run that swapped segments and is run again under its id (an Airflow retry, at a later clock or
    with new data) does not clean them again: their backups keep the originals, and a rollback restores
    them."""
    parts = partition(aborts=True)
    upload(store, parts)
    options = KeyCompactOptions(topics=re.escape(TOPIC), now_ms=NOW, delete_retention_ms=60_000, min_age_minutes=0,
                                merge=None)
    engine.run(store, keys_context(store), KeyCompaction(options))
    run = engine.run(store, keys_context(store), KeyCompaction(replace(options, now_ms=NOW + 120_000)))
    again = {r.base_offset: r for r in run.segments}
    assert all(again[b].cause is Cause.ALREADY_COMPACTED for b in (0, 20, 40)), run.segments
    for base in (0, 20, 40):
        assert store.get(f"{PREFIX}/_tiering/backup/keys-1/{DIRECTORY}/{base:020d}.log") == parts[base][0]
    assert rollback(store, keys_context(store, "undo"), "keys-1").counts == {"rolled-back": 3}
    assert all(final(store, b, LOG_SUFFIX) == log for b, (log, _) in parts.items())


def test_an_earlier_key_compaction_run_is_rolled_back_only_after_the_later_ones(store: S3Store) -> None:
    """Pass 2 lets the aborted transaction's .txnindex entry go (its data went on pass 1): rolling pass 1
    back first would put the aborted data back beside no entry. It is refused; pass 2 then pass 1 restore
    every original, .txnindex included."""
    parts = partition(aborts=True)
    upload(store, parts)
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    engine.run(store, keys_context(store, "keys-2"), KeyCompaction(at(NOW + DAY)))
    before = {b: final(store, b, LOG_SUFFIX) for b in parts}
    refused = rollback(store, keys_context(store, "undo-1"), "keys-1")
    assert refused.exit_code() is ExitCode.BUSY
    assert all("keys-2" in r.reason for r in refused.segments)
    assert {b: final(store, b, LOG_SUFFIX) for b in parts} == before
    assert rollback(store, keys_context(store, "undo-2"), "keys-2").exit_code() is ExitCode.OK
    assert rollback(store, keys_context(store, "undo-1b"), "keys-1").exit_code() is ExitCode.OK
    assert all(final(store, b, LOG_SUFFIX) == log for b, (log, _) in parts.items())
    assert final(store, 20, TXN_INDEX_SUFFIX) == parts[20][1]
    assert load_state(store, PREFIX, DIRECTORY).keys_runs == ()


class _CrashAfterTxnIndex:
    """The process dies right after S3 executed the DeleteObject of a .txnindex (then every request fails)."""

    def __init__(self, store: S3Store) -> None:
        self.key, self.dead = "", False
        events = store.client.meta.events
        events.register("before-parameter-build.s3.*", self._params)
        events.register("before-call.s3.*", self._before)
        events.register("after-call.s3.DeleteObject", self._after)

    def _params(self, params: dict[str, Any], **_: Any) -> None:
        self.key = str(params.get("Key", ""))

    def _before(self, **_: Any) -> None:
        if self.dead:
            raise Crash("already dead")

    def _after(self, **_: Any) -> None:
        if self.key.endswith(TXN_INDEX_SUFFIX):
            self.dead = True
            raise Crash("after the .txnindex went")


def _second_pass_crashed_after_its_txnindex(store: S3Store) -> dict[int, tuple[bytes, bytes]]:
    parts = partition(aborts=True)
    upload(store, parts)
    engine.run(store, keys_context(store, "keys-0"), KeyCompaction(at(NOW)))
    worker = fresh_store()
    _CrashAfterTxnIndex(worker)
    with pytest.raises(Crash):
        engine.run(worker, keys_context(worker), KeyCompaction(at(NOW + DAY)))
    assert not exists(store, segment_key(PREFIX, TOPIC, 0, 20, TXN_INDEX_SUFFIX))  # gone before the .log
    return parts


def test_an_operation_abandoned_after_its_txnindex_went_puts_the_original_back(store: S3Store) -> None:
    """Crashed after the .txnindex was removed, before the .log swap; meanwhile another writer replaced the
    .index: the retry abandons the operation and, the original .log being in place, puts the original
    .txnindex back beside it."""
    from tiering.commit.lease import Lease
    from tiering.commit.recover import recover_partition
    from tiering.storage.layout import lease_key

    parts = _second_pass_crashed_after_its_txnindex(store)
    store.put(segment_key(PREFIX, TOPIC, 0, 20, INDEX_SUFFIX), bytes(8))  # another writer's
    lease = Lease(store, lease_key(PREFIX, DIRECTORY), "keys-1", 600)  # the same run takes its lease back
    lease.acquire(PREFIX)
    results = recover_partition(keys_context(store), DIRECTORY, lease)
    lease.release()
    assert [(r.base_offset, r.status) for r in results] == [(20, Status.ABORTED)], results
    assert final(store, 20, TXN_INDEX_SUFFIX) == parts[20][1]
    assert no_pending(store)
    run = engine.run(store, keys_context(store), KeyCompaction(at(NOW + DAY)))  # again: the entry goes for good
    assert run.exit_code() is ExitCode.OK
    assert not exists(store, segment_key(PREFIX, TOPIC, 0, 20, TXN_INDEX_SUFFIX))


def test_cleanup_keeps_the_txnindex_a_pending_operation_needs(store: S3Store) -> None:
    from tiering.run.cleanup import CleanupOptions, cleanup

    parts = _second_pass_crashed_after_its_txnindex(store)  # its lease still held: the partition is busy
    cleaned = cleanup(store, keys_context(store, "cleanup"), CleanupOptions(grace_days=0, stale_hours=0))
    assert cleaned.exit_code() is ExitCode.BUSY
    assert store.get(f"{PREFIX}/_tiering/backup/keys-1/{DIRECTORY}/{20:020d}{TXN_INDEX_SUFFIX}") == parts[20][1]
    assert engine.run(store, keys_context(store), KeyCompaction(at(NOW + DAY))).exit_code() is ExitCode.OK
    assert no_pending(store)


def test_auto_codec_choice_still_recompresses_key_compacted_segments(store: S3Store) -> None:
    from tiering.lifecycle.vocabulary import Action
    from tiering.plan.policy import parse_policy
    from tiering.plan.scan import ScanOptions, scan

    upload(store, partition(aborts=False))
    engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    policy = parse_policy({"cluster": {"compression.type": "auto"}})
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0, policy=policy))
    assert {s.base_offset for s in plan.segments if s.action == Action.COMPACT} >= {0, 20, 40}


def test_the_report_counts_every_segment_of_the_run_not_only_those_its_document_lists(
        store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from tiering.cost.model import CostOptions
    from tiering.cost.prices import load_prices
    from tiering.report.publish import assemble

    monkeypatch.setattr("tiering.run.documents.MAX_LISTED_SEGMENTS", 2)
    upload(store, partition(aborts=True))
    run = engine.run(store, keys_context(store), KeyCompaction(at(NOW)))
    assert len(run.segments) == 2
    assert run.omitted == 3
    report = assemble(store, PREFIX, "keys-1", load_prices("us-east-1"), CostOptions({}, 7.0), [])
    assert report.totals.segments_rewritten == 3
    assert report.key_compaction is not None
    assert report.key_compaction.segments == 3
    assert report.key_compaction.aborted_records_removed == 2


def test_a_pass_that_merges_on_s3_makes_the_pure_pass_s_files_and_rolls_back(store: S3Store) -> None:
    """With merge bounds (the topic's segment.bytes and segment.index.bytes) the cleaned neighbours become one
    segment as the broker's cleaner groups them; on S3 the files are the pure pass's over the same bytes and
    bounds, file by file, the merged-away segments gone; a rollback puts every original back."""
    from tests.s3.broker_view import check_loaded
    from tiering.kafka.index import parse_txn_index
    from tiering.kafka.reader import iter_batches
    from tiering.storage.layout import partition_prefix

    parts = partition(aborts=True)
    upload(store, parts)
    limits = Limits(1 << 20, 10 << 20)
    segments = [Segment(b, lambda log=log: io.BytesIO(log), tuple(parse_txn_index(txn)), "", len(log),
                        len(read_back(io.BytesIO(log), base_offset=b).indexes.offset_index),
                        len(read_back(io.BytesIO(log), base_offset=b).indexes.time_index))
                for b, (log, txn) in sorted(parts.items())]
    pure = CleanStats()
    _, want = compact_partition(segments, CleanOptions(now_ms=NOW, merge=limits), pure)
    assert [c.sources for c in want] == [(0, 20, 40, 60)]  # every sealed segment, one group
    run = engine.run(store, keys_context(store), KeyCompaction(replace(at(NOW), merge=limits)))
    by_base = {r.base_offset: r for r in run.segments}
    assert [by_base[b].status for b in (0, 20, 40, 60)] == [Status.MERGED] * 4, [r.to_json() for r in run.segments]
    assert no_pending(store)
    (merged,) = want
    assert final(store, 0, LOG_SUFFIX) == merged.log
    assert final(store, 0, INDEX_SUFFIX) == merged.indexes.offset_index
    assert final(store, 0, TIME_INDEX_SUFFIX) == merged.indexes.time_index
    assert final(store, 0, TXN_INDEX_SUFFIX) == merged.txn_index
    for base in (20, 40, 60):
        assert not exists(store, segment_key(PREFIX, TOPIC, 0, base, LOG_SUFFIX))
    assert final(store, 80, LOG_SUFFIX) == parts[80][0]
    assert (by_base[0].stats or {}).get("key_compaction")
    kept = [(raw.header.offset, raw.header.last_offset) for raw in iter_batches(io.BytesIO(merged.log))]
    check_loaded(store, partition_prefix(PREFIX, DIRECTORY), [*kept, (80, 80)])
    # The report counts what the cleaner dropped from the merged group, in bytes and records.
    rep = assemble(store, PREFIX, "keys-1", load_prices(), CostOptions(), [], kind=RunKind.COMPACT_KEYS)
    before = sum(len(parts[b][0]) for b in (0, 20, 40, 60))
    kc = rep.key_compaction
    assert kc is not None
    assert kc.segments == 4
    assert kc.saved_bytes == before - len(merged.log) > 0
    assert (kc.records_before, kc.records_after) == (pure.records_in, pure.records_out)
    assert kc.records_after < kc.records_before
    assert (rep.totals.bytes_before, rep.totals.bytes_after) == (before, len(merged.log))
    assert rep.merging is not None
    assert (rep.merging.segments_before, rep.merging.segments_after) == (4, 1)
    text = render(rep, "table")
    assert text.startswith("compaction report"), text
    assert "saved by key compaction" in text
    undone = rollback(store, context(store, "rollback-1"), "keys-1")
    assert {r.status for r in undone.segments} == {Status.ROLLED_BACK}, [r.to_json() for r in undone.segments]
    for base, (log, _) in parts.items():
        assert final(store, base, LOG_SUFFIX) == log
    assert final(store, 20, TXN_INDEX_SUFFIX) == parts[20][1]
