"""Key naming of the logdir layout (pure functions)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiering.errors import ConfigError
from tiering.storage.layout import (
    DirKind,
    PlanName,
    StepDir,
    keys_unit_name,
    normalize_prefix,
    parse_dir,
    parse_segment_name,
    partition_key,
    plan_chunk_key,
    plan_chunk_name,
    plan_dir,
    plan_manifest_key,
    reserved_key,
    run_dir,
    segment_key,
    step_dir,
    step_key,
)


@pytest.mark.parametrize(
    ("name", "kind", "topic", "partition"),
    [
        ("orders-0", DirKind.PARTITION, "orders", 0),
        ("app.events-12", DirKind.PARTITION, "app.events", 12),
        ("my-topic-with-dashes-3", DirKind.PARTITION, "my-topic-with-dashes", 3),
        ("under_score-7", DirKind.PARTITION, "under_score", 7),
        ("_schemas-0", DirKind.PARTITION, "_schemas", 0),  # a topic may start with "_" (not "_tiering" itself)
        ("__consumer_offsets-49", DirKind.PARTITION, "__consumer_offsets", 49),
        ("orders-0.5c0bd1a0e7c84a0fa3d9b2c1e4f6a7b8-delete", DirKind.DELETE, "orders", 0),
        ("orders-1.0a1b2c3d-future", DirKind.FUTURE, "orders", 1),
        ("orders-2.0a1b2c3d-stray", DirKind.STRAY, "orders", 2),
        ("_tiering", DirKind.RESERVED, None, None),
        ("orders", DirKind.OTHER, None, None),
        ("orders-", DirKind.OTHER, None, None),
        ("-3", DirKind.OTHER, None, None),
        ("orders-x", DirKind.OTHER, None, None),
        ("bad topic-0", DirKind.OTHER, None, None),
    ],
)
def test_parse_dir(name: str, kind: DirKind, topic: str | None, partition: int | None) -> None:
    info = parse_dir(name)
    assert (info.kind, info.topic, info.partition) == (kind, topic, partition)


def test_internal_topics() -> None:
    assert parse_dir("__cluster_metadata-0").internal
    assert not parse_dir("_schemas-0").internal


def test_segment_keys_read_back_as_the_directory_and_file_they_name() -> None:
    key = segment_key("/backups/kafka/", "app.events", 3, 1_000_000, ".timeindex")
    assert key == "backups/kafka/app.events-3/00000000000001000000.timeindex"
    directory, file = key.removeprefix("backups/kafka/").split("/")
    info = parse_dir(directory)
    assert info.kind is DirKind.PARTITION
    assert (info.topic, info.partition, parse_segment_name(file)) == ("app.events", 3, (1_000_000, ".timeindex"))
    assert parse_segment_name("leader-epoch-checkpoint") is None
    assert parse_dir("_tiering").kind is DirKind.RESERVED
    assert partition_key("", "t", 0) == "t-0/"


def test_reserved_prefix_is_never_a_partition() -> None:
    assert reserved_key("a/b", "journal", "x.json") == "a/b/_tiering/journal/x.json"
    first = "a/b/_tiering/staging/orders-0/00000000000000000000.log".removeprefix("a/b/").split("/")[0]
    assert parse_dir(first).kind is DirKind.RESERVED  # the first directory under the prefix decides


def test_prefix_validation() -> None:
    assert normalize_prefix("/a/b/") == "a/b"
    with pytest.raises(ConfigError):
        normalize_prefix("a//b")


@given(topic=st.from_regex(r"\A[A-Za-z0-9._-]{1,60}\Z"), partition=st.integers(0, 100_000),
       base=st.integers(0, 2**63 - 1))
def test_any_topic_name_round_trips(topic: str, partition: int, base: int) -> None:
    directory, file = segment_key("p", topic, partition, base, ".log").removeprefix("p/").split("/")
    info = parse_dir(directory)
    assert (info.topic, info.partition, parse_segment_name(file)) == (topic, partition, (base, ".log"))


@pytest.mark.parametrize("prefix", ["", "logs", "a/b/c"])
@pytest.mark.parametrize("name", list(PlanName))
def test_a_runs_plan_keys_read_back(prefix: str, name: PlanName) -> None:
    """A plan's manifest, chunks and step documents lie under the run's directory, and their names read back:
    the Spark job is given a plan by its manifest's key alone."""
    run = "manual__2026-11-28T03:00:00+00:00"
    manifest = plan_manifest_key(prefix, run, name)
    assert manifest.startswith(plan_dir(prefix, run, name))
    assert plan_dir(prefix, run, name).startswith(run_dir(prefix, run))
    assert manifest.endswith(f"/{name.value}/manifest.json")
    chunk = plan_chunk_key(prefix, run, name, plan_chunk_name(7))
    assert chunk.startswith(plan_dir(prefix, run, name))
    unit = keys_unit_name(12)
    for step in StepDir:
        key = step_key(prefix, run, step, unit)
        assert key.startswith(step_dir(prefix, run, step))
        assert key.endswith(f"/{step.value}/{unit}.json")
