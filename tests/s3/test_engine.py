"""The run engine's plan on S3: each partition's work written to the run's plan chunks as it is planned, units
that name their partitions by chunk, a unit that reads only its own lines, a retry that plans anew; and the
kinds' options and the run's settings as the Spark job reads them (written once, read back strictly)."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from tests.s3.broker_view import check_loaded
from tests.s3.conftest import PREFIX, TOPIC, Original, context, no_pending, seed
from tiering.errors import ConfigError, InvalidDataError
from tiering.kafka.merge import Limits
from tiering.kafka.reader import iter_batches
from tiering.lifecycle.vocabulary import RunKind, Status, Swap, Verify
from tiering.plan.policy import load_policy, parse_policy
from tiering.run import engine
from tiering.run.documents import RUN_SCOPE
from tiering.run.keycompact import KeyCompactOptions
from tiering.run.kinds import kind_from_json
from tiering.run.merge import MergeOptions, Merging
from tiering.run.pipeline import RunSettings
from tiering.storage.layout import StepDir, partition_prefix, step_key, work_plan_chunk_key, work_plan_dir
from tiering.storage.s3 import S3Store

PARTITIONS = 5


def _seeded(store: S3Store) -> dict[int, dict[int, Original]]:
    return {p: seed(store, partition=p, segments=3, segment_bytes=20_000) for p in range(PARTITIONS)}


def _merging() -> Merging:
    return Merging(MergeOptions(Limits(1 << 20), min_age_minutes=0))


def _chunk_lines(store: S3Store, key: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in gzip.decompress(store.get(key)).splitlines()]


def test_the_plan_is_written_in_chunks_and_each_unit_names_its_partitions_by_chunk(
        store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    _seeded(store)
    monkeypatch.setattr(engine, "CHUNK_PARTITIONS", 2)
    ctx = context(store, "plan-1")
    kind = _merging().started(store, PREFIX)
    planned = engine.plan(store, ctx, kind, parallelism=1)
    assert planned.chunks == 3  # five partitions, two a chunk
    keys = [work_plan_chunk_key(PREFIX, "plan-1", StepDir.MERGE, i) for i in range(3)]
    assert sorted(i.key for i in store.list(work_plan_dir(PREFIX, "plan-1", StepDir.MERGE))) == keys
    lines = {doc["directory"]: (key, doc["work"]) for key in keys for doc in _chunk_lines(store, key)}
    assert sorted(lines) == [f"{TOPIC}-{p}" for p in range(PARTITIONS)]
    refs = [r for u in planned.units for r in u.partitions]
    assert sorted(r.directory for r in refs) == sorted(lines)
    for ref in refs:
        key, work = lines[ref.directory]
        assert ref.chunk == key
        part = kind.partition_from_json(work)
        assert (ref.segments, ref.bytes) == (len(part.segments), sum(s.size for s in part.segments))
    assert len(planned.units) == 4  # about four units a core, balanced by bytes
    for unit in planned.units:
        assert [r.directory for r in unit.partitions] == sorted(r.directory for r in unit.partitions)


def test_units_read_from_the_chunks_merge_every_partition(store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    originals = _seeded(store)
    monkeypatch.setattr(engine, "CHUNK_PARTITIONS", 2)
    run = engine.run(store, context(store, "plan-2"), _merging())
    merged = [r for r in run.segments if r.status is Status.MERGED]
    assert sorted({r.directory for r in merged}) == [f"{TOPIC}-{p}" for p in range(PARTITIONS)]
    for p, segments in originals.items():  # every batch of every partition in place, once, in order
        batches = [(raw.header.offset, raw.header.last_offset) for base in sorted(segments)
                   for raw in iter_batches(io.BytesIO(segments[base].log))]
        check_loaded(store, partition_prefix(PREFIX, f"{TOPIC}-{p}"), batches)
    assert no_pending(store)
    # each unit read its chunks once, outside any partition's work: the run's own requests
    assert run.usage["requests"][RUN_SCOPE]["GetObject"] >= 3


@pytest.mark.parametrize(("chunk", "named"), [
    (b'{"directory":"x","work":{}}\nnot json\n', ["line 2"]),  # damaged: the file and the line named
    (b"", []),  # without the unit's partition: the partition named
])
def test_a_chunk_that_does_not_read_is_an_error_naming_it(store: S3Store, chunk: bytes, named: list[str]) -> None:
    _seeded(store)
    ctx = context(store, "plan-3")
    kind = _merging().started(store, PREFIX)
    planned = engine.plan(store, ctx, kind)
    key = work_plan_chunk_key(PREFIX, "plan-3", StepDir.MERGE, 0)
    store.put(key, gzip.compress(chunk))
    with pytest.raises(InvalidDataError) as raised:
        engine.run_unit(store, ctx, kind, planned.units[0])
    for part in [key, *named] if named else [key, planned.units[0].partitions[0].directory]:
        assert part in str(raised.value)


def test_a_unit_stopped_by_an_unreadable_chunk_keeps_what_it_did_before(store: S3Store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _seeded(store)
    monkeypatch.setattr(engine, "CHUNK_PARTITIONS", 2)
    ctx = context(store, "plan-6")
    kind = _merging().started(store, PREFIX)
    planned = engine.plan(store, ctx, kind)
    whole = engine.Unit("whole", tuple(sorted((r for u in planned.units for r in u.partitions),
                                              key=lambda r: r.directory)))
    second = work_plan_chunk_key(PREFIX, "plan-6", StepDir.MERGE, 1)
    store.put(second, b"not gzip")
    with pytest.raises(InvalidDataError, match="damaged"):
        engine.run_unit(store, ctx, kind, whole)
    step = store.get_json(step_key(PREFIX, "plan-6", StepDir.MERGE, "whole"))[0]
    done = {r["directory"] for r in step["results"]}
    first = work_plan_chunk_key(PREFIX, "plan-6", StepDir.MERGE, 0)  # read before the damaged one: its two done
    assert done == {r.directory for r in whole.partitions if r.chunk == first} == {f"{TOPIC}-0", f"{TOPIC}-1"}


def test_a_retry_plans_anew_and_leaves_no_chunk_of_its_earlier_plan(store: S3Store,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _seeded(store)
    ctx = context(store, "plan-5")
    kind = _merging().started(store, PREFIX)
    monkeypatch.setattr(engine, "CHUNK_PARTITIONS", 1)
    assert engine.plan(store, ctx, kind).chunks == PARTITIONS
    monkeypatch.setattr(engine, "CHUNK_PARTITIONS", 1_000)
    again = engine.plan(store, ctx, kind)
    assert again.chunks == 1
    assert [i.key for i in store.list(work_plan_dir(PREFIX, "plan-5", StepDir.MERGE))] == [
        work_plan_chunk_key(PREFIX, "plan-5", StepDir.MERGE, 0)]
    assert {r.chunk for u in again.units for r in u.partitions} == {work_plan_chunk_key(PREFIX, "plan-5",
                                                                                        StepDir.MERGE, 0)}


def _policy_file(tmp_path: Path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\ncluster:\n  merge.enable: true\n  compact.enable: true\ntopics:\n"
                    "  - topic: logs.app\n    cleanup.policy: compact\n")
    return str(path)


@pytest.mark.parametrize("options", [
    KeyCompactOptions(topics=r"logs\..*"),
    KeyCompactOptions(1_700_000_000_000, 3_600_000, 60_000, "zstd", 9, "t", 15, 120, None, 1_000, Limits(4096, 512)),
    MergeOptions(),
    MergeOptions(Limits(1 << 20, 4096), r"logs\..*", 15, 120),
])
def test_a_kinds_options_read_back_as_they_were_written(options: KeyCompactOptions | MergeOptions) -> None:
    run_kind = RunKind.MERGE if isinstance(options, MergeOptions) else RunKind.COMPACT_KEYS
    kind = kind_from_json(run_kind.value, json.loads(json.dumps(options.to_json())))
    assert kind.options_json() == options.to_json()
    assert kind.run_kind is run_kind
    assert kind.options == options  # type: ignore[attr-defined]


def test_options_left_out_take_the_command_lines_defaults() -> None:
    """A person writing the Spark job's options gets what the CLI does by default: segments of the last 15
    minutes left; key compaction groups neighbours as the broker's cleaner does (null: each its own)."""
    merging = kind_from_json("merge", {})
    assert merging.options == MergeOptions()  # type: ignore[attr-defined]
    assert (merging.options.min_age_minutes, KeyCompactOptions(topics="t").merge) == (15, Limits())  # type: ignore[attr-defined]
    keys = kind_from_json("compact-keys", {"topics": "t"}).options  # type: ignore[attr-defined]
    assert (keys.min_age_minutes, keys.merge) == (15, Limits())
    assert kind_from_json("compact-keys", {"topics": "t", "merge": False}).options.merge is None  # type: ignore[attr-defined]


def test_a_policy_travels_by_its_files_path(tmp_path: Path) -> None:
    path = _policy_file(tmp_path)
    for options in (KeyCompactOptions(policy=load_policy(path)), MergeOptions(policy=load_policy(path))):
        doc = options.to_json()
        assert doc["policy"] == path
        back = type(options).from_json(doc)
        assert back.policy is not None
        assert back.policy.path == path
        assert back.policy.resolve("logs.app") == load_policy(path).resolve("logs.app")
    with pytest.raises(ConfigError, match="not read from a file"):
        MergeOptions(policy=parse_policy({"cluster": {"merge.enable": True}})).to_json()


@pytest.mark.parametrize(("run_kind", "doc", "found"), [
    ("merge", {"limits": [1, 2], "segment_bytes": 5}, "limits"),
    ("merge", {"segment_bytes": "16MiB"}, "16MiB"),
    ("merge", {"min_age_minutes": "15"}, "min_age_minutes"),
    ("compact-keys", {"topics": "t", "max_keys": True}, "max_keys"),
    ("compact-keys", {"topics": "t", "codecs": "zstd"}, "codecs"),
    ("compact-keys", {}, "neither"),  # the options' own check: no topics and no policy
    ("compact", {}, "compact"),  # not a kind of the engine
])
def test_options_that_do_not_read_are_an_error_naming_what_was_found(run_kind: str, doc: dict[str, object],
                                                                     found: str) -> None:
    with pytest.raises(ConfigError) as raised:
        kind_from_json(run_kind, doc, "--options")
    assert found in str(raised.value)


def test_a_runs_settings_read_back_strictly() -> None:
    settings = RunSettings("b", "p", "r", "zstd", 3, 120, Verify.READ_BACK, Swap.PUT)
    assert RunSettings.from_json(json.loads(json.dumps(settings.to_json()))) == settings
    with pytest.raises(ConfigError, match="run_id"):
        RunSettings.from_json({"bucket": "b", "prefix": "p", "codec": "none"})
    with pytest.raises(ConfigError, match="runid"):
        RunSettings.from_json({**settings.to_json(), "runid": "r"})
    with pytest.raises(ConfigError, match="lease_ttl_seconds"):
        RunSettings.from_json({**settings.to_json(), "lease_ttl_seconds": "600"})


def test_tiering_options_read_back_as_they_were_written_and_strictly(tmp_path: Path) -> None:
    from tiering.cost.prices import load_prices
    from tiering.run.tier import TierOptions

    path = tmp_path / "tiers.yaml"
    path.write_text("cluster:\n  storage.tiers:\n    - {after.days: 30, storage.class: STANDARD_IA}\n")
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"regions": {"eu-west-1": {"s3": {"STANDARD_IA": {"put_per_1000": 0.02}}}}}))
    options = TierOptions(load_policy(str(path)), load_prices("eu-west-1", str(prices)), True, 120,
                          "2026-12-06T00:00:00+00:00")
    kind = kind_from_json(RunKind.TIER.value, json.loads(json.dumps(options.to_json())))
    assert kind.options == options  # type: ignore[attr-defined]
    assert kind.options.prices.of("STANDARD_IA").put_per_1000 == 0.02  # type: ignore[attr-defined]
    for doc, found in (({}, "lack option policy"),
                       ({"policy": str(path), "include_internal": "yes"}, "include_internal"),
                       ({"policy": str(path), "polcy": "x"}, "polcy"),
                       ({"policy": str(path), "prices_region": "mars-1"}, "mars-1"),
                       ({"policy": str(path), "prices_region": ""}, "prices_region"),
                       ({"policy": str(path), "lease_ttl_seconds": -5}, "lease_ttl_seconds"),
                       ({"policy": str(path), "now": "garbage"}, "garbage"),
                       ({"policy": str(path), "now": "2026-12-06T00:00:00"}, "offset")):
        with pytest.raises(ConfigError) as raised:
            kind_from_json("tier", doc, "--options")
        assert found in str(raised.value), raised.value
