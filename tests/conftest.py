"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest
from botocore.handlers import BUILTIN_HANDLERS, REGISTER_FIRST

from tests.golden import SEGMENTS, segment_id


def _bytes_for_moto_in_process(request: Any, **_: Any) -> None:
    """moto's in-process stub (``mock_aws``) builds a werkzeug request from a body, which takes bytes, not the
    bytearray a streamed upload sends its parts as; over HTTP (moto's server, SeaweedFS) the bytearray goes to
    the socket as it is. Only while the stub is on, and before it (registered first)."""
    from moto.core.models import botocore_stubber

    if botocore_stubber.enabled and isinstance(request.body, bytearray):
        request.body = bytes(request.body)


BUILTIN_HANDLERS.append(("before-send", _bytes_for_moto_in_process, REGISTER_FIRST))


@pytest.fixture(params=SEGMENTS, ids=segment_id)
def golden(request: pytest.FixtureRequest) -> dict[str, Any]:
    """One MANIFEST entry per golden segment."""
    seg: dict[str, Any] = request.param
    return seg


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failing test's report shows the errors of the SeaweedFS servers running at the time."""
    outcome: Any = yield
    report = outcome.get_result()
    if report.failed:
        from tests.s3 import seaweedfs

        if text := seaweedfs.complaints():
            report.sections.append(("SeaweedFS: its log's errors and warnings", text))


# The suites whose tests share a costly fixture set up once per process (a module's DAG run, the session's
# broker), longest first. Under pytest-xdist (``make test`` runs two workers) each file's tests go to one
# worker whole, and all the broker tests to one (the session broker is started once); the long ones are
# handed out first, so that no worker is left with a long one at the end.
_FIRST: Final = ("tests/kafka_broker/", "tests/chaos/", "tests/s3/test_faults.py", "tests/cluster/",
                 "tests/s3/test_seaweedfs.py", "tests/s3/test_keycompact_s3.py", "tests/s3/test_merge_s3.py",
                 "tests/s3/test_protocol_memory.py",
                 "tests/dags/", "tests/infra/")


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/kafka_broker/" if path.startswith("tests/kafka_broker/") else path


def _rank(nodeid: str) -> int:
    return next((i for i, p in enumerate(_FIRST) if nodeid.startswith(p)), len(_FIRST))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test marked as needing a broker (the marker, wherever the test is, never a folder's name) is skipped
    here without one, or fails where CI requires the broker."""
    if item.get_closest_marker("kafka") is not None:
        from tests import needs
        from tests.kafka_broker.broker import missing

        if reason := missing():
            needs.missing(needs.KAFKA, reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: the order within a rank is kept


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist it is never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Work handed out a group at a time (:func:`_group`), in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """An xdist worker hands its fault-injection lines to the controller (``workeroutput``)."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        from tests.s3.conftest import FAULT_REPORT

        out["fault_report"] = list(FAULT_REPORT)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist it is never called
def pytest_testnodedown(node: Any, error: Any) -> None:
    """The controller collects each worker's fault-injection lines."""
    from tests.s3.conftest import FAULT_REPORT

    FAULT_REPORT.extend(getattr(node, "workeroutput", {}).get("fault_report", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the fault-injection tests covered (the issue asks for the count)."""
    from tests.s3.conftest import FAULT_REPORT

    for line in FAULT_REPORT:
        terminalreporter.write_line(line)
