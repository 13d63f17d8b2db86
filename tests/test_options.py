"""The kinds' options, each declared once: the command line's flags, the DAG's params and the strict reading
of the options' JSON all come from the declaration, and every kind reads the shared lease time the same way."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tiering.cli.args import add_key_map_args, max_keys
from tiering.commit.operation import AUTO_SWAP
from tiering.cost.prices import DEFAULT_REGION
from tiering.errors import ConfigError
from tiering.kafka.codecs import Codec
from tiering.kafka.keycompact import DEFAULT_DELETE_RETENTION_MS, DEFAULT_MAX_KEYS
from tiering.kafka.merge import DEFAULT_INDEX_BYTES, DEFAULT_SEGMENT_BYTES, Limits
from tiering.kafka.rebatch import DEFAULT_MAX_BYTES as DEFAULT_REBATCH_BYTES
from tiering.lifecycle.vocabulary import Swap, Verify
from tiering.options import (
    CLEANUP,
    CODECS,
    INDEX_BYTES,
    KEY_COMPACTION,
    LEASE_TTL,
    MERGE,
    REBATCH_MAX_BYTES,
    ROLLBACK,
    SEGMENT_BYTES,
    SWAP,
    TIERING,
    VERIFY,
    Opt,
    Options,
    add_arguments,
    option,
    params,
    read_options,
)
from tiering.run.cleanup import CleanupOptions
from tiering.run.keycompact import KeyCompactOptions
from tiering.run.kinds import kind_from_json
from tiering.run.merge import MergeOptions
from tiering.run.pipeline import RunSettings


def _parser(declared: tuple[Opt, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, declared)
    return p


def test_the_flag_the_param_and_the_json_take_the_same_default_and_bounds() -> None:
    parsed = vars(_parser(CLEANUP).parse_args([]))
    read = read_options({}, CLEANUP, what="cleanup options")
    dag = params(CLEANUP, prefix="cleanup_")
    assert set(dag) == {"cleanup_grace_days", "cleanup_stale_hours", "cleanup_lease_ttl_seconds"}  # none internal
    for name in ("grace_days", "stale_hours", "lease_ttl_seconds"):
        assert parsed[name] == read[name] == dag[f"cleanup_{name}"]["default"]
    assert dag["cleanup_lease_ttl_seconds"] | {"description": ""} == {
        "default": 600, "type": "integer", "minimum": 1, "maximum": 86_400, "description": ""}
    assert LEASE_TTL.param(minimum=30)["minimum"] == 30  # a DAG's scheduled runs may ask a tighter bound
    assert read["now"] is None  # set by the run as it starts ...
    assert "now" not in parsed  # ... never asked


@pytest.mark.parametrize(("argv", "doc"), [(["--grace-days", "-1"], {"grace_days": -1}),
                                           (["--grace-days", "inf"], {"grace_days": float("inf")}),
                                           (["--stale-hours", "1e12"], {"stale_hours": 1e12}),
                                           (["--lease-ttl-seconds", "0"], {"lease_ttl_seconds": 0}),
                                           (["--lease-ttl-seconds", "1.5"], {"lease_ttl_seconds": 1.5}),
                                           (["--stale-hours", "soon"], {"stale_hours": "soon"})])
def test_a_value_out_of_its_declaration_is_refused_everywhere_naming_the_option(argv: list[str], doc: dict[str, Any]
                                                                                ) -> None:
    name = next(iter(doc))
    with pytest.raises(argparse.ArgumentError, match=f"argument {argv[0]}: expected a "):
        _parser(CLEANUP).parse_args(argv)
    with pytest.raises(ConfigError, match=f"option {name} is out of its range or of the wrong type") as e:
        read_options(doc, CLEANUP, what="cleanup options", where="--options")
    assert e.value.expected == option(CLEANUP, name).expected()


def test_a_required_option_is_required_and_a_field_not_declared_is_named() -> None:
    with pytest.raises(ConfigError, match="rollback options lack option target_run"):
        read_options({}, ROLLBACK, what="rollback options")
    with pytest.raises(ConfigError, match="option target_run is out of its range"):
        read_options({"target_run": ""}, ROLLBACK, what="rollback options")
    with pytest.raises(ConfigError, match="fields this version does not know") as e:
        read_options({"target_run": "r", "target": "r"}, ROLLBACK, what="rollback options")
    assert e.value.found == "target"
    assert vars(_parser(ROLLBACK).parse_args(["--run-id", "r"])) == {"target_run": "r", "lease_ttl_seconds": 600}
    with pytest.raises(SystemExit):  # argparse exits (2) on a missing required flag whatever exit_on_error says
        _parser(ROLLBACK).parse_args([])


@pytest.mark.parametrize(("kind", "options"), [
    ("compact", {"plan_run": "p"}), ("compact-keys", {"topics": "t"}), ("merge", {}), ("rollback", {"target_run": "r"}),
    ("cleanup", {})])
def test_every_kind_reads_the_lease_time_as_declared(kind: str, options: dict[str, Any]) -> None:
    assert kind_from_json(kind, {**options, "lease_ttl_seconds": 30}).lease_ttl_seconds == 30
    for bad in (0, -5, 86_401, "600", True):
        with pytest.raises(ConfigError, match="lease_ttl_seconds"):
            kind_from_json(kind, {**options, "lease_ttl_seconds": bad}, "--options")


def test_the_run_settings_read_the_lease_time_as_declared() -> None:
    settings = {"bucket": "b", "prefix": "p", "run_id": "r"}
    assert RunSettings.from_json(settings).lease_ttl_seconds == LEASE_TTL.default
    with pytest.raises(ConfigError, match="lease_ttl_seconds"):
        RunSettings.from_json({**settings, "lease_ttl_seconds": 0})


def test_the_declared_defaults_are_the_formats_own() -> None:
    # options.py stays light (a DAG imports it when Airflow parses it), so it states Kafka's defaults itself
    assert (SEGMENT_BYTES.default, INDEX_BYTES.default) == (DEFAULT_SEGMENT_BYTES, DEFAULT_INDEX_BYTES)
    assert option(KEY_COMPACTION, "max_keys").default == DEFAULT_MAX_KEYS
    assert option(KEY_COMPACTION, "delete_retention_ms").default == DEFAULT_DELETE_RETENTION_MS
    assert sorted(CODECS) == sorted(c.label for c in Codec)
    assert VERIFY.choices == tuple(v.value for v in Verify)
    assert SWAP.choices == (AUTO_SWAP, *(s.value for s in Swap))
    assert REBATCH_MAX_BYTES.default == DEFAULT_REBATCH_BYTES
    assert option(TIERING, "prices_region").default == DEFAULT_REGION


@pytest.mark.parametrize(("cls", "argv", "doc"), [
    (MergeOptions, ["--segment-bytes", "16MiB", "--topics", "logs.*"], {"segment_bytes": 16 << 20, "topics": "logs.*"}),
    (KeyCompactOptions, ["--topics", "t", "--no-merge", "--now-ms", "5", "--codec", "zstd"],
     {"topics": "t", "merge": False, "now_ms": 5, "codec": "zstd"}),
    (KeyCompactOptions, ["--topics", "t", "--index-bytes", "1KiB", "--max-keys", "9"],
     {"topics": "t", "index_bytes": 1024, "max_keys": 9}),
    (CleanupOptions, ["--grace-days", "0.5"], {"grace_days": 0.5}),
])
def test_the_options_a_command_line_gives_are_those_their_json_gives(cls: type[Options], argv: list[str],
                                                                      doc: dict[str, Any]) -> None:
    p = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(p, cls.DECLARED, but=[o for o in cls.DECLARED if o.name == "max_keys"])
    given = {}
    if cls is KeyCompactOptions:  # the key map's bound: in keys, or as the broker's buffer in bytes
        add_key_map_args(p)
        given = {"max_keys": max_keys(p.parse_args(argv))}
    from_flags = cls.from_args(p.parse_args(argv), **given)
    assert set(from_flags.values()) == {o.name for o in cls.DECLARED}
    assert cls.from_json(from_flags.to_json()) == from_flags
    assert cls.from_json(doc) == from_flags  # the rest: the same defaults both ways


def test_a_size_takes_a_binary_unit_on_the_command_line_and_plain_bytes_in_json() -> None:
    p = _parser(MERGE)
    assert p.parse_args(["--segment-bytes", "16MiB"]).segment_bytes == 16 << 20
    assert p.parse_args(["--index-bytes", "4096"]).index_bytes == 4096
    for bad in ("16MB", "1.5GiB", "0", "2GiB"):  # not a binary unit, not whole, below 1, above 2^31 - 1
        with pytest.raises(argparse.ArgumentError, match="expected a size in bytes"):
            p.parse_args(["--segment-bytes", bad])
    assert MergeOptions.from_json({"segment_bytes": 1 << 20}).limits == Limits(1 << 20)
    with pytest.raises(ConfigError, match="option segment_bytes"):
        MergeOptions.from_json({"segment_bytes": "16MiB"})
    assert "(default 1GiB)" in " ".join(p.format_help().split())


def test_key_compaction_merges_by_default_and_a_null_bound_is_no_bound() -> None:
    keys = KeyCompactOptions.from_json({"topics": "t"})
    assert (keys.merge, keys.max_keys, keys.min_age_minutes) == (Limits(), DEFAULT_MAX_KEYS, 15)
    assert KeyCompactOptions.from_json({"topics": "t", "merge": False, "max_keys": None}).merge is None
    assert KeyCompactOptions.from_json({"topics": "t", "max_keys": None}).max_keys is None
    with pytest.raises(ConfigError, match="neither"):  # the options' own check: what to clean
        KeyCompactOptions.from_json({})
    with pytest.raises(ConfigError, match="option codec"):
        KeyCompactOptions.from_json({"topics": "t", "codec": "brotli"})


def test_a_clock_is_an_iso_time_with_its_offset() -> None:
    now = option(CLEANUP, "now")
    assert now.check("2026-12-07T12:00:00+00:00") == "2026-12-07T12:00:00+00:00"
    for bad in ("2026-12-07T12:00:00", "yesterday"):
        with pytest.raises(ConfigError, match="option now") as e:
            now.check(bad)
        assert e.value.expected == "an ISO 8601 time with its offset (or null)"


def test_a_kinds_options_built_directly_take_their_declared_defaults(tmp_path: Path) -> None:
    """Code that builds a kind's options (a test, a bench, a caller of the library) gets what the command line,
    the DAG and the Spark job's JSON get when nothing is given: one set of defaults, the declarations'."""
    from tiering.cost.prices import load_prices
    from tiering.plan.policy import load_policy
    from tiering.run.cleanup import CleanupOptions
    from tiering.run.keycompact import KeyCompactOptions
    from tiering.run.merge import MergeOptions
    from tiering.run.rollback import RollbackOptions
    from tiering.run.tier import TierOptions

    required: list[tuple[Any, dict[str, Any]]] = [(MergeOptions, {}), (KeyCompactOptions, {"topics": "t"}),
                                                  (CleanupOptions, {}), (RollbackOptions, {"target_run": "r"})]
    for cls, given in required:
        assert cls(**given) == cls.from_json(given), cls.__name__
    # Tiering's required option is a policy file; its prices are the default region's list prices.
    policy = tmp_path / "policy.yaml"
    policy.write_text("cluster:\n  storage.tiers:\n    - {after.days: 30, storage.class: GLACIER_IR}\n")
    built = TierOptions(load_policy(str(policy)), load_prices())
    assert built == TierOptions.from_json({"policy": str(policy)})
    assert (built.prices.region, built.include_internal, built.now) == (DEFAULT_REGION, False, None)
