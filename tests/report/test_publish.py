"""Publishing on S3 (moto): the report's keys in every format, the ledger's compare-and-swap, what the bucket
says about versioning, and ``tiering report``."""

from __future__ import annotations

import csv
import io
import json
import threading
from io import StringIO
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from tests.s3.conftest import BUCKET, PREFIX, TOPIC, context, plan_for, seed
from tiering.cli import main
from tiering.cost.document import LedgerEntry
from tiering.cost.model import CostOptions
from tiering.cost.prices import GB, load_prices
from tiering.lifecycle.vocabulary import Counted, RunKind, Status
from tiering.report.publish import LATEST, load_report, publish_report, read_ledger, record_in_ledger
from tiering.run.documents import CompactOptions
from tiering.run.pipeline import compact
from tiering.storage.layout import ledger_key, report_key, run_result_key
from tiering.storage.objects import ObjectNotFound
from tiering.storage.s3 import S3Store, make_client

PRICES = load_prices("us-east-1")


def _compact(store: S3Store, run_id: str = "run-1") -> Any:
    seed(store, segments=3)
    seed(store, partition=1, segments=2, kind="logs")
    return compact(store, plan_for(store), context(store, run_id), CompactOptions())


def test_a_published_report_is_in_every_format_at_the_run_and_latest(store: S3Store) -> None:
    run = _compact(store)
    report, keys = publish_report(store, PREFIX, "run-1", PRICES, CostOptions())
    assert set(keys) == {"json", "md", "csv", "html"}
    for fmt, key in keys.items():
        assert key == report_key(PREFIX, "run-1", fmt)
        body = store.get(key)
        assert body == store.get(report_key(PREFIX, LATEST, fmt))
        assert store.head(key).size == len(body) > 0
    assert store.client.head_object(Bucket=BUCKET, Key=keys["html"])["ContentType"].startswith("text/html")
    doc = load_report(store, PREFIX)
    assert json.loads(store.get(keys["json"]))["schema_version"] == 1
    assert doc == report
    t = doc.totals
    done = [s for s in run.segments if s.status == "compacted"]
    assert t.bytes_before == sum(s.bytes_before for s in done) == run.totals()["bytes_before"]
    assert t.bytes_after == sum(s.bytes_after for s in done)
    assert t.monthly_savings_usd == pytest.approx((t.bytes_before - t.bytes_after) / GB * 0.023)
    rows = list(csv.DictReader(io.StringIO(store.get(keys["csv"]).decode())))
    assert len(rows) == len(report.segments) == 5  # 3 sealed + 2 active
    assert "## By topic" in store.get(keys["md"]).decode()
    # Requests were counted by the run: it listed, read, wrote and copied.
    ops = doc.requests_by_operation
    assert ops["ListObjectsV2"] > 0
    assert ops["CopyObject"] == 3 * len(done) + 1  # .log, .index and .timeindex backed up; the run's swap probe
    assert ops["GetObject"] >= len(done)


def test_publishing_again_keeps_one_ledger_entry_per_run(store: S3Store) -> None:
    _compact(store)
    first, _ = publish_report(store, PREFIX, "run-1", PRICES, CostOptions())
    again, _ = publish_report(store, PREFIX, "run-1", PRICES, CostOptions())
    runs, _ = read_ledger(store, PREFIX)
    assert [r.run_id for r in runs] == ["run-1"]
    assert again.totals == first.totals
    second = compact(store, plan_for(store), context(store, "run-2"), CompactOptions())
    assert second.totals().get("compacted", 0) == 0
    rep, _ = publish_report(store, PREFIX, "run-2", PRICES, CostOptions())
    assert [r.entry.run_id for r in rep.ledger.runs] == ["run-1", "run-2"]
    assert rep.ledger.monthly_run_rate_usd == pytest.approx(first.totals.monthly_savings_usd)


def test_concurrent_ledger_updates_lose_no_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight runs record themselves at once through a moto server (real HTTP, real If-Match)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name, value in (("AWS_ENDPOINT_URL", f"http://{host}:{port}"), ("AWS_ACCESS_KEY_ID", "testing"),
                            ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(name, value)
        make_client().create_bucket(Bucket="ledger")
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def writer(i: int) -> None:
            own = S3Store(make_client(), "ledger")  # each writer its own client, as separate runs have
            barrier.wait()
            try:
                record_in_ledger(own, PREFIX, LedgerEntry(f"r{i:02d}", f"2026-11-22T00:00:{i:02d}", False, 1, 2, 1,
                                                          1.0, 0.1))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        check = S3Store(make_client(), "ledger")
        runs, etag = read_ledger(check, PREFIX)
        assert sorted(r.run_id for r in runs) == [f"r{i:02d}" for i in range(8)]
        assert etag is not None
        assert json.loads(check.get(ledger_key(PREFIX)))["schema_version"] == 1
    finally:
        server.stop()


class Killed(Exception):
    """The process dies here (nothing in the package catches it)."""


def _logs(store: S3Store) -> dict[str, int]:
    return {o.key: o.size for o in store.list(PREFIX + "/") if o.key.endswith(".log") and "/_tiering/" not in o.key}


def test_a_run_killed_before_its_report_is_counted_once_from_the_partitions_state(store: S3Store) -> None:
    """Run K compacts one topic and dies writing its run document (no document, no report); run N, a new
    id, compacts the other topic. N's report puts K in the ledger from the partitions' state, and the ledger
    adds up to what the bucket really saved, however often it is published; K retried under its own id
    later counts itself from its report instead, once."""
    seed(store, segments=3)
    seed(store, segments=3, topic="clicks")
    originals = _logs(store)
    doc_key = run_result_key(PREFIX, "run-K", RunKind.COMPACT)

    def die(params: dict[str, Any], **_: Any) -> None:
        if params.get("Key") == doc_key:
            raise Killed(doc_key)

    store.client.meta.events.register("before-parameter-build.s3.PutObject", die)
    with pytest.raises(Killed):
        compact(store, plan_for(store, topics=TOPIC), context(store, "run-K"), CompactOptions())
    store.client.meta.events.unregister("before-parameter-build.s3.PutObject", die)
    with pytest.raises(ObjectNotFound):
        store.head(doc_key)
    k_saved = sum(originals.values()) - sum(_logs(store).values())
    assert k_saved > 0

    run_n = compact(store, plan_for(store), context(store, "run-N"), CompactOptions())
    assert {s.directory for s in run_n.segments if s.status == Status.COMPACTED} == {"clicks-0"}
    for _ in range(2):
        report, _ = publish_report(store, PREFIX, "run-N", PRICES, CostOptions())
        runs, _ = read_ledger(store, PREFIX)
        by_run = {r.run_id: r for r in runs}
        assert sorted(by_run) == ["run-K", "run-N"]
        assert [by_run[r].counted_from for r in ("run-K", "run-N")] == [Counted.STATE, Counted.REPORT]
        k = by_run["run-K"]
        assert (k.segments_rewritten, k.bytes_before - k.bytes_after) == (2, k_saved)
        assert k.monthly_savings_usd == pytest.approx(k_saved / GB * 0.023)
        assert k.one_off_usd == 0.0
        assert sum(r.bytes_before - r.bytes_after for r in runs) == sum(originals.values()) - sum(
            _logs(store).values())
        assert report.ledger.monthly_run_rate_usd == pytest.approx(
            k.monthly_savings_usd + report.totals.monthly_savings_usd)
    assert "counted from the partitions' state" in store.get(report_key(PREFIX, "run-N", "md")).decode()

    compact(store, plan_for(store, topics=TOPIC), context(store, "run-K"), CompactOptions())
    publish_report(store, PREFIX, "run-K", PRICES, CostOptions())
    runs, _ = read_ledger(store, PREFIX)
    assert [(r.run_id, r.counted_from) for r in sorted(runs, key=lambda r: r.run_id)] == [
        ("run-K", Counted.REPORT), ("run-N", Counted.REPORT)]
    assert sum(r.bytes_before - r.bytes_after for r in runs) == sum(originals.values()) - sum(_logs(store).values())


def test_bucket_facts_versioning_and_noncurrent_expiry(store: S3Store) -> None:
    assert (store.facts(PREFIX).versioned, store.facts(PREFIX).noncurrent_expiry_days) == (False, None)
    store.client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    assert (store.facts(PREFIX).versioned, store.facts(PREFIX).noncurrent_expiry_days) == (True, None)
    store.client.put_bucket_lifecycle_configuration(Bucket=BUCKET, LifecycleConfiguration={"Rules": [
        {"ID": "other", "Status": "Enabled", "Filter": {"Prefix": "elsewhere/"},
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1}},
        {"ID": "ours", "Status": "Enabled", "Filter": {"Prefix": PREFIX.split("/")[0]},
         "NoncurrentVersionExpiration": {"NoncurrentDays": 14}}]})
    assert store.facts(PREFIX).noncurrent_expiry_days == 14


def test_a_versioned_bucket_without_a_rule_is_warned_about(store: S3Store) -> None:
    store.client.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    _compact(store)
    report, _ = publish_report(store, PREFIX, "run-1", PRICES, CostOptions())
    assert report.assumptions.versioned is True
    assert report.totals.monthly_savings_usd < 0
    assert report.warnings


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_cli_compact_publishes_and_report_prints_every_format(store: S3Store) -> None:
    seed(store, segments=3)
    where = ["--bucket", BUCKET, "--prefix", PREFIX]
    code, out, _ = _cli("s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--run-id", "cli-run",
                        "--json")
    assert code == 0
    assert json.loads(out)["run_id"] == "cli-run"
    code, out, _ = _cli("report", *where)
    assert code == 0
    assert "per TiB of such data" in out
    assert "this prefix, per year" in out
    assert "orders.v1" in out
    assert "not planned by the scan, because" in out
    code, out, _ = _cli("report", *where, "--run-id", "cli-run", "--format", "json")
    doc = json.loads(out)
    assert doc["run_id"] == "cli-run"
    assert doc["totals"]["segments_rewritten"] == 2
    # The scan's objects it did not plan, by reason: the active segment's three, the partition's two files.
    assert doc["objects_not_planned"] == {"active segment": 3, "partition file: kept as it is": 2}
    _, md, _ = _cli("report", *where, "--format", "md")
    assert md.startswith("# compaction report")
    assert "## Objects not planned" in md
    _, text, _ = _cli("report", *where, "--format", "csv")
    assert text.splitlines()[0].startswith("topic,partition")
    _, page, _ = _cli("report", *where, "--format", "html")
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page
    # Priced again for a bigger account (deep in Standard's third tier), nothing written.
    code, out, _ = _cli("report", *where, "--json", "--account-standard-tb", "600")
    repriced = json.loads(out)
    assert repriced["totals"]["monthly_savings_usd"] == pytest.approx(doc["totals"]["saved_bytes"] / GB * 0.021)
    assert load_report(store, PREFIX).totals.monthly_savings_usd == pytest.approx(
        doc["totals"]["monthly_savings_usd"])


def test_cli_report_of_a_missing_run_is_a_clear_error(store: S3Store) -> None:
    code, _, err = _cli("report", "--bucket", BUCKET, "--prefix", PREFIX, "--run-id", "nope")
    assert code == 2
    assert "nope/report.json" in err


def test_cli_report_help_explains_formats() -> None:
    out = StringIO()
    assert main(["report", "--help"], stdout=out) == 0
    for word in ("table", "json", "md", "csv", "html", "--run-id", "--prices", "--account-standard-tb"):
        assert word in out.getvalue()
