"""The cost model: a run's documents in, the report document out (pure: no I/O, no clock).

Savings
    Per storage class of the rewritten objects (a rewrite keeps the class): the monthly cost of the
    billed bytes before minus after, where an object under the class's minimum billable size counts as
    that size. Standard's volume tiers apply to the account's whole volume in the region, so the bytes
    saved come off the top of it: ``monthly(V) - monthly(V - saved)`` with ``V`` the account's current
    volume in that class (an input; by default just the bytes the run saw, i.e. the first tier). A year
    is twelve months. Only ``.log`` bytes are counted (the indexes shrink too, a little: not claimed).

One-off costs of the run
    - S3 requests, as counted by every step of the run, priced at the storage class of the partition they
      served (an upper bound: staging objects are Standard), the run's own documents at Standard;
    - compute: the rewrite tasks' seconds on one core each (Spark tasks, or the CLI's rewrites), as
      vCPU-hours at the price book's rate;
    - retrieval fees for IA and Glacier Instant Retrieval sources (read once to rewrite, copied once to the
      backup);
    - early deletion: replacing an object younger than its class's minimum duration bills the rest;
    - the originals kept for the grace period (a copy billed at least the class's minimum duration);
    - in a versioned bucket, the noncurrent versions (the replaced original, the deleted backup and the
      staging copy) until a lifecycle rule expires them; without such a rule the savings never arrive,
      and the report says so and counts the storage that is added instead;
    - KMS requests for SSE-KMS objects (none counted with an S3 Bucket Key).
    Payback is the one-off total divided by the monthly savings.

A dry run reports the same from the plan and the sampled estimate; every figure is then an estimate
and the savings carry the sample's range.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final

from tiering.cost.document import (
    SAVING,
    Assumptions,
    EstimateDetail,
    Failure,
    GroupRow,
    KeyCompactionFigures,
    LedgerEntry,
    LedgerRow,
    LedgerSummary,
    Listing,
    MergeFigures,
    NotRewritten,
    OneOff,
    RebatchFigures,
    Report,
    RowStatus,
    SegmentRow,
    Totals,
    row_status,
)
from tiering.cost.forecast import Forecast
from tiering.cost.prices import DAYS_PER_MONTH, GB, PriceBook, StoragePrice
from tiering.lifecycle.vocabulary import Counted, Status, StorageClass, Unrun

# KMS calls per SSE-KMS segment of three objects: a Decrypt to read the .log, a Decrypt and a GenerateDataKey
# per backup copy (3 objects), a GenerateDataKey per object put in place (3).
KMS_CALLS_PER_SEGMENT: Final = 10
# A dry run has no counts yet: S3 requests per segment of a real compaction through the DAG path (stage,
# verify by checksum, commit; tests/test_pipeline.py checks the measured count stays within 35% of these),
# and a rewrite speed per core through S3 (docs/benchmarks.md, bench-s3).
REQUESTS_PER_SEGMENT: Final = {"tier1": 17, "tier2": 24}
# The staging upload's part size (tiering.storage.objects.DEFAULT_PART_BYTES; a test keeps them equal): a new
# .log larger than one part is a multipart upload, one request a part plus its create and complete.
UPLOAD_PART_BYTES: Final = 8 << 20


def tier1_requests(bytes_after: int) -> int:
    """A dry run's tier-1 requests (PUT, COPY, POST, LIST) for compacting one segment into ``bytes_after``:
    the DAG path's fixed count, with the parts of a multipart staging upload instead of its single PUT."""
    parts = -(-bytes_after // UPLOAD_PART_BYTES)
    return REQUESTS_PER_SEGMENT["tier1"] + (parts + 1 if parts > 1 else 0)

DRY_RUN_BYTES_PER_CORE_SECOND: Final = 18 << 20
ROLLUPS: Final = ("storage_class", "topic", "directory", "source_codec")
MAX_LISTED_ROWS: Final = 10_000  # segment rows (and failures) a report lists; its figures count them all
MAX_LISTED_PARTITIONS: Final = 1_000  # partitions listed by name (those that saved the most)


@dataclass(frozen=True, slots=True)
class CostOptions:
    """What the price book cannot know: the account and the run's retention settings."""

    account_bytes: Mapping[str, int] = field(default_factory=dict)  # current volume per storage class
    grace_days: float = 7.0
    versioned: bool | None = None  # None: as the bucket says
    noncurrent_days: int | None = None  # None: as the bucket's lifecycle says

    def to_json(self) -> dict[str, Any]:
        return {"account_bytes": dict(self.account_bytes), "grace_days": self.grace_days,
                "versioned": self.versioned, "noncurrent_days": self.noncurrent_days}


def topic_of(directory: str) -> str:
    return directory.rsplit("-", 1)[0]


def source_codec(stats: Mapping[str, Any] | None) -> str:
    """The codec most of a segment's batches had before the rewrite ("mixed: a+b" when no majority)."""
    counts: Counter[str] = Counter((stats or {}).get("codecs_before") or {})
    if not counts:
        return "unknown"
    (top, n), total = counts.most_common(1)[0], sum(counts.values())
    return top if n * 2 > total else "mixed: " + "+".join(sorted(counts))


def _gb(n: float) -> float:
    return n / GB


def _row(directory: str, base: int, r: Mapping[str, Any], prices: PriceBook, plan: Mapping[str, Any] | None = None,
         codec: str | None = None) -> SegmentRow:
    """A segment's row from its result and its plan entry (none: a result the plan did not list, a rollback's
    say); ``codec``: its source codec, else the result's."""
    s = plan or {}
    log = s.get("log") or (r.get("stats") or {}).get("log") or {}  # a merge's result carries its source's
    merge = merge_figures(r.get("stats"), prices)
    keys = key_compaction_figures(r.get("stats"), int(r.get("bytes_before", 0)), int(r.get("bytes_after", 0)),
                                  merge.segments_before if merge is not None else 1)
    return SegmentRow(directory, s.get("topic") or topic_of(directory),
                      int(s.get("partition", directory.rsplit("-", 1)[-1])), base,
                      log.get("storage_class") or StorageClass.STANDARD, log.get("last_modified"),
                      int(log.get("size", 0)),
                      row_status(r["status"]), str(r.get("reason", "")), int(r.get("bytes_before", 0)),
                      int(r.get("bytes_after", 0)), source_codec(r.get("stats")) if codec is None else codec,
                      r.get("encryption"), r.get("error"), rebatch=rebatch_figures(r.get("stats")),
                      keys=keys, cause=r.get("cause"), merge=merge)


def object_month_usd(prices: PriceBook, storage_class: str, size: int) -> float:
    """What one object of ``size`` bytes costs a month in ``storage_class`` at its first-tier rate: at least
    the class's minimum billable size, plus the archive classes' per-object overhead (part of it billed at
    Standard's rate)."""
    p = prices.of(storage_class)
    return (_gb(p.billed_bytes(size) + p.overhead_bytes_class) * p.rate()
            + _gb(p.overhead_bytes_standard) * prices.of(StorageClass.STANDARD).rate())


def merge_figures(stats: Mapping[str, Any] | None, prices: PriceBook) -> MergeFigures | None:
    """A merged group's figures from its first segment's stats, priced; None for any other segment."""
    m = (stats or {}).get("merge")
    if not m:
        return None
    cls = str(m["storage_class"])
    before, after = [int(n) for n in m["objects_before"]], [int(n) for n in m["objects_after"]]
    get = prices.of(cls).get_per_1000 / 1000
    moves = tuple((c, len(before) * price / 1000, len(after) * price / 1000)
                  for c, p in sorted(prices.storage.items())
                  if c != cls and (price := p.transition_per_1000) is not None)
    return MergeFigures(int(m["segments_before"]), int(m["segments_after"]), len(before), len(after),
                        sum(object_month_usd(prices, cls, n) for n in before),
                        sum(object_month_usd(prices, cls, n) for n in after), len(before) * get, len(after) * get,
                        moves)


def key_compaction_figures(stats: Mapping[str, Any] | None, before: int, after: int,
                           segments: int = 1) -> KeyCompactionFigures | None:
    """The key-compaction figures of a segment (or of the ``segments`` a pass cleaned into one) from its pass's
    stats, or None when no pass cleaned it."""
    kc = (stats or {}).get("key_compaction")
    if not kc:
        return None
    return KeyCompactionFigures(segments, int(kc["records_in"]), int(kc["records_out"]), int(kc["keys"]),
                                int(kc["superseded_dropped"]), int(kc["no_key_dropped"]),
                                int(kc["aborted_records_dropped"]), int(kc["tombstones_stamped"]),
                                int(kc["tombstones_dropped"]), int(kc["markers_dropped"]),
                                int(kc.get("group_bytes_before", before)) - after)


def rebatch_figures(stats: Mapping[str, Any] | None) -> RebatchFigures | None:
    """A segment's re-batching figures from its rewrite's stats, or None when it was not re-batched."""
    rb = (stats or {}).get("rebatch")
    if not rb:
        return None
    return RebatchFigures(1, int(rb["batches_in"]), int(rb["batches_out"]), int(rb["saved_by_rebatching"]))


def _rows(plan: Iterable[Mapping[str, Any]], results: Iterable[Mapping[str, Any]], forecast: Forecast | None,
          prices: PriceBook) -> Iterator[SegmentRow]:
    """One row per segment the scan saw: its plan facts and the run's outcome (or, in a dry run, its
    stratum's forecast applied to it); then the results without a plan entry (a rollback, say)."""
    by_key = {(r["directory"], int(r["base_offset"])): r for r in results}
    for s in plan:
        key = (s["directory"], int(s["base_offset"]))
        r = by_key.pop(key, None)
        if r is not None:
            yield _row(*key, r, prices, s)
            continue
        size = int((s.get("log") or {}).get("size", 0))
        stratum = forecast.stratum(s["topic"], s["directory"]) if forecast is not None else None
        codec = ""
        if s["action"] == "skip":
            r = {"status": Status.SKIPPED, "reason": s["reason"], "cause": s.get("cause")}
        elif stratum is not None and s["action"] == "compact":
            codec = stratum.source_codec
            if stratum.saves:
                r = {"status": Unrun.ESTIMATED, "reason": "dry run", "cause": "dry run", "bytes_before": size,
                     "bytes_after": round(size * stratum.ratio)}
            else:
                r = {"status": Unrun.LIKELY_SKIPPED, "reason": f"{stratum.verdict}: its sample's ratio is "
                     f"{stratum.ratio:.3f} ({stratum.topic}, {stratum.source_codec})", "cause": str(stratum.verdict)}
        elif forecast is not None:
            r = {"status": Unrun.PLANNED, "reason": s["reason"], "cause": "planned"}
        else:
            r = {"status": Unrun.NOT_RUN, "reason": "planned, but no result was recorded", "cause": "no result"}
        yield _row(*key, r, prices, s, codec=codec)
    for (directory, base), r in sorted(by_key.items()):
        yield _row(directory, base, r, prices)


def _age_days(last_modified: str | None, now: datetime) -> float | None:
    if not last_modified:
        return None
    return (now - datetime.fromisoformat(last_modified)).total_seconds() / 86400


@dataclass
class _Line:
    item: str
    usd: float = 0.0
    detail: str = ""
    quantity: float = 0.0


@dataclass
class _Group:
    """A rollup's row while it is summed: segments, bytes, and billed bytes saved per storage class (its
    share of the class's dollars)."""

    segments: int = 0
    before: int = 0
    after: int = 0
    saved_billed: Counter[str] = field(default_factory=Counter)


class _Fold:
    """The report's figures, folded one segment row at a time: memory for the groups (topics, partitions,
    classes, codecs) and the listed rows, whatever the number of segments."""

    def __init__(self, prices: PriceBook, options: CostOptions, now: datetime, facts: tuple[bool, int | None],
                 dry_run: bool) -> None:
        self.prices, self.options, self.now, self.dry_run = prices, options, now, dry_run
        self.versioned, self.noncurrent_days = facts
        self.statuses: Counter[RowStatus] = Counter()
        self.reasons: Counter[tuple[RowStatus, str]] = Counter()
        self.failed: list[Failure] = []
        self.failed_omitted = 0
        self.rows: list[SegmentRow] = []
        self.rows_omitted = 0
        self.groups: dict[str, dict[str, _Group]] = {k: {} for k in ROLLUPS}
        self.billed_before: Counter[str] = Counter()  # per storage class, of the rewritten segments
        self.billed_after: Counter[str] = Counter()
        self.added_usd = 0.0  # versioned without expiry: what stays billed instead, per month
        self.class_of: dict[str, str] = {}  # a rewritten partition's storage class (prices its requests)
        self.before = self.after = self.done = 0
        self.rebatched = RebatchFigures(0, 0, 0, 0)
        self.rebatch_billed: Counter[str] = Counter()  # per class, the billed bytes re-batching saved
        self.keys: KeyCompactionFigures | None = None
        self.keys_partitions: set[str] = set()
        self.keys_billed: Counter[str] = Counter()  # per class, the billed bytes key compaction saved
        self.merged: MergeFigures | None = None
        self.cleaned_merged = 0  # segments a key-compaction pass cleaned into merged ones
        self.keys_merged_usd = 0.0  # what they dropped, per month (in self.merged's dollars too)
        self.dry_requests_usd = 0.0
        self.dry_requests = 0  # a dry run's estimated requests (tier1_requests and the tier-2 constant a segment)
        self.retrieval = _Line("Retrieval fees (IA / Glacier IR sources)")
        self.early = _Line("Early deletion (minimum storage duration)")
        self.grace = _Line(f"Originals kept {options.grace_days:g} days (grace period)")
        self.noncurrent = _Line("Noncurrent versions until they expire")
        self.kms = _Line("KMS requests (SSE-KMS)")

    def add(self, row: SegmentRow) -> None:
        self.statuses[row.status] += 1
        if row.merge is not None:
            self.merged = row.merge if self.merged is None else self.merged.plus(row.merge)
        if len(self.rows) < MAX_LISTED_ROWS:
            self.rows.append(row)
        else:
            self.rows_omitted += 1
        # A merged row's bytes count (a key-compaction pass cleans what it merges), its dollars do not: the
        # group's objects before and after are priced whole, minimum sizes included, by row.merge.
        merged = row.status is Status.MERGED
        if not merged and row.status not in SAVING:
            self.reasons[(row.status, row.why)] += 1
            if row.status is Status.FAILED:
                if len(self.failed) < MAX_LISTED_ROWS:
                    self.failed.append(Failure(f"{row.directory}/{row.base_offset}", row.reason, row.error))
                else:
                    self.failed_omitted += 1
            return
        cls = row.storage_class
        p = self.prices.of(cls)
        billed_before, billed_after = p.billed_bytes(row.bytes_before), p.billed_bytes(row.bytes_after)
        self.done += 1
        self.before += row.bytes_before
        self.after += row.bytes_after
        self.class_of[row.directory] = cls
        saved_billed = 0 if merged else billed_before - billed_after
        if not merged:
            self.billed_before[cls] += billed_before
            self.billed_after[cls] += billed_after
        if (rb := row.rebatch) is not None:
            r = self.rebatched
            self.rebatched = RebatchFigures(r.segments + 1, r.batches_before + rb.batches_before,
                                            r.batches_after + rb.batches_after, r.saved_bytes + rb.saved_bytes)
            if row.bytes_before > row.bytes_after:  # its share of the billed bytes the segment saved
                self.rebatch_billed[cls] += round(saved_billed * rb.saved_bytes
                                                  / (row.bytes_before - row.bytes_after))
        if (kc := row.keys) is not None:
            new_partition = row.directory not in self.keys_partitions
            self.keys_partitions.add(row.directory)
            self.keys = kc if self.keys is None else self.keys.plus(kc, new_partition=new_partition)
            self.keys_billed[cls] += saved_billed
            if merged:  # cleaned into a merged segment: what it dropped, at its class's rate
                self.keys_merged_usd += _gb(kc.saved_bytes) * p.rate()
                self.cleaned_merged += kc.segments
        for key in ROLLUPS:
            group = self.groups[key].setdefault(str(getattr(row, key)), _Group())
            group.segments += 1
            group.before += row.bytes_before
            group.after += row.bytes_after
            group.saved_billed[cls] += saved_billed
        self.added_usd += _gb(billed_before) * p.rate() + 2 * _gb(row.bytes_after) * p.rate()
        if self.dry_run:
            tier1 = tier1_requests(row.bytes_after)
            self.dry_requests += tier1 + REQUESTS_PER_SEGMENT["tier2"]
            self.dry_requests_usd += (tier1 * p.put_per_1000 + REQUESTS_PER_SEGMENT["tier2"] * p.get_per_1000) / 1000
        before_gb, after_gb = _gb(billed_before), _gb(row.bytes_after)
        rate = p.rate(_gb(self.options.account_bytes.get(cls, 0)))
        self.retrieval.usd += 2 * _gb(row.bytes_before) * p.retrieval_per_gb
        self.retrieval.quantity += 2 * _gb(row.bytes_before) if p.retrieval_per_gb else 0
        age = _age_days(row.last_modified, self.now)
        if p.min_days and age is not None and age < p.min_days:
            self.early.usd += before_gb * rate * (p.min_days - age) / DAYS_PER_MONTH
            self.early.quantity += 1
        self.grace.usd += before_gb * rate * max(self.options.grace_days, p.min_days) / DAYS_PER_MONTH
        if self.versioned and self.noncurrent_days is not None:
            keep = max(self.noncurrent_days, p.min_days) / DAYS_PER_MONTH
            standard = self.prices.of(StorageClass.STANDARD).rate()
            self.noncurrent.usd += (2 * before_gb * rate * keep
                                    + after_gb * standard * self.noncurrent_days / DAYS_PER_MONTH)
        if row.encryption == "aws:kms":
            self.kms.quantity += KMS_CALLS_PER_SEGMENT

    def savings(self, factor: float = 1.0) -> dict[str, float]:
        """Monthly $ saved per storage class; ``factor`` scales the bytes saved (a dry run's range)."""
        out: dict[str, float] = {}
        for cls in sorted(self.billed_before):
            saved = (self.billed_before[cls] - self.billed_after[cls]) * factor
            out[cls] = _monthly_saving(self.prices.of(cls), self.options, cls, self.billed_before[cls], saved)
        return out

    def share(self, by_class: Mapping[str, float], saved_billed: Mapping[str, int]) -> float:
        """The dollars of ``by_class`` that billed bytes ``saved_billed`` (per class) account for."""
        total = 0.0
        for cls, saved in saved_billed.items():
            whole = self.billed_before[cls] - self.billed_after[cls]
            if whole:
                total += by_class.get(cls, 0.0) * saved / whole
        return total

    def one_offs(self, usage: Mapping[str, Any]) -> tuple[list[OneOff], dict[str, int]]:
        # Requests: counted, priced at the class of the partition they served.
        by_class: Mapping[str, Mapping[str, int]] | None = usage.get("requests_by_class")
        if by_class is None:  # a run document that counts them by partition only
            merged: dict[str, Counter[str]] = {}
            for scope, ops in (usage.get("requests") or {}).items():
                merged.setdefault(self.class_of.get(scope, StorageClass.STANDARD), Counter()).update(ops)
            by_class = merged
        counts: Counter[str] = Counter()
        req = _Line("S3 requests")
        for cls, ops in by_class.items():
            for op, n in ops.items():
                counts[op] += int(n)
                req.usd += self.prices.request_usd(op, int(n), cls)
        if self.dry_run:
            req.usd += self.dry_requests_usd
            counts["(estimated, per segment)"] += self.dry_requests
        req.quantity = sum(counts.values())
        req.detail = f"{int(req.quantity):,} requests" + (" (partly estimated)" if self.dry_run else "")
        seconds = float(usage.get("compute_seconds", 0.0))
        if self.dry_run:
            seconds = self.before / DRY_RUN_BYTES_PER_CORE_SECOND
        compute = _Line("Compute (rewrite tasks)", seconds / 3600 * self.prices.vcpu_hour,
                        f"{seconds / 3600:.4f} vCPU-hours at ${self.prices.vcpu_hour:.4f}", seconds / 3600)
        self.kms.usd = self.kms.quantity * self.prices.kms_per_10000 / 10000
        self.retrieval.detail = f"{self.retrieval.quantity:.3f} GB read or copied from IA / Glacier IR objects"
        self.early.detail = f"{int(self.early.quantity)} objects replaced before their class's minimum duration"
        self.grace.detail = "a copy of each replaced .log, billed at least its class's minimum duration"
        self.kms.detail = f"{int(self.kms.quantity):,} KMS calls (none with an S3 Bucket Key)"
        self.noncurrent.detail = (
            f"replaced originals, deleted backups and staging copies for {self.noncurrent_days} days"
            if self.versioned and self.noncurrent_days is not None else
            "bucket not versioned" if not self.versioned else "no lifecycle rule expires them")
        lines = [req, compute, self.retrieval, self.early, self.grace, self.noncurrent, self.kms]
        return [OneOff(line.item, line.usd, line.detail) for line in lines], dict(sorted(counts.items()))

    def rollup(self, key: str, by_class: Mapping[str, float], limit: int | None = None
               ) -> tuple[tuple[GroupRow, ...], int]:
        """The groups of ``key``, by name (the ``limit`` that saved the most bytes, when there are more);
        and how many were left out."""
        groups = self.groups[key]
        names = sorted(groups)
        omitted = 0
        if limit is not None and len(names) > limit:
            names = sorted(sorted(names, key=lambda n: groups[n].after - groups[n].before)[:limit])
            omitted = len(groups) - limit
        return tuple(GroupRow(name, groups[name].segments, groups[name].before, groups[name].after,
                              by_class.get(name, 0.0) if key == "storage_class" else
                              self.share(by_class, groups[name].saved_billed)) for name in names), omitted


def build_report(run: Mapping[str, Any], plan: Iterable[Mapping[str, Any]], prices: PriceBook,
                 options: CostOptions, *, versioned: bool | None, noncurrent_days: int | None,
                 ledger: Sequence[LedgerEntry] = (), now: datetime,
                 auto: Mapping[str, Any] | None = None,
                 chunks: Iterable[tuple[Iterable[Mapping[str, Any]], Iterable[Mapping[str, Any]]]] | None = None,
                 not_planned: Mapping[str, int] | None = None) -> Report:
    """The report of one run. ``run`` is the run document (``compact.json``), ``plan`` the plan's segment
    entries (joined with the run document's segments), or ``chunks``: the plan's entries and the run's
    results a chunk at a time (a run of any size; ``plan`` is then ignored). ``ledger`` holds the earlier
    runs' ledger entries, ``now`` is the time the costs are computed at. The report lists segments (and
    failures, and partitions) up to a limit; its totals and rollups count them all. ``not_planned``: the
    scan's objects it did not plan, counted by reason."""
    estimate = (run.get("settings") or {}).get("estimate")
    forecast = Forecast.from_json(estimate, f"the run document of {run['run_id']}") if estimate else None
    dry_run = forecast is not None
    versioned = options.versioned if options.versioned is not None else versioned
    noncurrent_days = options.noncurrent_days if options.noncurrent_days is not None else noncurrent_days
    fold = _Fold(prices, options, now, (bool(versioned), noncurrent_days), dry_run)
    for entries, results in chunks if chunks is not None else [(plan, run.get("segments", []))]:
        for row in _rows(entries, results, forecast, prices):
            fold.add(row)
    warnings: list[str] = []

    by_class = fold.savings()
    monthly = sum(by_class.values()) + (fold.merged.monthly_savings_usd if fold.merged is not None else 0.0)
    if versioned and noncurrent_days is None and fold.done:
        # Nothing is ever removed: the new objects, the deleted backups and the staging copies are added.
        warnings.append("The bucket keeps versions and no lifecycle rule expires noncurrent ones: the replaced "
                        "originals stay billed forever, so this run ADDS storage instead of saving it. Add a "
                        "NoncurrentVersionExpiration rule (see infra/).")
        by_class = dict.fromkeys(by_class, 0.0)
        monthly = -fold.added_usd

    def priced(r: SegmentRow) -> SegmentRow:
        if r.status not in SAVING:
            return r
        p = prices.of(r.storage_class)
        saved = p.billed_bytes(r.bytes_before) - p.billed_bytes(r.bytes_after)
        return replace(r, monthly_savings_usd=fold.share(by_class, {r.storage_class: saved}))

    one_off, requests = fold.one_offs(run.get("usage") or {})
    before, after = fold.before, fold.after
    if after > before:
        warnings.append(f"This run made the rewritten segments bigger: {before:,} -> {after:,} bytes.")
    statuses = fold.statuses
    totals = Totals(sum(statuses.values()), statuses[Status.COMPACTED] + fold.cleaned_merged,
                    statuses[Unrun.ESTIMATED],
                    statuses[Status.SKIPPED], statuses[Status.FAILED], before, after, monthly,
                    sum(c.usd for c in one_off))
    partitions, partitions_omitted = fold.rollup("directory", by_class, MAX_LISTED_PARTITIONS)
    detail = None
    if forecast is not None:
        whole = forecast.total
        scale_low = whole.saved_low / whole.saved_bytes if whole.saved_bytes else 0.0
        scale_high = whole.saved_high / whole.saved_bytes if whole.saved_bytes else 0.0
        detail = EstimateDetail(forecast, before - after, sum(fold.savings(scale_low).values()),
                                sum(fold.savings(scale_high).values()))
    report = Report(
        run_id=run["run_id"], bucket=run["bucket"], prefix=run["prefix"], started_at=run.get("started_at"),
        finished_at=run.get("finished_at"), generated_at=now.isoformat(), estimate=dry_run,
        settings={k: v for k, v in (run.get("settings") or {}).items() if k != "estimate"},
        prices=prices.describe(),
        assumptions=Assumptions(dict(options.account_bytes), options.grace_days, versioned, noncurrent_days,
                                DAYS_PER_MONTH, GB),
        totals=totals,
        by_storage_class=fold.rollup("storage_class", by_class)[0],
        by_topic=fold.rollup("topic", by_class)[0],
        by_partition=partitions,
        by_source_codec=fold.rollup("source_codec", by_class)[0],
        one_off=tuple(one_off), requests_by_operation=requests,
        skipped=tuple(NotRewritten(st, why, n) for (st, why), n in sorted(fold.reasons.items())),
        failed=tuple(fold.failed), segments=tuple(priced(r) for r in fold.rows),
        listing=Listing(fold.rows_omitted, fold.failed_omitted, partitions_omitted),
        auto=dict(auto or {}), warnings=tuple(warnings), ledger=cumulative([], now), estimate_detail=detail,
        rebatching=fold.rebatched if fold.rebatched.segments else None,
        rebatching_monthly_usd=fold.share(by_class, fold.rebatch_billed),
        key_compaction=fold.keys,
        key_compaction_monthly_usd=fold.share(by_class, fold.keys_billed) + fold.keys_merged_usd,
        objects_not_planned=dict(sorted((not_planned or {}).items())), merging=fold.merged)
    return with_ledger(report, [e for e in ledger if e.run_id != report.run_id])


def _monthly_saving(p: StoragePrice, options: CostOptions, storage_class: str, before: float, saved: float) -> float:
    """$ a month that ``saved`` of ``before`` bytes in ``storage_class`` save, at the account's volume there."""
    volume = max(float(options.account_bytes.get(storage_class, 0)), before)
    return p.monthly(_gb(volume)) - p.monthly(_gb(volume - saved))


def ledger_entry_from_state(run_id: str, finished_at: str, by_class: Mapping[str, tuple[int, int, int]],
                            prices: PriceBook, options: CostOptions, *, saving: bool = True) -> LedgerEntry:
    """The ledger entry of a run counted from the partitions' states (what its generations there add up to,
    ``(segments, bytes_before, bytes_after)`` by storage class), its bytes priced as a report prices them;
    its requests are not known (no one-off cost). ``saving`` False: a bucket that keeps every version, where
    nothing replaced is gone."""
    monthly = sum(_monthly_saving(prices.of(cls), options, cls, before, before - after)
                  for cls, (_, before, after) in by_class.items()) if saving else 0.0
    return LedgerEntry(run_id, finished_at, False, sum(n for n, _, _ in by_class.values()),
                       sum(b for _, b, _ in by_class.values()), sum(a for _, _, a in by_class.values()), monthly, 0.0,
                       Counted.STATE)


def with_ledger(report: Report, earlier: Sequence[LedgerEntry]) -> Report:
    """``report`` with its ledger section computed from the ``earlier`` runs' entries and its own (an entry
    of its run among ``earlier`` is replaced), at the report's time."""
    entries = [*(e for e in earlier if e.run_id != report.run_id), report.ledger_entry()]
    return replace(report, ledger=cumulative(entries, datetime.fromisoformat(report.generated_at)))


def cumulative(entries: Sequence[LedgerEntry], now: datetime) -> LedgerSummary:
    """The ledger with running totals over the real (not estimated) runs in time order; ``to_date_usd`` is
    what the runs have saved by ``now`` net of their one-off costs (a run saves its monthly figure per month
    from when it finished)."""
    runs = sorted(entries, key=lambda e: (e.finished_at, e.run_id))
    monthly = one_off = accrued = 0.0
    rows = []
    for e in runs:
        if not e.estimate:
            monthly += e.monthly_savings_usd
            one_off += e.one_off_usd
            age = _age_days(e.finished_at, now) or 0.0
            accrued += e.monthly_savings_usd * max(0.0, age) / DAYS_PER_MONTH
        rows.append(LedgerRow(e, monthly, one_off))
    return LedgerSummary(tuple(rows), monthly, one_off, accrued - one_off)
