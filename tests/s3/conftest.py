"""Fixtures for S3 tests: moto's in-process S3, a seeded logdir, and the consistency check every
protocol test ends with."""

from __future__ import annotations

import functools
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from moto import mock_aws

from tests.reference_index import rebuild
from tests.reference_records import records as reference_records
from tiering.commit.operation import Context
from tiering.commit.recover import pending_journals
from tiering.demo.seed import DEFAULT_START_MS, GeneratedSegment, generate_partition, upload_partition
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.rewrite import RewriteOptions
from tiering.kafka.segment import verify_segment
from tiering.plan.document import Plan
from tiering.plan.scan import ScanOptions, scan
from tiering.storage.layout import BACKUP_DIR, segment_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store, make_client

BUCKET = "segments"
PREFIX = "prod/kafka"
TOPIC = "orders.v1"


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")


@pytest.fixture
def store(aws_env: None) -> Iterator[S3Store]:
    with mock_aws():
        client = make_client()
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
        yield S3Store(client, BUCKET)


def fresh_store() -> S3Store:
    """Another client on the same (mocked) S3: what a second process or a re-run would use."""
    return S3Store(make_client(), BUCKET)


@dataclass(frozen=True)
class Original:
    """What a seeded segment held before anything touched it."""

    base_offset: int
    log: bytes
    records_sha256: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.log).hexdigest()


@functools.cache
def _generated(segments: int, kind: str, codec: Codec, segment_bytes: int,
               start_ms: int = DEFAULT_START_MS) -> tuple[GeneratedSegment, ...]:
    return generate_partition(segments=segments, kind=kind, codec=codec, segment_bytes=segment_bytes,
                              start_ms=start_ms)


@functools.cache
def _records_sha256(log: bytes, base: int) -> str:
    digest = verify_segment(io.BytesIO(log), segment_base=base).records_sha256
    assert digest is not None
    return digest


def seed(store: S3Store, *, partition: int = 0, segments: int = 3, kind: str = "json",
         codec: Codec = Codec.SNAPPY, segment_bytes: int = 60_000, topic: str = TOPIC,
         start_ms: int = DEFAULT_START_MS) -> dict[int, Original]:
    generated = _generated(segments, kind, codec, segment_bytes, start_ms)
    upload_partition(store, PREFIX, topic, partition, generated)
    return {g.base_offset: Original(g.base_offset, g.log, _records_sha256(g.log, g.base_offset)) for g in generated}


def plan_for(store: S3Store, codec: str = "zstd", **kwargs: Any) -> Plan:
    return scan(store, PREFIX, ScanOptions(codec, min_age_minutes=0, **kwargs))


def context(store: S3Store, run_id: str = "run-1", codec: Codec = Codec.ZSTD) -> Context:
    return Context(store, PREFIX, run_id, RewriteOptions(codec))


def check_consistent(store: S3Store, originals: dict[int, Original], *, partition: int = 0,
                     topic: str = TOPIC, indexes: bool = True) -> dict[int, str]:
    """Every segment holds its original records, its .index and .timeindex equal the rebuild of its log
    (each seeded segment had both; ``indexes`` False: a missing one is allowed, where a test removed one),
    and every original is recoverable: in place or in a backup with the same bytes. Returns each segment's
    log codecs."""
    codecs: dict[int, str] = {}
    backups = {tuple(info.key.rsplit("/", 2)[-2:]): info.key
               for info in store.list(f"{PREFIX}/_tiering/{BACKUP_DIR}/")}
    for base, original in originals.items():
        data = store.get(segment_key(PREFIX, topic, partition, base, LOG_SUFFIX))
        summary = verify_segment(io.BytesIO(data), segment_base=base)
        assert summary.records_sha256 == original.records_sha256, f"segment {base}: records differ"
        assert reference_records(data) == reference_records(original.log), f"segment {base}: kafka-python reads " \
            "other records"
        for suffix, want in zip((INDEX_SUFFIX, TIME_INDEX_SUFFIX), rebuild(data, base), strict=True):
            try:
                got = store.get(segment_key(PREFIX, topic, partition, base, suffix))
            except ObjectNotFound:
                assert not indexes, f"segment {base}: its {suffix} is gone"
                continue
            assert got == want, f"segment {base}: {suffix} does not match its log"
        if data != original.log:
            name = (f"{topic}-{partition}", f"{base:020d}.log")
            assert name in backups, f"segment {base}: replaced, and its original is in no backup"
            assert store.get(backups[name]) == original.log
        codecs[base] = ",".join(sorted(summary.codecs))
    return codecs


def no_pending(store: S3Store) -> bool:
    return not list(pending_journals(store, PREFIX))


FAULT_REPORT: list[str] = []  # printed at the end of the session (tests/conftest.py)
