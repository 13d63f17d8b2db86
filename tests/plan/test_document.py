"""A planned segment's JSON: every field, as ``dataclasses.asdict`` gives it (the writer spells them out for
speed), and read back to the same segment."""

from __future__ import annotations

import json
from dataclasses import asdict, fields

import pytest

from tiering.lifecycle.vocabulary import Action, Cause
from tiering.plan.document import ObjectRef, PlannedSegment

REF = ObjectRef("p/t-0/00000000000000000005.log", 1234, '"e"', "2026-12-01T00:00:00+00:00", "STANDARD_IA")


@pytest.mark.parametrize("seg", [
    PlannedSegment("t-0", "t", 0, 5, Action.COMPACT, "why", REF, REF, None, REF, "zstd", 3, 0.1, 1 << 20, "run",
                   Cause.BUSY),
    PlannedSegment("t-0", "t", 0, 0, Action.SKIP, ""),
])
def test_a_planned_segment_is_written_as_asdict_and_read_back(seg: PlannedSegment) -> None:
    doc = seg.to_json()
    assert doc == asdict(seg)
    assert list(doc) == [f.name for f in fields(seg)]  # every field, none added
    assert PlannedSegment.from_json(json.loads(json.dumps(doc))) == seg
