"""Shared fixtures."""

from __future__ import annotations

from typing import Any

import pytest

from tests.golden import SEGMENTS, segment_id


@pytest.fixture(params=SEGMENTS, ids=segment_id)
def golden(request: pytest.FixtureRequest) -> dict[str, Any]:
    """One MANIFEST entry per golden segment."""
    seg: dict[str, Any] = request.param
    return seg


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the fault-injection tests covered (the issue asks for the count)."""
    from tests.s3.conftest import FAULT_REPORT

    for line in FAULT_REPORT:
        terminalreporter.write_line(line)
