"""Regression tests for what crashes, flaky S3 and concurrent writers did to the protocol: each test holds
one S3 request before or after S3 executes it (or cuts a body short) and checks the outcome and every
invariant."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.response import StreamingBody

from tests.s3.conftest import (
    PREFIX,
    TOPIC,
    check_consistent,
    context,
    fresh_store,
    no_pending,
    plan_for,
    seed,
)
from tests.s3.hooks import Step, key_ends
from tiering.commit.lease import Lease, LeaseHeld
from tiering.errors import ExitCode
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Action, Cause, Pending
from tiering.run.cleanup import cleanup
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import DirKind, lease_key, parse_dir, segment_key
from tiering.storage.objects import TransportError
from tiering.storage.s3 import S3Store

DIR = f"{TOPIC}-0"
INDEXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX)


class Crash(Exception):
    """The process dies here (nothing in the package catches it)."""


def key(base: int, suffix: str = LOG_SUFFIX) -> str:
    return segment_key(PREFIX, TOPIC, 0, base, suffix)


def final_log_swap(base: int) -> Any:
    """The conditional PUT that replaces a segment's final ``.log``."""
    return lambda p: p["Key"] == key(base) and "IfMatch" in p


def by_base(run: Any) -> dict[int, Any]:
    return {r.base_offset: r for r in run.segments}


def test_a_mirror_re_uploading_after_our_swap_keeps_its_objects(store: S3Store) -> None:
    """A mirror uploads .log, .index, .timeindex between our .log swap and our index PUTs: our indexes must
    never land beside its .log, and the segment is not reported as compacted."""
    originals = seed(store)
    target, other = sorted(originals)[:2]
    theirs = {sfx: store.get(key(target, sfx)) for sfx in INDEXES}
    mirror = fresh_store()

    def upload() -> None:
        mirror.put(key(target), originals[target].log)
        for sfx, data in theirs.items():
            mirror.put(key(target, sfx), data)

    worker = fresh_store()
    Step(worker, "PutObject", final_log_swap(target), lambda **_: upload(), after=True)
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    got = by_base(run)
    assert got[target].status == "superseded", got[target].reason
    assert got[target].pending is Pending.BUSY
    assert got[other].status == "compacted"
    assert store.get(key(target)) == originals[target].log
    assert {sfx: store.get(key(target, sfx)) for sfx in INDEXES} == theirs
    assert no_pending(store)
    check_consistent(store, originals)


def test_a_mirror_putting_only_the_log_after_our_swap_leaves_no_index_of_ours(store: S3Store) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    worker = fresh_store()
    Step(worker, "PutObject", final_log_swap(target),
         lambda **_: fresh_store().put(key(target), originals[target].log), after=True)
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    assert by_base(run)[target].status == "superseded"
    assert store.get(key(target)) == originals[target].log
    assert not [o for o in store.list(key(target, "")) if not o.key.endswith(LOG_SUFFIX)]  # a broker rebuilds them
    check_consistent(store, originals, indexes=False)


def test_a_compaction_planned_during_a_rollback_never_overwrites_the_restored_indexes(store: S3Store) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    compact(store, plan_for(store), context(store, "run-a"), CompactOptions())
    indexes = {sfx: store.get(key(target, sfx)) for sfx in INDEXES}  # run-a's; the originals are in its backup
    plans: list[Any] = []
    roller = fresh_store()
    # Run B plans at the instant the rollback has put the original .log back but not yet its indexes.
    Step(roller, "PutObject", final_log_swap(target), lambda **_: plans.append(plan_for(fresh_store())), after=True)
    rollback(roller, context(roller, "undo-a"), "run-a")
    restored = {sfx: store.get(key(target, sfx)) for sfx in INDEXES}
    assert restored != indexes
    planned = next(s for s in plans[0].segments if s.base_offset == target)
    assert (planned.action, planned.index, planned.timeindex) == ("compact", None, None)

    run = compact(store, plans[0], context(store, "run-b"), CompactOptions())
    got = by_base(run)[target]
    assert (got.status, got.pending) == ("skipped", Pending.BUSY)
    assert "appeared after planning" in got.reason
    assert {sfx: store.get(key(target, sfx)) for sfx in INDEXES} == restored
    check_consistent(store, originals)
    assert not list(store.list(f"{PREFIX}/_tiering/backup/run-b/"))  # B replaced nothing


def _cut_short(parsed: dict[str, Any], **_: Any) -> None:
    """The body ends (cleanly, no error from the connection) at half its announced length."""
    data = parsed["Body"].read()
    parsed["Body"] = StreamingBody(io.BytesIO(data[: len(data) // 2]), None)


def _damaged(parsed: dict[str, Any], **_: Any) -> None:
    """The body arrives whole but with one byte changed."""
    data = bytearray(parsed["Body"].read())
    data[300] ^= 0x40
    parsed["Body"] = StreamingBody(io.BytesIO(bytes(data)), len(data))


def test_a_body_cut_short_is_a_transport_error_not_short_data(store: S3Store) -> None:
    seed(store, segments=2)
    worker = fresh_store()
    worker.client.meta.events.register("after-call.s3.GetObject", _cut_short)
    with pytest.raises(TransportError, match="ended before its announced length") as caught:
        worker.get(key(0))
    assert caught.value.retryable


@pytest.mark.parametrize("fault", [_cut_short, _damaged], ids=["cut-short", "damaged"])
def test_a_download_damaged_on_the_way_is_retryable_and_never_remembered_as_invalid(store: S3Store,
                                                                                    fault: Any) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    worker = fresh_store()
    # The first GET of the .log (the rewrite's, pinned with If-Match) only: the re-check reads it whole.
    Step(worker, "GetObject", lambda p: p["Key"] == key(target) and "IfMatch" in p, fault, after=True)
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    got = by_base(run)[target]
    assert (got.status, got.pending) == ("failed", Pending.TRANSIENT), got.reason
    assert not run.failed  # nothing invalid: a retry will do it
    assert (entry := load_state(store, PREFIX, DIR).get(target)) is None or entry.compacted
    again = compact(fresh_store(), plan_for(store), context(store, "run-2"), CompactOptions())
    assert by_base(again)[target].status == "compacted"
    check_consistent(store, originals)


def test_a_lease_released_between_our_refused_create_and_our_read_is_created_again(store: S3Store) -> None:
    other = Lease(fresh_store(), lease_key(PREFIX, DIR), "other-run")
    other.acquire(PREFIX)
    mine = fresh_store()
    Step(mine, "GetObject", key_ends(f"leases/{DIR}.json"), other.release)
    lease = Lease(mine, lease_key(PREFIX, DIR), "my-run")
    lease.acquire(PREFIX)
    assert mine.get_json(lease_key(PREFIX, DIR))[0]["owner"] == "my-run"


def test_a_lease_deleted_before_our_takeover_write_is_created_again(store: S3Store) -> None:
    dead = Lease(fresh_store(), lease_key(PREFIX, DIR), "dead-run", ttl_seconds=0)
    dead.acquire(PREFIX)
    time.sleep(1.1)  # S3's clock counts whole seconds
    mine = fresh_store()
    Step(mine, "PutObject", lambda p: str(p["Key"]).endswith(f"leases/{DIR}.json") and "IfMatch" in p,
         lambda: fresh_store().delete(lease_key(PREFIX, DIR)))
    lease = Lease(mine, lease_key(PREFIX, DIR), "my-run")
    lease.acquire(PREFIX)
    assert mine.get_json(lease_key(PREFIX, DIR))[0]["owner"] == "my-run"


def test_a_live_lease_is_still_refused_with_its_holder_named(store: S3Store) -> None:
    Lease(fresh_store(), lease_key(PREFIX, DIR), "other-run").acquire(PREFIX)
    with pytest.raises(LeaseHeld, match="run other-run holds the partition's lease"):
        Lease(fresh_store(), lease_key(PREFIX, DIR), "my-run").acquire(PREFIX)


def _kill_after_state_write(store: S3Store) -> None:
    """The process dies once S3 has written the partition state: no request of it is sent after that."""
    dead = []

    def die(**_: Any) -> None:
        dead.append(True)
        raise Crash

    def dead_already(**_: Any) -> None:
        if dead:
            raise Crash

    store.client.meta.events.register("before-call.s3", dead_already)
    Step(store, "PutObject", key_ends(f"state/{DIR}.json"), die, after=True)


def test_a_retry_of_a_run_killed_after_its_state_write_finishes_the_journal(store: S3Store) -> None:
    """The kill leaves the state document saying "compacted" and the journal pending: the next scan
    skips the segment as already compacted, and the retry must still finish the journal."""
    originals = seed(store)
    worker = fresh_store()
    _kill_after_state_write(worker)
    with pytest.raises(Crash):
        compact(worker, plan_for(store), context(worker), CompactOptions())
    assert not no_pending(store)
    retry = fresh_store()
    run = compact(retry, plan_for(store), context(retry), CompactOptions())
    assert no_pending(store)
    assert any(r.status == "compacted" for r in run.segments)
    check_consistent(store, originals)


def test_work_left_to_a_dead_runs_lease_is_reported_and_not_exit_0(store: S3Store, capsys: Any) -> None:
    """Another run id while the dead run's lease lives: compact, cleanup and rollback say what they left."""
    from tiering.cli import main

    seed(store)
    worker = fresh_store()
    _kill_after_state_write(worker)
    with pytest.raises(Crash):
        compact(worker, plan_for(store), context(worker, "dead"), CompactOptions())
    other = fresh_store()
    result = cleanup(other, context(other, "sweeper"))
    assert result.exit_code() == ExitCode.BUSY
    assert {r.cause for r in result.segments} == {Cause.BUSY}
    assert all("partition busy" in r.reason for r in result.segments)
    where = ["--bucket", store.bucket, "--prefix", PREFIX]
    assert main(["s3", "cleanup", *where]) == ExitCode.BUSY
    assert "partition busy: run dead holds" in capsys.readouterr().out
    assert main(["s3", "rollback", *where, "--run-id", "dead"]) == ExitCode.BUSY
    assert "partition busy: run dead holds" in capsys.readouterr().out
    assert main(["s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--no-report"]) == ExitCode.BUSY
    assert not no_pending(store)  # nothing was forced: the dead run's lease still protects its partition


@pytest.mark.parametrize("name", ["alias-01", "uni-\u0660", "t-\uff11", "x-1\n", "t-00"])
def test_directory_names_kafka_does_not_write_are_not_partitions(name: str) -> None:
    assert parse_dir(name).kind is DirKind.OTHER


def test_a_look_alike_directory_is_never_taken_for_the_real_partition(store: S3Store) -> None:
    seed(store, topic="alias", segments=3)  # alias-0
    look_alike = f"{PREFIX}/alias-00/{0:020d}.log"
    store.put(look_alike, b"not a segment")
    stray = f"{PREFIX}/alias-0/{chr(0x0660) * 20}.log"  # twenty Arabic-Indic zeros: not segment 0
    store.put(stray, b"stray")
    plan = plan_for(store)
    assert {s.directory for s in plan.segments} == {"alias-0"}
    assert any(d["directory"] == "alias-00" for d in plan.skipped_dirs)
    assert any(k["key"] == stray for k in plan.ignored_keys)
    run = compact(store, plan, context(store), CompactOptions())
    assert [r.status for r in run.segments] == ["compacted", "compacted"]
    assert store.get(look_alike) == b"not a segment"
    assert store.get(stray) == b"stray"


def test_a_segment_with_an_archived_index_is_skipped(store: S3Store) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    data = store.get(key(target, INDEX_SUFFIX))
    store.client.put_object(Bucket=store.bucket, Key=key(target, INDEX_SUFFIX), Body=data, StorageClass="GLACIER")
    got = {s.base_offset: s for s in plan_for(store).segments}
    assert (got[target].action, got[target].reason) == (
        "skip", "archived: the .index is GLACIER (cannot be read or replaced without a restore)")


def test_a_same_id_retry_counts_what_the_killed_attempt_compacted(store: S3Store) -> None:
    """The run document (and so the savings ledger) counts what is on S3, whatever attempt did it. The
    attempt is killed after the partition's state names all three segments and one journal is deleted:
    that one is counted from the state, the two left journalled are finished by the retry."""
    originals = seed(store, segments=4)
    worker = fresh_store()
    journals = []

    def second_journal(**_: Any) -> None:
        journals.append(True)
        if len(journals) == 2:
            raise Crash

    Step(worker, "DeleteObject", lambda p: "/_tiering/journal/" in str(p["Key"]), second_journal, times=2)
    with pytest.raises(Crash):
        compact(worker, plan_for(store), context(worker), CompactOptions())
    retry = fresh_store()
    run = compact(retry, plan_for(store), context(retry), CompactOptions())
    got = by_base(run)
    sealed = sorted(originals)[:-1]
    assert [got[b].status for b in sealed] == ["compacted"] * 3
    assert sum(r.reason == "by an earlier attempt of this run" for r in run.segments) == 1
    state = load_state(store, PREFIX, DIR)
    assert run.totals()["bytes_after"] == sum(state.segments[b].bytes_after for b in sealed)
    check_consistent(store, originals)


def test_a_segment_s3_refuses_to_read_without_its_customer_key_is_named_and_not_read_again(store: S3Store) -> None:
    """moto does not enforce SSE-C; S3 answers a HEAD of such an object without its key with a bare 400."""
    originals = seed(store)
    target = sorted(originals)[0]
    worker = fresh_store()

    def refuse(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "400", "Message": "Bad Request"},
                           "ResponseMetadata": {"HTTPStatusCode": 400, "RequestId": "REQ-42"}}, "HeadObject")

    Step(worker, "HeadObject", lambda p: p["Key"] == key(target), refuse, after=True)
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    got = by_base(run)[target]
    assert (got.status, got.pending) == ("failed", None)
    assert "customer-provided key (SSE-C)" in got.reason
    assert "request id REQ-42" in got.reason
    assert got.error is not None
    assert (got.error["status"], got.error["request_id"]) == (400, "REQ-42")
    again = {s.base_offset: s for s in plan_for(store).segments}[target]
    assert again.action is Action.SKIP
    assert again.reason.startswith("unreadable last time")
    assert store.get(key(target)) == originals[target].log


def _takeover(store: S3Store, originals: dict[int, Any]) -> Any:
    """Run B compacting the partition once run A's lease (TTL 1 s) has expired: what a stalled A finds."""
    def run_b(**_: Any) -> None:
        time.sleep(2.1)
        other = fresh_store()
        results.append(compact(other, plan_for(store), context(other, "run-b"), CompactOptions(lease_ttl_seconds=1)))

    results: list[Any] = []
    return run_b, results


def test_a_run_stalled_before_its_backup_copy_never_spoils_the_backup_of_the_run_that_took_over(
        store: S3Store) -> None:
    """A stalls before copying the original to its backup; B takes the partition over. B takes A's staged
    operation over with its own backup keys (it never rolls forward into A's), backs the original up and
    swaps; A's copy, arriving after B's swap, lands in A's own backup, which no journal names, and A stops.
    Rolling B back restores the original."""
    originals = seed(store)
    target = sorted(originals)[0]
    run_b, results = _takeover(store, originals)
    worker = fresh_store()
    Step(worker, "CopyObject", lambda p: str(p["Key"]).endswith(f"{target:020d}.log"), run_b)
    run_a = compact(worker, plan_for(store), context(worker, "run-a"), CompactOptions(lease_ttl_seconds=1))
    a, b = by_base(run_a)[target], by_base(results[0])[target]
    assert (b.status, b.recovered) == ("compacted", False)  # taken over: this run's work now
    assert "taken over" in b.reason
    assert [r.base_offset for r in results[0].segments].count(target) == 1  # not staged again
    assert (a.status, a.pending) in {("aborted", Pending.BUSY), ("skipped", Pending.BUSY)}, a.reason
    assert no_pending(store)
    check_consistent(store, originals)
    rollback(store, context(store, "undo-b"), "run-b")
    assert store.get(key(target)) == originals[target].log


def test_a_run_stalled_after_an_index_delete_stops_as_a_conflict_when_another_finished_its_operation(
        store: S3Store) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    run_b, results = _takeover(store, originals)
    worker = fresh_store()
    Step(worker, "DeleteObject", lambda p: p["Key"] == key(target, INDEX_SUFFIX), run_b, after=True)
    run_a = compact(worker, plan_for(store), context(worker, "run-a"), CompactOptions(lease_ttl_seconds=1))
    a = by_base(run_a)[target]
    assert (a.status, a.pending) == ("aborted", Pending.BUSY), a.reason
    assert "took this operation over" in a.reason
    assert not run_a.failed
    finished = [r for r in results[0].segments if r.base_offset == target]
    assert [(r.status, r.recovered) for r in finished] == [("compacted", True)]  # B rolled A's op forward, once
    assert no_pending(store)
    check_consistent(store, originals)


def test_a_run_s_exit_code_is_its_worst_segment() -> None:
    from tiering.commit.operation import SegmentResult
    from tiering.lifecycle.vocabulary import Cause, Status
    from tiering.run.documents import outcome

    def seg(status: Status, cause: Cause | None = None, pending: Pending | None = None) -> SegmentResult:
        return SegmentResult("t-0", 0, status, cause=cause, pending=pending)

    done, busy = seg(Status.COMPACTED), seg(Status.SKIPPED, pending=Pending.BUSY)
    retry = seg(Status.FAILED, pending=Pending.TRANSIENT)
    refused, invalid = seg(Status.FAILED), seg(Status.FAILED, Cause.INVALID)
    proof = seg(Status.FAILED, Cause.PROOF_FAILED)
    assert outcome([]) == outcome([done, seg(Status.SKIPPED, Cause.ACTIVE)]) == ExitCode.OK
    assert outcome([done, busy]) == ExitCode.BUSY
    assert outcome([busy, retry]) == ExitCode.RETRY
    assert outcome([retry, refused]) == ExitCode.USAGE
    assert outcome([refused, invalid, busy]) == ExitCode.INVALID
    assert outcome([invalid, proof]) == ExitCode.INTERNAL


def test_a_mirror_re_uploading_a_byte_identical_original_never_leaves_its_index_beside_our_log(
        store: S3Store) -> None:
    """Found by the chaos suite's long mode: the mirror's .log is byte-identical to the original (same ETag), so
    our swap goes through; its .index arrives after our delete of the old one and before our swap. Our new
    .log must not stay beside that index: it is replaced by ours (the original is in the backup)."""
    originals = seed(store)
    target = sorted(originals)[0]
    theirs = {sfx: store.get(key(target, sfx)) for sfx in INDEXES}
    mirror = fresh_store()
    worker = fresh_store()
    Step(worker, "DeleteObject", lambda p: p["Key"] == key(target, INDEX_SUFFIX),
         lambda: mirror.put(key(target), originals[target].log))
    Step(worker, "PutObject", final_log_swap(target),
         lambda: [mirror.put(key(target, sfx), data) for sfx, data in theirs.items()])
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    assert by_base(run)[target].status == "compacted", by_base(run)[target].reason
    assert all(store.get(key(target, sfx)) != data for sfx, data in theirs.items())
    assert no_pending(store)
    check_consistent(store, originals)


def test_a_crash_while_giving_a_segment_up_never_strands_its_partition(store: S3Store) -> None:
    """The journal goes before the staging copies: a crash in between leaves only orphan staging objects."""
    originals = seed(store)
    target = sorted(originals)[0]
    worker = fresh_store()
    # A writer changes the .index before our delete (the segment is given up), and the process dies right
    # after S3 deleted the journal entry.
    Step(worker, "DeleteObject", lambda p: p["Key"] == key(target, INDEX_SUFFIX),
         lambda: fresh_store().put(key(target, INDEX_SUFFIX), b"\x00" * 8))
    dead: list[bool] = []

    def die(**_: Any) -> None:
        dead.append(True)
        raise Crash

    worker.client.meta.events.register("before-call.s3", lambda **_: (_ for _ in ()).throw(Crash) if dead else None)
    Step(worker, "DeleteObject", lambda p: "/_tiering/journal/" in str(p["Key"]), die, after=True)
    with pytest.raises(Crash):
        compact(worker, plan_for(store), context(worker, "run-a"), CompactOptions(lease_ttl_seconds=1))
    time.sleep(2.1)
    again = compact(fresh_store(), plan_for(store), context(store, "run-b"), CompactOptions(lease_ttl_seconds=1))
    assert again.exit_code() == ExitCode.OK, [r.reason for r in again.segments]
    assert no_pending(store)


def test_a_log_deleted_by_retention_right_before_the_swap_is_given_up_not_failed(store: S3Store) -> None:
    originals = seed(store)
    target = sorted(originals)[0]
    worker = fresh_store()
    Step(worker, "PutObject", final_log_swap(target), lambda: fresh_store().delete(key(target)))
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    got = by_base(run)[target]
    assert (got.status, got.pending) == ("aborted", None), got.reason
    assert "disappeared" in got.reason
    assert run.exit_code() == ExitCode.OK
    assert no_pending(store)


def test_an_s3_error_keeps_its_category_when_it_is_located() -> None:
    from tiering.errors import StorageError

    err = StorageError("put_object failed", path="s3://b/lease")
    err.retryable, err.code, err.status = True, "InternalError", 500
    moved = err.located(path="s3://b/seg.log", position=4096, base_offset=7)
    assert (type(moved), moved.retryable, moved.code, moved.status) == (StorageError, True, "InternalError", 500)
    assert str(moved) == "s3://b/lease, byte 4096, batch base offset 7: put_object failed"
