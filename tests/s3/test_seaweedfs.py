"""The S3 path on SeaweedFS, a real store that enforces what moto ignores (``tests/s3/seaweedfs.py``): the
conditions the protocol relies on, the probes' verdicts (where moto's differ, the moto tests say so), and
the whole cycle (scan, compact, rollback, compact, cleanup) through the CLI in its own process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.chaos.proxy import Proxy
from tests.s3.conftest import PREFIX, check_consistent, context, no_pending, plan_for, seed
from tests.s3.seaweedfs import Seaweed, empty, weed_mini
from tiering.errors import ExitCode
from tiering.lifecycle.vocabulary import Swap
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.objects import (
    MIN_PART_BYTES,
    ObjectAttrs,
    ObjectNotFound,
    PreconditionFailed,
    TransportError,
    copy_honours_if_match,
    delete_honours_etag,
)
from tiering.storage.s3 import S3Store, make_client, translate

pytestmark = [pytest.mark.slow, pytest.mark.seaweedfs]


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seaweed]:
    with weed_mini(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server


@pytest.fixture
def store(seaweed: Seaweed, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[S3Store]:
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweed.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweed.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:50].strip("-")
    client = make_client()
    client.create_bucket(Bucket=name)
    yield S3Store(client, name)
    empty(S3Store(client, name), delete_bucket=True)  # its volumes go with it


def test_it_refuses_what_the_protocol_relies_on(store: S3Store) -> None:
    """Conditional writes, a copy's If-Match, DeleteObjects' ETags, CRC-32C: each failing condition refused."""
    etag = store.put("k", b"one")
    with pytest.raises(PreconditionFailed):
        store.put("k", b"two", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.put("k", b"two", if_match=f'"{"0" * 32}"')
    two = store.put("k", b"two", if_match=etag)
    assert two != etag
    with pytest.raises(PreconditionFailed):  # a conditional delete of a changed object
        store.delete("k", if_match=etag)
    store.delete("k", if_match=two)
    with pytest.raises(ObjectNotFound):  # SeaweedFS answers 412 for an absent key, S3 404: taken as S3's answer
        store.delete("k", if_match=two)
    store.delete("k", if_match=two, missing_ok=True)  # what a re-run after a crash does
    store.put("k", b"two")
    assert copy_honours_if_match(store, "probe/copy")  # so a run swaps by server-side copy here (moto: by PUT)
    assert delete_honours_etag(store, "probe/delete")  # so cleanup needs no second look here (moto: it does)
    source = store.put("s", b"source")
    with pytest.raises(PreconditionFailed):
        store.copy_over("s", "k", source_etag=source, if_match=etag, attrs=ObjectAttrs(), size=6)  # k changed
    assert store.get("k") == b"two"
    with pytest.raises(ClientError) as refused:  # a body whose CRC-32C is not the one sent with it
        store.client.put_object(Bucket=store.bucket, Key="c", Body=b"data", ChecksumAlgorithm="CRC32C",
                                ChecksumCRC32C="AAAAAA==")
    assert refused.value.response["Error"]["Code"] == "BadDigest"  # which the store translates as retryable
    assert isinstance(translate(refused.value, bucket=store.bucket, key="c", action="put_object"), TransportError)


def test_uploads_carry_a_checksum_instead_of_a_signed_payload(store: S3Store,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Over plain HTTP botocore would SHA-256 every uploaded byte to sign it; the client sends S3's
    UNSIGNED-PAYLOAD instead, and every body carries a checksum the store checks (ours, or botocore's CRC32
    even where the environment asks for checksums only when required). A part's body is the writer's buffer,
    handed to the socket as it is once the store said to go on (``100-continue``)."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    s = S3Store(make_client(), store.bucket)
    sent: list[tuple[str, str, list[str]]] = []
    part_bodies: list[type] = []

    def seen(request: Any, **_: Any) -> None:
        checksums = sorted(k.lower() for k in request.headers if k.lower().startswith("x-amz-checksum-"))
        sent.append((request.method, request.headers["X-Amz-Content-SHA256"].decode(), checksums))
        if "partNumber=" in request.url:
            part_bodies.append((type(request.body), request.headers.get("Expect")))

    s.client.meta.events.register("before-send.s3", seen)
    s.put("plain", b"a JSON document")
    big = os.urandom(2 * MIN_PART_BYTES + 10)
    with s.writer("big", part_bytes=MIN_PART_BYTES, checksum=True) as out:
        for at in range(0, len(big), 1 << 20):
            out.write(big[at : at + (1 << 20)])
        out.finish()
    assert s.get("big") == big
    assert s.get("plain") == b"a JSON document"
    uploads = [(sha, checks) for method, sha, checks in sent if method == "PUT"]
    assert [sha for sha, _ in uploads] == ["UNSIGNED-PAYLOAD"] * 4  # the PUT and the three parts
    assert uploads[0][1] == ["x-amz-checksum-crc32"]  # botocore's, though the environment said when_required
    assert all(checks == ["x-amz-checksum-crc32c"] for _, checks in uploads[1:])  # ours, part by part
    # Not a BytesIO (urllib3 sends a buffer in one call), and a refusal answers before the body is sent.
    assert [(issubclass(t, bytearray), expect) for t, expect in part_bodies] == [(True, b"100-continue")] * 3


def test_a_compaction_swaps_by_server_side_copy_and_rolls_back_byte_for_byte(store: S3Store) -> None:
    originals = seed(store, segments=3)
    ctx = context(store)
    run = compact(store, plan_for(store), ctx, CompactOptions())
    assert [r.status for r in run.segments] == ["compacted", "compacted"]
    assert ctx.swap.mode is Swap.COPY  # learnt from the store: it refuses a copy whose If-Match fails
    assert store.requests["CopyObject"] > 0
    codecs = check_consistent(store, originals)
    assert [codecs[b] for b in sorted(originals)[:2]] == ["zstd", "zstd"]
    assert no_pending(store)


def _cli(seaweed: Seaweed, *argv: str) -> tuple[int, str, str]:
    """The CLI in its own process, with the store's endpoint and credentials in its environment."""
    env = {**os.environ, "AWS_ENDPOINT_URL": seaweed.endpoint, "AWS_ACCESS_KEY_ID": seaweed.access_key,
           "AWS_SECRET_ACCESS_KEY": seaweed.secret_key, "AWS_DEFAULT_REGION": "us-east-1"}
    done = subprocess.run([sys.executable, "-m", "tiering", *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    assert seaweed.secret_key not in done.stdout + done.stderr
    return done.returncode, done.stdout, done.stderr


def test_the_cli_cycle_scan_compact_rollback_compact_cleanup(seaweed: Seaweed, store: S3Store,
                                                              tmp_path: Path) -> None:
    originals = seed(store, segments=3)
    seeded = {o.key: store.get(o.key) for o in store.list(f"{PREFIX}/")}
    where = ["--bucket", store.bucket, "--prefix", PREFIX]
    code, out, err = _cli(seaweed, "s3", "scan", *where, "--min-age-minutes", "0", "--estimate", "--json")
    assert code == ExitCode.OK, err
    assert json.loads(out)["totals"]["to_compact"] == 2
    code, out, err = _cli(seaweed, "s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0",
                          "--run-id", "first", "--json")
    assert code == ExitCode.OK, err
    assert [s["status"] for s in json.loads(out)["segments"]] == ["compacted", "compacted"]
    check_consistent(store, originals)
    code, out, err = _cli(seaweed, "s3", "rollback", *where, "--run-id", "first", "--json")
    assert code == ExitCode.OK, err
    back = {o.key: store.get(o.key) for o in store.list(f"{PREFIX}/") if "/_tiering/" not in o.key}
    assert back == seeded  # every original byte, indexes included
    code, out, err = _cli(seaweed, "s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0",
                          "--run-id", "second", "--json")
    assert code == ExitCode.OK, err
    check_consistent(store, originals)
    code, out, err = _cli(seaweed, "s3", "cleanup", *where, "--grace-days", "0", "--json")
    assert code == ExitCode.OK, err
    assert json.loads(out)["usage"]["cleanup"]["backups_deleted"] == 12  # 2 runs x 2 segments x 3 files
    assert not list(store.list(f"{PREFIX}/_tiering/backup/"))
    assert no_pending(store)


def test_the_pinned_versions_agree() -> None:
    from tests.s3.seaweedfs import VERSION

    script = (Path(__file__).parents[2] / "scripts" / "fetch-seaweedfs.sh").read_text()
    assert f'version="{VERSION}"' in script


def test_crash_at_every_call_then_rerun_converges(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """test_faults.py's trial on SeaweedFS, where the run learns to swap by server-side copy and every
    condition is enforced by the store itself: crashed in every state it can leave (before the first write
    and after each), then re-run."""
    from tests.s3 import conftest
    from tests.s3.conftest import FAULT_REPORT
    from tests.s3.test_faults import _scenario, crash_points

    monkeypatch.setattr(conftest, "BUCKET", store.bucket)  # the re-runs' clients (fresh_store) use this bucket
    calls, _, _ = _scenario(store, None, "none")
    assert "CopyObject" in calls
    points = crash_points(calls)
    for at, mode in points:
        empty(store)  # a few hundred KB a trial: not two hundred buckets' volumes
        assert not list(store.list(""))
        _, _, crashed = _scenario(store, at, mode)
        assert crashed, f"no crash at {mode} call {at} ({calls[at]})"
    FAULT_REPORT.append(f"fault injection on SeaweedFS (swap probed: copy): {len(calls)} S3 calls, a crash before "
                        f"the first write and after each ({len(points)} states), every one converged on re-run")


def _every_state(store: S3Store, trial: Callable[[int | None, str], tuple[list[str], bool]]) -> tuple[list[str], int]:
    """``trial`` run clean, then crashed in every state it can leave (before its first write and after each), the
    bucket emptied before each crashed trial: its calls and the count of states."""
    from tests.s3.test_faults import crash_points

    calls, _ = trial(None, "none")
    points = crash_points(calls)
    for at, mode in points:
        empty(store)
        _, crashed = trial(at, mode)
        assert crashed, f"no crash at {mode} call {at} ({calls[at]})"
    return calls, len(points)


@pytest.mark.parametrize("undo", [False, True], ids=["merge", "rollback"])
def test_a_merge_crashed_in_every_state_converges(undo: bool, store: S3Store, monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:
    """test_merge_s3.py's crash trial on SeaweedFS: a merge of three segments through .swap files (or its
    rollback), crashed once before its first write and after each, the bucket as a broker would load it checked
    at the crash, then re-run: every file in place, nothing else."""
    from tests.s3 import conftest
    from tests.s3.test_merge_s3 import _crash_scenario

    monkeypatch.setattr(conftest, "BUCKET", store.bucket)
    calls, states = _every_state(store, lambda at, mode: _crash_scenario(at, mode, undo=undo))
    conftest.FAULT_REPORT.append(f"fault injection on SeaweedFS, {'rollback of a merge' if undo else 'merge'}: "
                                 f"{len(calls)} S3 calls, {states} states, every one converged on re-run")


@pytest.mark.parametrize(("second", "merged"), [(False, False), (True, False), (False, True)],
                         ids=["first-pass", "second-pass-txnindex", "first-pass-merged"])
def test_a_key_compaction_crashed_in_every_state_converges(second: bool, merged: bool, store: S3Store,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """test_keycompact_s3.py's crash trial on SeaweedFS: a pass swapping three segments in place (a second
    pass also removing a .txnindex), or cleaning four into one through .swap files, crashed once before its
    first write and after each, then re-run: the files one uninterrupted pass makes, nothing else."""
    from tests.s3 import conftest
    from tests.s3.test_keycompact_s3 import MERGE_LIMITS, _crash_scenario

    monkeypatch.setattr(conftest, "BUCKET", store.bucket)
    merge = MERGE_LIMITS if merged else None
    calls, states = _every_state(store, lambda at, mode: _crash_scenario(store, at, mode, second, merge))
    which = "a second pass" if second else "cleaned into one" if merged else "a first pass"
    conftest.FAULT_REPORT.append(f"fault injection on SeaweedFS, key compaction ({which}): {len(calls)} S3 calls, "
                                 f"{states} states, every one converged on re-run")


def test_a_run_that_loses_an_index_fails_the_crash_check(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.s3 import conftest
    from tests.s3.test_faults import _scenario, plant_a_lost_index

    monkeypatch.setattr(conftest, "BUCKET", store.bucket)
    plant_a_lost_index(monkeypatch)
    with pytest.raises(AssertionError, match=r"its \.timeindex is gone"):
        _scenario(store, None, "none")


# The suites below were written against moto; each runs here unchanged on SeaweedFS, where the swap is a
# server-side copy whose conditions the store enforces. (Imported inside each test, so that pytest does not
# collect them twice.)

def test_key_compaction_swaps_what_the_pure_pass_makes(store: S3Store) -> None:
    from tests.s3 import test_keycompact_s3

    test_keycompact_s3.test_a_pass_on_s3_swaps_what_the_pure_pass_makes_and_keeps_the_originals(store)


def test_key_compaction_later_passes_and_the_txnindex(store: S3Store) -> None:
    from tests.s3 import test_keycompact_s3

    test_keycompact_s3.test_later_passes_remove_the_aborted_transaction_s_txnindex_entry_then_its_marker(store)


def test_key_compaction_rolls_back(store: S3Store) -> None:
    from tests.s3 import test_keycompact_s3

    test_keycompact_s3.test_rollback_of_a_key_compaction_run_puts_the_originals_back(store)


@pytest.mark.parametrize("name", ["test_apply_keeps_the_object_and_a_rerun_moves_nothing",
                                  "test_an_object_changed_since_planning_is_left_alone",
                                  "test_a_segment_being_compacted_is_not_moved"])
def test_tiering(name: str, store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Storage classes moved by an in-place copy conditional on the ETag, tags and headers kept."""
    from tests.plan import test_tier

    monkeypatch.setattr(test_tier, "BUCKET", store.bucket)
    getattr(test_tier, name)(store)


def test_reads_are_checked_and_give_their_connection_back(store: S3Store, seaweed: Seaweed) -> None:
    """A whole object read in pieces is checked against the checksum the store keeps (ours, CRC-32C, or an AWS
    SDK's CRC32), and once its last byte is in, the connection serves the next request: the body is read
    below urllib3, which would otherwise not see its end. Through the chaos proxy, which counts connections
    (SeaweedFS keeps them alive; moto's server closes each)."""
    data = bytes(range(256)) * 8192  # 2 MiB
    store.put("c", data, checksum=True)
    store.client.put_object(Bucket=store.bucket, Key="d", Body=data)  # botocore's default checksum
    with Proxy(seaweed.endpoint) as proxy:
        s = S3Store(make_client(endpoint_url=proxy.url), store.bucket)
        for key, algorithm in [("c", "CRC32C"), ("d", "CRC32")] * 3:
            with s.open(key) as body:
                pieces = []
                while piece := body.read(100_000):
                    pieces.append(piece)
            assert b"".join(pieces) == data
            assert getattr(body, "verified", None) == algorithm
            s.head(key)
        assert proxy.connections == 1
