"""Crash the compaction in every state it can leave the bucket in, then re-run: the partition must always
converge.

Each S3 request of a clean compaction is a numbered injection point. A crash is injected either BEFORE
the request is sent or AFTER S3 has executed it but before the code sees the answer (botocore's
``before-call`` / ``after-call`` events); from then on every request of that process fails too, as if it
had died (so nothing, not even a lease release, runs after the crash). A crash leaves the bucket as the
last request that changed it left it: the crashes are one before the first write and one after each write
(:func:`crash_points`), every state a re-run can start from. Then a fresh process re-runs the
same plan with the same run id (what an Airflow retry does). Every time: no journal entry is left
pending, every segment is compacted and holds its original records, every index present matches its
log, and every replaced original is in a backup with the same bytes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests.s3.conftest import (
    FAULT_REPORT,
    PREFIX,
    Original,
    check_consistent,
    context,
    fresh_store,
    no_pending,
    plan_for,
    seed,
)
from tiering.commit.operation import Context, SwapChoice
from tiering.lifecycle.vocabulary import FileRole, Swap
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.s3 import S3Store


class Crash(Exception):
    """The process dies here (not a TieringError: nothing in the package catches it)."""


# The S3 operations that change a bucket: a crash leaves it as the last of them left it.
WRITES = frozenset({"PutObject", "CopyObject", "DeleteObject", "DeleteObjects", "CreateMultipartUpload",
                    "UploadPart", "CompleteMultipartUpload", "AbortMultipartUpload", "PutObjectTagging"})


def crash_points(calls: list[str]) -> list[tuple[int, str]]:
    """Where to crash a process that made ``calls``, to reach every state it can leave: a crash leaves the
    bucket as the last request that changed it left it, so once before the first write and once after each
    write (a crash before a request, or after a read, repeats one of those states)."""
    writes = [i for i, name in enumerate(calls) if name in WRITES]
    return [(writes[0], "before"), *((i, "after") for i in writes)]


class Faults:
    def __init__(self, store: S3Store, at: int | None, mode: str) -> None:
        self.calls: list[str] = []
        self.at, self.mode, self.dead = at, mode, False
        events = store.client.meta.events
        events.register("before-call.s3.*", self._before)
        events.register("after-call.s3.*", self._after)

    def _before(self, model: Any, **_: Any) -> None:
        if self.dead:
            raise Crash("already dead")
        self.calls.append(model.name)
        if self.at == len(self.calls) - 1 and self.mode == "before":
            self.dead = True
            raise Crash(f"before call {self.at} ({model.name})")

    def _after(self, model: Any, **_: Any) -> None:
        if self.at == len(self.calls) - 1 and self.mode == "after" and not self.dead:
            self.dead = True
            raise Crash(f"after call {self.at} ({model.name})")


def _context(store: S3Store, swap: Swap | None) -> Context:
    """The run's context: swapping as ``swap`` says, else as the probe finds (moto: by PUT)."""
    return replace(context(store), swap=SwapChoice(swap))


def _scenario(store: S3Store, at: int | None, mode: str, swap: Swap | None = None,
              rebatch: bool = False) -> tuple[list[str], dict[int, Original], bool]:
    originals = seed(store, segments=3, segment_bytes=40_000)
    seeded = _segment_keys(store)
    plan = plan_for(store, rebatch_max_bytes=1 << 20 if rebatch else None)
    if rebatch:
        assert all(s.rebatch_max_bytes for s in plan.to_compact())
    sealed = [s.base_offset for s in plan.to_compact()]
    worker = fresh_store()
    faults = Faults(worker, at, mode)
    crashed = False
    try:
        run = compact(worker, plan, _context(worker, swap), CompactOptions())
        if rebatch:  # the batches were merged indeed
            assert all((r.stats or {}).get("rebatch", {}).get("runs_merged") for r in run.segments), run.segments
    except Crash:
        crashed = True
    if crashed:
        rerun = fresh_store()
        result = compact(rerun, plan, _context(rerun, swap), CompactOptions())
        assert not result.failed, [r.to_json() for r in result.segments]
    assert no_pending(store)
    codecs = check_consistent(store, originals)
    assert all(codecs[b] == "zstd" for b in sealed), codecs
    assert _segment_keys(store) == seeded  # every segment file there, and nothing else beside them
    return faults.calls, originals, crashed


def _segment_keys(store: S3Store) -> set[str]:
    """The keys outside the platform's own ``_tiering/`` objects."""
    return {o.key for o in store.list(f"{PREFIX}/") if "/_tiering/" not in o.key}


def plant_a_lost_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted defect: the swap, after deleting the old indexes, never puts the new ``.timeindex`` (yet says
    it did). A run that converges this way must fail every crash check."""
    from tiering.commit import swap

    honest = swap._put_index_beside_ours

    def loses_the_timeindex(ctx: Context, journal: Any, name: FileRole, indexes: Any) -> str | None:
        return '"never-put"' if name is FileRole.TIMEINDEX else honest(ctx, journal, name, indexes)

    monkeypatch.setattr(swap, "_put_index_beside_ours", loses_the_timeindex)


@pytest.mark.parametrize(("at", "mode"), [(None, "none"), (0, "before")], ids=["clean", "crashed"])
def test_a_run_that_loses_an_index_fails_the_crash_check(store: S3Store, monkeypatch: pytest.MonkeyPatch,
                                                         at: int | None, mode: str) -> None:
    plant_a_lost_index(monkeypatch)
    with pytest.raises(AssertionError, match=r"its \.timeindex is gone"):
        _scenario(store, at, mode)


def test_clean_run_compacts_every_sealed_segment(store: S3Store) -> None:
    calls, originals, crashed = _scenario(store, None, "none")
    assert not crashed
    assert len(originals) == 3
    assert {"PutObject", "DeleteObject", "CopyObject", "GetObject", "HeadObject"} <= set(calls)


@pytest.mark.slow
@pytest.mark.parametrize(("swap", "rebatch"), [(None, False), (Swap.COPY, False), (Swap.COPY, True)],
                         ids=["probed-put", "copy", "copy-rebatch"])
def test_crash_at_every_call_then_rerun_converges(swap: Swap | None, rebatch: bool, aws_env: None) -> None:
    from moto import mock_aws

    from tests.s3.conftest import BUCKET
    from tiering.storage.s3 import make_client

    def fresh() -> S3Store:
        client = make_client()
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        return S3Store(client, BUCKET)

    with mock_aws():
        calls, _, _ = _scenario(fresh(), None, "none", swap, rebatch)
    points = crash_points(calls)
    for at, mode in points:
        with mock_aws():
            _, _, crashed = _scenario(fresh(), at, mode, swap, rebatch)
        assert crashed, f"no crash at {mode} call {at} ({calls[at]})"
    by_op: dict[str, int] = {}
    for name in calls:
        by_op[name] = by_op.get(name, 0) + 1
    FAULT_REPORT.append(f"fault injection, swap by {swap or 'probe'}{' with re-batching' if rebatch else ''}: "
                        f"{len(calls)} S3 calls, {len(points) - 1} of them writes; a crash before the first write "
                        f"and after each ({len(points)} states), every one converged on re-run; calls: "
                        + ", ".join(f"{k} {v}" for k, v in sorted(by_op.items())))
