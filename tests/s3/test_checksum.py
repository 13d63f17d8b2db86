"""Staged files are accepted by the CRC-32C the store reports for what it stored (``Verify.CHECKSUM``): the
staged ``.log`` is never downloaded; a store that reports no checksum is read back instead, and a store that
reports another checksum (other bytes, or CRC-32 computed for CRC-32C as moto does without the ``crc32c``
package) fails the segment loudly with the original untouched.

MOTO: moto 5.2.5 stores and echoes the CRC-32C sent with a PutObject without checking it against the body
(S3 refuses such a body with BadDigest); it computes a multipart upload's full-object checksum itself. The
in-memory store computes every checksum from the bytes it stores, so the tests of disagreement use it.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any, BinaryIO

import crc32c
import pytest

from tests.s3.conftest import PREFIX, TOPIC, check_consistent, context, no_pending, plan_for, seed
from tiering.commit.operation import SwapChoice
from tiering.errors import ProofError
from tiering.lifecycle.vocabulary import Cause, Status, Swap, Verify
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.memory import MemoryStore
from tiering.storage.objects import MIN_PART_BYTES, ChecksumMismatch, crc32c_b64
from tiering.storage.s3 import S3Store

STAGING = "/_tiering/staging/"


class Watched(MemoryStore):
    """A memory store that remembers which keys were read."""

    def __init__(self, bucket: str, **kw: Any) -> None:
        super().__init__(bucket, **kw)
        self.read: list[str] = []

    def open(self, key: str, **kw: Any) -> BinaryIO:
        self.read.append(key)
        return super().open(key, **kw)

    def get(self, key: str) -> bytes:
        self.read.append(key)
        return super().get(key)


class Altering(Watched):
    """Stores a staged .log with one bit flipped: a store that holds other bytes than it was sent."""

    def _write(self, key: str, data: bytes, action: str, **kw: Any) -> Any:
        if STAGING in key and key.endswith(".log"):
            data = data[:-1] + bytes([data[-1] ^ 1])
        return super()._write(key, data, action, **kw)


class Crc32ForCrc32c(Watched):
    """Reports CRC-32 where CRC-32C was asked for: moto 5.2.5 without the crc32c package."""

    def _reported_crc(self, stored: bytes) -> str | None:
        return base64.b64encode(binascii.crc32(stored).to_bytes(4, "big")).decode()


def _compact(store: Any, verify: Verify = Verify.CHECKSUM) -> Any:
    """A compaction swapping by copy (moto ignores a copy's If-Match, so a probe would choose a PUT)."""
    ctx = context(store)
    ctx = type(ctx)(ctx.store, ctx.prefix, ctx.run_id, ctx.options, verify=verify, swap=SwapChoice(Swap.COPY))
    return compact(store, plan_for(store), ctx, CompactOptions())


def test_with_checksums_no_staged_file_is_downloaded(store: S3Store) -> None:
    originals = seed(store, segments=3)
    reads: list[str] = []
    sent: dict[str, str | None] = {}
    events = store.client.meta.events
    events.register("before-call.s3.GetObject", lambda params, **_: reads.append(params["url_path"]))

    def checksum_header(request: Any, **_: Any) -> None:
        if STAGING in request.url and "/probe/" not in request.url:  # not the swap's probe of the store
            sent[request.url.split(STAGING, 1)[1]] = request.headers.get("x-amz-checksum-crc32c")
    events.register("before-send.s3.PutObject", checksum_header)
    run = _compact(store)
    done = [r for r in run.segments if r.status == Status.COMPACTED]
    assert len(done) == 2
    assert {(r.stats or {}).get("verified") for r in done} == {"checksum"}
    # The staged .log is never downloaded (the swap copies it; only the small staged indexes are read).
    assert [k for k in reads if STAGING in k and k.endswith(".log")] == []
    assert len(sent) == 3 * len(done)  # .log, .index and .timeindex of each
    assert all(sent.values())
    check_consistent(store, originals)
    assert no_pending(store)


def test_a_store_without_checksums_is_read_back() -> None:
    s = Watched("bkt", checksums=False)
    originals = seed(s, segments=3)  # type: ignore[arg-type]
    run = _compact(s)
    done = [r for r in run.segments if r.status == Status.COMPACTED]
    assert {(r.stats or {}).get("verified") for r in done} == {"read-back"}
    assert sum(1 for k in s.read if STAGING in k and k.endswith(".log")) == len(done)
    check_consistent(s, originals)  # type: ignore[arg-type]


def test_read_back_when_asked() -> None:
    s = Watched("bkt")
    seed(s, segments=3)  # type: ignore[arg-type]
    run = _compact(s, Verify.READ_BACK)
    done = [r for r in run.segments if r.status == Status.COMPACTED]
    assert {(r.stats or {}).get("verified") for r in done} == {"read-back"}
    assert sum(1 for k in s.read if STAGING in k and k.endswith(".log")) == len(done)


@pytest.mark.parametrize("store_class", [Altering, Crc32ForCrc32c])
def test_a_store_reporting_another_checksum_fails_the_segment_and_changes_nothing(store_class: type[Watched]
                                                                                  ) -> None:
    s = store_class("bkt")
    originals = seed(s, segments=3)  # type: ignore[arg-type]
    run = _compact(s)
    failed = [r for r in run.segments if r.status == Status.FAILED]
    assert len(failed) == 2
    assert all("another CRC-32C" in r.reason for r in failed), [r.reason for r in failed]
    assert {r.cause for r in failed} == {Cause.PROOF_FAILED}  # the store's disagreement: exit 5, not "usage"
    assert {r.status for r in run.segments} == {Status.FAILED}  # the active segment is not planned
    for base, original in originals.items():
        assert s.get(f"{PREFIX}/{TOPIC}-0/{base:020d}.log") == original.log
    assert no_pending(s)  # type: ignore[arg-type]


def test_a_multipart_upload_carries_its_full_object_checksum_and_a_changed_local_copy_is_refused(
        store: S3Store) -> None:
    data = os.urandom(2 * MIN_PART_BYTES + 1000)
    crc = crc32c.crc32c(data)
    store.upload("big", io.BytesIO(data), part_bytes=MIN_PART_BYTES, crc=crc)
    head = store.client.head_object(Bucket=store.bucket, Key="big", ChecksumMode="ENABLED")
    assert (head["ChecksumCRC32C"], head["ChecksumType"]) == (crc32c_b64(crc), "FULL_OBJECT")
    assert store.get("big") == data
    with pytest.raises(ProofError, match="not the ones produced"):
        store.upload("big2", io.BytesIO(data[:-1] + bytes([data[-1] ^ 1])), part_bytes=MIN_PART_BYTES, crc=crc)
    assert list(store.list_uploads("")) == []  # the failed upload was aborted
    assert [o.key for o in store.list("big2")] == []
    with pytest.raises(ChecksumMismatch):
        Crc32ForCrc32c("bkt").upload("k", io.BytesIO(data), part_bytes=MIN_PART_BYTES, crc=crc)


@pytest.mark.parametrize("verify", [Verify.CHECKSUM, Verify.READ_BACK])
def test_the_swap_copies_the_staged_log_without_reading_it(verify: Verify, monkeypatch: pytest.MonkeyPatch) -> None:
    """A compaction puts the staged .log in place by a server-side copy held to the ETag it was verified
    with: the staged .log is downloaded and decoded only where read-back verification asks, once a segment
    (its verification), and never for the swap."""
    from tiering.commit import stage, swap
    from tiering.commit import verify as verifying
    from tiering.plan.scan import ScanOptions
    from tiering.run.pipeline import RunSettings, plan_run, run_local, scan_run

    decoded: list[str] = []
    real = verifying.read_back
    for module in (stage, swap, verifying):
        monkeypatch.setattr(module, "read_back", lambda body, **kw: decoded.append(kw.get("path", "")) or real(body,
                                                                                                                 **kw))
    s = Watched("bkt")
    originals = seed(s, segments=3)  # type: ignore[arg-type]
    run = RunSettings("bkt", PREFIX, "piped", "zstd", 3, verify=verify)
    scan_run(s, run, ScanOptions("zstd", 3, min_age_minutes=0))
    plan_run(s, run, CompactOptions())
    s.read = []
    result = run_local(s, run, run.context(s), CompactOptions())
    assert result.totals()["compacted"] == 2
    assert no_pending(s)  # type: ignore[arg-type]
    check_consistent(s, originals)  # type: ignore[arg-type]
    staged_reads = [k for k in s.read if STAGING in k and k.endswith(".log")]
    assert s.requests["CopyObject"] >= 2 * 2 + 1  # per segment: the .log's backup and its swap; the probe
    if verify is Verify.CHECKSUM:
        assert (staged_reads, decoded) == ([], [])
    else:
        assert sorted(staged_reads) == sorted(set(staged_reads))
        assert len(staged_reads) == len(decoded) == 2
