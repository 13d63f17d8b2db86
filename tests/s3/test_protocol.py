"""The commit protocol against moto's in-process S3: compaction, safety rules, rollback, cleanup."""

from __future__ import annotations

import io
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError

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
from tiering.commit.lease import Lease
from tiering.commit.operation import META_CODEC, META_RUN, META_SOURCE_ETAG, Staged
from tiering.commit.recover import pending_journals
from tiering.commit.stage import stage_segment
from tiering.errors import ConfigError, ExitCode
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.lifecycle.vocabulary import Action, Cause, Status
from tiering.run.cleanup import CleanupFigures, CleanupOptions, cleanup
from tiering.run.documents import RUN_SCOPE, CompactOptions
from tiering.run.pipeline import compact
from tiering.run.rollback import rollback
from tiering.storage.layout import lease_key, segment_key
from tiering.storage.objects import ObjectAttrs, ObjectNotFound
from tiering.storage.s3 import S3Store

DIR = f"{TOPIC}-0"


def key(base: int, suffix: str = LOG_SUFFIX) -> str:
    return segment_key(PREFIX, TOPIC, 0, base, suffix)


def test_compaction_rewrites_sealed_segments_and_keeps_records_and_attributes(store: S3Store) -> None:
    originals = seed(store)
    sealed, active = sorted(originals)[:-1], sorted(originals)[-1]
    # The original .log of the first segment carries metadata, tags, a content type and a storage class.
    attrs = ObjectAttrs({"owner": "team-a"}, {"ContentType": "application/octet-stream"}, {"cost-center": "42"},
                        "STANDARD_IA")
    store.put_object(key(sealed[0]), originals[sealed[0]].log, attrs)
    source_etag = store.head(key(sealed[0])).etag
    run = compact(store, plan_for(store), context(store), CompactOptions())
    assert [(r.base_offset, r.status) for r in run.segments] == [(b, "compacted") for b in sealed]
    assert run.totals()["bytes_after"] < run.totals()["bytes_before"]
    codecs = check_consistent(store, originals)
    assert [codecs[b] for b in sealed] == ["zstd"] * len(sealed)
    assert codecs[active] == "snappy"  # the active segment is never touched
    info, new_attrs = store.describe(key(sealed[0]))
    assert new_attrs.tags == {"cost-center": "42"}
    assert new_attrs.storage_class == "STANDARD_IA"
    assert new_attrs.headers["ContentType"] == "application/octet-stream"
    assert new_attrs.metadata["owner"] == "team-a"
    assert info.metadata[META_RUN] == "run-1"
    assert info.metadata[META_CODEC] == "zstd"
    assert info.metadata[META_SOURCE_ETAG] == source_etag.strip('"')
    assert store.describe(key(sealed[0], INDEX_SUFFIX))[1].storage_class == "STANDARD"  # as its own original
    # Nothing of ours is left outside the kept originals, the state and the run's result.
    ours = {k.key.split("/_tiering/")[1].split("/")[0] for k in store.list(f"{PREFIX}/_tiering/")}
    assert ours <= {"backup", "state", "runs", "clock"}
    assert no_pending(store)
    stored = store.get_json(f"{PREFIX}/_tiering/runs/run-1/compact.json")[0]
    assert stored["totals"]["compacted"] == len(sealed)


def test_a_second_run_finds_everything_already_compacted(store: S3Store) -> None:
    seed(store)
    compact(store, plan_for(store), context(store), CompactOptions())
    plan = plan_for(store)
    reasons = {s.base_offset: s.reason for s in plan.segments}
    assert [s.action for s in plan.segments] == [Action.SKIP] * len(plan.segments)
    assert sum(r.startswith("already compacted: zstd by run run-1") for r in reasons.values()) == 2
    # Another codec is new work for the same segments.
    assert len(plan_for(store, codec="gzip").to_compact()) == 2


def test_two_compactions_of_one_partition_at_once_one_skips(store: S3Store) -> None:
    seed(store)
    other = Lease(store, lease_key(PREFIX, DIR), owner="run-other", ttl_seconds=600)
    other.acquire(PREFIX)
    run = compact(store, plan_for(store), context(store), CompactOptions())
    assert {r.status for r in run.segments} == {"skipped"}
    assert all("partition busy: run run-other holds the partition's lease" in r.reason for r in run.segments)
    other.release()
    run = compact(store, plan_for(store), context(store, "run-2"), CompactOptions())
    assert {r.status for r in run.segments} == {"compacted"}


def test_concurrent_runs_in_threads_never_both_compact_a_segment(store: S3Store) -> None:
    import threading

    originals = seed(store)
    plan = plan_for(store)
    results: dict[str, Any] = {}

    def go(run_id: str) -> None:
        s = fresh_store()
        results[run_id] = compact(s, plan, context(s, run_id), CompactOptions())

    threads = [threading.Thread(target=go, args=(f"run-{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    compacted = [r for run in results.values() for r in run.segments if r.status == "compacted"]
    assert len(compacted) == 2  # each sealed segment exactly once
    check_consistent(store, originals)


def test_a_source_replaced_after_planning_is_skipped_and_left_alone(store: S3Store) -> None:
    originals = seed(store)
    plan = plan_for(store)
    first = sorted(originals)[0]
    replacement = originals[sorted(originals)[1]].log  # any other valid bytes
    store.put(key(first), replacement)
    run = compact(store, plan, context(store), CompactOptions())
    status = {r.base_offset: (r.status, r.reason) for r in run.segments}
    assert status[first][0] == "skipped"
    assert "changed after planning" in status[first][1]
    assert store.get(key(first)) == replacement
    assert status[sorted(originals)[1]][0] == "compacted"


def test_a_source_replaced_just_before_the_swap_is_never_overwritten(store: S3Store) -> None:
    """The replacement lands after staging and backup, right before the .log PUT (If-Match stops it)."""
    originals = seed(store)
    first = sorted(originals)[0]
    plan = plan_for(store)
    worker = fresh_store()
    replacement = b"a mirror tool's upload"

    def before_put(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key") == key(first) and params.get("IfMatch"):
            fresh_store().put(key(first), replacement)

    worker.client.meta.events.register("before-parameter-build.s3.PutObject", before_put)
    run = compact(worker, plan, context(worker), CompactOptions())
    status = {r.base_offset: (r.status, r.reason) for r in run.segments}
    assert status[first] == ("aborted", "the .log changed after planning: the new object is left untouched")
    assert store.get(key(first)) == replacement
    assert no_pending(store)
    backup = f"{PREFIX}/_tiering/backup/run-1/{DIR}/{first:020d}.log"
    assert store.get(backup) == originals[first].log  # the original is still recoverable


def test_a_corrupt_segment_fails_alone_and_is_not_modified(store: S3Store) -> None:
    originals = seed(store, segments=4)
    bad = sorted(originals)[1]
    data = bytearray(originals[bad].log)
    data[200] ^= 0xFF  # inside the first batch: its CRC no longer matches
    store.put(key(bad), bytes(data))
    run = compact(store, plan_for(store), context(store), CompactOptions())
    status = {r.base_offset: r for r in run.segments}
    assert status[bad].status == "failed"
    assert "invalid data, original untouched" in status[bad].reason
    assert status[bad].error is not None
    assert status[bad].error["base_offset"] == bad
    assert store.get(key(bad)) == bytes(data)
    assert [status[b].status for b in sorted(originals)[:-1] if b != bad] == ["compacted", "compacted"]
    assert run.failed


class _Raw:
    def __init__(self, body: bytes) -> None:
        self._body = io.BytesIO(body)

    def stream(self, **_: Any) -> Any:
        yield self._body.read()


def test_transient_errors_are_retried_and_the_run_succeeds(store: S3Store) -> None:
    """Two kinds of transient failure, both retried by botocore's standard mode: a dropped connection
    before S3 sees the request, and a 500/503/SlowDown answer to a request S3 DID execute (moto's stub
    runs before our hook). The second kind makes a retried conditional write fail its own condition: the
    protocol must recognise its own write. (Rates stay within botocore's retry quota: past it, failures
    are final and the segments fail as retryable, which the chaos suite covers.)"""
    originals = seed(store)
    worker = fresh_store()
    injected: list[str] = []
    attempts = [0]

    def lost_on_the_way(request: Any, **_: Any) -> None:
        attempts[0] += 1
        if attempts[0] % 7 == 0:
            injected.append("ConnectionClosed")
            raise ConnectionClosedError(endpoint_url=request.url)

    def answer_lost(request: Any, **_: Any) -> AWSResponse | None:
        if attempts[0] % 4:
            return None
        code, status = [("InternalError", 500), ("ServiceUnavailable", 503), ("SlowDown", 503)][len(injected) % 3]
        injected.append(code)
        body = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
        return AWSResponse(request.url, status, {}, _Raw(body))

    worker.client.meta.events.register_first("before-send.s3.*", lost_on_the_way)
    worker.client.meta.events.register_last("before-send.s3.*", answer_lost)
    run = compact(worker, plan_for(store), context(worker), CompactOptions())
    assert {"ConnectionClosed", "InternalError", "ServiceUnavailable", "SlowDown"} <= set(injected)
    assert {r.status for r in run.segments} == {"compacted"}, [r.reason for r in run.segments]
    assert no_pending(store)
    check_consistent(store, originals)
    assert not list(store.list(f"{PREFIX}/_tiering/leases/"))


def test_conditions_moto_ignores_are_sent(store: S3Store) -> None:
    """CopyObject's source condition is not enforced by moto: assert the header goes out; and the ones it
    enforces (PutObject If-Match / If-None-Match, DeleteObject If-Match) are used where the doc says."""
    seed(store)
    worker = fresh_store()
    sent: list[tuple[str, str, dict[str, str]]] = []

    def record(request: Any, **_: Any) -> None:
        sent.append((request.method, request.url.split("?")[0], dict(request.headers)))

    worker.client.meta.events.register("before-send.s3.*", record)
    compact(worker, plan_for(store), context(worker), CompactOptions())
    copies = [h for m, u, h in sent if m == "PUT" and "x-amz-copy-source" in h]
    assert copies
    assert all("x-amz-copy-source-if-match" in h for h in copies)
    log_puts = [h for m, u, h in sent if m == "PUT" and u.endswith(".log") and "/_tiering/" not in u
                and "x-amz-copy-source" not in h]
    assert log_puts
    assert all("If-Match" in h for h in log_puts)
    index_deletes = [h for m, u, h in sent if m == "DELETE" and u.endswith("index") and "/_tiering/" not in u]
    assert index_deletes
    assert all("If-Match" in h for h in index_deletes)
    lease_creates = [h for m, u, h in sent if m == "PUT" and "/_tiering/leases/" in u and "If-None-Match" in h]
    assert lease_creates


def test_rollback_restores_the_originals_of_a_run(store: S3Store) -> None:
    originals = seed(store)
    sealed = sorted(originals)[:-1]
    compact(store, plan_for(store), context(store), CompactOptions())
    run = rollback(store, context(store, "undo-1"), "run-1")
    assert [(r.base_offset, r.status) for r in run.segments] == [(b, "rolled-back") for b in sealed]
    for base in sealed:
        assert store.get(key(base)) == originals[base].log
        info = store.head(key(base))
        assert info.metadata.get(META_RUN) is None
    check_consistent(store, originals)
    assert no_pending(store)
    # The indexes are the originals' again.
    assert all(store.get(key(b, TIME_INDEX_SUFFIX)) for b in sealed)
    # A second rollback finds nothing of run-1 in place and says so.
    again = rollback(store, context(store, "undo-2"), "run-1")
    assert {r.status for r in again.segments} == {"skipped"}


def test_a_rollback_waits_for_the_later_run_that_replaced_its_segments(store: S3Store) -> None:
    """Run 2 recompressed what run 1 wrote: run 1's rollback changes nothing and names run 2 (exit 3); once
    run 2 is rolled back (run 1's segments in place again), run 1's puts the originals back."""
    originals = seed(store)
    compact(store, plan_for(store, codec="gzip"), context(store, "run-1", Codec.GZIP), CompactOptions())
    compact(store, plan_for(store), context(store, "run-2"), CompactOptions())  # zstd: smaller again
    def outside() -> dict[str, bytes]:
        return {info.key: store.get(info.key) for info in store.list(f"{PREFIX}/") if "/_tiering/" not in info.key}

    both = outside()
    run = rollback(store, context(store, "undo"), "run-1")
    assert {(r.status, r.cause) for r in run.segments} == {(Status.SKIPPED, Cause.LATER_RUN)}
    assert all("run(s) run-2 replaced segments here after run run-1" in r.reason for r in run.segments)
    assert run.exit_code() == ExitCode.BUSY
    assert outside() == both
    assert rollback(store, context(store, "undo-2"), "run-2").exit_code() == ExitCode.OK
    assert rollback(store, context(store, "undo-1"), "run-1").exit_code() == ExitCode.OK
    for base, original in originals.items():
        assert store.get(segment_key(PREFIX, TOPIC, 0, base, ".log")) == original.log


def test_a_rollback_refused_in_one_partition_works_on_none(store: S3Store) -> None:
    """Run 1 compacted two topics, run 2 only the second: run 1's rollback is refused there, and so works on
    no partition (the first keeps run 1's segments); the refusals are the run's results, in its document,
    and it made no unit."""
    seed(store)
    seed(store, topic="other")
    compact(store, plan_for(store, codec="gzip"), context(store, "run-1", Codec.GZIP), CompactOptions())
    compact(store, plan_for(store, topics="other"), context(store, "run-2"), CompactOptions())

    def outside() -> dict[str, bytes]:
        return {info.key: store.get(info.key) for info in store.list(f"{PREFIX}/") if "/_tiering/" not in info.key}

    both = outside()
    run = rollback(store, context(store, "undo"), "run-1")
    assert {(r.directory, r.status, r.cause) for r in run.segments} == {("other-0", Status.SKIPPED, Cause.LATER_RUN)}
    assert len(run.segments) == 2  # the other topic's sealed segments, each naming run 2
    assert run.exit_code() == ExitCode.BUSY
    assert outside() == both
    steps = sorted(info.key.rsplit("/", 1)[-1] for info in store.list(f"{PREFIX}/_tiering/runs/undo/rollback/"))
    assert steps == ["refused.json"]
    assert rollback(store, context(store, "undo-2"), "run-2").exit_code() == ExitCode.OK
    again = rollback(store, context(store, "undo-3"), "run-1")
    assert {(r.directory, r.status) for r in again.segments} == {(f"{TOPIC}-0", Status.ROLLED_BACK),
                                                                 ("other-0", Status.ROLLED_BACK)}


def test_a_rollback_of_a_run_that_left_nothing_fails_before_it_changes_anything(store: S3Store) -> None:
    """Another run's segment staged and left in flight: a rollback of an unknown run is an error naming what
    it looked for, and the operation in flight is still there (the next real run finishes it)."""
    seed(store)
    seg = next(s for s in plan_for(store).segments if s.action is Action.COMPACT)
    lease = Lease(store, lease_key(PREFIX, DIR), owner="run-1", ttl_seconds=1)
    lease.acquire(PREFIX)
    assert isinstance(stage_segment(context(store).for_segment(seg), seg, lease), Staged)
    lease.release()
    in_flight = [j for j, _ in pending_journals(store, PREFIX)]
    assert in_flight
    with pytest.raises(ConfigError, match="nothing to roll back") as e:
        rollback(store, context(store, "undo"), "no-such-run")
    assert "_tiering/backup/no-such-run/" in str(e.value)
    assert [j for j, _ in pending_journals(store, PREFIX)] == in_flight


def test_a_rollback_on_worker_threads_restores_every_partition(store: S3Store) -> None:
    """Three partitions rolled back on three threads: every original back, and each partition's requests
    counted apart in the run document (a thread's own client each)."""
    originals = {p: seed(store, partition=p) for p in range(3)}
    compact(store, plan_for(store), context(store), CompactOptions())
    run = rollback(store, context(store, "undo"), "run-1", workers=3)
    assert {(r.directory, r.status) for r in run.segments} == {(f"{TOPIC}-{p}", Status.ROLLED_BACK) for p in range(3)}
    assert len(run.segments) == 6
    for p, kept in originals.items():
        check_consistent(store, kept, partition=p)
    by_scope = run.usage["requests"]
    assert set(by_scope) == {f"{TOPIC}-{p}" for p in range(3)} | {RUN_SCOPE}
    for p in range(3):  # each partition's own: one listing of its journals, two originals put back
        assert by_scope[f"{TOPIC}-{p}"]["ListObjectsV2"] == 1
        assert by_scope[f"{TOPIC}-{p}"]["PutObject"] >= 4
    assert no_pending(store)


def test_a_rollback_judges_a_log_it_did_not_write_by_its_bytes(store: S3Store) -> None:
    """Where the .log in place is not the run's: the original's bytes (a mirror put them back, here beside the
    run's indexes) are restored whole; a later run over an original put back so leaves nothing of the run
    (said so, exit 0 for it); another writer's bytes are not restored over, and the exit code says so (3)."""
    originals = seed(store, segments=5)
    s0, s1, s2, s3 = sorted(originals)[:4]
    files = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
    before = {(b, sfx): store.get(key(b, sfx)) for b in (s0, s1, s2, s3) for sfx in files}
    compact(store, plan_for(store), context(store), CompactOptions())
    for sfx in files:  # a mirror puts s3's originals back, and run 2 compacts them
        store.put(key(s3, sfx), before[(s3, sfx)])
    run2 = compact(store, plan_for(store), context(store, "run-2"), CompactOptions())
    assert [r.base_offset for r in run2.segments if r.status is Status.COMPACTED] == [s3]
    store.put(key(s0), before[(s0, LOG_SUFFIX)])  # a mirror's upload of the original .log alone
    store.put(key(s1), before[(s1, LOG_SUFFIX)] + b"\0")  # another writer's object

    run = rollback(store, context(store, "undo-1"), "run-1")
    by_base = {r.base_offset: r for r in run.segments}
    assert [by_base[b].status for b in (s0, s2)] == [Status.ROLLED_BACK] * 2
    assert (by_base[s1].cause, by_base[s3].cause) == (Cause.NOT_RESTORABLE, Cause.RESTORED)
    assert "an object we did not write" in by_base[s1].reason
    assert "run run-2 has replaced the original since" in by_base[s3].reason
    assert run.exit_code() == ExitCode.BUSY
    assert {(b, sfx): store.get(key(b, sfx)) for b in (s0, s2) for sfx in files} == {
        (b, sfx): before[(b, sfx)] for b in (s0, s2) for sfx in files}  # s0's indexes too
    assert store.get(key(s1)) == before[(s1, LOG_SUFFIX)] + b"\0"  # not restored over

    assert rollback(store, context(store, "undo-2"), "run-2").exit_code() == ExitCode.OK
    assert {sfx: store.get(key(s3, sfx)) for sfx in files} == {sfx: before[(s3, sfx)] for sfx in files}


def test_budget_takes_the_largest_segments_first(store: S3Store) -> None:
    seed(store, segments=4)
    plan = plan_for(store)
    largest = max(plan.to_compact(), key=lambda s: s.size)
    run = compact(store, plan, context(store), CompactOptions(max_segments=1))
    status = {r.base_offset: r for r in run.segments}
    assert status[largest.base_offset].status == "compacted"
    assert sum(r.reason == "over the --max-segments budget" for r in run.segments) == 2
    run = compact(store, plan_for(store), context(store, "run-2"), CompactOptions(max_bytes=1))
    assert {r.reason for r in run.segments} == {"over the --max-bytes budget"}


def test_cleanup_deletes_kept_originals_after_the_grace_period_only(store: S3Store) -> None:
    seed(store)
    compact(store, plan_for(store), context(store), CompactOptions())
    kept = list(store.list(f"{PREFIX}/_tiering/backup/"))
    assert len(kept) == 6
    result = CleanupFigures.of(cleanup(store, context(store, "clean-1")))
    assert result.backups_deleted == 0
    # Leftovers a crash would leave: a staging object and an incomplete multipart upload.
    store.put(f"{PREFIX}/_tiering/staging/dead-run/{DIR}/00000000000000000000.log", b"x")
    store.client.create_multipart_upload(Bucket=store.bucket, Key=f"{PREFIX}/_tiering/staging/dead-run/big.log")
    before = store.requests["DeleteObject"]
    run = cleanup(store, context(store, "clean-2"), CleanupOptions(grace_days=0, stale_hours=0))
    result = CleanupFigures.of(run)
    assert run.exit_code() == ExitCode.OK
    assert store.requests["DeleteObject"] - before == 1  # the partition's lease: its objects go in one DeleteObjects
    assert {r.status for r in run.segments} == {"expired"}
    assert result.backups_deleted == 6
    assert result.backup_bytes_deleted == sum(k.size for k in kept)
    assert result.staging_deleted == 1
    assert result.uploads_aborted == 1
    assert not list(store.list(f"{PREFIX}/_tiering/backup/"))
    assert not list(store.list_uploads(f"{PREFIX}/_tiering/"))


def test_cleanup_finishes_an_interrupted_operation_first(store: S3Store) -> None:
    originals = seed(store)
    worker = fresh_store()

    def die_at_the_index_put(params: dict[str, Any], **_: Any) -> None:
        if str(params.get("Key", "")).endswith(".index") and "/_tiering/" not in params["Key"]:
            raise KeyboardInterrupt  # the process is stopped between the .log swap and the indexes

    worker.client.meta.events.register("before-parameter-build.s3.PutObject", die_at_the_index_put)
    with pytest.raises(KeyboardInterrupt):
        compact(worker, plan_for(store), context(worker, ttl_run := "run-dead"), CompactOptions(lease_ttl_seconds=1))
    pending = [j for j, _ in pending_journals(store, PREFIX)]
    assert len(pending) == 1
    first = pending[0].base_offset
    with pytest.raises(ObjectNotFound):
        store.head(key(first, INDEX_SUFFIX))  # the crash left the new .log without indexes: still readable
    import time

    time.sleep(2.1)  # the dead run's lease expires (TTL 1 s, by S3's clock)
    result = cleanup(store, context(store, "clean"), CleanupOptions(lease_ttl_seconds=1))
    assert [(r.run_id, r.status, r.recovered) for r in result.segments if r.recovered] == [
        (ttl_run, "compacted", True)]
    assert no_pending(store)
    check_consistent(store, originals)
    assert store.head(key(first, INDEX_SUFFIX)).size > 0


def test_sse_kms_settings_are_carried_over(store: S3Store) -> None:
    key_id = boto3.client("kms", region_name="eu-west-1").create_key()["KeyMetadata"]["KeyId"]
    originals = seed(store)
    first = sorted(originals)[0]
    attrs = ObjectAttrs(headers={"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": key_id})
    store.put_object(key(first), originals[first].log, attrs)
    compact(store, plan_for(store), context(store), CompactOptions())
    _, new_attrs = store.describe(key(first))
    assert new_attrs.headers["ServerSideEncryption"] == "aws:kms"
    assert key_id in new_attrs.headers["SSEKMSKeyId"]
    backup = f"{PREFIX}/_tiering/backup/run-1/{DIR}/{first:020d}.log"
    assert store.describe(backup)[1].headers["ServerSideEncryption"] == "aws:kms"
    check_consistent(store, originals)
