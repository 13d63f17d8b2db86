"""The suites' own index rebuild (tests/reference_index.py), which their judges hold the package's indexes to,
against the indexes Kafka's own recovery wrote for every golden segment (legacy ones too), at both
intervals."""

from __future__ import annotations

from typing import Any

import pytest

from tests.golden import SEGMENTS, index_path, log_path, segment_id
from tests.reference_index import rebuild


def test_the_golden_set_holds_every_magic() -> None:
    assert {m for s in SEGMENTS for m in s["magics"]} == {0, 1, 2}


@pytest.mark.parametrize("interval", [4096, 1024])
@pytest.mark.parametrize("seg", SEGMENTS, ids=segment_id)
def test_the_rebuild_equals_kafkas_recovery(seg: dict[str, Any], interval: int) -> None:
    offsets, times = rebuild(log_path(seg).read_bytes(), seg["base_offset"], interval)
    assert offsets == index_path(seg, interval, "index").read_bytes()
    assert times == index_path(seg, interval, "timeindex").read_bytes()


def test_a_log_cut_short_is_refused_not_indexed() -> None:
    seg = SEGMENTS[0]
    log = log_path(seg).read_bytes()
    with pytest.raises(ValueError, match="past the end"):
        rebuild(log[:-5], seg["base_offset"])
