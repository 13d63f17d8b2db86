"""Rolling back storage-tiering runs, alone and among compactions and merges: each move is marked in the
partition's state before its copy (and its ETag after it), a rollback moves the objects back to the class the
run found them in, and rollbacks in reverse order of any sequence of runs put every object back, byte for
byte and in its class. Out of order, a rollback changes nothing and names the run to roll back first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError
from msgspec import structs

from tests.plan.test_tier import moved_by, planned_tiers, run_tiers
from tests.s3.conftest import BUCKET, PREFIX, TOPIC, context, plan_for, seed
from tests.s3.hooks import Step, key_ends
from tiering.cost.prices import PriceBook, load_prices
from tiering.errors import ConfigError, ExitCode
from tiering.kafka.merge import Limits
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Cause, RunKind, Status
from tiering.plan.policy import parse_policy
from tiering.run import engine
from tiering.run.documents import CompactOptions, RunResult
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import partition_prefix, segment_key
from tiering.storage.s3 import S3Store

DIRECTORY = f"{TOPIC}-0"
BIG = 300_000  # .log objects above the 128 KiB that IA and Glacier IR bill at least; their indexes below it
# Every class may be left at once: the runs of a test follow each other within seconds.
_LIST_PRICES = load_prices("us-east-1")
PRICES: PriceBook = replace(_LIST_PRICES, storage={k: replace(v, min_days=0) for k, v in _LIST_PRICES.storage.items()})


def _policy(storage_class: str) -> Any:
    return parse_policy({"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": storage_class}]}})


def _tier(store: S3Store, run_id: str, storage_class: str) -> RunResult:
    return run_tiers(store, _policy(storage_class), run_id, PRICES)


def _objects(store: S3Store) -> dict[str, tuple[bytes, str]]:
    """Every object of the partition: its bytes and storage class."""
    root = partition_prefix(PREFIX, DIRECTORY)
    return {info.key[len(root):]: (store.get(info.key), info.storage_class) for info in store.list(root)}


def _classes(store: S3Store) -> dict[str, str]:
    return {name: cls for name, (_, cls) in _objects(store).items()}


def _refused(run: RunResult, *names: str) -> None:
    """The rollback changed nothing and names each of ``names`` as a run to roll back first."""
    assert run.exit_code() == ExitCode.BUSY, run.outcome_rows()
    refused = [s for s in run.segments if s.cause is Cause.LATER_RUN]
    assert refused, run.outcome_rows()
    assert all(any(n in s.reason for n in names) for s in refused), [s.reason for s in refused]
    assert {n for n in names if any(n in s.reason for s in refused)} == set(names)


def test_a_tiering_run_rolls_back_to_the_classes_it_found(store: S3Store) -> None:
    seed(store, segments=3, segment_bytes=BIG)  # records a year old
    before = _objects(store)
    run = _tier(store, "tier-1", "GLACIER_IR")
    moved = [m["key"] for m in moved_by(run)]
    assert len(moved) == 2  # the two sealed .log objects; the indexes are too small, the active segment stays
    marks = load_state(store, PREFIX, DIRECTORY).tiered
    assert sorted(marks) == sorted(r.base_offset for r in run.segments)
    for base, [mark] in marks.items():
        [move] = mark.moves
        assert (mark.run_id, mark.generation, move.file, move.from_class, move.to_class) == (
            "tier-1", None, "log", "STANDARD", "GLACIER_IR")
        assert (move.etag_after or move.etag_before) == store.head(segment_key(PREFIX, TOPIC, 0, base, ".log")).etag

    undone = rollback(store, context(store, "undo-1"), "tier-1")
    assert undone.exit_code() == ExitCode.OK
    assert {s.status for s in undone.segments} == {Status.ROLLED_BACK}
    assert _objects(store) == before  # the same bytes, every object in its class again
    assert load_state(store, PREFIX, DIRECTORY).tiered == {}
    again = rollback(store, context(store, "undo-2"), "tier-1")  # e.g. a rollback killed before its end, re-run
    assert (again.exit_code(), again.segments) == (ExitCode.OK, ())
    with pytest.raises(ConfigError, match="nothing to roll back"):
        rollback(store, context(store, "undo-3"), "no-such-run")


def test_rollbacks_in_reverse_order_undo_tiering_then_compaction_then_tiering(store: S3Store) -> None:
    seed(store, segments=3, segment_bytes=BIG)
    originals = _objects(store)
    assert moved_by(_tier(store, "tier-1", "STANDARD_IA"))
    after_t1 = _objects(store)
    assert compact(store, plan_for(store), context(store, "compact-1"), CompactOptions()).totals()["compacted"] == 2
    assert {c for n, c in _classes(store).items() if n.endswith(".log")} == {"STANDARD_IA", "STANDARD"}  # the
    # compacted .log stays in the class of the one it replaced; the active segment's in STANDARD
    after_c = _objects(store)
    assert moved_by(_tier(store, "tier-2", "GLACIER_IR"))
    after_t2 = _objects(store)
    assert {c for n, c in after_t2.values()} >= {"GLACIER_IR"}

    _refused(rollback(store, context(store, "undo-a"), "tier-1"), "tier-2", "compact-1")
    _refused(rollback(store, context(store, "undo-b"), "compact-1"), "tier-2")
    assert _objects(store) == after_t2  # nothing changed

    for run_id, expected in (("tier-2", after_c), ("compact-1", after_t1), ("tier-1", originals)):
        undone = rollback(store, context(store, f"undo-{run_id}"), run_id)
        assert undone.exit_code() == ExitCode.OK, (run_id, undone.outcome_rows())
        assert _objects(store) == expected, run_id
    assert load_state(store, PREFIX, DIRECTORY).tiered == {}


def test_a_merge_and_a_tiering_run_roll_back_in_either_order_they_ran(store: S3Store) -> None:
    seed(store, segments=5, segment_bytes=150_000)  # neighbours that merge in pairs, each above 128 KiB
    originals = _objects(store)
    limits = Limits(400_000)

    def merge(run_id: str) -> None:
        results = engine.run(store, context(store, run_id), Merging(MergeOptions(limits, min_age_minutes=0))).segments
        assert any(r.status is Status.MERGED for r in results)

    # a merge, then a tiering run of the merged segments
    merge("merge-1")
    merged = _objects(store)
    assert moved_by(_tier(store, "tier-1", "GLACIER_IR"))
    _refused(rollback(store, context(store, "undo-a"), "merge-1"), "tier-1")
    assert rollback(store, context(store, "undo-b"), "tier-1").exit_code() == ExitCode.OK
    assert _objects(store) == merged
    assert rollback(store, context(store, "undo-c"), "merge-1").exit_code() == ExitCode.OK
    assert _objects(store) == originals

    # a tiering run, then a merge of the moved segments
    assert moved_by(_tier(store, "tier-2", "GLACIER_IR"))
    moved = _objects(store)
    merge("merge-2")
    _refused(rollback(store, context(store, "undo-d"), "tier-2"), "merge-2")
    assert rollback(store, context(store, "undo-e"), "merge-2").exit_code() == ExitCode.OK
    assert _objects(store) == moved  # the sources back from the backup, in the class the merge found them in
    assert rollback(store, context(store, "undo-f"), "tier-2").exit_code() == ExitCode.OK
    assert _objects(store) == originals


def _multipart(store: S3Store, key: str) -> str:
    """``key`` uploaded again, the same bytes and metadata, as one part of a multipart upload: a copy of it (a
    move to another class) gets another ETag, as on S3."""
    body = store.get(key)
    metadata = store.client.head_object(Bucket=BUCKET, Key=key)["Metadata"]  # our marks, where we wrote it
    upload = store.client.create_multipart_upload(Bucket=BUCKET, Key=key, Metadata=metadata)["UploadId"]
    part = store.client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=body)["ETag"]
    store.client.complete_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload,
                                           MultipartUpload={"Parts": [{"ETag": part, "PartNumber": 1}]})
    return store.head(key).etag


def test_a_copy_that_changes_the_etag_is_marked_with_it(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    key = segment_key(PREFIX, TOPIC, 0, 0, ".log")
    etag = _multipart(store, key)
    before = _objects(store)
    _tier(store, "tier-1", "GLACIER_IR")
    [[mark]] = load_state(store, PREFIX, DIRECTORY).tiered.values()
    [move] = mark.moves
    assert move.etag_before == etag
    assert move.etag_after == store.head(key).etag != etag
    assert rollback(store, context(store, "undo-1"), "tier-1").exit_code() == ExitCode.OK
    assert _objects(store) == before


def _unreachable(**_: object) -> None:
    raise EndpointConnectionError(endpoint_url="http://s3.invalid")


def test_a_run_stopped_before_its_copy_rolls_back_to_nothing_to_move(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    before = _objects(store)
    Step(store, "CopyObject", key_ends(".log", StorageClass=True), _unreachable, times=100)
    [result] = _tier(store, "tier-1", "GLACIER_IR").segments
    assert (result.status, result.cause) == (Status.FAILED, Cause.TRANSIENT)
    [[mark]] = load_state(store, PREFIX, DIRECTORY).tiered.values()  # noted before the copy, which never came
    assert mark.moves[0].etag_after is None
    undone = rollback(store, context(store, "undo-1"), "tier-1")
    assert undone.exit_code() == ExitCode.OK
    assert [(s.status, s.cause) for s in undone.segments] == [(Status.SKIPPED, Cause.RESTORED)]
    assert _objects(store) == before
    assert load_state(store, PREFIX, DIRECTORY).tiered == {}


def test_a_run_stopped_after_its_copy_rolls_back_by_class_size_and_generation(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    _multipart(store, segment_key(PREFIX, TOPIC, 0, 0, ".log"))  # the copy's new ETag needs a write after it
    before = _objects(store)
    state_writes = Step(store, "PutObject", key_ends(f"/state/{DIRECTORY}.json", IfMatch=True), _unreachable,
                        times=100)  # the write after the copy: its ETag never recorded
    [result] = _tier(store, "tier-1", "GLACIER_IR").segments
    assert state_writes.fired
    assert result.status is Status.FAILED
    [[mark]] = load_state(store, PREFIX, DIRECTORY).tiered.values()
    assert mark.moves[0].etag_after is None
    assert _classes(store)[f"{0:020d}.log"] == "GLACIER_IR"  # moved all the same

    state_writes.left = 0
    assert _tier(store, "tier-1", "GLACIER_IR").segments == ()  # the same run again: the object is where the plan
    # wants it, and the mark stays as the stopped attempt left it

    undone = rollback(store, context(store, "undo-1"), "tier-1")
    assert undone.exit_code() == ExitCode.OK, undone.outcome_rows()
    assert {s.status for s in undone.segments} == {Status.ROLLED_BACK}  # judged by class, size and generation
    assert _objects(store) == before


def test_an_object_someone_replaced_since_is_not_moved_back(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    _tier(store, "tier-1", "GLACIER_IR")
    key = segment_key(PREFIX, TOPIC, 0, 0, ".log")
    other = bytes(b ^ 0xFF for b in store.get(key))  # the same size, other bytes
    store.client.put_object(Bucket=BUCKET, Key=key, Body=other, StorageClass="GLACIER_IR")
    undone = rollback(store, context(store, "undo-1"), "tier-1")
    assert undone.exit_code() == ExitCode.BUSY
    [segment] = undone.segments
    assert segment.cause is Cause.NOT_RESTORABLE
    assert "is not the object run tier-1 moved" in segment.reason
    assert load_state(store, PREFIX, DIRECTORY).tiered == {}  # nothing of the run left there to undo: no mark
    # stays to refuse the rollbacks of the runs below it for ever
    assert store.get(key) == other
    assert store.head(key).storage_class == "GLACIER_IR"


def test_a_rollback_stopped_by_s3_keeps_what_it_did_not_undo_and_its_retry_does_it(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    before = _objects(store)
    _tier(store, "tier-1", "GLACIER_IR")
    failing = Step(store, "CopyObject", key_ends(".log", StorageClass=True), _unreachable, times=100)
    first = rollback(store, context(store, "undo-1"), "tier-1")
    assert first.exit_code() == ExitCode.RETRY, first.outcome_rows()
    [[mark]] = load_state(store, PREFIX, DIRECTORY).tiered.values()  # the move it did not undo is still marked
    assert [m.file for m in mark.moves] == ["log"]
    failing.left = 0
    again = rollback(store, context(store, "undo-2"), "tier-1")
    assert again.exit_code() == ExitCode.OK, again.outcome_rows()
    assert {s.status for s in again.segments} == {Status.ROLLED_BACK}
    assert _objects(store) == before


def test_a_run_without_marks_is_not_said_to_be_rolled_back(store: S3Store) -> None:
    from tiering.lifecycle.state import record_segments

    seed(store, segments=2, segment_bytes=BIG)
    _tier(store, "tier-1", "GLACIER_IR")
    record_segments(store, PREFIX, DIRECTORY, {}, tiered=lambda _: {})  # as a run made before marks left it
    undone = rollback(store, context(store, "undo-1"), "tier-1")
    assert undone.exit_code() == ExitCode.BUSY
    [segment] = undone.segments
    assert segment.cause is Cause.NOT_RESTORABLE
    assert "is still in GLACIER_IR" in segment.reason
    assert "no mark of the move" in segment.reason


def test_a_move_planned_before_another_run_moved_the_object_rolls_back_to_that_runs_class(store: S3Store) -> None:
    seed(store, segments=2, segment_bytes=BIG)
    before = _objects(store)
    late = planned_tiers(store, _policy("GLACIER_IR"), "tier-2", PRICES)  # planned while the .log is in STANDARD
    _tier(store, "tier-1", "STANDARD_IA")
    moved_to_ia = _objects(store)
    assert moved_by(late())  # the same ETag: the move goes ahead, from STANDARD_IA
    _refused(rollback(store, context(store, "undo-a"), "tier-1"), "tier-2")
    assert rollback(store, context(store, "undo-b"), "tier-2").exit_code() == ExitCode.OK
    assert _objects(store) == moved_to_ia
    assert rollback(store, context(store, "undo-c"), "tier-1").exit_code() == ExitCode.OK
    assert _objects(store) == before


def test_a_compacted_segment_moved_by_a_run_killed_before_its_state_write_stays_ours(store: S3Store) -> None:
    """The copy of a multipart .log changes its ETag; a run stopped before noting it leaves our entry naming the
    ETag before the move. The scan still reads the segment as compacted (the mark explains the new ETag), not as
    a .log someone replaced, and both rollbacks put the originals back."""
    from tiering.lifecycle.state import record_segment

    seed(store, segments=2, segment_bytes=BIG)
    originals = _objects(store)
    compact(store, plan_for(store), context(store, "compact-1"), CompactOptions())
    key = segment_key(PREFIX, TOPIC, 0, 0, ".log")
    entry = load_state(store, PREFIX, DIRECTORY).get(0)
    assert entry is not None
    record_segment(store, PREFIX, DIRECTORY, 0, structs.replace(entry, log_etag=_multipart(store, key)))
    compacted = _objects(store)
    assert store.head(key).size >= 131072, "the compacted .log must pass Glacier IR's minimum to be moved"
    written = [0]  # the run's state writes: its mark, then (refused here) the ETags its copy made

    def second(**_: object) -> None:
        written[0] += 1
        if written[0] > 1:
            _unreachable()

    refusing = Step(store, "PutObject", key_ends(f"/state/{DIRECTORY}.json", IfMatch=True), second, times=100)
    [result] = _tier(store, "tier-1", "GLACIER_IR").segments
    refusing.left = 0
    assert result.status is Status.FAILED
    assert store.head(key).storage_class == "GLACIER_IR"
    assert load_state(store, PREFIX, DIRECTORY).get(0).log_etag != store.head(key).etag  # type: ignore[union-attr]
    [first] = [s for s in plan_for(store).segments if s.base_offset == 0]
    assert first.cause is Cause.ALREADY_COMPACTED, first.reason
    assert rollback(store, context(store, "undo-1"), "tier-1").exit_code() == ExitCode.OK
    assert _objects(store) == compacted
    assert rollback(store, context(store, "undo-2"), "compact-1").exit_code() == ExitCode.OK
    assert _objects(store) == originals


def test_a_run_of_an_earlier_version_is_judged_by_its_own_document(store: S3Store) -> None:
    """A tiering run document written before the engine ran tiering held the run's results itself, and its
    moves left no mark: an object still where it moved it is reported, not said to be rolled back."""
    from tiering.commit.operation import SegmentResult
    from tiering.storage.layout import run_result_key

    seed(store, segments=2, segment_bytes=BIG)
    key = segment_key(PREFIX, TOPIC, 0, 0, ".log")
    store.client.copy_object(Bucket=BUCKET, Key=key, CopySource={"Bucket": BUCKET, "Key": key},
                             StorageClass="GLACIER_IR", MetadataDirective="COPY")
    moved = SegmentResult(DIRECTORY, 0, Status.MOVED, "", stats={"moved": [{"key": key, "from": "STANDARD",
                                                                              "to": "GLACIER_IR", "bytes": 1}]})
    store.put_json(run_result_key(PREFIX, "old-tier", RunKind.TIER),
                   {"schema_version": 2, "kind": "tier", "run_id": "old-tier", "results": [moved.to_json()]})
    undone = rollback(store, context(store, "undo-1"), "old-tier")
    assert undone.exit_code() == ExitCode.BUSY
    [segment] = undone.segments
    assert (segment.cause, segment.base_offset) == (Cause.NOT_RESTORABLE, 0)
    assert store.head(key).storage_class == "GLACIER_IR"
