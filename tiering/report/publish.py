"""Publish a run's report on S3 and keep the ledger of all runs.

    PREFIX/_tiering/reports/<run_id>/report.{json,md,csv,html}
    PREFIX/_tiering/reports/latest/report.{json,md,csv,html}   (the same, at a stable key)
    PREFIX/_tiering/reports/ledger.json                        (one entry per run)

The ledger is updated with a compare-and-swap: read it with its ETag, add or replace this run's entry,
write it with ``If-Match`` (``If-None-Match: *`` for the first one); a concurrent writer makes the write fail
with 412 and the update starts again from a fresh read, so no entry is lost. Publishing again (a retried
task) replaces the run's entry: the ledger holds each run once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from tiering.commit.operation import SegmentResult
from tiering.cost.document import Ledger, LedgerEntry, Report
from tiering.cost.model import CostOptions, build_report, ledger_entry_from_state, with_ledger
from tiering.cost.prices import DEFAULT_REGION, PriceBook, load_prices
from tiering.documents import read, to_builtins
from tiering.errors import ConfigError, StorageError
from tiering.lifecycle.vocabulary import Action, Cause, Counted, RunKind, StorageClass
from tiering.plan.document import Committed, Plan, PlannedSegment
from tiering.plan.planfile import ChunkedPlan, PlanManifest
from tiering.report.render import render
from tiering.run.documents import StepResults
from tiering.run.pipeline import RunSettings, plan_files
from tiering.storage.layout import StepDir, ledger_key, report_key, run_result_key, step_dir, whole_plan_key
from tiering.storage.objects import ObjectAttrs, ObjectNotFound, ObjectStore, PreconditionFailed

LATEST: Final = "latest"
MAX_LEDGER_ATTEMPTS: Final = 20
CONTENT_TYPES: Final = {"json": "application/json", "md": "text/markdown; charset=utf-8",
                        "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}



def read_ledger(store: ObjectStore, prefix: str) -> tuple[list[LedgerEntry], str | None]:
    """The ledger's entries and its ETag; none yet: ([], None)."""
    try:
        doc, etag = store.get_json(ledger_key(prefix))
    except ObjectNotFound:
        return [], None
    where = f"s3://{store.bucket}/{ledger_key(prefix)}"
    return list(read(doc, Ledger, what="a ledger", where=where).runs), etag


def record_in_ledger(store: ObjectStore, prefix: str, entry: LedgerEntry,
                     found: Iterable[LedgerEntry] = ()) -> list[LedgerEntry]:
    """Add (or replace) ``entry`` in the ledger with a compare-and-swap; the ledger as written. ``found``: runs
    counted from the partitions' states (:func:`state_entries`), each added where the ledger has no entry of
    that run, or one counted from the states with fewer segments (an earlier scan saw fewer partitions);
    never over a run's own report."""
    found = list(found)
    for _ in range(MAX_LEDGER_ATTEMPTS):
        earlier, etag = read_ledger(store, prefix)
        by_run = {r.run_id: r for r in earlier}
        for f in found:
            have = by_run.get(f.run_id)
            if have is None or (have.counted_from is Counted.STATE and have.segments_rewritten < f.segments_rewritten):
                by_run[f.run_id] = f
        by_run[entry.run_id] = entry
        runs = sorted(by_run.values(), key=lambda r: (r.finished_at, r.run_id))
        doc = to_builtins(Ledger(tuple(runs)))
        try:
            if etag is None:
                store.put_json(ledger_key(prefix), doc, if_none_match=True)
            else:
                store.put_json(ledger_key(prefix), doc, if_match=etag)
            return runs
        except PreconditionFailed:
            continue  # another run wrote it first: read again
    raise StorageError(f"the ledger kept changing under {MAX_LEDGER_ATTEMPTS} attempts to update it",
                          path=f"s3://{store.bucket}/{ledger_key(prefix)}")


RUN_KINDS: Final = (RunKind.COMPACT, RunKind.MERGE, RunKind.COMPACT_KEYS)  # the runs that have a savings report
_STEPS: Final = {RunKind.COMPACT: StepDir.COMPACT, RunKind.COMPACT_KEYS: StepDir.KEYS, RunKind.MERGE: StepDir.MERGE}


def _unrun(run_id: str, *, dry: bool) -> Callable[[PlannedSegment], bool]:
    """Which plan entries the report lists as the plan has them: a dry run's every one; else those the run
    did not work on and did not note (its step documents give those: the budget's skips, an earlier
    attempt's compactions, the segments it compacted or repaired)."""
    if dry:
        return lambda s: True
    return lambda s: (s.action not in (Action.COMPACT, Action.REPAIR) and s.cause is not Cause.BUDGET
                      and s.compacted_by != run_id)


Chunk = tuple[Iterable[dict[str, Any]], Iterable[dict[str, Any]]]  # plan entries and results, joined by _rows


def _step(store: ObjectStore, key: str) -> StepResults:
    return StepResults.from_json(store.get_json(key)[0], f"s3://{store.bucket}/{key}")


def _joined(store: ObjectStore, docs: list[str], chunked: ChunkedPlan, manifest: PlanManifest,
            unrun: Callable[[PlannedSegment], bool]) -> Iterator[Chunk]:
    """A compaction run's rows, one segment each, a step document or a plan chunk at a time: the run's own
    results (those a step document holds); then the plan's entries it did not work on, each with the result of
    the operation another run left there that it finished, if any (a segment's own result wins over such a
    one, a result over its plan entry); then those operations' results on segments the plan does not list.
    The step documents are read twice: first for the operations of other runs they finished (a few, held)."""
    others: dict[tuple[str, int], SegmentResult] = {}
    for key in docs:
        for r in _step(store, key).results:
            if r.recovered:
                others.setdefault((r.directory, r.base_offset), r)
    for key in docs:
        own = [r for r in _step(store, key).results if not r.recovered]
        for r in own:
            others.pop((r.directory, r.base_offset), None)
        yield (), [r.to_json() for r in own]
    for info in manifest.chunks:
        entries = [s for s in chunked.chunk(info.key) if unrun(s) or (s.directory, s.base_offset) in others]
        yield ([s.to_json() for s in entries],
               [others.pop(k).to_json() for s in entries if (k := (s.directory, s.base_offset)) in others])
    yield (), [r.to_json() for r in others.values()]


def _kind_of(store: ObjectStore, prefix: str, run_id: str) -> RunKind:
    for kind in RUN_KINDS[:-1]:
        try:
            store.head(run_result_key(prefix, run_id, kind))
            return kind
        except ObjectNotFound:
            continue
    return RUN_KINDS[-1]


def assemble(store: ObjectStore, prefix: str, run_id: str, prices: PriceBook, options: CostOptions,
             ledger: list[LedgerEntry], *, kind: RunKind | None = None) -> Report:
    """The report of ``run_id`` from its run document (of ``kind``; None: whichever of :data:`RUN_KINDS` the
    run has), its step documents' results one document at a time and its plan's entries a chunk at a time
    (:func:`_joined`; nothing is written)."""
    kind = kind or _kind_of(store, prefix, run_id)
    run = store.get_json(run_result_key(prefix, run_id, kind))[0]
    step = _STEPS.get(kind)
    docs = [info.key for info in store.list(step_dir(prefix, run_id, step))] if step is not None else []
    chunked = plan_files(store, RunSettings(store.bucket, prefix, run_id))
    not_planned: Mapping[str, int] = {}
    chunks: Iterable[Chunk] | None = None
    legacy: list[dict[str, Any]] = []
    try:
        manifest = chunked.manifest()
        auto, not_planned = manifest.header.auto or {}, manifest.header.ignored_by_reason
        dry = bool((run.get("settings") or {}).get("estimate"))
        if docs or dry or not run.get("segments"):
            chunks = _joined(store, docs, chunked, manifest, _unrun(run_id, dry=dry))
        else:  # a run of an earlier version, its results in other documents: its document's listing
            legacy = [s.to_json() for s in chunked.segments(manifest)]
    except ObjectNotFound:  # no chunked plan (key compaction, merging): the step documents alone
        auto = {}
        if step is not None:
            chunks = (((), [r.to_json() for r in _step(store, key).results]) for key in docs)
    plan: list[dict[str, Any]] = legacy
    if chunks is None and not legacy:
        try:  # a run of an earlier version of the CLI kept its whole plan in one document
            whole = Plan.from_json(store.get_json(whole_plan_key(prefix, run_id))[0])
            plan, auto = [s.to_json() for s in whole.segments], whole.auto or {}
        except ObjectNotFound:
            pass  # a rollback: no plan
    facts = store.facts(prefix)
    finished = run.get("finished_at")
    now = datetime.fromisoformat(finished) if finished else datetime.now(UTC)
    return build_report(run, plan, prices, options, versioned=facts.versioned,
                        noncurrent_days=facts.noncurrent_expiry_days, ledger=ledger, now=now, auto=auto,
                        chunks=chunks, not_planned=not_planned)


def state_entries(store: ObjectStore, prefix: str, run_id: str, prices: PriceBook,
                  options: CostOptions) -> list[LedgerEntry]:
    """The other runs whose generations the scan of ``run_id`` found in the partitions' states, each counted
    from them (:class:`Committed`): a run killed before its report, or run without one, is in the ledger
    all the same. None for a run without a scan (key compaction, a merge)."""
    try:
        header = plan_files(store, RunSettings(store.bucket, prefix, run_id, "")).manifest().header
    except ObjectNotFound:
        return []
    runs: dict[str, list[Committed]] = {}
    for c in header.committed:
        if c.run_id != run_id:
            runs.setdefault(c.run_id, []).append(c)
    if not runs:
        return []
    facts = store.facts(prefix)
    saving = not (facts.versioned and facts.noncurrent_expiry_days is None)
    return [ledger_entry_from_state(
        run, max((c.recorded_at for c in rows if c.recorded_at), default=header.created_at),
        {c.storage_class: (c.segments, c.bytes_before, c.bytes_after) for c in rows}, prices, options, saving=saving)
        for run, rows in sorted(runs.items())]


def publish_report(store: ObjectStore, prefix: str, run_id: str, prices: PriceBook, options: CostOptions,
                   *, kind: RunKind | None = None) -> tuple[Report, dict[str, str]]:
    """Build the report of ``run_id``, record it in the ledger, and write it in every format to the run's key
    and to ``latest``. Returns the report and its keys by format."""
    # The ledger's running totals include this run: record it first, then build with the ledger as written.
    draft = assemble(store, prefix, run_id, prices, options, [], kind=kind)
    found = state_entries(store, prefix, run_id, prices, options)
    report = with_ledger(draft, record_in_ledger(store, prefix, draft.ledger_entry(), found))
    keys = {}
    for fmt in ("json", "md", "csv", "html"):
        body = render(report, fmt).encode()
        attrs = ObjectAttrs(headers={"ContentType": CONTENT_TYPES[fmt]})
        for where in (run_id, LATEST):
            store.put_object(report_key(prefix, where, fmt), body, attrs)
        keys[fmt] = report_key(prefix, run_id, fmt)
    return report, keys


def load_report(store: ObjectStore, prefix: str, run_id: str = LATEST) -> Report:
    key = report_key(prefix, run_id)
    return Report.from_json(store.get_json(key)[0], f"s3://{store.bucket}/{key}")


def cost_config(*, region: str | None = None, prices_file: str | None = None,
                account_standard_tb: float | None = None, grace_days: float = 7.0) -> tuple[PriceBook, CostOptions]:
    """Prices and options from explicit values, else the environment: ``TIERING_PRICE_REGION`` (default the
    AWS region, else us-east-1), ``TIERING_PRICES_FILE``, ``TIERING_ACCOUNT_STANDARD_TB`` (the account's
    current S3 Standard volume in the region, in TB of 2^40 bytes: it decides the volume tier)."""
    region = (region or os.environ.get("TIERING_PRICE_REGION") or os.environ.get("AWS_REGION")
              or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION)
    prices_file = prices_file or os.environ.get("TIERING_PRICES_FILE") or None
    if account_standard_tb is None and os.environ.get("TIERING_ACCOUNT_STANDARD_TB"):
        try:
            account_standard_tb = float(os.environ["TIERING_ACCOUNT_STANDARD_TB"])
        except ValueError:
            raise ConfigError("TIERING_ACCOUNT_STANDARD_TB is not a number",
                              found=os.environ["TIERING_ACCOUNT_STANDARD_TB"]) from None
    volume: dict[str, int] = {} if account_standard_tb is None else {
        cls: round(account_standard_tb * (1 << 40)) for cls in (StorageClass.STANDARD,
                                                               StorageClass.INTELLIGENT_TIERING)}
    return load_prices(region, prices_file), CostOptions(volume, grace_days)
