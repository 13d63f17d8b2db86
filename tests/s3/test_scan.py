"""The scanner: classification of every segment, skipped directories, plan documents, pagination."""

from __future__ import annotations

import functools
import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.s3.conftest import PREFIX, TOPIC, plan_for, seed
from tiering.commit.operation import Context
from tiering.documents import read
from tiering.errors import ConfigError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.state import PartitionState
from tiering.lifecycle.vocabulary import Action, Cause
from tiering.plan.document import Plan
from tiering.plan.estimate import Sampling
from tiering.plan.scan import ScanOptions, classify_partition, scan
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import RunSettings, compact, dry_run
from tiering.storage.layout import parse_dir, partition_key, segment_key
from tiering.storage.objects import ObjectAttrs, ObjectInfo
from tiering.storage.s3 import S3Store

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _obj(name: str, size: int = 1000, age_minutes: int = 60, storage_class: str = "STANDARD",
         etag: str = '"e"') -> ObjectInfo:
    return ObjectInfo(f"p/t-0/{name}", size, etag, NOW - timedelta(minutes=age_minutes), storage_class)


def _classify(objects: list[ObjectInfo], state: dict[str, object] | None = None,
              **options: object) -> dict[int, tuple[str, str]]:
    ignored: list[tuple[str, str]] = []
    known = read({"schema_version": 1, "segments": state or {}}, PartitionState, what="a partition state")
    segs = classify_partition(parse_dir("t-0"), "p/t-0/", objects, known, NOW,
                              ScanOptions("zstd", **options),  # type: ignore[arg-type]
                              lambda k, r: ignored.append((k, r)))
    return {s.base_offset: (s.action, s.reason) for s in segs}


def test_no_grace_means_no_age_check_and_a_grace_allows_for_a_store_rounding_up() -> None:
    """A store may give LastModified rounded up to the next second, ahead of its own clock (versitygw did for
    6 of 40 puts): with --min-age-minutes 0 such a segment is not "too young", and a grace period allows a
    second for it."""
    n = "{:020d}".format

    def at(seconds: float, name: str) -> ObjectInfo:
        return ObjectInfo(f"p/t-0/{name}", 1000, '"e"', NOW - timedelta(seconds=seconds), "STANDARD")

    objects = [at(-0.6, n(0) + LOG_SUFFIX), at(59.4, n(10) + LOG_SUFFIX), at(58, n(20) + LOG_SUFFIX),
               at(0, n(99) + LOG_SUFFIX)]
    assert _classify(objects, min_age_minutes=0)[0] == (Action.COMPACT, "sealed")  # 0.6 s in the future
    graced = _classify(objects, min_age_minutes=1)
    assert graced[10] == (Action.COMPACT, "sealed")  # 59.4 s by a clock that rounded up: a minute old
    assert graced[20][1].startswith("too young")  # 58 s: two seconds short
    assert graced[0][1].startswith("too young: uploaded 0 min ago, within the 1-minute grace period")


def test_each_segment_gets_an_action_and_a_reason() -> None:
    n = "{:020d}".format
    objects = [
        _obj(n(0) + LOG_SUFFIX), _obj(n(0) + INDEX_SUFFIX), _obj(n(0) + TIME_INDEX_SUFFIX),
        _obj(n(100) + LOG_SUFFIX, age_minutes=5),  # too young
        _obj(n(200) + LOG_SUFFIX, storage_class="GLACIER"),
        _obj(n(250) + LOG_SUFFIX, storage_class="DEEP_ARCHIVE"),
        _obj(n(260) + LOG_SUFFIX, storage_class="GLACIER_IR"),  # readable at once: compacted
        _obj(n(300) + INDEX_SUFFIX), _obj(n(300) + TIME_INDEX_SUFFIX),  # orphan indexes
        _obj(n(400) + LOG_SUFFIX, size=0),
        _obj(n(500) + LOG_SUFFIX), _obj(n(500) + INDEX_SUFFIX, age_minutes=1),  # its index is young
        _obj(n(600) + LOG_SUFFIX, size=3 << 30),
        _obj(n(650) + ".snapshot"),  # producer state: not a segment
        _obj(n(700) + LOG_SUFFIX),  # highest base offset: active
        _obj("leader-epoch-checkpoint"), _obj("partition.metadata"),
    ]
    got = _classify(objects)
    assert got[0] == (Action.COMPACT, "sealed")
    assert got[100][0] == Action.SKIP
    assert got[100][1].startswith("too young: uploaded 5 min ago, within the 15-minute grace period")
    assert got[200] == (Action.SKIP, "archived: the .log is GLACIER (cannot be read or replaced without a restore)")
    assert got[250] == (Action.SKIP,
                        "archived: the .log is DEEP_ARCHIVE (cannot be read or replaced without a restore)")
    assert got[260] == (Action.COMPACT, "sealed")
    assert got[300][1].startswith("incomplete: index files without a .log")
    assert got[400] == (Action.SKIP, "empty: the .log holds no batches")
    assert got[500][1].startswith("too young: uploaded 1 min ago")
    assert got[600][1].startswith("invalid: 3221225472 bytes is beyond Kafka's 2 GiB segment limit")
    assert got[700][1].startswith("active: the highest base offset")
    assert 650 not in got
    assert _classify(objects, min_age_minutes=0)[100] == (Action.COMPACT, "sealed")
    # Decisions read the cause, not the text: one per skip, none for the work.
    segs = classify_partition(parse_dir("t-0"), "p/t-0/", objects, PartitionState(), NOW, ScanOptions("zstd"),
                              lambda k, r: None)
    causes = {s.base_offset: s.cause for s in segs}
    assert causes == {0: None, 100: Cause.TOO_YOUNG, 200: Cause.ARCHIVED, 250: Cause.ARCHIVED, 260: None,
                      300: Cause.INCOMPLETE, 400: Cause.EMPTY, 500: Cause.TOO_YOUNG, 600: Cause.INVALID,
                      700: Cause.ACTIVE}


def test_state_tells_already_compacted_and_a_mirror_reupload() -> None:
    n = "{:020d}".format
    objects = [_obj(n(0) + LOG_SUFFIX, etag='"new"'), _obj(n(0) + INDEX_SUFFIX, etag='"our-index"'),
               _obj(n(5) + LOG_SUFFIX, etag='"mirrored-original"'), _obj(n(5) + INDEX_SUFFIX, etag='"our-idx5"'),
               _obj(n(9) + LOG_SUFFIX)]
    state = {"0": {"codec": "zstd", "level": 3, "run_id": "r1", "log_etag": '"new"', "index_etag": '"our-index"'},
             "5": {"codec": "zstd", "level": 3, "run_id": "r1", "log_etag": '"ours5"', "index_etag": '"our-idx5"'}}
    got = _classify(objects, state)
    assert got[0] == (Action.SKIP, "already compacted: zstd by run r1")
    assert got[5][0] == Action.REPAIR
    assert "replaced after run r1 compacted it" in got[5][1]
    assert _classify(objects, state, level=19)[0] == (Action.COMPACT, "sealed")  # another level is new work


def test_scan_skips_internal_and_special_directories_unless_included(store: S3Store) -> None:
    for topic in ("__consumer_offsets", "orders"):
        seed(store, topic=topic, segments=2, segment_bytes=5000)
    store.put(f"{PREFIX}/orders-3.abc123-delete/00000000000000000000.log", b"")
    store.put(f"{PREFIX}/orders-4.abc123-future/00000000000000000000.log", b"")
    store.put(f"{PREFIX}/orders-5.abc123-stray/00000000000000000000.log", b"")
    store.put(f"{PREFIX}/README.txt", b"not ours")
    store.put(f"{PREFIX}/orders-0/notes.txt", b"x")
    plan = plan_for(store)
    skipped = {d["directory"]: d["reason"] for d in plan.skipped_dirs}
    assert skipped["__consumer_offsets-0"].startswith("internal topic")
    assert skipped["orders-3.abc123-delete"].startswith("Kafka '-delete' directory")
    assert skipped["orders-4.abc123-future"].startswith("Kafka '-future' directory")
    assert skipped["orders-5.abc123-stray"].startswith("Kafka '-stray' directory")
    assert "_tiering" not in skipped
    assert {s.topic for s in plan.segments} == {"orders"}
    assert {"key": f"{PREFIX}/orders-0/notes.txt", "reason": "not a Kafka file"} in plan.ignored_keys
    everything = plan_for(store, include_internal=True, include_special=True)
    assert {s.directory for s in everything.segments} >= {"__consumer_offsets-0", "orders-3.abc123-delete"}
    only = plan_for(store, topics="__.*", include_internal=True)
    assert {s.topic for s in only.segments} == {"__consumer_offsets"}


def test_reserved_prefix_is_never_a_topic_even_after_a_run(store: S3Store) -> None:
    seed(store)
    ctx = Context(store, PREFIX, "r1", RewriteOptions(Codec.ZSTD))
    compact(store, plan_for(store), ctx, CompactOptions())
    plan = plan_for(store)
    assert {s.directory for s in plan.segments} == {f"{TOPIC}-0"}
    assert not plan.skipped_dirs


def test_plan_document_round_trips_and_is_versioned(store: S3Store, tmp_path: object) -> None:
    seed(store)
    plan = plan_for(store)
    doc = json.loads(json.dumps(plan.to_json()))
    assert doc["schema_version"] == 1
    assert doc["kind"] == "tiering.plan"
    assert doc["totals"]["to_compact"] == 2
    assert Plan.from_json(doc).to_json() == plan.to_json()
    with pytest.raises(ConfigError, match="not a plan this version can read"):
        Plan.from_json({**doc, "schema_version": 99})


def test_listing_is_paginated_past_a_thousand_keys(store: S3Store) -> None:
    root = partition_key(PREFIX, "many", 0)
    for base in range(1200):
        store.put(segment_key(PREFIX, "many", 0, base, LOG_SUFFIX), b"")
    store.put(root + "leader-epoch-checkpoint", b"")
    plan = plan_for(store)
    assert plan.objects_listed == 1201
    assert len(plan.segments) == 1200


def test_bad_options_are_usage_errors() -> None:
    with pytest.raises(ConfigError, match="--topics is not a valid regular expression"):
        ScanOptions("zstd", topics="(")
    with pytest.raises(ConfigError, match="--min-age-minutes must not be negative"):
        ScanOptions("zstd", min_age_minutes=-1)
    with pytest.raises(ConfigError, match="unknown codec"):
        ScanOptions("brotli")


def test_dry_run_estimate_is_close_to_the_real_savings(store: S3Store) -> None:
    seed(store, segments=5, segment_bytes=200_000)
    plan = plan_for(store)
    est = dry_run(store, RunSettings(store.bucket, PREFIX, "dry", "zstd", None, 60), plan, CompactOptions(),
                  Sampling(bytes=64 * 1024)).estimate
    assert est is not None
    assert est.segments_sampled == 4
    assert 0 < est.bytes_sampled <= 4 * 64 * 1024
    run = compact(store, plan, Context(store, PREFIX, "r1", RewriteOptions(Codec.ZSTD)), CompactOptions())
    actual = run.totals()["bytes_before"] - run.totals()["bytes_after"]
    total = est.total
    assert abs(total.saved_bytes - actual) / actual < 0.10
    assert total.saved_low <= total.saved_bytes <= total.saved_high
    # Nothing was written by the estimate itself: the only objects of ours are the run's.
    assert not list(store.list(f"{PREFIX}/_tiering/staging/"))


def test_scan_reads_storage_class_from_the_listing(store: S3Store) -> None:
    seed(store, segments=3)
    first = segment_key(PREFIX, TOPIC, 0, 0, LOG_SUFFIX)
    store.put_object(first, store.get(first), ObjectAttrs(storage_class="GLACIER"))
    plan = scan(store, PREFIX, ScanOptions("zstd", min_age_minutes=0))
    assert plan.segments[0].reason == "archived: the .log is GLACIER (cannot be read or replaced without a restore)"


def test_every_object_the_scan_does_not_plan_has_a_reason(store: S3Store) -> None:
    """Each object under a partition directory is either part of a segment to compact or listed with why not,
    and counted by that reason."""
    seed(store, segments=4)  # bases b0 < b1 < b2 < b3 (active)
    bases = sorted(int(o.key.rsplit("/", 1)[1][:20]) for o in store.list(f"{PREFIX}/{TOPIC}-0/")
                   if o.key.endswith(LOG_SUFFIX))
    key = functools.partial(segment_key, PREFIX, TOPIC, 0)
    store.put(key(bases[0], LOG_SUFFIX), b"")  # a zero-byte .log
    store.put_object(key(bases[1], LOG_SUFFIX), store.get(key(bases[1], LOG_SUFFIX)),
                     ObjectAttrs(storage_class="GLACIER"))
    store.put_object(key(bases[2], TIME_INDEX_SUFFIX), store.get(key(bases[2], TIME_INDEX_SUFFIX)),
                     ObjectAttrs(storage_class="DEEP_ARCHIVE"))
    store.put(key(99, INDEX_SUFFIX), b"")  # an index whose .log is missing
    store.put(key(99, TIME_INDEX_SUFFIX), b"")
    store.put(f"{PREFIX}/{TOPIC}-0/", b"")  # a directory placeholder, as consoles make them
    store.put(f"{PREFIX}/{TOPIC}-0/notes.txt", b"x")
    store.put(key(bases[3], ".snapshot"), b"s")
    plan = plan_for(store)
    reasons = {k["key"]: k["reason"] for k in plan.ignored_keys}
    assert reasons[key(bases[0], LOG_SUFFIX)] == "empty .log"
    assert reasons[key(bases[1], LOG_SUFFIX)] == "archived storage class GLACIER: restore first"
    assert reasons[key(bases[1], INDEX_SUFFIX)] == "archived storage class GLACIER: restore first"
    assert reasons[key(bases[2], TIME_INDEX_SUFFIX)] == "archived storage class DEEP_ARCHIVE: restore first"
    assert reasons[key(99, INDEX_SUFFIX)] == reasons[key(99, TIME_INDEX_SUFFIX)] == "index without its .log"
    assert reasons[f"{PREFIX}/{TOPIC}-0/"] == "directory placeholder (a zero-byte key ending in /)"
    assert reasons[f"{PREFIX}/{TOPIC}-0/notes.txt"] == "not a Kafka file"
    assert reasons[key(bases[3], LOG_SUFFIX)] == "active segment"
    assert reasons[key(bases[3], ".snapshot")] == "producer-state snapshot: kept as it is"
    assert reasons[f"{PREFIX}/{TOPIC}-0/leader-epoch-checkpoint"] == "partition file: kept as it is"
    planned = {r.key for s in plan.segments if s.action == Action.COMPACT
               for r in (s.log, s.index, s.timeindex, s.txnindex) if r is not None}
    everything = {o.key for o in store.list(f"{PREFIX}/") if "/_tiering/" not in o.key}
    assert planned.isdisjoint(reasons)
    assert planned | set(reasons) == everything  # nothing without a reason
    assert plan.ignored_count == len(reasons)
    assert sum(plan.ignored_by_reason.values()) == plan.ignored_count
    assert plan.ignored_by_reason["index without its .log"] == 2
    summary = plan.summary(plan.totals(), "listing")
    assert summary["totals"]["objects_not_planned_by_reason"] == plan.ignored_by_reason
