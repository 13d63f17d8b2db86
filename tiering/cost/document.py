"""The report document of one run (``PREFIX/_tiering/reports/<run>/report.json``) and the ledger's entries:
typed, frozen, with a schema version; :mod:`tiering.cost.model` builds them, :mod:`tiering.report` renders
and publishes them.

Figures that follow from others (bytes saved, ratios, yearly savings, payback) are properties: written into
the JSON for its readers, never read back from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias

from tiering.cost.forecast import Forecast
from tiering.documents import Document, Part, check_document, read_part, to_builtins
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import Cause, Counted, Status, Unrun

REPORT_KIND: Final = "compaction-report"


RowStatus: TypeAlias = Status | Unrun  # what became of a segment, as the report lists it


def row_status(text: str) -> RowStatus:
    """A report row's status from its text: a run's outcome, else what a plan says of an unrun segment."""
    try:
        return Status(text)
    except ValueError:
        pass
    try:
        return Unrun(text)
    except ValueError:
        raise ConfigError("a report row's status is unknown", expected="a segment status", found=text) from None


# The rows whose bytes the report counts as saved.
SAVING: Final[frozenset[RowStatus]] = frozenset({Status.COMPACTED, Unrun.ESTIMATED})


class _BeforeAfter:
    """Bytes saved and the ratio, from a row's ``.log`` bytes before and after."""

    __slots__ = ()
    bytes_before: int
    bytes_after: int

    @property
    def saved_bytes(self) -> int:
        return self.bytes_before - self.bytes_after

    @property
    def ratio(self) -> float | None:
        return self.bytes_after / self.bytes_before if self.bytes_before else None


@dataclass(frozen=True, slots=True)
class SegmentRow:
    """One segment the scan saw (or a run touched): its plan facts and what became of it."""

    directory: str
    topic: str
    partition: int
    base_offset: int
    storage_class: str
    last_modified: str | None
    size: int
    status: RowStatus
    reason: str
    bytes_before: int
    bytes_after: int
    source_codec: str
    encryption: str | None
    error: str | None = None
    monthly_savings_usd: float = 0.0
    rebatch: RebatchFigures | None = None  # set when the rewrite merged runs of batches
    keys: KeyCompactionFigures | None = None  # set when a key-compaction pass cleaned the segment
    cause: str | None = None  # why it was not rewritten (the lifecycle's cause, or the dry run's verdict)
    merge: MergeFigures | None = None  # the first segment of a group a merge run merged: the group's figures

    @property
    def why(self) -> str:
        """What the report counts a segment left as it was by: its cause as people read it, else its status."""
        cause = Cause.named(self.cause)
        return cause.label if cause is not None else self.cause or str(self.status)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": str(self.status),
                "merge": self.merge.to_json() if self.merge is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SegmentRow:
        rb = d.get("rebatch")
        return cls(str(d["directory"]), str(d["topic"]), int(d["partition"]), int(d["base_offset"]),
                   str(d["storage_class"]), d.get("last_modified"), int(d["size"]), row_status(d["status"]),
                   str(d["reason"]), int(d["bytes_before"]), int(d["bytes_after"]), str(d["source_codec"]),
                   d.get("encryption"), d.get("error"), float(d["monthly_savings_usd"]),
                   RebatchFigures(**rb) if rb else None,
                   KeyCompactionFigures(**d["keys"]) if d.get("keys") else None, d.get("cause"),
                   MergeFigures.from_json(d["merge"]) if d.get("merge") else None)


@dataclass(frozen=True, slots=True)
class RebatchFigures:
    """What re-batching did to a segment (or, summed, to a run): batches before and after, and the bytes it
    saved beyond recompressing the same batches one by one."""

    segments: int
    batches_before: int
    batches_after: int
    saved_bytes: int


@dataclass(frozen=True, slots=True)
class MergeFigures:
    """What merging did to a group of segments (or, summed, to a run), and what their objects cost by the
    object in their storage class: storage per month (each object billed at least the class's minimum size,
    with the archive classes' per-object overhead), one lifecycle transition of every object to each class
    that charges for it, and one GET of every object."""

    segments_before: int
    segments_after: int
    objects_before: int
    objects_after: int
    monthly_before_usd: float
    monthly_after_usd: float
    reads_before_usd: float
    reads_after_usd: float
    transitions: tuple[tuple[str, float, float], ...]  # (storage class, before, after) in dollars

    def plus(self, other: MergeFigures) -> MergeFigures:
        moves: dict[str, tuple[float, float]] = {c: (b, a) for c, b, a in self.transitions}
        for c, b, a in other.transitions:
            was = moves.get(c, (0.0, 0.0))
            moves[c] = (was[0] + b, was[1] + a)
        summed = {f: getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__ if f != "transitions"}
        return MergeFigures(**summed, transitions=tuple((c, b, a) for c, (b, a) in sorted(moves.items())))

    @property
    def monthly_savings_usd(self) -> float:
        return self.monthly_before_usd - self.monthly_after_usd

    def to_json(self) -> dict[str, Any]:
        return {**{f: getattr(self, f) for f in self.__dataclass_fields__ if f != "transitions"},
                "transitions": [{"storage_class": c, "before_usd": b, "after_usd": a} for c, b, a in self.transitions]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> MergeFigures:
        return cls(int(doc["segments_before"]), int(doc["segments_after"]), int(doc["objects_before"]),
                   int(doc["objects_after"]), float(doc["monthly_before_usd"]), float(doc["monthly_after_usd"]),
                   float(doc["reads_before_usd"]), float(doc["reads_after_usd"]),
                   tuple((str(t["storage_class"]), float(t["before_usd"]), float(t["after_usd"]))
                         for t in doc["transitions"]))


@dataclass(frozen=True, slots=True)
class KeyCompactionFigures:
    """What key compaction did to a segment (or, summed, to a run): records before and after, the partition's
    keys, what went (superseded, without a key, aborted, tombstones and markers past their horizon), the
    tombstones stamped with a horizon, and the bytes saved."""

    segments: int
    records_before: int
    records_after: int
    keys: int  # distinct keys in the key maps (each partition counted once)
    superseded_dropped: int
    no_key_dropped: int
    aborted_records_removed: int
    tombstones_stamped: int
    tombstones_dropped: int
    markers_dropped: int
    saved_bytes: int

    def plus(self, other: KeyCompactionFigures, *, new_partition: bool) -> KeyCompactionFigures:
        """The sum of two (``keys`` added only when ``other`` is another partition's)."""
        summed = {f: getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__}
        summed["keys"] = self.keys + other.keys if new_partition else max(self.keys, other.keys)
        return KeyCompactionFigures(**summed)


@dataclass(frozen=True, slots=True)
class SavingsSplit:
    """A run's savings by where they came from: re-batching (:class:`RebatchFigures`, priced as its share of
    the bytes saved per storage class), and recompression, which is the rest of the totals."""

    rebatching: RebatchFigures
    rebatching_monthly_usd: float
    total_saved_bytes: int
    total_monthly_usd: float

    @property
    def recompression_bytes(self) -> int:
        return self.total_saved_bytes - self.rebatching.saved_bytes

    @property
    def recompression_monthly_usd(self) -> float:
        return self.total_monthly_usd - self.rebatching_monthly_usd

    def to_json(self) -> dict[str, Any]:
        return {"rebatching": {**asdict(self.rebatching), "monthly_savings_usd": self.rebatching_monthly_usd},
                "recompression": {"saved_bytes": self.recompression_bytes,
                                  "monthly_savings_usd": self.recompression_monthly_usd}}


@dataclass(frozen=True, slots=True)
class GroupRow(_BeforeAfter):
    """A rollup's row: the rewritten segments of one topic, partition, storage class or source codec."""

    name: str
    segments: int
    bytes_before: int
    bytes_after: int
    monthly_savings_usd: float

    def to_json(self, key: str) -> dict[str, Any]:
        return {key: self.name, "segments": self.segments, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "saved_bytes": self.saved_bytes, "ratio": self.ratio,
                "monthly_savings_usd": self.monthly_savings_usd}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], key: str) -> GroupRow:
        return cls(str(d[key]), int(d["segments"]), int(d["bytes_before"]), int(d["bytes_after"]),
                   float(d["monthly_savings_usd"]))


@dataclass(frozen=True, slots=True)
class Totals(_BeforeAfter):
    """The run's figures over every segment (listed or not)."""

    segments_seen: int
    segments_rewritten: int
    segments_estimated: int
    segments_skipped: int
    segments_failed: int
    bytes_before: int
    bytes_after: int
    monthly_savings_usd: float
    one_off_usd: float

    @property
    def yearly_savings_usd(self) -> float:
        return self.monthly_savings_usd * 12

    @property
    def monthly_savings_per_tib_usd(self) -> float | None:
        return self.monthly_savings_usd / self.bytes_before * (1 << 40) if self.bytes_before else None

    @property
    def payback_months(self) -> float | None:
        return self.one_off_usd / self.monthly_savings_usd if self.monthly_savings_usd > 0 else None

    @property
    def net_first_year_usd(self) -> float:
        return self.yearly_savings_usd - self.one_off_usd

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "saved_bytes": self.saved_bytes, "ratio": self.ratio,
                "yearly_savings_usd": self.yearly_savings_usd,
                "monthly_savings_per_tib_usd": self.monthly_savings_per_tib_usd,
                "payback_months": self.payback_months, "net_first_year_usd": self.net_first_year_usd}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Totals:
        return cls(int(d["segments_seen"]), int(d["segments_rewritten"]), int(d["segments_estimated"]),
                   int(d["segments_skipped"]), int(d["segments_failed"]), int(d["bytes_before"]),
                   int(d["bytes_after"]), float(d["monthly_savings_usd"]), float(d["one_off_usd"]))


@dataclass(frozen=True, slots=True)
class OneOff:
    """A one-off cost of the run."""

    item: str
    usd: float
    detail: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> OneOff:
        return cls(str(d["item"]), float(d["usd"]), str(d["detail"]))


@dataclass(frozen=True, slots=True)
class NotRewritten:
    """How many segments were left as they were, for one status and reason."""

    status: RowStatus
    reason: str
    segments: int

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NotRewritten:
        return cls(row_status(d["status"]), str(d["reason"]), int(d["segments"]))


@dataclass(frozen=True, slots=True)
class Failure:
    segment: str  # <directory>/<base offset>
    reason: str
    error: str | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Failure:
        return cls(str(d["segment"]), str(d["reason"]), d.get("error"))


@dataclass(frozen=True, slots=True)
class Listing:
    """What the report's lists leave out (its figures count everything)."""

    segments_omitted: int = 0
    failed_omitted: int = 0
    partitions_omitted: int = 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Listing:
        return cls(int(d.get("segments_omitted", 0)), int(d.get("failed_omitted", 0)),
                   int(d.get("partitions_omitted", 0)))


@dataclass(frozen=True, slots=True)
class Assumptions:
    """The inputs the figures rest on besides the prices."""

    account_bytes: Mapping[str, int]
    grace_days: float
    versioned: bool | None
    noncurrent_days: int | None
    days_per_month: float
    gb_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "account_bytes": dict(self.account_bytes)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Assumptions:
        return cls({str(k): int(v) for k, v in (d.get("account_bytes") or {}).items()}, float(d["grace_days"]),
                   d.get("versioned"), d.get("noncurrent_days"), float(d["days_per_month"]), int(d["gb_bytes"]))


@dataclass(frozen=True, slots=True)
class EstimateDetail:
    """A dry run's estimate: the forecast the plan recorded, and the savings range it gives in dollars."""

    forecast: Forecast
    saved_bytes: int
    monthly_savings_usd_low: float
    monthly_savings_usd_high: float

    @property
    def segments_sampled(self) -> int:
        return self.forecast.segments_sampled

    @property
    def bytes_sampled(self) -> int:
        return self.forecast.bytes_sampled

    def to_json(self) -> dict[str, Any]:
        return {"forecast": self.forecast.to_json(), "saved_bytes": self.saved_bytes,
                "monthly_savings_usd_low": self.monthly_savings_usd_low,
                "monthly_savings_usd_high": self.monthly_savings_usd_high}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EstimateDetail:
        return cls(Forecast.from_json(d.get("forecast"), "the report's estimate_detail"), int(d["saved_bytes"]),
                   float(d["monthly_savings_usd_low"]), float(d["monthly_savings_usd_high"]))


class LedgerEntry(Part, frozen=True, omit_defaults=False):
    """One run in the ledger (``reports/ledger.json``): what it saved and cost (every field written: a report's
    ledger rows show each)."""

    run_id: str
    finished_at: str
    estimate: bool
    segments_rewritten: int
    bytes_before: int
    bytes_after: int
    monthly_savings_usd: float
    one_off_usd: float
    counted_from: Counted = Counted.REPORT  # STATE: its requests and other one-off costs are not known (0)


class Ledger(Document, frozen=True, tag="tiering.ledger"):
    """The ledger document: every run once, in the order they finished."""

    runs: tuple[LedgerEntry, ...]
    schema_version: Literal[1] = 1


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """A ledger entry with the running totals of the real runs up to it."""

    entry: LedgerEntry
    cumulative_monthly_usd: float
    cumulative_one_off_usd: float

    def to_json(self) -> dict[str, Any]:
        return {**to_builtins(self.entry), "cumulative_monthly_usd": self.cumulative_monthly_usd,
                "cumulative_one_off_usd": self.cumulative_one_off_usd}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LedgerRow:
        entry = {k: v for k, v in d.items() if k not in ("cumulative_monthly_usd", "cumulative_one_off_usd")}
        return cls(read_part(entry, LedgerEntry, what="a ledger row"), float(d["cumulative_monthly_usd"]),
                   float(d["cumulative_one_off_usd"]))


@dataclass(frozen=True, slots=True)
class LedgerSummary:
    """Every run in time order with running totals; ``to_date_usd``: saved by the report's time, net of the
    one-off costs."""

    runs: tuple[LedgerRow, ...]
    monthly_run_rate_usd: float
    one_off_usd: float
    to_date_usd: float

    def to_json(self) -> dict[str, Any]:
        return {"runs": [r.to_json() for r in self.runs], "monthly_run_rate_usd": self.monthly_run_rate_usd,
                "one_off_usd": self.one_off_usd, "to_date_usd": self.to_date_usd}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LedgerSummary:
        return cls(tuple(LedgerRow.from_json(r) for r in d["runs"]), float(d["monthly_run_rate_usd"]),
                   float(d["one_off_usd"]), float(d["to_date_usd"]))


# The rollups: the report's field, and the key naming a group in its JSON rows.
ROLLUP_KEYS: Final = {"by_storage_class": "storage_class", "by_topic": "topic", "by_partition": "directory",
                      "by_source_codec": "source_codec"}


@dataclass(frozen=True, slots=True)
class Report:
    """The report of one run (or a dry run's estimate): what it saved per month, what it cost once, by
    storage class, topic, partition and source codec, the listed segments, and the ledger of all runs."""

    SCHEMA_VERSION: ClassVar[int] = 1

    run_id: str
    bucket: str
    prefix: str
    started_at: str | None
    finished_at: str | None
    generated_at: str
    estimate: bool
    settings: Mapping[str, Any]  # the run's settings, as its run document records them
    prices: Mapping[str, Any]  # the price book's description: region, source, as_of, overridden_by, ...
    assumptions: Assumptions
    totals: Totals
    by_storage_class: tuple[GroupRow, ...]
    by_topic: tuple[GroupRow, ...]
    by_partition: tuple[GroupRow, ...]  # at most MAX_LISTED_PARTITIONS, those that saved the most
    by_source_codec: tuple[GroupRow, ...]
    one_off: tuple[OneOff, ...]
    requests_by_operation: Mapping[str, int]
    skipped: tuple[NotRewritten, ...]
    failed: tuple[Failure, ...]
    segments: tuple[SegmentRow, ...]
    listing: Listing
    auto: Mapping[str, Any]  # per topic: the automatic codec choice and every candidate's numbers
    warnings: tuple[str, ...]
    ledger: LedgerSummary
    estimate_detail: EstimateDetail | None = field(default=None)
    rebatching: RebatchFigures | None = None  # summed over the rewritten segments that were re-batched
    rebatching_monthly_usd: float = 0.0  # the dollars of the totals that re-batching's bytes account for
    key_compaction: KeyCompactionFigures | None = None  # summed over the segments a key-compaction pass cleaned
    key_compaction_monthly_usd: float = 0.0  # the dollars of the totals those segments account for
    objects_not_planned: Mapping[str, int] = field(default_factory=dict)  # the scan's, by reason
    merging: MergeFigures | None = None  # summed over the groups of segments a merge run merged

    def ledger_entry(self) -> LedgerEntry:
        t = self.totals
        return LedgerEntry(self.run_id, self.finished_at or self.generated_at, self.estimate, t.segments_rewritten,
                           t.bytes_before, t.bytes_after, t.monthly_savings_usd, t.one_off_usd)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema_version": self.SCHEMA_VERSION, "kind": REPORT_KIND, "run_id": self.run_id,
            "bucket": self.bucket, "prefix": self.prefix, "started_at": self.started_at,
            "finished_at": self.finished_at, "generated_at": self.generated_at, "estimate": self.estimate,
            "settings": dict(self.settings), "prices": dict(self.prices), "assumptions": self.assumptions.to_json(),
            "totals": self.totals.to_json(),
            **{name: [g.to_json(key) for g in getattr(self, name)] for name, key in ROLLUP_KEYS.items()},
            "one_off": [asdict(c) for c in self.one_off],
            "requests": {"requests_by_operation": dict(self.requests_by_operation)},
            "skipped": [{**asdict(s), "status": str(s.status)} for s in self.skipped],
            "failed": [asdict(f) for f in self.failed],
            "segments": [r.to_json() for r in self.segments],
            "listing": asdict(self.listing), "auto": dict(self.auto), "warnings": list(self.warnings),
            "ledger": self.ledger.to_json(), "objects_not_planned": dict(self.objects_not_planned),
        }
        if self.estimate_detail is not None:
            doc["estimate_detail"] = self.estimate_detail.to_json()
        if (split := self.savings_split) is not None:
            doc["savings_split"] = split.to_json()
        if self.key_compaction is not None:
            doc["key_compaction"] = {**asdict(self.key_compaction),
                                     "monthly_savings_usd": self.key_compaction_monthly_usd}
        if self.merging is not None:
            doc["merging"] = self.merging.to_json()
        return doc

    @property
    def savings_split(self) -> SavingsSplit | None:
        """The savings by source, when any segment of the run was re-batched."""
        if self.rebatching is None:
            return None
        return SavingsSplit(self.rebatching, self.rebatching_monthly_usd, self.totals.saved_bytes,
                            self.totals.monthly_savings_usd)

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Report:
        doc = check_document(doc, kind=REPORT_KIND, version=cls.SCHEMA_VERSION, what="a report", where=where)
        try:
            rollups = {name: tuple(GroupRow.from_json(g, key) for g in doc[name]) for name, key in ROLLUP_KEYS.items()}
            detail = doc.get("estimate_detail")
            split = (doc.get("savings_split") or {}).get("rebatching")
            keys = doc.get("key_compaction")
            rebatching = None if split is None else RebatchFigures(
                int(split["segments"]), int(split["batches_before"]), int(split["batches_after"]),
                int(split["saved_bytes"]))
            return cls(
                str(doc["run_id"]), str(doc["bucket"]), str(doc["prefix"]), doc.get("started_at"),
                doc.get("finished_at"), str(doc["generated_at"]), bool(doc["estimate"]), dict(doc["settings"]),
                dict(doc["prices"]), Assumptions.from_json(doc["assumptions"]), Totals.from_json(doc["totals"]),
                rollups["by_storage_class"], rollups["by_topic"], rollups["by_partition"],
                rollups["by_source_codec"], tuple(OneOff.from_json(c) for c in doc["one_off"]),
                {str(k): int(v) for k, v in doc["requests"]["requests_by_operation"].items()},
                tuple(NotRewritten.from_json(s) for s in doc["skipped"]),
                tuple(Failure.from_json(f) for f in doc["failed"]),
                tuple(SegmentRow.from_json(r) for r in doc["segments"]), Listing.from_json(doc.get("listing") or {}),
                dict(doc.get("auto") or {}), tuple(str(w) for w in doc["warnings"]),
                LedgerSummary.from_json(doc["ledger"]),
                None if detail is None else EstimateDetail.from_json(detail), rebatching,
                float(split["monthly_savings_usd"]) if split is not None else 0.0,
                None if keys is None else KeyCompactionFigures(
                    **{k: int(v) for k, v in keys.items() if k != "monthly_savings_usd"}),
                float(keys["monthly_savings_usd"]) if keys is not None else 0.0,
                {str(k): int(v) for k, v in (doc.get("objects_not_planned") or {}).items()},
                MergeFigures.from_json(doc["merging"]) if doc.get("merging") else None)
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            raise ConfigError("report unreadable", path=where, expected="a compaction report's fields",
                              found=f"{type(e).__name__}: {e}") from None
