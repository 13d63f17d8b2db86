"""The kinds' options, each declared once: the command line's flags, the DAG's params and the strict reading
of the options' JSON all come from the declaration, and every kind reads the shared lease time the same way."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from tiering.errors import ConfigError
from tiering.options import CLEANUP, LEASE_TTL, ROLLBACK, Opt, add_arguments, option, params, read_options
from tiering.run.kinds import kind_from_json
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
    assert vars(_parser(ROLLBACK).parse_args(["--run-id", "r"])) == {"run_id": "r", "lease_ttl_seconds": 600}
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
