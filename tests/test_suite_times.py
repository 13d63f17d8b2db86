"""tests/suite_times.py on the JUnit XML a real pytest run wrote: suites by the first two parts of the path,
setup counted in a test's time, a total row, ``--json``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from tests.suite_times import main, suite_of, suites

TOP = """
import time
import pytest

@pytest.fixture
def slow_setup():
    time.sleep(0.3)

def test_one(slow_setup):
    pass

def test_two():
    pass
"""
INNER = """
import pytest

class TestInClass:
    def test_a(self):
        pass

@pytest.mark.skip(reason="a skip is a test case too")
def test_skipped():
    pass

def test_failing():
    assert False
"""


def _junit(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "tests" / "sub").mkdir(parents=True)
    (tmp_path / "tests" / "test_top.py").write_text(TOP)
    (tmp_path / "tests" / "sub" / "test_inner.py").write_text(INNER)
    junit = tmp_path / "junit.xml"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           f"--junitxml={junit}", "tests"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1, done.stdout[-3000:]  # the failing test
    return junit


def test_suites_of_a_real_run_with_setup_in_the_time(tmp_path: Path) -> None:
    rows = {r.name: r for r in suites(_junit(tmp_path))}
    assert set(rows) == {"tests/test_top.py", "tests/sub"}
    assert (rows["tests/test_top.py"].tests, rows["tests/sub"].tests) == (2, 3)
    assert rows["tests/test_top.py"].seconds >= 0.3  # the fixture's sleep, in the test's setup
    assert list(rows) == ["tests/test_top.py", "tests/sub"]  # the longest first


def test_the_table_and_the_json(tmp_path: Path) -> None:
    junit = _junit(tmp_path)
    out = io.StringIO()
    assert main([str(junit)], stdout=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["suite", "tests", "seconds"]
    total = next(line for line in lines if line.startswith("total"))
    assert total.split()[1] == "5"
    out = io.StringIO()
    assert main([str(junit), "--json"], stdout=out) == 0
    doc = json.loads(out.getvalue())
    assert [s["suite"] for s in doc["suites"]] == ["tests/test_top.py", "tests/sub"]
    assert doc["total"]["tests"] == 5
    assert doc["total"]["seconds"] == sum(s["seconds"] for s in doc["suites"])


def test_a_missing_or_broken_file_is_exit_2_saying_which(tmp_path: Path) -> None:
    err = io.StringIO()
    assert main([str(tmp_path / "none.xml")], stderr=err) == 2
    assert "none.xml: cannot read it" in err.getvalue()
    broken = tmp_path / "broken.xml"
    broken.write_text("<testsuites><testcase")
    err = io.StringIO()
    assert main([str(broken)], stderr=err) == 2
    assert "not a JUnit XML file" in err.getvalue()


def test_the_suite_of_a_class_name() -> None:
    assert suite_of("tests.s3.test_body", "test_x") == "tests/s3"
    assert suite_of("tests.s3.test_body.TestClass", "test_x") == "tests/s3"
    assert suite_of("tests.test_cli", "test_x") == "tests/test_cli.py"
    assert suite_of("tests.test_cli.TestClass", "test_x") == "tests/test_cli.py"
    assert suite_of("tests.kafka_broker.test_demo", "test_x") == "tests/kafka_broker"
    assert suite_of("", "tests.chaos.test_chaos") == "tests/chaos"  # a collection error
