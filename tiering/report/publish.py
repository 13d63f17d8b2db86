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

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Final

from tiering.cost.model import CostOptions, build_report, cumulative, ledger_entry
from tiering.cost.prices import DEFAULT_REGION, PriceBook, load_prices
from tiering.errors import ConfigError, StorageError
from tiering.plan.scan import Plan
from tiering.report.render import render
from tiering.run.pipeline import RunSettings, plan_files, run_outcomes
from tiering.storage.layout import ledger_key, report_key, run_key, run_result_key
from tiering.storage.objects import ObjectStore
from tiering.storage.store import ObjectAttrs, ObjectNotFound, PreconditionFailed

LATEST: Final = "latest"
LEDGER_SCHEMA_VERSION: Final = 1
MAX_LEDGER_ATTEMPTS: Final = 20
CONTENT_TYPES: Final = {"json": "application/json", "md": "text/markdown; charset=utf-8",
                        "csv": "text/csv; charset=utf-8", "html": "text/html; charset=utf-8"}



@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One run in the ledger: what it saved and cost (see :func:`tiering.cost.model.ledger_entry`)."""

    run_id: str
    finished_at: str
    estimate: bool
    segments_rewritten: int
    bytes_before: int
    bytes_after: int
    monthly_savings_usd: float
    one_off_usd: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> LedgerEntry:
        return cls(str(doc["run_id"]), str(doc["finished_at"]), bool(doc["estimate"]), int(doc["segments_rewritten"]),
                   int(doc["bytes_before"]), int(doc["bytes_after"]), float(doc["monthly_savings_usd"]),
                   float(doc["one_off_usd"]))


@dataclass(frozen=True, slots=True)
class Ledger:
    """The ledger document: every run once, in the order they finished."""

    SCHEMA_VERSION: ClassVar[int] = LEDGER_SCHEMA_VERSION

    runs: tuple[LedgerEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"schema_version": self.SCHEMA_VERSION, "runs": [r.to_json() for r in self.runs]}

    @classmethod
    def from_json(cls, doc: Any, where: str) -> Ledger:
        if not isinstance(doc, dict) or doc.get("schema_version") != cls.SCHEMA_VERSION:
            raise ConfigError("not a ledger this version can read", path=where,
                              expected=f"schema_version {cls.SCHEMA_VERSION}",
                              found=doc.get("schema_version") if isinstance(doc, dict) else type(doc).__name__)
        try:
            return cls(tuple(LedgerEntry.from_json(r) for r in doc["runs"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError("ledger unreadable", path=where, expected="runs of {run_id, finished_at, ...}",
                              found=f"{type(e).__name__}: {e}") from None


def read_ledger(store: ObjectStore, prefix: str) -> tuple[list[dict[str, Any]], str | None]:
    """The ledger's entries (checked against the :class:`Ledger` model) and its ETag; none yet: ([], None)."""
    try:
        doc, etag = store.get_json(ledger_key(prefix))
    except ObjectNotFound:
        return [], None
    ledger = Ledger.from_json(doc, f"s3://{store.bucket}/{ledger_key(prefix)}")
    return [r.to_json() for r in ledger.runs], etag


def record_in_ledger(store: ObjectStore, prefix: str, entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Add (or replace) ``entry`` in the ledger with a compare-and-swap; the ledger as written."""
    for _ in range(MAX_LEDGER_ATTEMPTS):
        runs, etag = read_ledger(store, prefix)
        runs = [*(r for r in runs if r["run_id"] != entry["run_id"]), LedgerEntry.from_json(entry).to_json()]
        runs.sort(key=lambda r: (str(r["finished_at"]), str(r["run_id"])))
        doc = Ledger(tuple(LedgerEntry.from_json(r) for r in runs)).to_json()
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


def assemble(store: ObjectStore, prefix: str, run_id: str, prices: PriceBook, options: CostOptions,
             ledger: list[dict[str, Any]], *, kind: str = "compact") -> dict[str, Any]:
    """The report of ``run_id`` from its run document, and its plan and step results a chunk at a time
    (nothing is written)."""
    run = store.get_json(run_result_key(prefix, run_id, kind))[0]
    settings = RunSettings(store.bucket, prefix, run_id, str((run.get("settings") or {}).get("codec", "")))
    chunked = plan_files(store, settings)
    try:
        auto = chunked.manifest().header.auto or {}
        chunks: Iterable[tuple[Iterable[dict[str, Any]], Iterable[dict[str, Any]]]] | None = (
            ((s.to_json() for s in c.segments), (r.to_json() for r in c.results))
            for c in run_outcomes(store, settings))
    except ObjectNotFound:  # no chunked plan: its document lists its segments
        auto, chunks = {}, None
    plan: list[dict[str, Any]] = []
    if chunks is None:
        try:  # a run of an earlier version of the CLI kept its whole plan in one document
            whole = Plan.from_json(store.get_json(run_key(prefix, run_id, "plan.json"))[0])
            plan, auto = [s.to_json() for s in whole.segments], whole.auto or {}
        except ObjectNotFound:
            pass  # a rollback: no plan
    facts = store.facts(prefix)
    finished = run.get("finished_at")
    now = datetime.fromisoformat(finished) if finished else datetime.now(UTC)
    return build_report(run, plan, prices, options, versioned=facts.versioned,
                        noncurrent_days=facts.noncurrent_expiry_days, ledger=ledger, now=now, auto=auto,
                        chunks=chunks)


def publish_report(store: ObjectStore, prefix: str, run_id: str, prices: PriceBook, options: CostOptions,
                   *, kind: str = "compact") -> tuple[dict[str, Any], dict[str, str]]:
    """Build the report of ``run_id``, record it in the ledger, and write it in every format to the run's key
    and to ``latest``. Returns the report and its keys by format."""
    # The ledger's running totals include this run: record it first, then build with the ledger as written.
    draft = assemble(store, prefix, run_id, prices, options, [], kind=kind)
    runs = record_in_ledger(store, prefix, ledger_entry(draft))
    report = build_report_again(draft, runs)
    keys = {}
    for fmt in ("json", "md", "csv", "html"):
        body = render(report, fmt).encode()
        attrs = ObjectAttrs(headers={"ContentType": CONTENT_TYPES[fmt]})
        for where in (run_id, LATEST):
            store.put_object(report_key(prefix, where, fmt), body, attrs)
        keys[fmt] = report_key(prefix, run_id, fmt)
    return report, keys


def build_report_again(report: dict[str, Any], ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """``report`` with its ledger section recomputed from ``ledger`` (the ledger as it was written)."""
    now = datetime.fromisoformat(report["generated_at"])
    return {**report, "ledger": cumulative(ledger, now)}


def load_report(store: ObjectStore, prefix: str, run_id: str = LATEST) -> dict[str, Any]:
    doc: dict[str, Any] = store.get_json(report_key(prefix, run_id))[0]
    return doc


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
    volume = {} if account_standard_tb is None else {
        cls: round(account_standard_tb * (1 << 40)) for cls in ("STANDARD", "INTELLIGENT_TIERING")}
    return load_prices(region, prices_file), CostOptions(volume, grace_days)
