"""Policies: precedence (built-in, cluster, regex, exact), validation errors naming the key, the CLI."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
import yaml

from tiering.cli import main
from tiering.plan.policy import PolicyError, Tier, load_policy, parse_policy

POLICY: dict[str, Any] = {
    "version": 1,
    "cluster": {"compression.type": "zstd", "compression.level": 6, "min.savings.ratio": 0.05,
                "storage.tiers": [{"after.days": 30, "storage.class": "STANDARD_IA"},
                                  {"after.days": 90, "storage.class": "GLACIER_IR"}]},
    "topics": [
        {"regex": r"clickstream\..*", "compression.type": "auto", "min.segment.age.hours": 2},
        {"regex": r".*\.events", "compression.type": "lz4", "min.savings.ratio": 0.2},
        {"topic": "clickstream.events", "compression.type": "gzip", "compression.gzip.level": 9},
        {"topic": "payments.encrypted", "compression.type": "producer", "storage.tiers": []},
        {"regex": "archive-.*", "storage.allow.archive": True,
         "storage.tiers": [{"after.days": 7, "storage.class": "STANDARD_IA"},
                           {"after.days": 180, "storage.class": "DEEP_ARCHIVE"}]},
    ],
}


@pytest.mark.parametrize(("topic", "expected"), [
    # (compression.type, level, min.savings.ratio, min.segment.age.hours)
    ("orders", ("zstd", 6, 0.05, 0.0)),                      # cluster for everything
    ("clickstream.views", ("auto", None, 0.05, 2.0)),         # the first regex
    ("clickstream.events", ("gzip", 9, 0.05, 2.0)),           # exact beats both regexes; its level key
    ("shop.events", ("lz4", None, 0.2, 0.0)),                 # the second regex; zstd's level is not lz4's
    ("payments.encrypted", ("producer", None, 0.05, 0.0)),    # exact
    ("archive-2019", ("zstd", 6, 0.05, 0.0)),
])
def test_precedence_key_by_key(topic: str, expected: tuple[Any, ...]) -> None:
    p = parse_policy(POLICY).resolve(topic)
    assert (p.compression_type, p.level, p.min_savings_ratio, p.min_age_hours) == expected


def test_sources_say_where_each_value_came_from() -> None:
    p = parse_policy(POLICY).resolve("clickstream.events")
    assert p.sources["compression.type"] == "topic 'clickstream.events' (topics[2])"
    assert p.sources["compression.level"] == "topic 'clickstream.events' (topics[2])"
    assert p.sources["min.segment.age.hours"] == r"regex 'clickstream\..*' (topics[0])"
    assert p.sources["min.savings.ratio"] == "cluster"  # the FIRST matching regex only: not '.*\.events'
    assert p.sources["auto.candidates"] == "built-in default"


def test_with_no_file_entries_the_built_in_defaults_apply() -> None:
    p = parse_policy({}).resolve("anything")
    assert (p.compression_type, p.level, p.min_savings_ratio, p.tiers) == ("zstd", None, 0.0, ())
    assert set(p.sources.values()) == {"built-in default"}


def test_storage_tiers_are_one_key_and_pick_the_coldest_due_rule() -> None:
    policy = parse_policy(POLICY)
    default = policy.resolve("orders")
    assert default.tiers == (Tier(30, "STANDARD_IA"), Tier(90, "GLACIER_IR"))
    assert [default.tier_for(d) for d in (0, 29.9, 30, 89, 90, 1000)] == [
        None, None, "STANDARD_IA", "STANDARD_IA", "GLACIER_IR", "GLACIER_IR"]
    assert policy.resolve("payments.encrypted").tiers == ()  # replaced as a whole, not merged
    archive = policy.resolve("archive-2019")
    assert archive.allow_archive
    assert archive.tier_for(200) == "DEEP_ARCHIVE"


def _error(doc: Any) -> str:
    with pytest.raises(PolicyError) as e:
        parse_policy(doc)
    return str(e.value)


@pytest.mark.parametrize(("doc", "names"), [
    ({"cluster": {"compression.type": "brotli"}}, ["cluster.compression.type", "unknown compression type"]),
    ({"cluster": {"compresion.type": "zstd"}}, ["cluster.compresion.type", "unknown key"]),
    ({"topics": [{"regex": "orders[", "compression.type": "zstd"}]}, ["topics[0].regex", "regular expression"]),
    ({"cluster": {"compression.type": "gzip", "compression.level": 12}}, ["level out of range for gzip", "1..9"]),
    ({"topics": [{"topic": "t", "compression.type": "snappy", "compression.level": 3}]},
     ["topic 't' (topics[0])", "snappy takes no level"]),
    ({"cluster": {"compression.zstd.level": 99}}, ["cluster.compression.zstd.level", "-131072..22"]),
    ({"cluster": {"storage.tiers": [{"after.days": 90, "storage.class": "GLACIER_IR"},
                                    {"after.days": 30, "storage.class": "STANDARD_IA"}]}},
     ["storage.tiers", "out of order"]),
    ({"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "GLACIER_IR"},
                                    {"after.days": 90, "storage.class": "STANDARD_IA"}]}},
     ["storage.tiers", "colder"]),
    ({"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "GLACIER"}]}},
     ["storage.allow.archive", "GLACIER"]),
    ({"cluster": {"storage.tiers": [{"after.days": 30, "storage.class": "COLD"}]}}, ["unknown storage class"]),
    ({"cluster": {"storage.tiers": [{"after.days": -1, "storage.class": "STANDARD_IA"}]}},
     ["cluster.storage.tiers[0].after.days"]),
    ({"cluster": {"min.savings.ratio": 1.5}}, ["cluster.min.savings.ratio", "fraction"]),
    ({"cluster": {"auto.candidates": ["zstd:30"]}}, ["auto.candidates", "level out of range"]),
    ({"topics": [{"topic": "a", "regex": "b"}]}, ["topics[0]", "exactly one of topic"]),
    ({"topics": [{"topic": "a"}, {"topic": "a"}]}, ["topics[1].topic", "already has an entry"]),
    ({"version": 2}, ["version", "unsupported"]),
    ({"cluster": {"compression.type": "auto", "compression.level": 99}}, ["cluster.compression.level", "no level"]),
    ({"topics": [{"regex": "cold-.*", "storage.allow.archive": True,
                  "storage.tiers": [{"after.days": 9, "storage.class": "GLACIER"}]},
                 {"topic": "cold-1", "storage.allow.archive": False}]},
     ["storage.allow.archive", "GLACIER"]),  # the exact topic with the regex entry it also matches
    ({"clusters": {}}, ["clusters", "unknown top-level key"]),
    ({"cluster": {"merge.target.bytes": 0}}, ["cluster.merge.target.bytes", "bytes in 1..2147483647"]),
    ({"cluster": {"segment.bytes": 1 << 31}}, ["cluster.segment.bytes", "bytes in 1..2147483647"]),
    ({"cluster": {"merge.enable": "yes"}}, ["cluster.merge.enable", "true or false"]),
])
def test_an_invalid_policy_names_the_key_and_the_problem(doc: Any, names: list[str]) -> None:
    message = _error(doc)
    for name in names:
        assert name in message, message


def test_a_level_belongs_to_its_codec() -> None:
    doc = {"cluster": {"compression.type": "zstd", "compression.level": 19, "compression.lz4.level": 12},
           "topics": [{"regex": "logs-.*", "compression.type": "gzip"},
                      {"regex": "snap-.*", "compression.type": "snappy"},
                      {"regex": "fast-.*", "compression.type": "lz4"}]}
    policy = parse_policy(doc)
    assert policy.resolve("orders").level == 19
    assert policy.resolve("logs-1").level is None  # zstd's 19 is not gzip's: Kafka's default then
    assert policy.resolve("snap-1").level is None
    fast = policy.resolve("fast-1")
    assert (fast.level, fast.sources["compression.level"]) == (12, "cluster")
    assert "compression.level" in _error({"cluster": {"compression.level": 3}})  # no type in the entry


def _write(tmp_path: Path, doc: Any) -> Path:
    f = tmp_path / "policy.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def test_load_policy_names_the_file(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("cluster: [unclosed\n")
    with pytest.raises(PolicyError, match="not valid YAML") as e:
        load_policy(f)
    assert str(f) in str(e.value)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy(tmp_path / "missing.yaml")
    assert load_policy(_write(tmp_path, POLICY)).resolve("orders").compression_type == "zstd"


def test_cli_policy_resolve(tmp_path: Path) -> None:
    f = _write(tmp_path, POLICY)
    out = StringIO()
    assert main(["policy", "resolve", "--policy", str(f), "--topic", "clickstream.events", "--json"], stdout=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["compression.type"] == "gzip"
    assert doc["compression.level"] == 9
    assert doc["sources"]["compression.type"].startswith("topic 'clickstream.events'")
    out = StringIO()
    assert main(["policy", "resolve", "--policy", str(f), "--topic", "orders"], stdout=out) == 0
    assert "compression.type" in out.getvalue()
    assert "cluster" in out.getvalue()
    bad = _write(tmp_path, {"cluster": {"compression.type": "brotli"}})
    err = StringIO()
    assert main(["policy", "check", "--policy", str(bad)], stdout=StringIO(), stderr=err) == 2
    assert "compression.type" in err.getvalue()


def test_uncompressed_is_kafkas_name_for_none() -> None:
    assert parse_policy({"cluster": {"compression.type": "uncompressed"}}).resolve("t").compression_type == "none"


def test_key_compaction_is_opt_in_and_only_for_compacted_topics() -> None:
    policy = parse_policy({"cluster": {"compact.enable": True}, "topics": [
        {"topic": "users", "cleanup.policy": "compact", "delete.retention.ms": 3_600_000},
        {"topic": "both", "cleanup.policy": "delete, compact", "min.compaction.lag.ms": 60_000},
        {"topic": "off", "cleanup.policy": "compact", "compact.enable": False}]})
    users, both = policy.resolve("users"), policy.resolve("both")
    assert users.key_compaction
    assert (users.delete_retention_ms, users.min_compaction_lag_ms) == (3_600_000, 0)
    assert both.key_compaction
    assert both.cleanup_policy == "compact,delete"
    assert (both.delete_retention_ms, both.min_compaction_lag_ms) == (86_400_000, 60_000)
    assert not policy.resolve("off").key_compaction
    assert not policy.resolve("logs").key_compaction  # cleanup.policy delete: never key-compacted
    assert users.sources["compact.enable"] == "cluster"


@pytest.mark.parametrize(("settings", "names"), [
    ({"cleanup.policy": "compacted"}, ["cluster.cleanup.policy", "unknown cleanup policy", "compacted"]),
    ({"delete.retention.ms": -1}, ["cluster.delete.retention.ms", "milliseconds >= 0"]),
    ({"min.compaction.lag.ms": 1.5}, ["cluster.min.compaction.lag.ms", "an integer"]),
    ({"compact.enable": "yes"}, ["cluster.compact.enable", "true or false"]),
])
def test_key_compaction_keys_are_checked(settings: dict[str, Any], names: list[str]) -> None:
    with pytest.raises(PolicyError) as e:
        parse_policy({"cluster": settings})
    assert all(n in str(e.value) for n in names), str(e.value)


def test_merge_bounds_default_to_the_topics_segment_bytes() -> None:
    policy = parse_policy({"cluster": {"merge.enable": True, "segment.bytes": 64 << 20},
                           "topics": [{"regex": "big-.*", "merge.target.bytes": 256 << 20},
                                      {"topic": "off", "merge.enable": False}]})
    assert (policy.resolve("orders").merge_enable, policy.resolve("orders").merge_target_bytes) == (True, 64 << 20)
    assert policy.resolve("big-1").merge_target_bytes == 256 << 20  # its own, above segment.bytes
    assert policy.resolve("off").merge_enable is False
    assert parse_policy({}).resolve("t").merge_target_bytes == 1 << 30  # Kafka's segment.bytes
    assert parse_policy({}).resolve("t").segment_index_bytes == 10 << 20
    assert parse_policy({}).resolve("t").merge_enable is False  # opt-in


def test_a_policy_enables_merging_when_some_scope_sets_it_true() -> None:
    assert parse_policy({"cluster": {"merge.enable": True}}).enables("merge.enable")
    assert parse_policy({"topics": [{"regex": "m-.*", "merge.enable": True}]}).enables("merge.enable")
    assert not parse_policy({"topics": [{"topic": "a", "merge.enable": False}]}).enables("merge.enable")
    assert not parse_policy({}).enables("merge.enable")  # opt-in: the built-in default is off
