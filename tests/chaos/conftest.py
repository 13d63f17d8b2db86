"""The chaos suite's S3: one moto server on loopback for the module (each trial uses its own bucket)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tiering.demo.s3 import moto_server


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint
