"""Markers name the real components a test starts or needs, written in the test's own file (never decided by a
folder's name), and ``make check`` (the inner loop) leaves out every one of them and the slow tests, fetches
nothing, and fails rather than skips a test of its selection that would go without something."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from typing import Final

from tests import needs

ROOT = Path(__file__).parents[1]

# The marker a test carries where it calls needs.missing(needs.<VAR>) (LIBZSTD: the venv's zstandard brings a
# libzstd recent enough, so the compiled proof's tests run everywhere the venv does).
MARKER_OF: Final = {needs.KAFKA: "kafka", needs.SEAWEEDFS: "seaweedfs", needs.CHROMIUM: "chromium",
                    needs.POSTGRES: "postgres", needs.FUZZ: "clang", needs.JAVA: "java", needs.ROOT: "root",
                    needs.DOCKER_COMPOSE: "docker", needs.LIBZSTD: None}


def _declared() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {m.split(":")[0] for m in config["tool"]["pytest"]["ini_options"]["markers"]}


def _make_variable(name: str) -> str:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    found = re.search(rf"^{name} :=(.*)$", text, re.M)
    assert found, f"the Makefile defines no {name}"
    return " ".join(found.group(1).split())


def _check_rule() -> tuple[list[str], str]:
    text = (ROOT / "Makefile").read_text()
    found = re.search(r"^check:(.*)\n((?:\t.*\n)+)", text, re.M)
    assert found, "the Makefile has no check target"
    return found.group(1).split(), found.group(2)


def test_make_check_leaves_out_the_slow_tests_and_every_component() -> None:
    expression = _make_variable("CHECK_MARKERS")
    assert expression.split(" and ") == [f"not {m}" for m in expression.replace("not ", "").split(" and ")]
    assert set(expression.replace("not ", "").split(" and ")) == _declared()
    assert '-m "$(CHECK_MARKERS)"' in _check_rule()[1]


def test_make_check_fetches_nothing_and_fails_where_a_test_would_go_without_something() -> None:
    prerequisites, recipe = _check_rule()
    assert prerequisites == ["lint", "typecheck"]  # the venv through them; no jars, no SeaweedFS
    assert "scripts/" not in recipe  # no ensure-*.sh: no Chromium, clang or PostgreSQL installed
    assert "$(CHECK_REQUIRE)" in recipe
    required = dict(pair.split("=") for pair in _make_variable("CHECK_REQUIRE").split())
    assert required == dict.fromkeys(needs.REQUIRES, "1")
    assert re.search(r"^\.PHONY:.* check ", (ROOT / "Makefile").read_text(), re.M)


def _test_files() -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if not p.is_relative_to(ROOT / "tests" / "data"))


def test_a_file_that_goes_without_a_component_carries_its_marker() -> None:
    """Where a test file says it needs something (``needs.missing``, SeaweedFS's ``require``/``weed_mini``), the
    file marks tests with that thing's marker: a skip in ``make check`` would hide the test."""
    assert set(MARKER_OF) == set(needs.REQUIRES)
    assert {m for m in MARKER_OF.values() if m} <= _declared()
    unmarked = []
    for path in _test_files():
        text = path.read_text()
        wanted = {MARKER_OF[getattr(needs, v)] for v in re.findall(r"needs\.missing\(needs\.(\w+)", text)}
        if re.search(r"\bweed_mini\(|\bseaweedfs\.require\(", text):
            wanted.add("seaweedfs")
        unmarked += [f"{path.relative_to(ROOT)}: {m}" for m in sorted(wanted - {None})
                     if f"pytest.mark.{m}" not in text]
    assert unmarked == []


def test_no_conftest_decides_a_marker() -> None:
    """A marker is written beside the test it describes: no hook adds one (by a folder's name or otherwise)."""
    found = []
    for path in sorted((ROOT / "tests").rglob("conftest.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("add_marker", "applymarker"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.Name) and node.id == "pytestmark":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
