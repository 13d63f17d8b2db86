"""Every document of ``tests/data/documents``, written by the code of an earlier commit, read back by the
readers production uses today: each reader accepts what was written, and writes it again as it was.

The corpus is the past (``tests/data/documents/README.md`` says which commit wrote it): a change that makes
one of these fail changes what a bucket (or a plan file, or an XCom) written by that commit reads as. Fix
the reader, never the corpus.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest

from tiering.commit.lease import LeaseRecord
from tiering.cost.document import Ledger, Report
from tiering.cost.forecast import Forecast
from tiering.cost.model import CostOptions, build_report
from tiering.cost.prices import load_prices
from tiering.documents import Document, kind_of, read, write
from tiering.lifecycle.journal import read_journal
from tiering.lifecycle.state import PartitionState
from tiering.plan.document import Plan
from tiering.plan.inventory import InventoryManifest
from tiering.plan.planfile import PlanManifest, json_lines, read_chunk
from tiering.run.cleanup import CleanupPartition
from tiering.run.compaction import CompactPartition
from tiering.run.documents import RunResult, StepResults, StepUsage
from tiering.run.keycompact import KeyPartition
from tiering.run.merge import MergePartition
from tiering.run.pipeline import PlanStep
from tiering.run.rollback import RollbackPartition
from tiering.run.tier import TierPartition, TierPlan, TierReport
from tiering.steps.storage_classes import TierStep

CORPUS: Final = Path(__file__).parent / "data" / "documents"


def _doc(path: Path) -> Any:
    return json.loads(path.read_bytes())


def _where(path: Path) -> str:
    return str(path.relative_to(CORPUS))


def _plan(path: Path) -> None:
    """``tiering s3 scan --out``'s file, as ``tiering s3 compact --plan`` reads it."""
    doc = _doc(path)
    plan = Plan.from_json(doc)
    assert plan.segments
    assert plan.to_json() == doc


def _plan_manifest(path: Path) -> None:
    doc = _doc(path)
    manifest = PlanManifest.from_json(doc)
    assert manifest.chunks
    assert manifest.to_json() == doc


def _plan_chunk(path: Path) -> None:
    lines = list(json_lines(path.open("rb"), _where(path)))
    with path.open("rb") as body:
        segments = list(read_chunk(body, _where(path)))
    assert segments
    assert [s.to_json() for s in segments] == lines


def _work(read: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A run's plan chunk of one kind (``runs/<run>/<step>-plan/``): each line a partition's work, read by the
    kind's ``partition_from_json`` (which is the class's ``from_json``)."""
    def check(path: Path) -> None:
        with path.open("rb") as body:
            lines = list(json_lines(body, _where(path)))
        assert lines
        for line in lines:
            part = read(line["work"])
            assert part.directory == line["directory"]
            assert part.to_json() == line["work"]
    return check


def _journal(path: Path) -> None:
    doc = _doc(path)
    assert read_journal(doc, where=_where(path)).to_json() == doc


def _within(new: Any, old: Any) -> bool:
    """Whether every field of ``new`` is in ``old`` with the same value (lists element by element), or holds
    nothing (null, empty: what its absence read as): a declared writer invents nothing, and what it leaves out
    (a field at its default) reads back as it was."""
    if isinstance(new, dict):
        return isinstance(old, dict) and all(_within(v, old[k]) if k in old else v in (None, [], {})
                                             for k, v in new.items())
    if isinstance(new, list):
        return isinstance(old, list) and len(new) == len(old) and all(map(_within, new, old))
    return bool(new == old)


def _declared(cls: type[Document], what: str) -> Callable[[Path], None]:
    """A kind declared as a :class:`Document`: the one reader reads it, and writes it again naming its kind,
    with nothing that was not there, and reading that gives the same document."""
    def check(path: Path) -> None:
        doc = _doc(path)
        read_back = read(path.read_bytes(), cls, what=what, where=_where(path))
        assert read(doc, cls, what=what) == read_back
        again = json.loads(write(read_back))
        assert again.pop("kind") == kind_of(cls)
        assert _within(again, doc)
        assert read(again, cls, what=what) == read_back
    return check


_state = _declared(PartitionState, "a partition state document")


_lease = _declared(LeaseRecord, "a lease")


def _step_results(path: Path) -> None:
    doc = _doc(path)
    assert StepResults.from_json(doc, _where(path)).to_json() == doc


_step_usage = _declared(StepUsage, "a step's usage")


def _run(path: Path) -> None:
    doc = _doc(path)
    assert RunResult.from_json(doc, _where(path)).to_json() == doc


def _tier_plan(path: Path) -> None:
    doc = _doc(path)
    assert TierPlan.from_json(doc).to_json() == doc


def _tier_report(path: Path) -> None:
    doc = _doc(path)
    assert TierReport.from_json(doc).to_json() == doc


def _report(path: Path) -> None:
    doc = _doc(path)
    assert Report.from_json(doc, _where(path)).to_json() == doc


_ledger = _declared(Ledger, "a ledger")


def _inventory(path: Path) -> None:
    """The demo's S3 Inventory manifest (AWS's format: no ``to_json``, so its fields are checked)."""
    doc = _doc(path)
    manifest = InventoryManifest.from_json(doc, _where(path))
    assert manifest.source_bucket == doc["sourceBucket"]
    assert doc["destinationBucket"] == f"arn:aws:s3:::{manifest.destination_bucket}"
    assert manifest.file_format == doc["fileFormat"]
    assert ", ".join(manifest.columns) == doc["fileSchema"]
    assert [(f.key, f.size, f.md5) for f in manifest.files] == [(f["key"], f["size"], f["MD5checksum"])
                                                                for f in doc["files"]]
    assert manifest.created_at is not None
    assert int(manifest.created_at.timestamp() * 1000) == int(doc["creationTimestamp"])


def _plan_step(path: Path) -> None:
    """The compaction DAG's plan task's XCom, as its compaction task reads it."""
    doc = _doc(path)
    assert PlanStep.from_json(doc).to_json() == doc


def _tier_step(path: Path) -> None:
    """The tiering DAG's tier task's XCom, as its report task reads it."""
    doc = _doc(path)
    assert TierStep.from_json(doc).to_json() == doc


# Every kind of document, by its directory in the corpus, with the reader production reads it with.
READERS: Final[dict[str, Callable[[Path], None]]] = {
    "plan": _plan,
    "plan-manifest": _plan_manifest,
    "plan-chunk": _plan_chunk,
    "compact-work": _work(CompactPartition.from_json),
    "keys-work": _work(KeyPartition.from_json),
    "merge-work": _work(MergePartition.from_json),
    "tier-work": _work(TierPartition.from_json),
    "rollback-work": _work(RollbackPartition.from_json),
    "cleanup-work": _work(CleanupPartition.from_json),
    "journal": _journal,
    "partition-state": _state,
    "lease": _lease,
    "step-results": _step_results,
    "step-usage": _step_usage,
    "run": _run,
    "tier-plan": _tier_plan,
    "tier-report": _tier_report,
    "report": _report,
    "ledger": _ledger,
    "s3-inventory-manifest": _inventory,
    "plan-step": _plan_step,
    "tier-step": _tier_step,
}


def _files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*/*") if p.is_file() and p.parent.name != "__pycache__")


@pytest.mark.parametrize("path", _files(), ids=_where)
def test_todays_reader_reads_the_document_as_written(path: Path) -> None:
    assert path.parent.name in READERS, f"no reader for the documents of {path.parent.name}/"
    READERS[path.parent.name](path)


# Where a forecast (``tiering.forecast``) is written: inside other documents only.
FORECASTS: Final = (("plan", ("estimate",)), ("plan-manifest", ("estimate",)), ("run", ("settings", "estimate")),
                    ("report", ("estimate_detail", "forecast")))


def _forecasts() -> Iterator[tuple[str, Any]]:
    for kind, at in FORECASTS:
        for path in sorted((CORPUS / kind).glob("*.json")):
            doc = _doc(path)
            for name in at:
                doc = (doc or {}).get(name)
            if doc is not None:
                yield f"{_where(path)}:{'.'.join(at)}", doc


@pytest.mark.parametrize(("where", "doc"), list(_forecasts()), ids=[w for w, _ in _forecasts()])
def test_todays_reader_reads_each_forecast_as_written(where: str, doc: dict[str, Any]) -> None:
    assert Forecast.from_json(doc, where).to_json() == doc


# The run documents a savings report is made from: it reads them as they are, not through RunResult.
REPORTED: Final = ("compact", "compact-keys", "merge")


def _reported_runs() -> list[Path]:
    return [p for p in sorted((CORPUS / "run").glob("*.json")) if _doc(p)["kind"] in REPORTED]


@pytest.mark.parametrize("path", _reported_runs(), ids=_where)
def test_the_savings_report_reads_the_run_document(path: Path) -> None:
    doc = _doc(path)
    report = build_report(doc, [], load_prices("us-east-1"), CostOptions(), versioned=False, noncurrent_days=None,
                          now=datetime.fromisoformat(doc["finished_at"]))
    assert (report.run_id, report.bucket, report.prefix) == (doc["run_id"], doc["bucket"], doc["prefix"])
    assert report.totals.segments_seen == len(doc["segments"])
    estimate = doc["settings"].get("estimate")
    assert report.estimate is (estimate is not None)
    if estimate is not None:
        assert report.estimate_detail is not None
        assert report.estimate_detail.forecast.to_json() == estimate


def test_the_corpus_holds_every_kind_of_document() -> None:
    """A kind without a document, or documents of a kind without a reader, fail here."""
    kinds = {p.parent.name for p in _files()}
    assert sorted(set(READERS) - kinds) == [], "kinds without a document in the corpus"
    assert sorted(kinds - set(READERS)) == [], "documents of a kind this test has no reader for"
    assert list(_forecasts()), "no forecast in any document"
    assert _reported_runs(), "no run document a savings report is made from"
