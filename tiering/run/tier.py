"""Storage-class tiering by age: plan which segment objects move to a colder class, then move them.

Age is the age of a segment's newest record: its max timestamp, read from the batches after the last
``.index`` entry (one ranged GET of the ``.log``'s tail; the whole ``.log`` when there is no index), never
S3's ``LastModified`` (a rewrite resets it). A segment without record timestamps (magic v0) falls back to
``LastModified`` and says so.

For each object of a sealed segment (``.log``, ``.index``, ``.timeindex``, ``.txnindex``) the topic's policy
gives the target class (the coldest rule due at that age). An object stays, with its reason, when it is
already that cold; when it is under 128 KiB and the target bills 128 KiB at least (IA, Glacier IR); when it
has not yet spent its current class's minimum duration there (moving it would bill the rest); or when the
move saves nothing. A move is an in-place copy with the new class (:meth:`S3Store.transition`: metadata,
tags and encryption kept; conditional on the planned ETag), done under the partition's lease like a
compaction, and our state document follows any ETag the copy changed. Re-running finds the moved objects
already there.

The one-off cost of a move is the copy request (priced as a PUT of the target class) and the retrieval fee
of an IA / Glacier IR source; its saving is the monthly storage price difference.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from msgspec import structs

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease, LeaseLost
from tiering.commit.moves import follow_etags, in_flight_groups, moved_objects, operation_pending
from tiering.commit.operation import Context, SegmentResult
from tiering.cost.prices import GB, PriceBook, load_prices
from tiering.documents import check_document
from tiering.errors import ConfigError, ConflictError, InvalidDataError, TieringError
from tiering.lifecycle.state import (
    ClassMove,
    Marks,
    TierMark,
    generation_in_place,
    load_state,
    record_segments,
)
from tiering.lifecycle.vocabulary import (
    Action,
    Cause,
    FileRole,
    Pending,
    RunKind,
    Status,
    StayCause,
    StorageClass,
    TierAction,
)
from tiering.options import TIERING, Options
from tiering.plan.ages import max_timestamp
from tiering.plan.document import PlannedSegment
from tiering.plan.policy import ARCHIVE_CLASSES, STORAGE_ORDER, Policy, policy_at, policy_ref
from tiering.plan.scan import ScanOptions
from tiering.run import engine
from tiering.storage.layout import (
    StepDir,
    clock_key,
    normalize_prefix,
    reserved_dir,
)
from tiering.storage.objects import ObjectAttrs, ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed

TIER_SCHEMA_VERSION: Final = 2  # 2: each object that stays, and each segment, says its StayCause


MOVE: Final = TierAction.MOVE
STAY: Final = TierAction.STAY
MOVED: Final = Status.MOVED
FILES: Final = (FileRole.LOG, FileRole.INDEX, FileRole.TIMEINDEX, FileRole.TXNINDEX)
IA_CLASSES: Final = frozenset({StorageClass.STANDARD_IA, StorageClass.ONEZONE_IA})
S3_IA_MIN_DAYS: Final = 30  # S3 Lifecycle refuses transitions to the IA classes before 30 days


@dataclass(frozen=True, slots=True)
class ObjectMove:
    key: str
    file: FileRole
    size: int
    etag: str
    storage_class: str
    target: str | None
    action: TierAction
    reason: str
    monthly_savings_usd: float = 0.0
    one_off_usd: float = 0.0
    cause: StayCause | None = None  # why it stays (None: it moves)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ObjectMove:
        return cls(str(d["key"]), FileRole(d["file"]), int(d["size"]), str(d["etag"]), str(d["storage_class"]),
                   d.get("target"), TierAction(d["action"]), str(d["reason"]), float(d.get("monthly_savings_usd", 0)),
                   float(d.get("one_off_usd", 0)), StayCause(d["cause"]) if d.get("cause") else None)


@dataclass(frozen=True, slots=True)
class SegmentTiering:
    directory: str
    topic: str
    base_offset: int
    max_timestamp_ms: int | None
    age_days: float | None
    age_source: str
    objects: tuple[ObjectMove, ...] = ()
    reason: str = ""  # why the whole segment stays (active, no age, ...)
    cause: StayCause | None = None  # set with the reason

    @property
    def moving(self) -> bool:
        """Whether any of its objects moves."""
        return any(o.action == MOVE for o in self.objects)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "objects": [asdict(o) for o in self.objects]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> SegmentTiering:
        return cls(str(d["directory"]), str(d["topic"]), int(d["base_offset"]), d.get("max_timestamp_ms"),
                   d.get("age_days"), str(d["age_source"]), tuple(ObjectMove.from_json(o) for o in d["objects"]),
                   str(d.get("reason", "")), StayCause(d["cause"]) if d.get("cause") else None)


def transition_name(storage_class: object, target: object) -> str:
    """How a plan and a run name a move between two classes (``"<class> -> <target>"``)."""
    return f"{storage_class} -> {target}"


def transition_target(name: str) -> str:
    """The target class of a move :func:`transition_name` names."""
    return name.rsplit(" -> ", 1)[-1]


@dataclass(frozen=True, slots=True)
class Transition:
    """The objects (and their bytes) that move from one storage class to another."""

    objects: int
    bytes: int


@dataclass(frozen=True, slots=True)
class TierTotals:
    """A tiering plan's sums: what moves, what it saves and costs, and why the rest stays."""

    segments: int
    objects_to_move: int
    bytes_to_move: int
    by_transition: Mapping[str, Transition]  # "<class> -> <target>"
    monthly_savings_usd: float
    one_off_usd: float
    staying: Mapping[str, int]  # objects and segments that stay, by reason

    @property
    def payback_months(self) -> float | None:
        return self.one_off_usd / self.monthly_savings_usd if self.monthly_savings_usd > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "by_transition": {k: asdict(v) for k, v in self.by_transition.items()},
                "staying": dict(self.staying), "payback_months": self.payback_months}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TierTotals:
        return cls(int(d["segments"]), int(d["objects_to_move"]), int(d["bytes_to_move"]),
                   {k: Transition(int(v["objects"]), int(v["bytes"])) for k, v in d["by_transition"].items()},
                   float(d["monthly_savings_usd"]), float(d["one_off_usd"]),
                   {str(k): int(v) for k, v in d["staying"].items()})


class TierTally:
    """A tiering plan's sums, added up a segment at a time (what :class:`TierTotals` says)."""

    def __init__(self) -> None:
        self.segments = 0
        self.by_transition: dict[str, Transition] = {}
        self.monthly = 0.0
        self.one_off = 0.0
        self.staying: Counter[str] = Counter()

    def add(self, part: TierPartition) -> None:
        for s in part.decided:
            self.add_segment(s)

    def add_segment(self, s: SegmentTiering) -> None:
        self.segments += 1
        if s.cause is not None:
            self.staying[s.cause.value] += 1
        for o in s.objects:
            if o.action != MOVE:
                if o.cause is not None:
                    self.staying[o.cause.value] += 1
                continue
            name = transition_name(o.storage_class, o.target)
            row = self.by_transition.get(name, Transition(0, 0))
            self.by_transition[name] = Transition(row.objects + 1, row.bytes + o.size)
            self.monthly += o.monthly_savings_usd
            self.one_off += o.one_off_usd

    def totals(self) -> TierTotals:
        return TierTotals(self.segments, sum(t.objects for t in self.by_transition.values()),
                          sum(t.bytes for t in self.by_transition.values()), dict(sorted(self.by_transition.items())),
                          self.monthly, self.one_off, dict(sorted(self.staying.items())))


@dataclass(frozen=True, slots=True)
class TierPlan:
    """Which objects of the prefix move to which storage class, in sums (``runs/<run>/tier-plan.json``: a
    run's plan, whose segments are in its plan chunks) or with every segment's decision (a dry run's)."""

    KIND: ClassVar[str] = "tier-plan"
    SCHEMA_VERSION: ClassVar[int] = TIER_SCHEMA_VERSION

    bucket: str
    prefix: str
    created_at: str
    policy: str | None
    prices: Mapping[str, Any]
    totals: TierTotals
    segments: tuple[SegmentTiering, ...] = ()

    @property
    def archived(self) -> dict[str, int]:
        """The objects that move to a class they cannot be read from without a restore, by class."""
        out: dict[str, int] = {}
        for name, row in self.totals.by_transition.items():
            target = transition_target(name)
            if target in ARCHIVE_CLASSES:
                out[target] = out.get(target, 0) + row.objects
        return out

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "kind": self.KIND, "bucket": self.bucket,
                "prefix": self.prefix, "created_at": self.created_at, "policy": self.policy,
                "prices": dict(self.prices), "totals": self.totals.to_json(),
                **({"segments": [s.to_json() for s in self.segments]} if self.segments else {})}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TierPlan:
        check_document(doc, kind=cls.KIND, version=TIER_SCHEMA_VERSION, what="a tiering plan")
        return cls(doc["bucket"], doc["prefix"], doc["created_at"], doc["policy"], doc["prices"],
                   TierTotals.from_json(doc["totals"]),
                   tuple(SegmentTiering.from_json(s) for s in doc.get("segments", ())))


@dataclass(frozen=True, slots=True)
class TierOptions(Options):
    """One tiering run: the policy whose ``storage.tiers`` say where each topic's objects go, the prices that
    say whether a move pays, the internal topics or not, and the clock read when the run starts (declared
    in :data:`tiering.options.TIERING`; the policy travels by its file's path, the prices by their region
    and the file that overrides them)."""

    DECLARED: ClassVar = TIERING
    WHAT: ClassVar = "tiering options"

    policy: Policy
    prices: PriceBook
    include_internal: bool = False
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    now: str | None = None  # ISO 8601, S3's clock at the start (None: not started)

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> TierOptions:
        policy = policy_at(values["policy"])
        assert policy is not None  # a required option: read_options refuses its absence
        return cls(policy, load_prices(values["prices_region"], values["prices_file"]), values["include_internal"],
                   values["lease_ttl_seconds"], values["now"])

    def values(self) -> dict[str, Any]:
        return {"policy": policy_ref(self.policy), "include_internal": self.include_internal,
                "prices_region": self.prices.region, "prices_file": self.prices.overridden_by,
                "lease_ttl_seconds": self.lease_ttl_seconds, "now": self.now}

    def settings_json(self) -> dict[str, Any]:
        return {"policy": self.policy.path, "include_internal": self.include_internal,
                "prices": self.prices.describe()}


@dataclass(frozen=True, slots=True)
class TierPartition(engine.OnListedSegments):
    """What a tiering run makes of one partition: every listed segment's decision (what moves where, why the
    rest stays) and, for the work, the segments with objects to move. Its JSON (the work a unit reads back)
    holds the decisions of those segments only: the others count in the plan's sums alone."""

    directory: str
    decided: tuple[SegmentTiering, ...]
    segments: tuple[PlannedSegment, ...]

    def moving(self) -> list[SegmentTiering]:
        return [s for s in self.decided if s.moving]

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "decided": [s.to_json() for s in self.moving()],
                "segments": [s.to_json() for s in self.segments]}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> TierPartition:
        return cls(str(doc["directory"]), tuple(SegmentTiering.from_json(s) for s in doc["decided"]),
                   tuple(PlannedSegment.from_json(s) for s in doc["segments"]))


@dataclass(frozen=True, slots=True)
class Tiering(engine.PartitionsOnly):
    """Storage tiering as a kind of run (:mod:`tiering.run.engine`): each sealed segment's objects moved to
    the class its topic's policy gives its newest record's age, a partition at a time under its lease."""

    options: TierOptions

    run_kind: ClassVar[RunKind] = RunKind.TIER
    label: ClassVar[str] = "storage tiering"
    step: ClassVar[StepDir] = StepDir.TIER
    plans_ahead: ClassVar[bool] = False

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def started(self, store: ObjectStore, prefix: str) -> Tiering:
        now = self.options.now or store.now(clock_key(normalize_prefix(prefix))).isoformat()
        return Tiering(replace(self.options, now=now))

    @property
    def now(self) -> datetime:
        if self.options.now is None:
            raise ConfigError("a tiering run has no clock before it starts", expected="now", found=None)
        return datetime.fromisoformat(self.options.now)

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[TierPartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        options = ScanOptions("none", min_age_minutes=0, include_internal=self.options.include_internal)
        engine.listed(store, prefix, options, lambda segments: self.partition(store, segments), emit, source)

    def partition(self, store: ObjectStore, segments: list[PlannedSegment]) -> TierPartition:
        decided = tuple(_tier_segment(store, seg, self.options.policy, self.options.prices, self.now)
                        for seg in segments)
        moving = {s.base_offset for s in decided if s.moving}
        return TierPartition(segments[0].directory, decided, tuple(s for s in segments if s.base_offset in moving))

    def partition_from_json(self, doc: Mapping[str, Any]) -> TierPartition:
        return TierPartition.from_json(doc)

    def work(self, ctx: Context, part: TierPartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        regrouped = in_flight_groups(ctx.store, ctx.prefix, part.directory)
        for s in part.moving():
            if s.base_offset in regrouped:
                out.append(SegmentResult(s.directory, s.base_offset, Status.SKIPPED, "a merge of segments "
                                         f"{regrouped[s.base_offset]} is in flight (its journal entry exists): "
                                         "left for a later run", cause=Cause.BUSY))
            else:
                out.append(_apply_segment(ctx.store, ctx.prefix, s, lease, ctx.run_id))
            if progress is not None:
                progress(out[-1])

    def settings_json(self) -> dict[str, Any]:
        return self.options.settings_json()

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        """The objects moved and their bytes, by transition (``"<class> -> <target>"``)."""
        objects: Counter[str] = Counter()
        moved_bytes: Counter[str] = Counter()
        for m in moved_objects(list(results)):
            name = transition_name(m.get("from"), m.get("to"))
            objects[name] += 1
            moved_bytes[name] += int(m.get("bytes", 0))
        return {"objects_moved": objects, "bytes_moved": moved_bytes}


def plan_document(store: ObjectStore, prefix: str, options: TierOptions, totals: TierTotals,
                  segments: Sequence[SegmentTiering] = ()) -> TierPlan:
    """A tiering plan's document from what the run (or the dry run) added up."""
    return TierPlan(store.bucket, normalize_prefix(prefix), options.now or datetime.now(UTC).isoformat(),
                    options.policy.path, options.prices.describe(), totals, tuple(segments))


def run_results(store: ObjectStore, prefix: str, run_id: str) -> Iterator[SegmentResult]:
    """The results of tiering run ``run_id``'s own moves (:func:`engine.own_results`)."""
    return engine.own_results(store, prefix, run_id, StepDir.TIER)


def _decide(ref: Any, file: str, target: str | None, prices: PriceBook, now: datetime) -> ObjectMove:
    base = {"key": ref.key, "file": file, "size": ref.size, "etag": ref.etag, "storage_class": ref.storage_class,
            "target": target}
    if target is None:
        return ObjectMove(**base, action=STAY, reason="not old enough for any storage tier", cause=StayCause.TOO_YOUNG)
    current = ref.storage_class if ref.storage_class in STORAGE_ORDER else StorageClass.STANDARD
    if STORAGE_ORDER.index(current) >= STORAGE_ORDER.index(target):
        return ObjectMove(**base, action=STAY, reason=f"already in {ref.storage_class}", cause=StayCause.ALREADY_THERE)
    to, frm = prices.of(target), prices.of(current)
    if to.min_object_bytes and ref.size < to.min_object_bytes:
        return ObjectMove(**base, action=STAY, reason=f"under {to.min_object_bytes // 1024} KiB: {target} would bill "
                          f"it as {to.min_object_bytes // 1024} KiB (costs more than {current})",
                          cause=StayCause.TOO_SMALL)
    in_class_days = (now - datetime.fromisoformat(ref.last_modified)).total_seconds() / 86400
    if frm.min_days and in_class_days < frm.min_days:
        return ObjectMove(**base, action=STAY, reason=f"in {current} for {in_class_days:.0f} days, under its "
                          f"{frm.min_days}-day minimum (moving now bills the rest)", cause=StayCause.MIN_DURATION)
    std = prices.of(StorageClass.STANDARD).rate()
    monthly = (ref.size / GB * (frm.rate() - to.rate()) - max(0, to.min_object_bytes - ref.size) / GB * to.rate()
               - (to.overhead_bytes_class * to.rate() + to.overhead_bytes_standard * std) / GB)
    if monthly <= 0:
        return ObjectMove(**base, action=STAY, reason=f"no saving: in {target} it would cost more than in {current} "
                          "(per-object minimum size and metadata overhead)", cause=StayCause.NO_SAVING)
    one_off = to.put_per_1000 / 1000 + ref.size / GB * frm.retrieval_per_gb
    return ObjectMove(**base, action=MOVE, reason=f"{target} after its newest record's age",
                      monthly_savings_usd=monthly, one_off_usd=one_off)


def _tier_segment(store: ObjectStore, seg: PlannedSegment, policy: Policy, prices: PriceBook, now: datetime
                  ) -> SegmentTiering:
    """Where one segment's objects go (or why the segment stays as a whole)."""
    t = SegmentTiering(seg.directory, seg.topic, seg.base_offset, None, None, "")
    sealed = seg.action == Action.COMPACT or seg.cause in (Cause.ALREADY_COMPACTED, Cause.TOO_YOUNG)
    if seg.log is None or not sealed:
        return replace(t, reason=f"not tiered: {seg.reason}", cause=StayCause.NOT_TIERED)
    try:
        newest_ms, source = max_timestamp(store, seg)
    except PreconditionFailed:  # the read is conditional on the ETag the listing (or the inventory) gave
        return replace(t, reason="not tiered: its .log changed since it was listed (an inventory older than the "
                       "object?): left for a later run", cause=StayCause.NOT_TIERED)
    except (TieringError, ObjectNotFound) as e:
        return replace(t, reason=f"not tiered: cannot read its newest timestamp: {e}", cause=StayCause.NOT_TIERED)
    if newest_ms is None:
        source = f"S3 LastModified ({source})"
        newest = datetime.fromisoformat(seg.log.last_modified)
    else:
        newest = datetime.fromtimestamp(newest_ms / 1000, UTC)
    age = (now - newest).total_seconds() / 86400
    target = policy.resolve(seg.topic).tier_for(age)
    objects = tuple(_decide(ref, file, target, prices, now) for file in FILES
                    if (ref := getattr(seg, file)) is not None)
    return replace(t, max_timestamp_ms=newest_ms, age_days=age, age_source=source, objects=objects)


def _apply_segment(store: ObjectStore, prefix: str, s: SegmentTiering, lease: Lease, run_id: str) -> SegmentResult:
    """Move one segment's planned objects. The run's mark goes in the partition's state before the first copy
    (what a rollback undoes) and, after the copies, the ETags they made (a copy may change one): a mark
    without them is one a crash left between the two, which the rollback judges by the object's class, size
    and generation. A same-run retry of the same plan adds them to such a mark; one that plans anew finds
    the objects in their target class and leaves it."""
    moved: list[dict[str, Any]] = []
    notes: list[str] = []
    etags: dict[FileRole, tuple[str, str]] = {}
    if operation_pending(store, prefix, s.directory, s.base_offset):
        return SegmentResult(s.directory, s.base_offset, Status.SKIPPED, "a compaction of this segment is in progress "
                             "(its journal entry exists): left for a later run", cause=Cause.BUSY)
    state = load_state(store, prefix, s.directory)
    entry = state.get(s.base_offset)
    earlier = {m.file: m for mark in state.tiered.get(s.base_offset, ()) if mark.run_id == run_id
               for m in mark.moves}  # an earlier attempt of this run's mark
    try:
        todo: list[tuple[ObjectMove, ObjectAttrs]] = []
        for o in s.objects:
            if o.action != MOVE:
                continue
            assert o.target is not None
            lease.check()
            info, attrs = store.describe(o.key)
            if info.storage_class == o.target:
                moved.append({"key": o.key, "to": o.target, "already": True})
                if (m := earlier.get(o.file)) is not None and m.etag_after is None:
                    etags[o.file] = (m.etag_before, info.etag)  # that attempt's copy, now with its ETag
                continue
            if info.etag != o.etag:
                notes.append(f"{o.file} changed since planning: left as it is")
                continue
            todo.append((o, attrs))
        if todo:  # the class each object is in now is the one a rollback puts it back in
            moves = {**earlier, **{o.file: ClassMove(o.file, o.size, attrs.storage_class, str(o.target), o.etag)
                                   for o, attrs in todo}}
            mark = TierMark(run_id, generation_in_place(entry),
                            tuple(moves[f] for f in FILES if f in moves))
            lease.check()
            record_segments(store, prefix, s.directory, {}, tiered=_with_mark(s.base_offset, mark))
        for o, attrs in todo:
            assert o.target is not None
            lease.check()
            new_etag = store.transition(o.key, etag=o.etag, attrs=attrs, storage_class=o.target)
            etags[o.file] = (o.etag, new_etag)
            moved.append({"key": o.key, "from": attrs.storage_class, "to": o.target, "bytes": o.size,
                          "monthly_savings_usd": o.monthly_savings_usd, "one_off_usd": o.one_off_usd})
    except LeaseLost:
        raise  # with_lease reports the rest of the partition as skipped
    except TieringError as e:  # what the error says decides the exit: retry, later, or the store's setup
        pending = (Pending.TRANSIENT if e.retryable else
                   Pending.BUSY if isinstance(e, ConflictError | PreconditionFailed) else None)
        return SegmentResult(s.directory, s.base_offset, Status.FAILED, f"stopped: {e}",
                             stats={"moved": moved}, error=e.to_dict(), pending=pending,
                             cause=Cause.INVALID if isinstance(e, InvalidDataError) else
                             Cause.TRANSIENT if e.retryable else Cause.BUSY if pending else Cause.REFUSED)
    finally:  # whatever moved, our state names it (a mark without the ETags after is a crash's)
        if etags:
            follow_etags(store, prefix, s.directory, s.base_offset, entry, etags,
                          _moved_to(s.base_offset, run_id, etags))
    status = MOVED if moved else Status.SKIPPED
    reason = "; ".join(notes) or ("" if moved else "nothing left to move")
    size = sum(int(m.get("bytes", 0)) for m in moved)  # the bytes moved, the same in any class
    return SegmentResult(s.directory, s.base_offset, status, reason, size, size, stats={"moved": moved},
                         cause=None if moved else Cause.BUSY if notes else Cause.NOTHING_TO_MOVE)


def _with_mark(base: int, mark: TierMark) -> Callable[[Marks], Marks]:
    """The marks with ``mark`` the newest of segment ``base`` (in place of an earlier attempt's of its run)."""
    def change(marks: Marks) -> Marks:
        kept = tuple(m for m in marks.get(base, ()) if m.run_id != mark.run_id)
        return {**marks, base: (*kept, mark)}
    return change


def _moved_to(base: int, run_id: str, etags: Mapping[FileRole, tuple[str, str]]) -> Callable[[Marks], Marks]:
    """Run ``run_id``'s mark of segment ``base`` with the ETags its copies made."""
    def change(marks: Marks) -> Marks:
        stack = tuple(structs.replace(mark, moves=tuple(structs.replace(m, etag_after=etags[m.file][1])
                                                        if m.file in etags else m
                                                for m in mark.moves)) if mark.run_id == run_id else mark
                      for mark in marks.get(base, ()))
        return {**marks, base: stack}
    return change


@dataclass(frozen=True, slots=True)
class TierReport:
    """What a tiering run moved (or, dry, would move), what it saves and costs, and why the rest stays
    (``reports/<run>/tiering.json``). ``achieved`` sums what the run moved; ``planned`` is the plan's."""

    KIND: ClassVar[str] = "tier-report"

    run_id: str
    dry_run: bool
    bucket: str
    prefix: str
    planned_at: str
    policy: str | None
    prices: Mapping[str, Any]
    planned: TierTotals
    objects_moved: int
    bytes_moved: int
    achieved_monthly_usd: float
    achieved_one_off_usd: float
    segments_failed: tuple[SegmentResult, ...]
    segments_left: tuple[SegmentResult, ...]
    warnings: tuple[str, ...]

    def money(self) -> tuple[float, float]:
        """Monthly savings and one-off cost: what a run did, or what a dry run would do."""
        if self.dry_run:
            return self.planned.monthly_savings_usd, self.planned.one_off_usd
        return self.achieved_monthly_usd, self.achieved_one_off_usd

    def to_json(self) -> dict[str, Any]:
        monthly, one_off = self.achieved_monthly_usd, self.achieved_one_off_usd
        return {"schema_version": TIER_SCHEMA_VERSION, "kind": self.KIND, "run_id": self.run_id,
                "dry_run": self.dry_run, "bucket": self.bucket, "prefix": self.prefix,
                "planned_at": self.planned_at, "policy": self.policy, "prices": dict(self.prices),
                "planned": self.planned.to_json(), "objects_moved": self.objects_moved,
                "bytes_moved": self.bytes_moved,
                "achieved": {"monthly_savings_usd": monthly, "one_off_usd": one_off,
                             "payback_months": one_off / monthly if monthly > 0 else None},
                "segments_failed": [r.to_json() for r in self.segments_failed],
                "segments_left": [r.to_json() for r in self.segments_left], "warnings": list(self.warnings)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> TierReport:
        check_document(doc, kind=cls.KIND, version=TIER_SCHEMA_VERSION, what="a tiering report")
        achieved = doc["achieved"]
        return cls(str(doc["run_id"]), bool(doc["dry_run"]), str(doc["bucket"]), str(doc["prefix"]),
                   str(doc["planned_at"]), doc.get("policy"), dict(doc["prices"]), TierTotals.from_json(doc["planned"]),
                   int(doc["objects_moved"]), int(doc["bytes_moved"]), float(achieved["monthly_savings_usd"]),
                   float(achieved["one_off_usd"]), tuple(SegmentResult.from_json(r) for r in doc["segments_failed"]),
                   tuple(SegmentResult.from_json(r) for r in doc["segments_left"]),
                   tuple(str(w) for w in doc["warnings"]))


def tier_report(plan: TierPlan, results: Sequence[SegmentResult], run_id: str, *, dry_run: bool) -> TierReport:
    """The report of a tiering run (or a dry run: no results) of ``plan``."""
    moved = moved_objects(results)
    return TierReport(
        run_id, dry_run, plan.bucket, plan.prefix, plan.created_at, plan.policy, plan.prices, plan.totals,
        len(moved), sum(int(m.get("bytes", 0)) for m in moved),
        sum(float(m.get("monthly_savings_usd", 0.0)) for m in moved),
        sum(float(m.get("one_off_usd", 0.0)) for m in moved),
        tuple(r for r in results if r.status == Status.FAILED), tuple(r for r in results if r.status == Status.SKIPPED),
        tuple(f"{n} objects go to {cls}: they cannot be read (by Kafka, a consumer or the compaction) without a "
              "restore first" for cls, n in sorted(plan.archived.items())))


def tier_table(report: TierReport) -> str:
    """The tiering report as plain text (task logs, the CLI)."""
    t = report.planned
    head = "DRY RUN (nothing moved)" if report.dry_run else f"moved {report.objects_moved} objects"
    lines = [f"storage tiering of s3://{report.bucket}/{report.prefix} run {report.run_id}: {head}",
             f"  {'transition':<32} {'objects':>8} {'bytes':>14}"]
    for name, row in sorted(t.by_transition.items()):
        lines.append(f"  {name:<32} {row.objects:>8} {row.bytes:>14,}")
    monthly, one_off = report.money()  # a run reports what it did, not what it planned
    payback = one_off / monthly if monthly > 0 else None
    lines.append(f"  {'would save' if report.dry_run else 'saves'} ${monthly:.6f}/month, one-off ${one_off:.6f}, "
                 "payback " + ("never" if payback is None else f"{payback:.1f} months"))
    for reason, n in sorted(t.staying.items()):
        lines.append(f"  stays ({n}): {reason}")
    for r in report.segments_failed:
        lines.append(f"  FAILED {r.directory}/{r.base_offset}: {r.reason}")
    lines += [f"  WARNING: {w}" for w in report.warnings]
    return "\n".join(lines)


def lifecycle_configuration(policy: Policy, prefix: str) -> tuple[dict[str, Any], list[str]]:
    """An approximate S3 Lifecycle configuration for the policy's storage tiers (what
    ``put-bucket-lifecycle-configuration`` accepts), for users who would rather let S3 move objects, and notes
    on where it differs: S3 sees only an object's age since it was written (not its records' age), its key
    prefix, tags and size."""
    root = prefix.strip("/")
    rules: list[dict[str, Any]] = []
    notes = [
        "S3 counts days from when an object was written (a compaction resets it), not from the newest record "
        "in the segment: segments uploaded late or rewritten move later than the policy says.",
        "Objects of 128 KiB or less are excluded (ObjectSizeGreaterThan), as the policy never moves them to IA.",
        "S3 applies every matching rule and the coldest transition wins: a topic entry cannot exempt a topic "
        "from the cluster rule, and regex entries cannot be expressed at all.",
        f"The reserved prefix {reserved_dir('')} matches the cluster rule too; its objects are small or short-lived.",
    ]

    def rule(rule_id: str, key_prefix: str, tiers: Any) -> dict[str, Any]:
        where: dict[str, Any] = {"ObjectSizeGreaterThan": 131072}
        if key_prefix:
            where = {"And": {"Prefix": key_prefix, **where}}
        transitions = []
        for t in tiers:
            days = max(1, math.ceil(t.after_days))
            if t.storage_class in IA_CLASSES and days < S3_IA_MIN_DAYS:
                notes.append(f"{rule_id}: S3 moves objects to {t.storage_class} after {S3_IA_MIN_DAYS} days at the "
                             f"earliest; the policy's {t.after_days:g} days became {S3_IA_MIN_DAYS}.")
                days = S3_IA_MIN_DAYS
            transitions.append({"Days": days, "StorageClass": t.storage_class})
        return {"ID": rule_id[:255], "Status": "Enabled", "Filter": where, "Transitions": transitions}

    cluster = policy.resolve("\x00 no entry names this topic")
    if cluster.tiers:
        rules.append(rule("kafka-tiering-cluster", f"{root}/" if root else "", cluster.tiers))
    for scope in policy.topics:
        if scope.exact is not None and "storage.tiers" in scope.settings:
            resolved = policy.resolve(scope.exact)
            if resolved.tiers:
                rules.append(rule(f"kafka-tiering-topic-{scope.exact}", f"{root}/{scope.exact}-" if root else
                                  f"{scope.exact}-", resolved.tiers))
            notes.append(f"topic {scope.exact}: its rule's prefix {root}/{scope.exact}- also matches topics named "
                         f"{scope.exact}-<something>.")
        elif scope.pattern is not None and "storage.tiers" in scope.settings:
            notes.append(f"{scope.name}: a regex cannot be a lifecycle filter; not emitted.")
    return {"Rules": rules}, notes
