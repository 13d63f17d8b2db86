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
