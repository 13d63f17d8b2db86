"""The Kafka-written golden segments (copied from the oracle into tests/data/golden) and their MANIFEST."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "data" / "golden"
MANIFEST: dict[str, Any] = json.loads((GOLDEN / "MANIFEST.json").read_text())
SEGMENTS: list[dict[str, Any]] = MANIFEST["segments"]


def segment_id(seg: dict[str, Any]) -> str:
    return f"{seg['topic']}-{seg['partition']}/{seg['base_offset']}"


def log_path(seg: dict[str, Any]) -> Path:
    return GOLDEN / seg["path"]


def index_path(seg: dict[str, Any], interval: int, kind: str) -> Path:
    """The golden index file ``kind`` ("index" or "timeindex") rebuilt by Kafka at ``interval`` bytes."""
    return GOLDEN / seg["indexes_by_recovery"][str(interval)][kind]["path"]


def by_topic(topic: str) -> dict[str, Any]:
    return next(s for s in SEGMENTS if s["topic"] == topic)
