"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the fault-injection tests covered (the issue asks for the count)."""
    from tests.s3.conftest import FAULT_REPORT

    for line in FAULT_REPORT:
        terminalreporter.write_line(line)
