"""Remembered outcomes: a segment that would not shrink, or is invalid, is not read again by the next scan
until its .log (or, for no savings, the target codec) changes; a compacted segment's record is kept."""

from __future__ import annotations

from tests.s3.conftest import PREFIX, TOPIC, context, plan_for, seed
from tiering.kafka.codecs import Codec
from tiering.lifecycle.state import load_state
from tiering.lifecycle.vocabulary import Action
from tiering.plan.document import Plan, PlannedSegment
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.layout import segment_key
from tiering.storage.s3 import S3Store


def _by_base(plan: Plan) -> dict[int, PlannedSegment]:
    return {s.base_offset: s for s in plan.segments}


def test_no_savings_is_remembered_until_the_target_changes(store: S3Store) -> None:
    seed(store, segments=2, kind="random", codec=Codec.NONE)
    run = compact(store, plan_for(store), context(store), CompactOptions())
    [first] = [r for r in run.segments if r.base_offset == 0]
    assert first.status == "skipped"
    assert first.reason.startswith("no savings")
    again = _by_base(plan_for(store))[0]
    assert again.action == Action.SKIP
    assert again.reason.startswith("no-savings last time (zstd by run run-1)")
    read: list[str] = []
    store.client.meta.events.register("provide-client-params.s3.GetObject",
                                      lambda params, **_: read.append(params["Key"]))
    compact(store, plan_for(store), context(store, "run-2"), CompactOptions())
    assert read  # documents of ours were read
    assert not [key for key in read if key.endswith(".log")]  # the .log is not read again
    other = _by_base(plan_for(store, codec="gzip"))[0]
    assert other.action == Action.COMPACT


def test_an_invalid_segment_is_not_read_again_until_it_changes(store: S3Store) -> None:
    originals = seed(store, segments=2)
    key = segment_key(PREFIX, TOPIC, 0, 0, ".log")
    data = bytearray(originals[0].log)
    data[300] ^= 0x40
    store.put(key, bytes(data))
    run = compact(store, plan_for(store), context(store), CompactOptions())
    assert run.segments[0].status == "failed"
    for codec in ("zstd", "lz4"):
        seg = _by_base(plan_for(store, codec=codec))[0]
        assert seg.reason.startswith("invalid last time")
    store.put(key, originals[0].log)  # repaired by its owner: a new object
    assert _by_base(plan_for(store))[0].action == Action.COMPACT


def test_a_compacted_segments_record_is_not_replaced_by_an_outcome(store: S3Store) -> None:
    seed(store, segments=2)
    compact(store, plan_for(store), context(store), CompactOptions())
    entry = load_state(store, PREFIX, f"{TOPIC}-0").get(0)
    assert entry is not None
    assert entry.codec == "zstd"
    run = compact(store, plan_for(store, codec="lz4"), context(store, "run-2", Codec.LZ4), CompactOptions())
    [seg] = [r for r in run.segments if r.base_offset == 0]
    assert seg.status == "skipped"  # lz4 does not beat the zstd it holds now: nothing to gain
    assert seg.reason.startswith("no savings")
    assert load_state(store, PREFIX, f"{TOPIC}-0").get(0) == entry
