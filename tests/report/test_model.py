"""The cost model against hand calculations: tiers, minimum sizes and durations, one-off costs, payback,
dry runs, versioned buckets, and the edge cases (nothing, all skipped, bigger)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tiering.cost.document import LedgerEntry, Listing, NotRewritten, Report, row_status
from tiering.cost.forecast import Forecast, Stratum
from tiering.cost.model import KMS_CALLS_PER_SEGMENT, CostOptions, build_report, cumulative, source_codec
from tiering.cost.prices import DAYS_PER_MONTH, GB, load_prices
from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import Status
from tiering.report.render import FORMATS, render

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
M = 730 / 24  # days per billing month
PRICES = load_prices("us-east-1")
VCPU_HOUR = 0.052624 + 4 * 0.0057785


def seg(directory: str, base: int, *, action: str = "compact", reason: str = "", size: int = GB,
        storage_class: str = "STANDARD", age_days: float = 100, cause: str | None = None) -> dict[str, Any]:
    when = (NOW - timedelta(days=age_days)).isoformat()
    return {"directory": directory, "topic": directory.rsplit("-", 1)[0], "partition": int(directory.rsplit("-", 1)[1]),
            "base_offset": base, "action": action, "reason": reason, "cause": cause,
            "log": {"key": f"p/{directory}/{base:020d}.log", "size": size, "etag": '"x"', "last_modified": when,
                    "storage_class": storage_class}}


def result(directory: str, base: int, before: int, after: int, status: str = "compacted", **extra: Any
           ) -> dict[str, Any]:
    return {"directory": directory, "base_offset": base, "status": status, "bytes_before": before,
            "bytes_after": after, "stats": {"codecs_before": {"snappy": 9, "none": 1}}, **extra}


def run_doc(results: list[dict[str, Any]], usage: dict[str, Any] | None = None, **settings: Any) -> dict[str, Any]:
    return {"run_id": "r1", "bucket": "b", "prefix": "p", "started_at": NOW.isoformat(),
            "finished_at": NOW.isoformat(), "settings": {"codec": "zstd", **settings}, "segments": results,
            "usage": usage or {"requests": {}, "compute_seconds": 0.0}}


def report(run: dict[str, Any], plan: list[dict[str, Any]], options: CostOptions | None = None,
           versioned: bool = False, noncurrent_days: int | None = None, **kw: Any) -> Report:
    return build_report(run, plan, PRICES, options or CostOptions(grace_days=7), versioned=versioned,
                        noncurrent_days=noncurrent_days, now=NOW, **kw)


def forecast(ratio: float, stderr: float, *, sampled: int = 2, size: int = 1000) -> dict[str, Any]:
    """The JSON of a dry run's forecast: one stratum, topic ``t`` (partition ``t-0``) from snappy."""
    stratum = Stratum("t", "snappy", 1, 1, size, sampled, 500 * sampled, ratio, stderr)
    return Forecast("test", 16, 4 << 20, (stratum,), {"t-0": "snappy"}).to_json()


def one_off(rep: Report, prefix: str) -> float:
    (usd,) = [c.usd for c in rep.one_off if c.item.startswith(prefix)]
    return usd


def test_standard_and_infrequent_access_by_hand() -> None:
    plan = [seg("events-0", 0),
            seg("events-0", 100, action="skip", reason="active: the partition's newest", cause="active"),
            seg("logs-0", 0, size=2 * GB, storage_class="STANDARD_IA", age_days=10)]
    usage = {"requests": {"events-0": {"PutObject": 1000, "GetObject": 1000, "DeleteObject": 50},
                          "logs-0": {"PutObject": 1000, "HeadObject": 2000}, "_run": {"ListObjectsV2": 10}},
             "compute_seconds": 3600.0}
    run = run_doc([result("events-0", 0, GB, GB // 4), result("logs-0", 0, 2 * GB, GB)], usage)
    rep = report(run, plan)
    t = rep.totals
    monthly = 0.75 * 0.023 + 1.0 * 0.0125
    assert t.monthly_savings_usd == pytest.approx(monthly)
    assert t.yearly_savings_usd == pytest.approx(12 * monthly)
    assert (t.bytes_before, t.bytes_after, t.saved_bytes) == (3 * GB, GB + GB // 4, 3 * GB - GB - GB // 4)
    assert one_off(rep, "S3 requests") == pytest.approx(0.005 + 0.0004 + 0.01 + 2 * 0.001 + 10 * 0.005 / 1000)
    assert one_off(rep, "Compute") == pytest.approx(VCPU_HOUR)
    assert one_off(rep, "Retrieval") == pytest.approx(2 * 2 * 0.01)  # IA source read once, copied once
    assert one_off(rep, "Early deletion") == pytest.approx(2 * 0.0125 * (30 - 10) / M)
    grace = 1 * 0.023 * 7 / M + 2 * 0.0125 * 30 / M  # the IA copy is billed its 30-day minimum
    assert one_off(rep, "Originals kept") == pytest.approx(grace)
    assert one_off(rep, "Noncurrent") == 0
    assert one_off(rep, "KMS") == 0
    assert t.one_off_usd == pytest.approx(sum(c.usd for c in rep.one_off))
    assert t.payback_months == pytest.approx(t.one_off_usd / monthly)
    assert t.net_first_year_usd == pytest.approx(12 * monthly - t.one_off_usd)
    by_class = {r.name: r.monthly_savings_usd for r in rep.by_storage_class}
    assert by_class == pytest.approx({"STANDARD": 0.75 * 0.023, "STANDARD_IA": 0.0125})
    assert {r.name: r.monthly_savings_usd for r in rep.by_topic} == pytest.approx(
        {"events": 0.75 * 0.023, "logs": 0.0125})
    assert rep.by_source_codec[0].name == "snappy"
    assert rep.skipped == (NotRewritten(Status.SKIPPED, "active", 1),)
    assert rep.requests_by_operation["DeleteObject"] == 50


def test_savings_come_off_the_marginal_volume_tier() -> None:
    # The account holds 50 TB + 100 GB of Standard; the run frees 200 GB: 100 GB at 0.022, 100 GB at 0.023.
    volume = (51_200 + 100) * GB
    run = run_doc([result("t-0", 0, 300 * GB, 100 * GB)])
    rep = report(run, [seg("t-0", 0, size=300 * GB)], CostOptions({"STANDARD": volume}))
    assert rep.totals.monthly_savings_usd == pytest.approx(100 * 0.022 + 100 * 0.023)
    # Deep in the third tier, everything is at 0.021.
    rep = report(run, [seg("t-0", 0, size=300 * GB)], CostOptions({"STANDARD": 600_000 * GB}))
    assert rep.totals.monthly_savings_usd == pytest.approx(200 * 0.021)


def test_minimum_billable_size_hides_savings_of_small_ia_objects() -> None:
    kib = 1024
    run = run_doc([result("t-0", 0, 100 * kib, 40 * kib), result("t-0", 1, 300 * kib, 100 * kib)])
    plan = [seg("t-0", 0, size=100 * kib, storage_class="STANDARD_IA"),
            seg("t-0", 1, size=300 * kib, storage_class="STANDARD_IA")]
    rep = report(run, plan)
    # 100 KiB -> 40 KiB: both billed as 128 KiB, nothing saved; 300 KiB -> 100 KiB: billed 300 -> 128 KiB.
    assert rep.totals.monthly_savings_usd == pytest.approx((300 - 128) * kib / GB * 0.0125)
    rows = {r.base_offset: r.monthly_savings_usd for r in rep.segments}
    assert rows[0] == 0
    assert rows[1] == pytest.approx(rep.totals.monthly_savings_usd)


def test_no_early_deletion_charge_past_the_minimum_duration() -> None:
    run = run_doc([result("t-0", 0, GB, GB // 2)])
    old = report(run, [seg("t-0", 0, storage_class="GLACIER_IR", age_days=91)])
    young = report(run, [seg("t-0", 0, storage_class="GLACIER_IR", age_days=1)])
    assert one_off(old, "Early deletion") == 0
    assert one_off(young, "Early deletion") == pytest.approx(0.004 * 89 / M)
    assert one_off(young, "Retrieval") == pytest.approx(2 * 0.03)


def test_kms_calls_are_counted_without_a_bucket_key() -> None:
    run = run_doc([result("t-0", 0, GB, GB // 2, encryption="aws:kms"),
                   result("t-0", 1, GB, GB // 2, encryption="aws:kms+bucket-key")])
    rep = report(run, [seg("t-0", 0), seg("t-0", 1)])
    assert one_off(rep, "KMS") == pytest.approx(KMS_CALLS_PER_SEGMENT * 0.03 / 10_000)


def test_versioned_bucket_with_a_noncurrent_rule() -> None:
    run = run_doc([result("t-0", 0, GB, GB // 4)])
    rep = report(run, [seg("t-0", 0)], versioned=True, noncurrent_days=30)
    # The replaced original and the deleted backup (1 GiB each) and the staging copy (0.25 GiB), 30 days.
    assert one_off(rep, "Noncurrent") == pytest.approx((2 * 1 + 0.25) * 0.023 * 30 / M)
    assert rep.totals.monthly_savings_usd == pytest.approx(0.75 * 0.023)
    assert rep.warnings == ()


def test_versioned_bucket_without_a_rule_adds_storage_and_says_so() -> None:
    run = run_doc([result("t-0", 0, GB, GB // 4)])
    rep = report(run, [seg("t-0", 0)], versioned=True, noncurrent_days=None)
    assert rep.totals.monthly_savings_usd == pytest.approx(-(1 + 2 * 0.25) * 0.023)
    assert rep.totals.payback_months is None
    assert "never" in rep.warnings[0] or "forever" in rep.warnings[0]
    # An explicit option wins over what the bucket said.
    assert report(run, [seg("t-0", 0)], CostOptions(versioned=False), versioned=True).warnings == ()


def test_no_segments_at_all() -> None:
    rep = report(run_doc([]), [])
    t = rep.totals
    assert (t.segments_seen, t.bytes_before, t.monthly_savings_usd, t.one_off_usd) == (0, 0, 0, 0)
    assert t.payback_months is None
    assert t.ratio is None
    for fmt in FORMATS:
        assert render(rep, fmt)


def test_everything_skipped() -> None:
    plan = [seg("t-0", 0, action="skip", reason="already compacted (zstd)",
                cause="already compacted"),
            seg("t-0", 1, action="skip", reason="active: the partition's newest", cause="active")]
    run = run_doc([result("t-0", 2, 0, 0, status="skipped", reason="no savings: zstd would not shrink it (5 -> 9)",
                          cause="no savings")])
    rep = report(run, [*plan, seg("t-0", 2)])
    assert rep.totals.segments_rewritten == 0
    assert rep.totals.monthly_savings_usd == 0
    assert {(s.reason, s.segments) for s in rep.skipped} == {
        ("already compacted", 1), ("active", 1), ("no savings", 1)}
    assert "never" in render(rep, "table")


def test_a_run_that_made_things_bigger_is_reported_honestly() -> None:
    run = run_doc([result("t-0", 0, GB, GB + GB // 2)])
    rep = report(run, [seg("t-0", 0)])
    assert rep.totals.monthly_savings_usd == pytest.approx(-0.5 * 0.023)
    assert rep.totals.saved_bytes == -(GB // 2)
    assert rep.totals.payback_months is None
    assert any("bigger" in w for w in rep.warnings)
    assert "-$0.01" in render(rep, "table")


def test_a_dry_run_is_an_estimate_with_a_range() -> None:
    run = run_doc([], estimate=forecast(0.4, 0.075))
    rep = report(run, [seg("t-0", 0, size=1000), seg("t-0", 1, action="skip", reason="active", cause="active")])
    assert rep.estimate is True
    assert rep.totals.segments_estimated == 1
    assert (rep.totals.bytes_before, rep.totals.bytes_after) == (1000, 400)
    d = rep.estimate_detail
    assert d is not None
    assert d.monthly_savings_usd_low == pytest.approx(450 / GB * 0.023)
    assert d.monthly_savings_usd_high == pytest.approx(750 / GB * 0.023)
    assert one_off(rep, "S3 requests") > 0  # estimated per segment
    assert "ESTIMATE" in render(rep, "table")
    assert "ESTIMATE" in render(rep, "html")
    assert rep.ledger.monthly_run_rate_usd == 0  # an estimate saves nothing


def test_a_dry_run_counts_the_parts_of_a_large_staging_upload() -> None:
    """A segment whose new .log spans several upload parts costs a request a part (and the upload's create
    and complete) instead of one PUT; the part size is the one the store uploads with."""
    from tiering.cost.model import REQUESTS_PER_SEGMENT, UPLOAD_PART_BYTES, tier1_requests
    from tiering.storage.objects import DEFAULT_PART_BYTES

    assert UPLOAD_PART_BYTES == DEFAULT_PART_BYTES
    base = REQUESTS_PER_SEGMENT["tier1"]
    assert [tier1_requests(n) for n in (0, 1000, UPLOAD_PART_BYTES, UPLOAD_PART_BYTES + 1, 10 * UPLOAD_PART_BYTES)] == [
        base, base, base, base + 3, base + 11]
    small, large = (report(run_doc([], estimate=forecast(0.5, 0.0, sampled=1, size=size)), [seg("t-0", 0, size=size)])
                    for size in (1000, GB))
    per_put = PRICES.of("STANDARD").put_per_1000 / 1000
    parts = GB // 2 // UPLOAD_PART_BYTES  # the new .log: half of 1 GiB, 64 parts
    assert one_off(large, "S3 requests") - one_off(small, "S3 requests") == pytest.approx((parts + 1) * per_put)


def test_cumulative_savings_accrue_from_each_run() -> None:
    entries = [LedgerEntry("a", (NOW - timedelta(days=2 * M)).isoformat(), False, 1, 0, 0, 10.0, 1.0),
               LedgerEntry("b", (NOW - timedelta(days=M)).isoformat(), False, 1, 0, 0, 5.0, 2.0),
               LedgerEntry("c", NOW.isoformat(), True, 0, 0, 0, 99.0, 0.0)]
    c = cumulative(entries, NOW)
    assert c.monthly_run_rate_usd == 15
    assert c.to_date_usd == pytest.approx(10 * 2 + 5 * 1 - 3)
    assert [r.cumulative_monthly_usd for r in c.runs] == [10, 15, 15]


def test_source_codec_is_the_majority_or_mixed() -> None:
    assert source_codec({"codecs_before": {"lz4": 3, "none": 1}}) == "lz4"
    assert source_codec({"codecs_before": {"lz4": 1, "gzip": 1}}) == "mixed: gzip+lz4"
    assert source_codec(None) == "unknown"


def test_csv_has_one_row_per_segment() -> None:
    run = run_doc([result("t-0", 0, GB, GB // 2)])
    text = render(report(run, [seg("t-0", 0), seg("t-0", 5, action="skip", reason="active", cause="active")]), "csv")
    lines = text.strip().splitlines()
    assert lines[0].startswith("topic,partition,base_offset,status")
    assert len(lines) == 3
    assert lines[1].split(",")[:4] == ["t", "0", "0", "compacted"]


def test_a_report_folded_chunk_by_chunk_equals_the_whole_and_lists_within_its_limits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The streamed report (the plan and results a chunk at a time) gives the figures of the whole; past
    its limits it lists fewer segments, failures and partitions, and says how many it left out, while the
    totals and rollups still count every one."""
    from tiering.cost import model

    plan = [seg(f"t-{p}", b, size=GB // 8) for p in range(6) for b in (0, 100)]
    results = [result(f"t-{p}", b, GB // 8, GB // 32) if p else result(f"t-{p}", b, 0, 0, status="failed",
                                                                        reason="invalid data")
               for p in range(6) for b in (0, 100)]
    usage = {"requests": {"_run": {"ListObjectsV2": 3}}, "requests_by_class": {"STANDARD": {"ListObjectsV2": 3}},
             "compute_seconds": 10.0}
    whole = report(run_doc(results, usage), plan)
    chunks = [(plan[i:i + 4], results[i:i + 4]) for i in range(0, len(plan), 4)]
    streamed = report(run_doc([], usage), [], chunks=chunks)
    assert streamed.totals == whole.totals
    assert streamed.by_topic == whole.by_topic
    assert streamed.segments == whole.segments
    assert whole.listing == Listing(0, 0, 0)
    monkeypatch.setattr(model, "MAX_LISTED_ROWS", 1)
    monkeypatch.setattr(model, "MAX_LISTED_PARTITIONS", 2)
    small = report(run_doc([], usage), [], chunks=chunks)
    assert small.totals == whole.totals
    assert (len(small.segments), len(small.failed), len(small.by_partition)) == (1, 1, 2)
    assert small.listing == Listing(11, 1, 3)
    assert sum(r.segments for r in small.by_topic) == 10


def test_what_a_report_leaves_out_is_said_in_every_human_format(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiering.cost import model

    monkeypatch.setattr(model, "MAX_LISTED_ROWS", 1)
    plan = [seg("t-0", 0), seg("t-0", 100)]
    rep = report(run_doc([result("t-0", 0, GB, GB // 2), result("t-0", 100, GB, GB // 2)]), plan)
    for fmt in ("md", "html"):
        assert "Not listed: 1 segment rows" in render(rep, fmt)
    assert "Not listed" not in render(report(run_doc([result("t-0", 0, GB, GB // 2)]), plan[:1]), "md")


def test_the_report_document_reads_back_as_written() -> None:
    """report.json is the typed report: from_json(to_json()) gives it back, for a run and for a dry run."""
    run = run_doc([result("t-0", 0, GB, GB // 2), result("t-0", 5, 0, 0, status="failed", reason="invalid data",
                                                         error="CRC mismatch")])
    real = report(run, [seg("t-0", 0), seg("t-0", 5), seg("t-0", 9, action="skip", reason="active", cause="active")])
    dry = report(run_doc([], estimate=forecast(0.4, 0.075)), [seg("t-0", 0, size=1000)])
    for rep in (real, dry):
        doc = json.loads(json.dumps(rep.to_json()))
        assert Report.from_json(doc, "report.json") == rep
        assert doc["totals"]["saved_bytes"] == rep.totals.saved_bytes
    assert real.failed[0].error == "CRC mismatch"
    assert dry.estimate_detail is not None
    assert dry.estimate_detail.segments_sampled == 2


def test_a_document_of_another_kind_or_version_is_refused_by_name() -> None:
    doc = report(run_doc([]), []).to_json()
    with pytest.raises(ConfigError, match="not a report this version can read") as e:
        Report.from_json({**doc, "schema_version": 99}, "s3://b/p/_tiering/reports/r1/report.json")
    assert "compaction-report v99" in str(e.value)
    assert "reports/r1/report.json" in str(e.value)
    with pytest.raises(ConfigError, match="report unreadable"):
        Report.from_json({k: v for k, v in doc.items() if k != "totals"}, "report.json")


def test_a_report_row_says_a_run_s_status_or_what_a_plan_says_of_an_unrun_segment() -> None:
    from tiering.lifecycle.vocabulary import Status, Unrun

    assert not {str(s) for s in Status} & {str(s) for s in Unrun}  # a row's text names one of them
    for status in [*Status, *Unrun]:
        assert row_status(str(status)) is status
    with pytest.raises(ConfigError, match="a report row's status is unknown"):
        row_status("compressed")


def _rebatch_stats(batches_in: int, batches_out: int, saved: int) -> dict[str, Any]:
    return {"codecs_before": {"snappy": batches_in},
            "rebatch": {"batches_in": batches_in, "batches_out": batches_out, "saved_by_rebatching": saved}}


def test_the_savings_split_into_recompression_and_re_batching_by_hand() -> None:
    """events-0 was re-batched: of the 0.75 GB it saved, 0.5 GB came from merging batches; logs-0 was only
    recompressed (IA). Re-batching's dollars are its bytes at their class's rate; recompression is the rest."""
    plan = [seg("events-0", 0), seg("logs-0", 0, size=2 * GB, storage_class="STANDARD_IA")]
    run = run_doc([result("events-0", 0, GB, GB // 4, stats=_rebatch_stats(10_000, 40, GB // 2)),
                   result("logs-0", 0, 2 * GB, GB)])
    rep = report(run, plan)
    split = rep.savings_split
    assert split is not None
    rb = split.rebatching
    assert (rb.segments, rb.batches_before, rb.batches_after, rb.saved_bytes) == (1, 10_000, 40, GB // 2)
    assert split.rebatching_monthly_usd == pytest.approx(0.5 * 0.023)
    assert split.recompression_bytes == GB // 4 + GB
    assert split.recompression_monthly_usd == pytest.approx(0.25 * 0.023 + 1.0 * 0.0125)
    doc = rep.to_json()
    assert doc["savings_split"]["rebatching"]["monthly_savings_usd"] == pytest.approx(0.5 * 0.023)
    assert Report.from_json(json.loads(json.dumps(doc)), "r").savings_split == split
    text = render(rep, "table")
    assert "saved by re-batching" in text
    assert "10,000 -> 40 batches" in text
    assert "Savings per month by source" in render(rep, "html")


def test_a_run_without_re_batching_has_no_split() -> None:
    rep = report(run_doc([result("events-0", 0, GB, GB // 4)]), [seg("events-0", 0)])
    assert rep.savings_split is None
    assert "savings_split" not in rep.to_json()
    assert "re-batching" not in render(rep, "table")


def _merged(directory: str, bases: list[int], sizes_before: list[int], sizes_after: list[int],
            storage_class: str) -> list[dict[str, Any]]:
    """A merge run's results: the group's first segment carries what the merge changed."""
    stats = {"merge": {"segments_before": len(bases), "segments_after": 1, "storage_class": storage_class,
                       "objects_before": sizes_before, "objects_after": sizes_after}}
    return [{"directory": directory, "base_offset": b, "status": "merged", "bytes_before": 0, "bytes_after": 0,
             "stats": stats if i == 0 else {}} for i, b in enumerate(bases)]


def test_a_merge_of_small_ia_objects_saves_their_minimum_billable_size_by_hand() -> None:
    # Four 20,000-byte objects (two segments of .log and .index) in Standard-IA become two of 40,000 bytes:
    # each is billed 128 KiB at $0.0125 per GB-month. One transition costs $0.02 (Glacier IR) and $0.05
    # (Deep Archive) per 1,000 objects; a GET $0.001 per 1,000.
    run = run_doc(_merged("t-0", [0, 10], [20_000] * 4, [40_000] * 2, "STANDARD_IA"))
    rep = report(run, [])
    m = rep.merging
    assert m is not None
    assert (m.segments_before, m.segments_after, m.objects_before, m.objects_after) == (2, 1, 4, 2)
    assert m.monthly_before_usd == pytest.approx(4 * 131072 / GB * 0.0125)
    assert m.monthly_after_usd == pytest.approx(2 * 131072 / GB * 0.0125)
    assert rep.totals.monthly_savings_usd == pytest.approx(2 * 131072 / GB * 0.0125)
    moves = {c: (b, a) for c, b, a in m.transitions}
    assert "STANDARD_IA" not in moves  # where they are already
    assert moves["GLACIER_IR"] == pytest.approx((4 * 0.02 / 1000, 2 * 0.02 / 1000))
    assert moves["DEEP_ARCHIVE"] == pytest.approx((4 * 0.05 / 1000, 2 * 0.05 / 1000))
    assert (m.reads_before_usd, m.reads_after_usd) == pytest.approx((4 * 0.001 / 1000, 2 * 0.001 / 1000))
    assert rep.skipped == ()  # merged segments are done, not "not rewritten"
    text = render(rep, "table")
    assert text.startswith("merge report")
    assert "2 into 1: 4 objects -> 2" in text
    assert Report.from_json(json.loads(json.dumps(rep.to_json())), "report.json") == rep


def test_merging_in_deep_archive_counts_each_objects_overhead() -> None:
    # Deep Archive bills 32 KiB of each object at its own rate and 8 KiB at Standard's: two objects of 1 MiB
    # merged into one save one object's overhead.
    run = run_doc(_merged("t-0", [0, 10], [1 << 20] * 2, [2 << 20], "DEEP_ARCHIVE"))
    m = report(run, []).merging
    assert m is not None
    overhead = 32768 / GB * 0.00099 + 8192 / GB * 0.023
    assert m.monthly_before_usd - m.monthly_after_usd == pytest.approx(overhead)


def test_a_merge_of_young_ia_sources_costs_their_early_deletion_and_grace_copies_by_hand() -> None:
    # Two 1 GB .log sources in Standard-IA ($0.0125 per GB-month, 30 days minimum), uploaded 10 days before
    # the report: each deleted 20 days early costs 1 GB x $0.0125 x 20 days; each kept as a backup for the
    # grace period (7 days, billed at least IA's 30) costs 1 GB x $0.0125 x 30 days (a month: 365/12 days).
    # Their bytes are the same after the merge: nothing is saved by the byte, nothing counted twice.
    ten_days = (NOW - timedelta(days=10)).isoformat()
    rows = _merged("t-0", [0, 10], [GB, GB], [2 * GB], "STANDARD_IA")
    for row, size in zip(rows, (GB, GB), strict=True):
        row["stats"] = {**row["stats"], "log": {"storage_class": "STANDARD_IA", "last_modified": ten_days,
                                                "size": size}}
    rows[0]["bytes_before"], rows[0]["bytes_after"] = GB, 2 * GB
    rows[1]["bytes_before"], rows[1]["bytes_after"] = GB, 0
    rep = report(run_doc(rows), [])
    lines = {line.item: line.usd for line in rep.one_off}
    assert lines["Early deletion (minimum storage duration)"] == pytest.approx(2 * 0.0125 * 20 / DAYS_PER_MONTH)
    assert lines["Originals kept 7 days (grace period)"] == pytest.approx(2 * 0.0125 * 30 / DAYS_PER_MONTH)
    assert (rep.totals.bytes_before, rep.totals.bytes_after) == (2 * GB, 2 * GB)
    m = rep.merging
    assert m is not None
    assert rep.totals.monthly_savings_usd == pytest.approx(m.monthly_savings_usd)
    assert [g.name for g in rep.by_storage_class] == ["STANDARD_IA"]
