"""Key compaction against SIGKILL: the real ``tiering s3 compact-keys`` in its own process, reaching S3 through
the chaos proxy, killed right before or right after its N-th S3 request (N spread over an uninterrupted
run's requests, each slot jittered: listing, the passes' reads, staging, backups, four segments cleaned into
one and swapped in by the merge protocol (the first pass, the command's default), the swaps of several
segments and a ``.txnindex`` removal (the second pass, ``--no-merge``), then run again under the same run id
until it finishes. Every trial must end with the files one uninterrupted pass makes, every backup holding the
pass's original, no journal left, and no traceback or leaked secret in any process's output."""

from __future__ import annotations

import random

import pytest

from tests.chaos.harness import Proc, run_killed
from tests.kafka.test_keycompact import DAY, NOW
from tests.s3 import test_keycompact_s3 as K
from tiering.commit.recover import pending_journals
from tiering.kafka.files import LOG_SUFFIX, TXN_INDEX_SUFFIX
from tiering.kafka.merge import DEFAULT_INDEX_BYTES, DEFAULT_SEGMENT_BYTES, Limits
from tiering.storage.s3 import S3Store, make_client

pytestmark = pytest.mark.slow
TRIALS = 6  # per pass: kill instants spread evenly over an uninterrupted run's duration, then jittered


@pytest.fixture
def bucket(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> S3Store:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    client = make_client(endpoint_url=moto_endpoint)
    name = request.node.name.replace("_", "-").replace("[", "-").replace("]", "")[-50:].strip("-").lower()
    client.create_bucket(Bucket=name)
    return S3Store(client, name)


def _run(store: S3Store, endpoint: str, run_id: str, now: int, kill: tuple[int, str] | None = None,
         merge: bool = False) -> tuple[Proc, int]:
    """One CLI process through a proxy; ``kill``: SIGKILL it before or after its N-th request; ``merge``:
    the command's default, neighbours cleaned into one as the broker's cleaner groups them (else
    ``--no-merge``). The process and how many requests it made."""
    argv = ["s3", "compact-keys", "--bucket", store.bucket, "--prefix", K.PREFIX, "--topics", r"profiles\..*",
            "--now-ms", str(now), "--min-age-minutes", "0", "--run-id", run_id, "--no-report", "--json",
            *([] if merge else ["--no-merge"])]
    return run_killed(endpoint, argv, run_id, kill)


def _trial(store: S3Store, endpoint: str, second: bool, kill: tuple[int, str] | None) -> tuple[int, list[Proc]]:
    """The first pass merges (the default), the second does not (each segment its own, a .txnindex removed)."""
    parts = K.partition(aborts=True)
    K.upload(store, parts)
    now = NOW
    if second:  # the pass a day later, which also removes the aborted transaction's .txnindex entry
        assert _run(store, endpoint, "first", NOW)[0].code == 0
        parts = {b: (K.final(store, b, LOG_SUFFIX), parts[b][1]) for b in parts}
        now = NOW + DAY
    merge = not second
    first, requests = _run(store, endpoint, "victim", now, kill, merge)
    procs = [first]
    while procs[-1].code != 0:
        assert len(procs) < 6, [p.summary() for p in procs]
        procs.append(_run(store, endpoint, "victim", now, merge=merge)[0])
    problems = [problem for p in procs for problem in p.problems()]
    assert not problems, problems
    assert not list(pending_journals(store, K.PREFIX))
    want = K.expected(parts, now, Limits(DEFAULT_SEGMENT_BYTES, DEFAULT_INDEX_BYTES) if merge else None)
    assert len(want[0].sources) == (4 if merge else 1)
    K.check_cleaned(store, want, kill)
    kept = {i.key.rsplit("/", 1)[1]: i.key for i in store.list(f"{K.PREFIX}/_tiering/backup/victim/")}
    for name, key in kept.items():  # the pass's originals, never its own output
        if name.endswith((LOG_SUFFIX, TXN_INDEX_SUFFIX)):
            assert store.get(key) == parts[int(name[:20])][0 if name.endswith(LOG_SUFFIX) else 1], name
    return requests, procs


@pytest.mark.parametrize("second", [False, True], ids=["first-pass-merged", "second-pass-txnindex"])
def test_sigkilled_at_aimed_requests_a_rerun_converges(second: bool, moto_endpoint: str,
                                                      request: pytest.FixtureRequest) -> None:
    rng = random.Random(22 + second)
    total, procs = _trial(request.getfixturevalue("bucket"), moto_endpoint, second, None)  # uninterrupted
    assert procs[0].code == 0
    killed = []
    for i in range(TRIALS):
        client = make_client(endpoint_url=moto_endpoint)
        name = f"keys-chaos-{int(second)}-{i}"
        client.create_bucket(Bucket=name)
        kill = (int(total * (i + rng.random()) / TRIALS), "before" if i % 2 else "after")
        _, procs = _trial(S3Store(client, name), moto_endpoint, second, kill)
        assert procs[0].killed, (kill, procs[0].summary())
        killed.append(f"{kill[1]} #{kill[0]}")
    print(f"\nkey compaction, {'second' if second else 'first'} pass ({total} requests): SIGKILLed "
          f"{', '.join(killed)}; every trial converged")
