"""The run document: typed and versioned, folded from the step results a chunk at a time, bounded."""

from __future__ import annotations

import json

import pytest

import tiering.run.documents as compact_module
from tests.s3.conftest import BUCKET, PREFIX
from tests.s3.test_planfile import TOPIC, _seed
from tiering.commit.operation import SegmentResult
from tiering.errors import ConfigError, ExitCode
from tiering.lifecycle.vocabulary import Cause, Pending, RunKind, Status
from tiering.plan.scan import ScanOptions
from tiering.run.documents import CompactOptions, RunResult, RunTally
from tiering.run.pipeline import RunSettings, plan_run, run_local, scan_run
from tiering.storage.layout import run_result_key
from tiering.storage.s3 import S3Store


def _results() -> list[SegmentResult]:
    done = [SegmentResult(f"t-{p}", b, Status.COMPACTED, "", 100, 40) for p in range(3) for b in (0, 10)]
    return [*done, SegmentResult("t-9", 0, Status.FAILED, "invalid data: crc", 50, cause=Cause.INVALID),
            SegmentResult("u-1", 5, Status.SKIPPED, "partition busy: x", pending=Pending.BUSY, cause=Cause.BUSY)]


def test_a_full_listing_lists_the_problems_first_and_counts_everything() -> None:
    tally = RunTally(max_listed=3)
    for r in _results():
        tally.add(r)
    run = tally.result(RunKind.COMPACT, "r", "b", "p", "s", "f", {"codec": "zstd"})
    assert run.totals() == {"segments": 8, "compacted": 6, "failed": 1, "skipped": 1,
                            "bytes_before": 600, "bytes_after": 240}
    assert {(r.directory, r.status) for r in run.segments} >= {("t-9", Status.FAILED), ("u-1", Status.SKIPPED)}
    assert (len(run.segments), run.omitted) == (3, 5)
    assert (run.exit_code(), run.failed, run.pending) == (ExitCode.INVALID, True, 1)
    assert run.topics == {"t": (6, 600, 240)}
    assert run.outcomes == {("t", Status.FAILED, Cause.INVALID): 1, ("u", Status.SKIPPED, Cause.BUSY): 1}


def test_the_document_reads_back_equal_and_a_version_1_document_is_counted_again() -> None:
    tally = RunTally()
    for r in _results():
        tally.add(r)
    run = tally.result(RunKind.COMPACT, "r", "b", "p", "s", "f", {"codec": "zstd"}, {"compute_seconds": 1.5})
    assert RunResult.from_json(json.loads(json.dumps(run.to_json())), "here") == run
    v1 = {"schema_version": 1, "kind": "compact", "run_id": "r", "bucket": "b", "prefix": "p", "started_at": "s",
          "finished_at": "f", "settings": {"codec": "zstd"}, "usage": {"compute_seconds": 1.5},
          "segments": [r.to_json() for r in _results()]}
    assert RunResult.from_json(v1, "here") == run
    with pytest.raises(ConfigError, match="not a run document"):
        RunResult.from_json({**run.to_json(), "schema_version": 4}, "here")


def test_a_version_2_document_counts_its_outcomes_by_cause_where_its_reason_names_one() -> None:
    """Version 2 counted outcomes by the first words of their reasons: those that are a cause's name read back
    as that cause, the others under their status alone, added up (never one overwriting another)."""
    run = RunTally().result(RunKind.COMPACT, "r", "b", "p", "s", "f", {"codec": "zstd"})
    v2 = {**run.to_json(), "schema_version": 2, "outcomes": [
        {"topic": "t", "status": "skipped", "reason": "partition busy", "segments": 3},
        {"topic": "t", "status": "skipped", "reason": "stopped", "segments": 2},
        {"topic": "t", "status": "skipped", "reason": "too young", "segments": 4}]}
    assert RunResult.from_json(v2, "here").outcomes == {("t", Status.SKIPPED, None): 5,
                                                        ("t", Status.SKIPPED, Cause.TOO_YOUNG): 4}


def test_a_run_larger_than_the_listing_stays_bounded_and_whole_in_its_figures(
        store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _seed(store, 6)
    run = RunSettings(BUCKET, PREFIX, "bounded", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    plan_run(store, run, CompactOptions(), chunk_work=1)  # several chunks, folded one at a time
    whole = run_local(store, run, run.context(store), CompactOptions())
    assert whole.totals()["compacted"] == 12
    assert whole.omitted == 0
    monkeypatch.setattr(compact_module, "MAX_LISTED_SEGMENTS", 5)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))  # cleared and run again: each segment
    plan_run(store, run, CompactOptions(), chunk_work=1)  # counted from the state
    small = run_local(store, run, run.context(store), CompactOptions())
    assert (len(small.segments), small.omitted) == (5, 7)
    assert small.totals() == whole.totals()
    assert small.topics == whole.topics
    stored = RunResult.from_json(store.get_json(run_result_key(PREFIX, "bounded", "compact"))[0], "doc")
    assert stored.totals() == whole.totals()
    assert len(stored.segments) == 5
    # the requests of the scan and the plan (run-wide) and of each partition's work, counted apart
    assert sorted(whole.usage["requests"]) == ["_run", *(f"{TOPIC}-{p}" for p in range(6))]


def test_a_lease_is_released_when_the_work_fails_unexpectedly_and_when_it_ends(store: S3Store) -> None:
    """A bug in a partition's work must not leave the partition busy for the lease's TTL."""
    from tiering.run.segment import with_lease
    from tiering.storage.layout import lease_key

    run = RunSettings(BUCKET, PREFIX, "buggy", "zstd")

    def work(lease: object, out: list[SegmentResult]) -> None:
        raise KeyError("a bug")

    with pytest.raises(KeyError):
        with_lease(run.context(store), "t-0", 60, work, [("t-0", 0)])
    assert not list(store.list(lease_key(PREFIX, "t-0")))
    assert with_lease(run.context(store), "t-0", 60, lambda lease, out: None, []) == []
    assert not list(store.list(lease_key(PREFIX, "t-0")))


def test_a_run_planned_again_under_its_id_counts_each_segment_once(store: S3Store) -> None:
    """A DAG run cleared and run again re-plans under the same run id: the first attempt's step documents are
    not counted again; its work is counted from the state."""
    _seed(store, 6)
    run = RunSettings(BUCKET, PREFIX, "cleared", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    plan_run(store, run, CompactOptions(), chunk_work=1)
    first = run_local(store, run, run.context(store), CompactOptions())
    assert first.totals()["compacted"] == 12
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    plan_run(store, run, CompactOptions())  # one chunk now
    again = run_local(store, run, run.context(store), CompactOptions())
    assert again.totals() == first.totals()
    assert {r.reason for r in again.segments if r.status == "compacted"} == {"by an earlier attempt of this run"}


def test_the_lease_and_the_ledger_are_typed_and_versioned() -> None:
    from tiering.commit.lease import DEFAULT_TTL_SECONDS, LeaseRecord, lease_ttl
    from tiering.documents import read, write
    from tiering.report.publish import Ledger, LedgerEntry

    record = LeaseRecord("run-1", 600, "host-a", 3, "ab12")
    assert LeaseRecord.held(json.loads(write(record))) == record
    assert LeaseRecord.held({"schema_version": 1, "owner": "x"}) == LeaseRecord("x")  # version 1's defaults
    for other in ({"schema_version": 2, "owner": "x"}, {"schema_version": 1}, ["owner"],
                  {"schema_version": 1, "owner": "x", "ttl_seconds": "soon"},
                  {"schema_version": 1, "owner": "x", "kind": "tiering.ledger"}):
        assert LeaseRecord.held(other) is None  # nobody we can name: it expires by the default TTL
    # One this version cannot read, but whose holder said how long it lives: never taken over before that.
    newer = {"schema_version": 1, "owner": "x", "ttl_seconds": 7200, "lane": "fast"}
    assert LeaseRecord.held(newer) is None
    assert lease_ttl(newer, None) == 7200
    assert lease_ttl({"schema_version": 1, "ttl_seconds": 5}, None) == DEFAULT_TTL_SECONDS  # never shorter
    assert lease_ttl({"ttl_seconds": True}, None) == DEFAULT_TTL_SECONDS
    assert lease_ttl(newer, record) == 600
    entry = LedgerEntry("r1", "2026-11-24T00:00:00+00:00", False, 3, 300, 100, 1.25, 0.5)
    ledger = Ledger((entry,))
    assert read(write(ledger), Ledger, what="a ledger") == ledger
    with pytest.raises(ConfigError, match="not a ledger"):
        read({"schema_version": 2, "runs": []}, Ledger, what="a ledger", where="ledger")
    with pytest.raises(ConfigError, match="a ledger unreadable"):
        read({"schema_version": 1, "runs": [{"run_id": "r"}]}, Ledger, what="a ledger", where="ledger")


def test_a_retried_run_on_the_same_plan_counts_what_its_first_attempt_compacted(store: S3Store) -> None:
    """The DAG retries its compaction task without planning again: the segments the first attempt swapped in
    are counted from their state entries (by this run), not reported as changed since the plan."""
    _seed(store, 2)
    run = RunSettings(BUCKET, PREFIX, "retried", "zstd", 3)
    scan_run(store, run, ScanOptions("zstd", 3, min_age_minutes=0))
    plan_run(store, run, CompactOptions())
    first = run_local(store, run, run.context(store), CompactOptions())
    assert first.totals()["compacted"] == 4
    again = run_local(store, run, run.context(store), CompactOptions())
    assert again.totals() == first.totals()
    assert (again.exit_code(), again.pending) == (ExitCode.OK, 0)
    assert {r.reason for r in again.segments if r.status == "compacted"} == {"by an earlier attempt of this run"}
