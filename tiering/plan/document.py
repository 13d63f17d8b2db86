"""The plan document: every segment under a prefix with what a run may do to it, and the plan's totals.

A scan (:mod:`tiering.plan.scan`) makes it; a policy and the automatic codec choice set per-topic targets
on it (:mod:`tiering.plan.auto`); the plan's chunk files carry it in parts (:mod:`tiering.plan.planfile`).
Its JSON form is versioned (``kind`` ``tiering.plan``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from tiering.cost.forecast import Forecast
from tiering.documents import check_document
from tiering.lifecycle.vocabulary import Action, Cause, FileRole
from tiering.storage.objects import ObjectInfo

PLAN_SCHEMA_VERSION: Final = 1
MAX_IGNORED_LISTED: Final = 1000  # objects not planned listed with their reason (every one is counted)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    key: str
    size: int
    etag: str
    last_modified: str  # ISO 8601, S3's clock
    storage_class: str

    @classmethod
    def of(cls, info: ObjectInfo) -> ObjectRef:
        return cls(info.key, info.size, info.etag, info.last_modified.isoformat(), info.storage_class)


def _ref_json(ref: ObjectRef | None) -> dict[str, Any] | None:
    if ref is None:
        return None
    return {"key": ref.key, "size": ref.size, "etag": ref.etag, "last_modified": ref.last_modified,
            "storage_class": ref.storage_class}


@dataclass(frozen=True, slots=True)
class PlannedSegment:
    directory: str
    topic: str
    partition: int
    base_offset: int
    action: Action
    reason: str
    log: ObjectRef | None = None
    index: ObjectRef | None = None
    timeindex: ObjectRef | None = None
    txnindex: ObjectRef | None = None
    # Set by a policy (per topic); None: the plan's codec and level.
    codec: str | None = None
    level: int | None = None
    min_savings_ratio: float = 0.0
    rebatch_max_bytes: int | None = None  # merge runs of small batches up to this size (None: no re-batching)
    compacted_by: str | None = None  # a skip because it is compacted already: the run that did it
    cause: Cause | None = None  # why it is skipped


    @property
    def skip_label(self) -> str:
        """What a skipped segment is counted by: its cause, as people read it (the reason is the detail)."""
        return self.cause.label if self.cause is not None else self.action.value

    @property
    def size(self) -> int:
        return self.log.size if self.log else 0

    def to_json(self) -> dict[str, Any]:
        """As ``dataclasses.asdict`` makes it, field by field (asdict's deep copy is most of a plan's CPU)."""
        return {"directory": self.directory, "topic": self.topic, "partition": self.partition,
                "base_offset": self.base_offset, "action": self.action, "reason": self.reason,
                FileRole.LOG: _ref_json(self.log), FileRole.INDEX: _ref_json(self.index),
                FileRole.TIMEINDEX: _ref_json(self.timeindex), FileRole.TXNINDEX: _ref_json(self.txnindex),
                "codec": self.codec, "level": self.level,
                "min_savings_ratio": self.min_savings_ratio, "rebatch_max_bytes": self.rebatch_max_bytes,
                "compacted_by": self.compacted_by, "cause": self.cause}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PlannedSegment:
        refs = {k: ObjectRef(**doc[k]) if doc.get(k) else None for k in FileRole}
        return cls(doc["directory"], doc["topic"], int(doc["partition"]), int(doc["base_offset"]),
                   Action(doc["action"]), doc["reason"], **refs, codec=doc.get("codec"), level=doc.get("level"),
                   min_savings_ratio=float(doc.get("min_savings_ratio", 0.0)),
                   rebatch_max_bytes=doc.get("rebatch_max_bytes"), compacted_by=doc.get("compacted_by"),
                   cause=Cause(doc["cause"]) if doc.get("cause") else None)


class PlanTotals:
    """Counts of a plan, added up one segment at a time (the figures :meth:`Plan.totals` gives)."""

    def __init__(self) -> None:
        self.segments = self.to_compact = self.to_repair = self.bytes_to_compact = 0
        self.skipped_by_reason: Counter[str] = Counter()

    def add(self, seg: PlannedSegment) -> None:
        self.segments += 1
        if seg.action == Action.COMPACT:
            self.to_compact += 1
            self.bytes_to_compact += seg.size
        elif seg.action == Action.REPAIR:
            self.to_repair += 1
        elif seg.action == Action.SKIP:
            self.skipped_by_reason[seg.skip_label] += 1

    def counts(self) -> PlanCounts:
        return PlanCounts(self.segments, self.to_compact, self.to_repair, self.bytes_to_compact,
                          dict(sorted(self.skipped_by_reason.items())))

    def to_json(self) -> dict[str, Any]:
        return self.counts().to_json()


@dataclass(frozen=True, slots=True)
class PlanCounts:
    """A plan's counts: segments, those to compact (and their bytes) or repair, and those skipped by reason."""

    segments: int
    to_compact: int
    to_repair: int
    bytes_to_compact: int
    skipped_by_reason: Mapping[str, int]

    @property
    def skipped(self) -> int:
        return sum(self.skipped_by_reason.values())

    def to_json(self) -> dict[str, Any]:
        return {"segments": self.segments, "to_compact": self.to_compact, "to_repair": self.to_repair,
                "bytes_to_compact": self.bytes_to_compact, "skipped": self.skipped,
                "skipped_by_reason": dict(self.skipped_by_reason)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PlanCounts:
        return cls(int(doc["segments"]), int(doc["to_compact"]), int(doc["to_repair"]), int(doc["bytes_to_compact"]),
                   {str(k): int(v) for k, v in doc["skipped_by_reason"].items()})


@dataclass(frozen=True, slots=True)
class Committed:
    """The generations one run committed that a scan found in the partitions' states (in place, or below
    in a lineage), for the ``.log`` objects in place of one storage class: what that run saved, counted from
    S3 rather than from its run document, which a run killed before its end never wrote."""

    run_id: str
    storage_class: str
    segments: int
    bytes_before: int
    bytes_after: int
    recorded_at: str | None  # the latest of its entries' (the recording hosts' clocks); None: not kept

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Committed:
        at = doc.get("recorded_at")
        return cls(str(doc["run_id"]), str(doc["storage_class"]), int(doc["segments"]), int(doc["bytes_before"]),
                   int(doc["bytes_after"]), None if at is None else str(at))


@dataclass(frozen=True, slots=True)
class Plan:
    """A scan's verdicts: the run's settings, every planned segment, and every object it leaves alone with why."""

    bucket: str
    prefix: str
    codec: str
    level: int | None
    min_age_minutes: int
    topics: str | None
    created_at: str
    segments: tuple[PlannedSegment, ...] = ()
    skipped_dirs: tuple[Mapping[str, str], ...] = ()
    # Every object under the prefix a compaction would not touch, with why: up to MAX_IGNORED_LISTED of them
    # listed, all of them counted (the objects of skipped directories are not listed: see skipped_dirs).
    ignored_keys: tuple[Mapping[str, str], ...] = ()
    ignored_count: int = 0
    ignored_by_reason: Mapping[str, int] = field(default_factory=dict)
    objects_listed: int = 0
    estimate: Forecast | None = None  # a dry run's forecast of the savings
    policy: str | None = None  # the policy file the plan followed
    auto: Mapping[str, Any] | None = None  # per topic, the automatic codec choice and its numbers
    committed: tuple[Committed, ...] = ()  # every run's generations in the scanned partitions, by run and class

    def to_compact(self) -> list[PlannedSegment]:
        return [s for s in self.segments if s.action in (Action.COMPACT, Action.REPAIR)]

    def totals(self) -> dict[str, Any]:
        totals = PlanTotals()
        for s in self.segments:
            totals.add(s)
        return totals.to_json()

    def summary(self, totals: dict[str, Any], source: str) -> dict[str, Any]:
        """What a scan found, as numbers, without its segments (``totals``: from a streamed scan)."""
        doc = self.to_json()
        doc.pop("segments")
        return {**doc, "kind": "tiering.scan-summary", "source": source,
                "totals": {**totals, "objects_not_planned": self.ignored_count,
                           "objects_not_planned_by_reason": dict(sorted(self.ignored_by_reason.items()))}}

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": PLAN_SCHEMA_VERSION, "kind": "tiering.plan", "bucket": self.bucket,
                "prefix": self.prefix, "codec": self.codec, "level": self.level,
                "min_age_minutes": self.min_age_minutes, "topics": self.topics, "created_at": self.created_at,
                "objects_listed": self.objects_listed, "totals": self.totals(),
                "estimate": self.estimate.to_json() if self.estimate is not None else None,
                "skipped_dirs": [dict(d) for d in self.skipped_dirs],
                "ignored_keys": [dict(k) for k in self.ignored_keys],
                "ignored_count": self.ignored_count,
                "ignored_by_reason": dict(sorted(self.ignored_by_reason.items())), "policy": self.policy,
                "auto": dict(self.auto) if self.auto is not None else None,
                "committed": [c.to_json() for c in self.committed],
                "segments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Plan:
        check_document(doc, kind="tiering.plan", version=PLAN_SCHEMA_VERSION, what="a plan")
        return cls(doc["bucket"], doc["prefix"], doc["codec"], doc["level"], int(doc["min_age_minutes"]),
                   doc["topics"], doc["created_at"], tuple(PlannedSegment.from_json(s) for s in doc["segments"]),
                   tuple(doc["skipped_dirs"]), tuple(doc["ignored_keys"]), int(doc["ignored_count"]),
                   {str(k): int(v) for k, v in (doc.get("ignored_by_reason") or {}).items()},
                   objects_listed=int(doc["objects_listed"]),
                   estimate=Forecast.from_json(doc["estimate"], "the plan's estimate") if doc.get("estimate") else None,
                   policy=doc.get("policy"), auto=doc.get("auto"),
                   committed=tuple(Committed.from_json(c) for c in doc.get("committed") or ()))
