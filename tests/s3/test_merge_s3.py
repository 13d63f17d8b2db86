"""Merging small neighbouring segments on S3 (moto in-process), and rolling a merge back.

Every test ends with what a broker restoring the bucket would load (:mod:`tests.s3.broker_view`, Kafka's
``LogLoader`` rules): the partition's batches, each once, in order, every index fitting its ``.log``. The
fault-injection test holds every state a crash can leave to the same.
"""

from __future__ import annotations

import io
import time

import crc32c
import pytest
from botocore.exceptions import EndpointConnectionError

from tests.reference_index import rebuild
from tests.s3.broker_view import check_loaded
from tests.s3.conftest import (
    FAULT_REPORT,
    PREFIX,
    TOPIC,
    Original,
    context,
    fresh_store,
    no_pending,
    plan_for,
    seed,
)
from tests.s3.hooks import Step, key_ends
from tests.s3.test_faults import Crash, Faults, crash_points
from tiering.commit.operation import META_MERGED, Context, SegmentResult
from tiering.commit.recover import pending_journals
from tiering.errors import ConfigError, ExitCode
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.merge import Limits
from tiering.kafka.reader import iter_batches
from tiering.lifecycle.journal import Journal, OpFile
from tiering.lifecycle.state import Outcome, load_state
from tiering.lifecycle.vocabulary import Cause, Status
from tiering.plan.policy import parse_policy
from tiering.run import engine
from tiering.run.documents import CompactOptions
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import BACKUP_DIR, partition_prefix, segment_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store

DIRECTORY = f"{TOPIC}-0"
ROOT = partition_prefix(PREFIX, DIRECTORY)


def _batches(originals: dict[int, Original]) -> list[tuple[int, int]]:
    return [(raw.header.offset, raw.header.last_offset) for base in sorted(originals)
            for raw in iter_batches(io.BytesIO(originals[base].log))]


def _names(store: S3Store) -> list[str]:
    return sorted(info.key[len(ROOT):] for info in store.list(ROOT))


def _get(store: S3Store, base: int, suffix: str) -> bytes:
    return store.get(segment_key(PREFIX, TOPIC, 0, base, suffix))


def _merge(store: S3Store, run_id: str = "merge-1", limits: Limits | None = None) -> list[SegmentResult]:
    run = engine.run(store, context(store, run_id), Merging(MergeOptions(limits or Limits(1 << 20), min_age_minutes=0)))
    return list(run.segments)


def test_small_neighbours_become_one_segment(store: S3Store) -> None:
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    results = {r.base_offset: r for r in _merge(store)}
    assert [results[b].status for b in bases] == [Status.MERGED] * 4 + [Status.SKIPPED]
    assert results[bases[-1]].cause is Cause.ACTIVE
    merged = b"".join(originals[b].log for b in bases[:-1])
    assert _get(store, bases[0], LOG_SUFFIX) == merged  # every batch byte for byte, one after the other
    offsets, times = rebuild(merged, bases[0])
    assert _get(store, bases[0], INDEX_SUFFIX) == offsets
    assert _get(store, bases[0], TIME_INDEX_SUFFIX) == times
    assert store.head(segment_key(PREFIX, TOPIC, 0, bases[0], LOG_SUFFIX)).metadata[META_MERGED] == "4"
    names = _names(store)
    assert not [n for n in names if n.endswith((".swap", ".cleaned"))], names
    for base in bases[1:-1]:
        assert not [n for n in names if n.startswith(f"{base:020d}.")], names
    assert _get(store, bases[-1], LOG_SUFFIX) == originals[bases[-1]].log  # the active segment is untouched
    for base in bases[:-1]:  # every original kept for the grace period
        kept = f"{PREFIX}/_tiering/{BACKUP_DIR}/merge-1/{DIRECTORY}/{base:020d}.log"
        assert store.get(kept) == originals[base].log
    entry = load_state(store, PREFIX, DIRECTORY).get(bases[0])
    assert entry is not None
    assert entry.merged_from == tuple(bases[:-1])
    assert no_pending(store)
    check_loaded(store, ROOT, _batches(originals))
    again = {r.base_offset: r for r in _merge(store, "merge-2")}  # nothing left to merge
    assert again[bases[0]].status is Status.SKIPPED
    assert again[bases[0]].cause is Cause.NOTHING_TO_MERGE


def test_groups_stay_within_segment_bytes(store: S3Store) -> None:
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    sizes = [len(originals[b].log) for b in bases]
    limit = max(sizes[0] + sizes[1], sizes[2] + sizes[3])  # two segments fit, three do not
    assert limit < min(sizes[0] + sizes[1] + sizes[2], sizes[1] + sizes[2] + sizes[3])
    results = {r.base_offset: r for r in _merge(store, limits=Limits(limit))}
    assert all(results[b].status is Status.MERGED for b in bases[:4])
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log + originals[bases[1]].log
    assert _get(store, bases[2], LOG_SUFFIX) == originals[bases[2]].log + originals[bases[3]].log
    assert all(len(_get(store, b, LOG_SUFFIX)) <= limit for b in (bases[0], bases[2]))
    check_loaded(store, ROOT, _batches(originals))


def test_a_gap_in_offsets_ends_a_group(store: S3Store) -> None:
    originals = seed(store, segments=6, segment_bytes=20_000)
    bases = sorted(originals)
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):  # a segment missing in the middle
        store.delete(segment_key(PREFIX, TOPIC, 0, bases[2], suffix))
    results = {r.base_offset: r for r in _merge(store)}
    assert results[bases[0]].status is results[bases[1]].status is Status.MERGED
    assert results[bases[3]].status is results[bases[4]].status is Status.MERGED
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log + originals[bases[1]].log
    assert _get(store, bases[3], LOG_SUFFIX) == originals[bases[3]].log + originals[bases[4]].log
    del originals[bases[2]]
    check_loaded(store, ROOT, _batches(originals))


def test_a_gap_after_the_first_segment_merges_nothing_there(store: S3Store) -> None:
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        store.delete(segment_key(PREFIX, TOPIC, 0, bases[1], suffix))
    results = {r.base_offset: r for r in _merge(store)}
    assert results[bases[0]].status is Status.SKIPPED
    assert "gap in offsets" in results[bases[0]].reason
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log
    assert results[bases[2]].status is results[bases[3]].status is Status.MERGED
    assert not list(store.list(f"{PREFIX}/_tiering/staging/"))


def test_a_source_changed_before_the_swap_leaves_every_segment_as_it_was(store: S3Store) -> None:
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    changed = b"\x00" * 10
    key = segment_key(PREFIX, TOPIC, 0, bases[1], LOG_SUFFIX)
    # A writer replaces the second segment's .log as the first backup copy goes out.
    def replace_it(**_: object) -> None:
        store.put(key, changed)

    Step(store, "CopyObject", key_ends(f"{bases[0]:020d}.log"), replace_it)
    results = {r.base_offset: r for r in _merge(store)}
    assert {results[b].status for b in bases[:3]} == {Status.ABORTED}
    assert results[bases[0]].cause is Cause.BUSY
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log
    assert _get(store, bases[1], LOG_SUFFIX) == changed
    assert not [n for n in _names(store) if n.endswith((".swap", ".cleaned"))]
    assert no_pending(store)


def _drop_copies(store: S3Store, under: str) -> None:
    """Delete every ``.log`` under ``_tiering/<under>/`` (staging cleaned up, or backups past their grace)."""
    for info in store.list(f"{PREFIX}/_tiering/{under}/"):
        if info.key.endswith(LOG_SUFFIX):
            store.delete(info.key)


def test_a_merge_whose_staged_copy_is_gone_before_its_swap_is_given_up_and_made_anew(store: S3Store) -> None:
    """Its staged .log vanishes after it was verified and before its swap files go in: the merge is given up
    (busy: a later run merges anew), every segment stays as it was, and the next run merges them."""
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    before = {b: _get(store, b, LOG_SUFFIX) for b in bases}
    Step(store, "CopyObject", key_ends(".log.swap"), lambda **_: _drop_copies(store, "staging/merge-1"))
    results = {r.base_offset: r for r in _merge(store)}
    assert {(results[b].status, results[b].cause) for b in bases[:3]} == {(Status.ABORTED, Cause.BUSY)}
    assert "the copy to put in place is gone" in results[bases[0]].reason
    assert {b: _get(store, b, LOG_SUFFIX) for b in bases} == before
    assert not [n for n in _names(store) if n.endswith((".swap", ".cleaned"))]
    assert no_pending(store)
    again = {r.base_offset: r.status for r in _merge(fresh_store(), "merge-2")}
    assert again[bases[0]] is Status.MERGED
    check_loaded(store, ROOT, _batches(originals))


def test_a_rollback_of_a_merge_whose_backup_is_gone_before_its_swap_says_so_and_changes_nothing(
        store: S3Store) -> None:
    """The merge's backups vanish after the rollback staged its operation: nothing is restored, the merged
    segment stays in place, and the rollback exits 1 naming the missing backup (never 0)."""
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    _merge(store)
    merged = _get(store, bases[0], LOG_SUFFIX)
    worker = fresh_store()
    Step(worker, "CopyObject", key_ends(".log.swap"), lambda **_: _drop_copies(store, f"{BACKUP_DIR}/merge-1"))
    run = rollback(worker, context(worker, "rollback-1"), "merge-1")
    assert run.exit_code() == ExitCode.INVALID, [r.to_json() for r in run.segments]
    missing = [r for r in run.segments if r.cause is Cause.BACKUP_MISSING]
    assert missing
    assert {r.status for r in missing} == {Status.FAILED}
    assert "its backup is gone" in missing[0].reason
    assert _get(store, bases[0], LOG_SUFFIX) == merged
    assert not [n for n in _names(store) if n.endswith((".swap", ".cleaned"))]
    assert no_pending(store)
    check_loaded(store, ROOT, _batches(originals))


def test_rollback_splits_the_merged_segment_again(store: S3Store) -> None:
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    before = {(b, s): _get(store, b, s) for b in bases for s in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)}
    _merge(store)
    worker = fresh_store()
    run = rollback(worker, context(worker, "rollback-1"), "merge-1")
    assert [r.status for r in run.segments] == [Status.ROLLED_BACK] * 4, [r.to_json() for r in run.segments]
    assert {k: _get(store, *k) for k in before} == before
    assert not [n for n in _names(store) if n.endswith((".swap", ".cleaned"))]
    assert load_state(store, PREFIX, DIRECTORY).get(bases[0]) is None
    assert no_pending(store)
    check_loaded(store, ROOT, _batches(originals))


def test_a_merged_segment_is_not_restored_one_for_one_without_its_state(store: S3Store) -> None:
    """The state entry names the segments a merge holds; without it, a rollback must not put the first one
    back over the merged segment (the offsets of the others would vanish)."""
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    _merge(store)
    store.delete(f"{PREFIX}/_tiering/state/{DIRECTORY}.json")
    run = rollback(store, context(store, "rollback-1"), "merge-1")
    first = {r.base_offset: r for r in run.segments}[bases[0]]
    assert first.status is Status.SKIPPED
    assert first.cause is Cause.NOT_RESTORABLE
    assert run.exit_code() == ExitCode.BUSY  # not restored: said so
    check_loaded(store, ROOT, _batches(originals))


def _crash_scenario(at: int | None, mode: str, *, undo: bool) -> tuple[list[str], bool]:
    """Merge (``undo``: then roll back) with a crash at call ``at``; the bucket as a broker would load it
    checked at the crash, then a re-run converges."""
    store = fresh_store()
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    batches = _batches(originals)
    before = {(b, s): _get(store, b, s) for b in bases for s in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)}
    seeded = _names(store)
    if undo:
        _merge(store)
    worker = fresh_store()
    faults = Faults(worker, at, mode)

    def act(s: S3Store) -> list[SegmentResult]:
        if undo:
            return list(rollback(s, context(s, "rollback-1"), "merge-1").segments)
        return _merge(s)

    crashed = False
    try:
        act(worker)
    except Crash:
        crashed = True
    check_loaded(store, ROOT, batches)
    if crashed:
        results = act(fresh_store())
        assert not [r for r in results if r.status is Status.FAILED], [r.to_json() for r in results]
    assert no_pending(store)
    check_loaded(store, ROOT, batches)
    # Every file, and nothing else: the rollback's are the seeded ones; the merge's, the merged segment's under
    # the first one's name (the merged-away segments' files gone).
    gone = () if undo else tuple(f"{b:020d}." for b in bases[1:-1])
    names, expect = set(_names(store)), {n for n in seeded if not n.startswith(gone)}
    assert names == expect, f"lost or stray files: {sorted(names ^ expect)}"
    if undo:
        assert {k: _get(store, *k) for k in before} == before
    else:
        assert _get(store, bases[0], LOG_SUFFIX) == b"".join(originals[b].log for b in bases[:-1])
        for b in bases[1:-1]:
            with pytest.raises(ObjectNotFound):
                store.head(segment_key(PREFIX, TOPIC, 0, b, LOG_SUFFIX))
    return faults.calls, crashed


def plant_a_lost_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted defect: the regroup's step 4 says it put each target's ``.timeindex`` at its final name, and
    does not (its swap file is then removed as usual). A run that converges this way must fail the checks."""
    from tiering.commit import regroup

    honest = regroup._place

    def loses_the_timeindex(ctx: Context, journal: Journal, f: OpFile, key: str, fallback: str | None = None) -> str:
        if key == f.final and key.endswith(TIME_INDEX_SUFFIX):
            return str(f.etag)
        return honest(ctx, journal, f, key, fallback)

    monkeypatch.setattr(regroup, "_place", loses_the_timeindex)


@pytest.mark.parametrize("undo", [False, True], ids=["merge", "rollback"])
def test_a_merge_that_loses_an_index_fails_the_crash_check(undo: bool, aws_env: None,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    from tests.s3.conftest import BUCKET
    from tiering.storage.s3 import make_client

    plant_a_lost_index(monkeypatch)  # in the merge, and in its rollback
    with mock_aws():
        make_client().create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        with pytest.raises(AssertionError, match=r"lost or stray files: \['[0-9]{20}\.timeindex'"):
            _crash_scenario(None, "none", undo=undo)


@pytest.mark.slow
@pytest.mark.parametrize("undo", [False, True], ids=["merge", "rollback"])
def test_crash_at_every_call_then_rerun_converges(undo: bool, aws_env: None) -> None:
    from moto import mock_aws

    from tests.s3.conftest import BUCKET
    from tiering.storage.s3 import make_client

    def scenario(at: int | None, mode: str) -> tuple[list[str], bool]:
        with mock_aws():
            make_client().create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
            return _crash_scenario(at, mode, undo=undo)

    calls, _ = scenario(None, "none")
    points = crash_points(calls)
    for at, mode in points:
        _, crashed = scenario(at, mode)
        assert crashed, f"no crash at {mode} call {at} ({calls[at]})"
    by_op: dict[str, int] = {}
    for name in calls:
        by_op[name] = by_op.get(name, 0) + 1
    FAULT_REPORT.append(f"fault injection, {'rollback of a merge' if undo else 'merge'} of 3 segments: "
                        f"{len(calls)} S3 calls, {len(points) - 1} of them writes; a crash before the first write and "
                        f"after each ({len(points)} states), a broker's load of the bucket whole in each, every one "
                        "converged on re-run; calls: " + ", ".join(f"{k} {v}" for k, v in sorted(by_op.items())))


def test_results_count_bytes_once(store: S3Store) -> None:
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    results = [r for r in _merge(store) if r.status is Status.MERGED]
    assert sum(r.bytes_before for r in results) == sum(len(originals[b].log) for b in bases[:-1])
    assert sum(r.bytes_after for r in results) == len(_get(store, bases[0], LOG_SUFFIX))
    assert [r.bytes_after for r in results][1:] == [0, 0]


def test_a_policy_merges_the_topics_it_enables_each_to_its_bound(store: S3Store) -> None:
    merged = seed(store, segments=5, segment_bytes=20_000)  # orders.v1: enabled, two segments a group
    left = seed(store, segments=4, segment_bytes=20_000, topic="audit")  # not enabled
    fresh = seed(store, segments=4, segment_bytes=20_000, topic="fresh", start_ms=int(time.time() * 1000))
    bases = sorted(merged)
    sizes = [len(merged[b].log) for b in bases]
    bound = max(sizes[0] + sizes[1], sizes[2] + sizes[3])
    policy = parse_policy({"cluster": {"merge.enable": True, "min.segment.age.hours": 1},
                           "topics": [{"topic": TOPIC, "merge.target.bytes": bound},
                                      {"topic": "audit", "merge.enable": False}]})
    run = engine.run(store, context(store, "merge-p"), Merging(MergeOptions(policy=policy, min_age_minutes=0)))
    by = {(r.directory, r.base_offset): r for r in run.segments}
    assert [by[(DIRECTORY, b)].status for b in bases[:4]] == [Status.MERGED] * 4
    assert _get(store, bases[2], LOG_SUFFIX) == merged[bases[2]].log + merged[bases[3]].log
    assert not [k for k in by if k[0] == "audit-0"]  # not a topic to merge: not touched, not listed
    young = [by[("fresh-0", b)] for b in sorted(fresh)[:-1]]
    assert {r.cause for r in young} == {Cause.TOO_YOUNG}
    assert "min.segment.age.hours" in young[0].reason
    for base, original in left.items():
        assert store.get(segment_key(PREFIX, "audit", 0, base, LOG_SUFFIX)) == original.log
    assert run.settings["policy"] is None  # parsed from a document, not a file


def test_s3_failing_after_the_swap_leaves_the_merge_in_flight_and_the_partition_alone(store: S3Store) -> None:
    """A source's delete failing for good after the swap files went in: the merge stays in flight (its journal
    says where), no other merge of the partition goes beside it, a broker restoring the bucket loads every
    offset once, and the next run finishes it."""
    originals = seed(store, segments=6, segment_bytes=20_000)
    bases = sorted(originals)
    sizes = [len(originals[b].log) for b in bases]
    limits = Limits(max(sizes[0] + sizes[1], sizes[2] + sizes[3]))

    def unreachable(**_: object) -> None:
        raise EndpointConnectionError(endpoint_url="http://s3.invalid")

    Step(store, "DeleteObject", key_ends(f"{bases[1]:020d}.log"), unreachable, times=100)
    first = {r.base_offset: r for r in _merge(store, limits=limits)}
    assert first[bases[0]].status is Status.FAILED
    assert first[bases[0]].pending is not None
    assert "left in flight" in first[bases[0]].reason
    assert first[bases[2]].cause is Cause.BUSY  # the next group waits for it
    [(journal, _)] = list(pending_journals(store, PREFIX))
    merged = originals[bases[0]].log + originals[bases[1]].log
    # the journal names both sources and the merged target, each with what it is held to
    assert [(s.base_offset, s.log.size) for s in journal.sources] == [(bases[0], sizes[0]), (bases[1], sizes[1])]
    assert (journal.targets[0].log.size, journal.targets[0].log.crc32c) == (len(merged), crc32c.crc32c(merged))
    check_loaded(store, ROOT, _batches(originals))
    second = _merge(fresh_store(), "merge-2", limits=limits)
    assert no_pending(store)
    check_loaded(store, ROOT, _batches(originals))
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log + originals[bases[1]].log
    finished = [r for r in second if r.recovered]  # run merge-1's operation, finished by merge-2
    assert [(r.base_offset, r.status) for r in finished] == [(bases[0], Status.MERGED), (bases[1], Status.MERGED)]
    assert _get(store, bases[2], LOG_SUFFIX) == originals[bases[2]].log + originals[bases[3]].log


def _merge_left_in_flight(store: S3Store, originals: dict[int, Original]) -> Limits:
    """The first two segments merged, the merge left in flight after its swap files went in (the delete of the
    second source's .log never gets through); the merge's bounds."""
    bases = sorted(originals)
    limits = Limits(len(originals[bases[0]].log) + len(originals[bases[1]].log))

    def unreachable(**_: object) -> None:
        raise EndpointConnectionError(endpoint_url="http://s3.invalid")

    Step(store, "DeleteObject", key_ends(f"{bases[1]:020d}.log"), unreachable, times=100)
    first = {r.base_offset: r for r in _merge(store, limits=limits)}
    assert "left in flight" in first[bases[0]].reason
    return limits


def test_storage_tiering_leaves_the_segments_of_a_merge_in_flight_alone(store: S3Store) -> None:
    """A merge left in flight after a tiering run planned: the run moves none of its segments (a move would
    change a source the merge deletes by its ETag), moves the others, and the merge finishes later."""
    from tests.plan.test_tier import DOC, planned_tiers

    originals = seed(store, segments=4, segment_bytes=300_000)  # .log objects above IA's 128 KiB minimum
    bases = sorted(originals)
    worker = fresh_store()
    finish = planned_tiers(worker, DOC, "tier-1")  # every sealed .log planned to move
    limits = _merge_left_in_flight(store, originals)
    moved = {r.base_offset: r for r in finish().segments}
    for base in bases[:2]:
        assert moved[base].status is Status.SKIPPED
        assert moved[base].cause is Cause.BUSY
        assert f"a merge of segments {bases[0]}..{bases[1]} is in flight" in moved[base].reason
    assert moved[bases[2]].status is Status.MOVED  # the other sealed segment moves
    classes = {info.key.rsplit("/", 1)[1]: worker.client.head_object(Bucket=worker.bucket, Key=info.key).get(
        "StorageClass", "STANDARD") for info in worker.list(f"{PREFIX}/{TOPIC}-0/")}
    assert {name for name, cls in classes.items() if cls != "STANDARD"} == {f"{bases[2]:020d}.log"}, classes
    _merge(fresh_store(), "merge-2", limits=limits)
    assert no_pending(store)
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log + originals[bases[1]].log


def test_a_tiering_run_finishes_a_merge_left_in_flight_before_it_plans(store: S3Store) -> None:
    from tests.plan.test_tier import DOC, run_tiers

    originals = seed(store, segments=4, segment_bytes=300_000)
    bases = sorted(originals)
    _merge_left_in_flight(store, originals)
    run = run_tiers(fresh_store(), DOC, "tier-1")
    finished = [(r.base_offset, r.status) for r in run.segments if r.recovered]
    assert finished == [(bases[0], Status.MERGED), (bases[1], Status.MERGED)]
    assert no_pending(store)
    assert _get(store, bases[0], LOG_SUFFIX) == originals[bases[0]].log + originals[bases[1]].log
    moved = {r.base_offset: r.status for r in run.segments if not r.recovered}
    assert moved == {bases[0]: Status.MOVED, bases[2]: Status.MOVED}  # the merged segment and the other sealed one


def test_another_operations_swap_files_in_the_partition_stop_a_merge_before_its_own(store: S3Store) -> None:
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    stray = segment_key(PREFIX, TOPIC, 0, bases[-1], LOG_SUFFIX) + ".swap"
    store.put(stray, originals[bases[-1]].log)  # e.g. a half-copied broker directory
    results = {r.base_offset: r for r in _merge(store)}
    assert results[bases[0]].status is Status.ABORTED
    assert "another operation's swap files" in results[bases[0]].reason
    assert [n for n in _names(store) if n.endswith(".swap")] == [stray[len(ROOT):]]
    for base in bases:
        assert _get(store, base, LOG_SUFFIX) == originals[base].log
    assert no_pending(store)


def test_a_retry_of_the_same_run_does_not_merge_what_it_merged(store: S3Store) -> None:
    originals = seed(store, segments=6, segment_bytes=20_000)
    bases = sorted(originals)
    sizes = [len(originals[b].log) for b in bases]
    _merge(store, "merge-1", Limits(max(sizes[0] + sizes[1], sizes[2] + sizes[3])))
    again = {r.base_offset: r for r in _merge(store, "merge-1")}  # larger bounds: it would merge the merged
    assert again[bases[0]].cause is again[bases[2]].cause is Cause.ALREADY_COMPACTED
    run = rollback(store, context(store, "rollback-1"), "merge-1")
    assert {r.status for r in run.segments} == {Status.ROLLED_BACK}
    for base in bases:
        assert _get(store, base, LOG_SUFFIX) == originals[base].log
    check_loaded(store, ROOT, _batches(originals))


def test_a_compaction_of_a_merged_segment_rolls_back_to_the_merged_segment(store: S3Store) -> None:

    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    _merge(store)
    merged = _get(store, bases[0], LOG_SUFFIX)
    compacted = compact(store, plan_for(store), context(store, "zstd-1"), CompactOptions())
    assert {r.status for r in compacted.segments if r.base_offset == bases[0]} == {Status.COMPACTED}
    run = rollback(store, context(store, "rollback-1"), "zstd-1")
    assert [r.status for r in run.segments] == [Status.ROLLED_BACK]
    assert _get(store, bases[0], LOG_SUFFIX) == merged
    check_loaded(store, ROOT, _batches(originals))


def _objects(store: S3Store) -> dict[str, bytes]:
    """Every object of the partition, by name."""
    return {name: store.get(ROOT + name) for name in _names(store)}


def test_rollbacks_in_reverse_order_undo_a_merge_then_a_compaction_of_it(store: S3Store) -> None:
    """A merge, a compaction of what it merged, then the rollbacks: the merge's first is refused (exit 3, the
    compaction named, nothing changed); the compaction's puts the merged segment and its state entry back;
    then the merge's restores every original object byte for byte."""
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    before = _objects(store)
    _merge(store)
    merged_entry = load_state(store, PREFIX, DIRECTORY).get(bases[0])
    assert merged_entry is not None
    assert merged_entry.merged_from == tuple(bases[:-1])
    compacted = compact(store, plan_for(store), context(store, "zstd-1"), CompactOptions())
    assert {r.status for r in compacted.segments if r.base_offset == bases[0]} == {Status.COMPACTED}
    on_top = load_state(store, PREFIX, DIRECTORY).get(bases[0])
    assert on_top is not None
    assert on_top.run_id == "zstd-1"
    assert [r.entry for r in on_top.replaced] == [merged_entry]  # the merge's generation, one step down

    after_both = _objects(store)
    refused = rollback(store, context(store, "rollback-early"), "merge-1")
    assert refused.exit_code() == ExitCode.BUSY
    assert {r.base_offset for r in refused.segments} == set(bases[:-1])
    assert {(r.status, r.cause) for r in refused.segments} == {(Status.SKIPPED, Cause.LATER_RUN)}
    assert all("zstd-1" in r.reason for r in refused.segments), [r.reason for r in refused.segments]
    assert _objects(store) == after_both
    assert no_pending(store)

    undone = rollback(store, context(store, "rollback-1"), "zstd-1")
    assert undone.exit_code() == ExitCode.OK
    restored = load_state(store, PREFIX, DIRECTORY).get(bases[0])
    assert restored is not None
    assert (restored.run_id, restored.merged_from, restored.replaced) == (
        "merge-1", merged_entry.merged_from, merged_entry.replaced)
    assert restored.log_etag == store.head(segment_key(PREFIX, TOPIC, 0, bases[0], LOG_SUFFIX)).etag
    unmerged = rollback(store, context(store, "rollback-2"), "merge-1")
    assert unmerged.exit_code() == ExitCode.OK, [r.to_json() for r in unmerged.segments]
    assert [r.status for r in unmerged.segments] == [Status.ROLLED_BACK] * 4
    assert _objects(store) == before  # every object, and no other
    assert load_state(store, PREFIX, DIRECTORY).segments == {}
    assert no_pending(store)
    check_loaded(store, ROOT, _batches(originals))


def test_a_merge_with_nothing_to_merge_says_so_in_its_figures(store: S3Store) -> None:
    seed(store, segments=3, segment_bytes=20_000)
    run = engine.run(store, context(store, "merge-none"), Merging(MergeOptions(Limits(1 << 20), topics="other",
                                                                                        min_age_minutes=0)))
    assert run.usage["objects"] == {"before": 0, "after": 0}
    assert run.totals() == {"segments": 0, "bytes_before": 0, "bytes_after": 0}


def test_a_merge_rewrites_nothing_and_judges_an_invalid_source_by_reading_it_again(store: S3Store) -> None:
    """A merge's context has no rewrite options (it copies batches as they are): a source whose batch fails
    its CRC is downloaded again and validated batch by batch, then failed as invalid, remembered without a
    codec (the compaction's next scan skips it, saying which run found it), and nothing is merged over it;
    the segment before it in its group is not merged, naming it (not "damaged on the way": exit 1, not 4)."""
    originals = seed(store, segments=4, segment_bytes=20_000)
    bases = sorted(originals)
    key = segment_key(PREFIX, TOPIC, 0, bases[1], LOG_SUFFIX)
    damaged = bytearray(store.get(key))
    damaged[200] ^= 1  # a record's byte: the batch's CRC no longer holds
    store.put(key, bytes(damaged))
    ctx = Context(store, PREFIX, "merge-x")
    with pytest.raises(ConfigError, match="rewrites no segment"):
        ctx.rewrite  # noqa: B018 - the property raises
    run = engine.run(store, ctx, Merging(MergeOptions(Limits(1 << 20), min_age_minutes=0)))
    by_base = {r.base_offset: r for r in run.segments}
    assert (by_base[bases[1]].status, by_base[bases[1]].cause) == (Status.FAILED, Cause.INVALID)
    assert "CRC mismatch" in by_base[bases[1]].reason
    entry = load_state(store, PREFIX, DIRECTORY).get(bases[1])
    assert entry is not None
    assert (entry.outcome, entry.codec, entry.run_id) == (Outcome.INVALID, None, "merge-x")
    skipped = next(s for s in plan_for(store).segments if s.base_offset == bases[1])
    assert skipped.reason.startswith("invalid last time (by run merge-x)")
    assert (by_base[bases[0]].status, by_base[bases[0]].cause) == (Status.SKIPPED, Cause.NOTHING_TO_MERGE)
    assert f"segment {bases[1]}, in its group, failed validation" in by_base[bases[0]].reason
    assert run.exit_code() == ExitCode.INVALID  # not a retry: the bytes in the bucket are the problem
    assert store.get(key) == bytes(damaged)
    for base in (bases[0], bases[2]):  # its neighbours are not merged over it
        assert _get(store, base, LOG_SUFFIX) == originals[base].log


def test_the_sources_before_an_invalid_last_source_still_merge(store: S3Store) -> None:
    """The last source of a group fails validation: it is judged at once (invalid, remembered, exit 1) and the
    sources before it are merged together without it."""
    originals = seed(store, segments=5, segment_bytes=20_000)
    bases = sorted(originals)
    key = segment_key(PREFIX, TOPIC, 0, bases[3], LOG_SUFFIX)
    damaged = bytearray(store.get(key))
    damaged[200] ^= 1
    store.put(key, bytes(damaged))
    run = engine.run(store, Context(store, PREFIX, "merge-y"), Merging(MergeOptions(Limits(1 << 20),
                                                                                      min_age_minutes=0)))
    by_base = {r.base_offset: r for r in run.segments}
    assert [by_base[b].status for b in bases[:3]] == [Status.MERGED] * 3
    assert (by_base[bases[3]].status, by_base[bases[3]].cause) == (Status.FAILED, Cause.INVALID)
    assert run.exit_code() == ExitCode.INVALID
    assert _get(store, bases[0], LOG_SUFFIX) == b"".join(originals[b].log for b in bases[:3])
    assert store.get(key) == bytes(damaged)
    entry = load_state(store, PREFIX, DIRECTORY).get(bases[3])
    assert entry is not None
    assert entry.outcome is Outcome.INVALID
