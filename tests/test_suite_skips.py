"""The suite's own skips: a machine without what one suite needs skips that suite, never another."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Final

from tests import needs

ROOT = Path(__file__).parents[1]


def test_without_java_the_broker_tests_skip_and_the_format_tests_still_run(tmp_path: Path) -> None:
    """The broker suite's skip (no java, no Kafka jars) marks only the tests that need a broker: the format
    tests under ``tests/kafka/`` (whose folder name is one of their keywords) still run."""
    env = {k: v for k, v in os.environ.items() if k != "TIERING_REQUIRE_KAFKA"}
    env["PATH"] = str(tmp_path)  # no java on it
    done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                           "tests/kafka/test_buffers.py", "tests/kafka_broker/test_demo.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcomes = [line.split(" ", 2)[:2] for line in done.stdout.splitlines() if line.startswith("tests/")]
    assert {test.split("::")[0] for test, outcome in outcomes if outcome == "SKIPPED"} == {
        "tests/kafka_broker/test_demo.py"}
    assert {test.split("::")[0] for test, outcome in outcomes if outcome == "PASSED"} == {"tests/kafka/test_buffers.py"}
    assert "needs java" in done.stdout


def test_with_the_broker_required_a_machine_without_java_fails_instead_of_skipping(tmp_path: Path) -> None:
    env = {**os.environ, "TIERING_REQUIRE_KAFKA": "1", "PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/kafka_broker/test_demo.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "needs java" in done.stdout
    assert "TIERING_REQUIRE_KAFKA=1: this run requires it" in done.stdout
    assert "SKIPPED" not in done.stdout


_SKIPS: Final = {("pytest", "skip"), ("pytest", "importorskip"), ("pytest", "xfail"), ("mark", "skip"),
                 ("mark", "skipif"), ("mark", "xfail")}


def _dotted(node: ast.expr) -> tuple[str, ...]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return (node.id, *parts) if isinstance(node, ast.Name) else tuple(parts)


def _skip_sites() -> tuple[list[str], list[tuple[str, ast.Call]]]:
    """Every skip the suite spells out other than through tests/needs.py, and every call of ``needs.missing``,
    each with where it is."""
    others, needed = [], []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.is_relative_to(ROOT / "tests" / "data") or path == ROOT / "tests" / "needs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Attribute) and (name := _dotted(node))[-2:] in _SKIPS:
                others.append(f"{where} {'.'.join(name)}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and _dotted(node.func) == ("needs", "missing"):
                needed.append((where, node))
    return others, needed


def test_every_skip_names_the_variable_that_makes_it_a_failure_and_ci_sets_every_one() -> None:
    """A test goes without what it needs only through ``needs.missing`` (a skip naming its ``TIERING_REQUIRE_*``
    variable, a failure where that is 1), and CI sets every variable but those said not to be settable there."""
    others, needed = _skip_sites()
    assert others == [], "skip through tests/needs.py: " + "; ".join(others)
    assert len(needed) >= 20, needed  # the sites this check holds (a parser that found none would pass anything)
    used = set()
    for where, call in needed:
        first = call.args[0] if call.args else None
        assert isinstance(first, ast.Attribute), f"{where}: name the variable as needs.<VAR>"
        assert _dotted(first)[:1] == ("needs",), f"{where}: name the variable as needs.<VAR>"
        variable = getattr(needs, first.attr, None)
        assert variable in needs.REQUIRES, f"{where}: {first.attr} is no variable of tests/needs.py"
        used.add(variable)
    assert used == set(needs.REQUIRES), f"declared but never used: {set(needs.REQUIRES) - used}"
    ci = set(re.findall(r"^export (TIERING_REQUIRE_\w+)=1$", (ROOT / ".ci" / "run").read_text(), re.M))
    assert ci == set(needs.REQUIRES) - set(needs.NOT_IN_CI), "CI must set every variable needs.REQUIRES lists"
    assert set(needs.NOT_IN_CI) <= set(needs.REQUIRES)
    assert all(len(why) > 40 for why in needs.NOT_IN_CI.values())
