"""The report document rendered for people: a text table (task logs, the CLI), Markdown, CSV (one row per
segment) and a self-contained HTML page whose charts are inline SVG (no script, no network).

Money is rounded here and only here: the document keeps full precision.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from typing import Final

from tiering.cost.document import GroupRow, MergeFigures, Report, Totals
from tiering.cost.forecast import Range
from tiering.lifecycle.vocabulary import Counted

FORMATS: Final = ("table", "json", "md", "csv", "html")
NUMERIC: Final = re.compile(r"^-?\$?[0-9][0-9,.]*( ?(B|KiB|MiB|GiB|TiB|days|months))?$")
CSV_FIELDS: Final = ("topic", "partition", "base_offset", "status", "reason", "storage_class", "source_codec",
                     "bytes_before", "bytes_after", "monthly_savings_usd")


def usd(x: float | None) -> str:
    """Dollars to the cent; amounts under a cent keep three significant digits (a demo's bytes cost little)."""
    if x is None:
        return "n/a"
    sign = "-" if x < 0 else ""
    if x != 0 and abs(x) < 0.01:
        decimals = min(12, 2 - math.floor(math.log10(abs(x))))
        return f"{sign}${abs(x):.{decimals}f}"
    return f"{sign}${abs(x):,.2f}"


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    raise AssertionError


def ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def payback(months: float | None) -> str:
    if months is None:
        return "never (nothing saved)"
    if months < 1:
        return f"{months * 30.4:.1f} days"
    return f"{months:.1f} months"


def per_tib(t: Totals) -> str:
    """Savings per month for each TiB of segments like these, at the measured (or forecast) ratio."""
    if t.monthly_savings_per_tib_usd is None:
        return "n/a (nothing rewritten)"
    return f"{usd(t.monthly_savings_per_tib_usd)} per month, {usd(12 * t.monthly_savings_per_tib_usd)} per year"


def title(report: Report) -> str:
    kind = "ESTIMATE (dry run)" if report.estimate else "merge report" if _merge_only(report) else "compaction report"
    return f"{kind}: s3://{report.bucket}/{report.prefix} run {report.run_id}"


def _merge_only(report: Report) -> bool:
    return report.merging is not None and not report.totals.segments_rewritten and report.key_compaction is None


def headline(report: Report) -> list[tuple[str, str]]:
    t = report.totals
    if _merge_only(report):
        rows = [("this prefix, per year", f"{usd(t.yearly_savings_usd)} ({usd(t.monthly_savings_usd)} per month)"),
                ("skipped / failed", f"{t.segments_skipped} / {t.segments_failed}"),
                ("one-off cost of the run", usd(t.one_off_usd)),
                ("payback (storage alone)", payback(t.payback_months))]
    else:
        rows = _compaction_headline(report)
    if (m := report.merging) is not None:
        rows.extend(merge_rows(m, "; what key compaction dropped from them included" if report.key_compaction
                               else ""))
    return [*rows, *_closing_rows(report)]


def merge_rows(m: MergeFigures, note: str = "") -> list[tuple[str, str]]:
    """What merging does to the objects, priced by the object: ``note`` adds to the storage row."""
    return [("segments merged", f"{m.segments_before:,} into {m.segments_after:,}: {m.objects_before:,} objects -> "
             f"{m.objects_after:,}"),
            ("storage of those objects", f"{usd(m.monthly_before_usd)} -> {usd(m.monthly_after_usd)} per month (each "
             f"at least its class's minimum billable size, plus per-object overhead{note})"),
            ("reading them once (GET)", f"{usd(m.reads_before_usd)} -> {usd(m.reads_after_usd)}"),
            ("a lifecycle transition of them", "; ".join(f"to {c} {usd(b)} -> {usd(a)}" for c, b, a in m.transitions)
             or "n/a")]


def merge_priced_text(m: MergeFigures) -> str:
    """:func:`merge_rows` as aligned lines, for a plan's forecast."""
    rows = merge_rows(m)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def _compaction_headline(report: Report) -> list[tuple[str, str]]:
    t = report.totals
    rows = [
        ("per TiB of such data", per_tib(t)),
        ("this prefix, per year", f"{usd(t.yearly_savings_usd)} ({usd(t.monthly_savings_usd)} per month)"),
        ("segments rewritten" if not report.estimate else "segments to compact",
         str(t.segments_rewritten or t.segments_estimated)),
        ("skipped / failed", f"{t.segments_skipped} / {t.segments_failed}"),
        (".log bytes before -> after", f"{size(t.bytes_before)} -> {size(t.bytes_after)} (ratio {ratio(t.ratio)})"),
        ("one-off cost of the run", usd(t.one_off_usd)),
        ("payback", payback(t.payback_months)),
    ]
    if (split := report.savings_split) is not None:
        rb = split.rebatching
        rows.append(("saved by recompression", f"{size(split.recompression_bytes)}, "
                     f"{usd(split.recompression_monthly_usd)} per month"))
        rows.append(("saved by re-batching", f"{size(rb.saved_bytes)}, {usd(split.rebatching_monthly_usd)} per month "
                     f"({rb.segments} segments, {rb.batches_before:,} -> {rb.batches_after:,} batches)"))
    if (kc := report.key_compaction) is not None:
        rows.append(("saved by key compaction", f"{size(kc.saved_bytes)}, {usd(report.key_compaction_monthly_usd)} "
                     f"per month ({kc.segments} segments)"))
        rows.append(("records before -> after", f"{kc.records_before:,} -> {kc.records_after:,} ({kc.keys:,} keys; "
                     f"dropped: {kc.superseded_dropped:,} superseded, {kc.no_key_dropped:,} without a key, "
                     f"{kc.aborted_records_removed:,} aborted, {kc.tombstones_dropped:,} tombstones, "
                     f"{kc.markers_dropped:,} markers; {kc.tombstones_stamped:,} tombstones stamped)"))
    return rows


def _closing_rows(report: Report) -> list[tuple[str, str]]:
    rows = []
    if (e := report.estimate_detail) is not None:
        rows.append(("estimate range (+/- 2 s.e.)", f"{usd(e.monthly_savings_usd_low)} .. "
                     f"{usd(e.monthly_savings_usd_high)} per month, from {e.segments_sampled} sampled "
                     f"segments ({size(e.bytes_sampled)})"))
    ledger = report.ledger
    rows.append(("all runs: saving per month", f"{usd(ledger.monthly_run_rate_usd)} "
                 f"(net to date {usd(ledger.to_date_usd)})"))
    p = report.prices
    rows.append(("prices", f"{p['region']}, as of {p['as_of']}"
                 + (f", overridden by {p['overridden_by']}" if p["overridden_by"] else "")))
    return rows


def _grid(head: Sequence[str], body: Sequence[Sequence[str]], right: frozenset[int]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                  strict=True)))
    return [line(head), "  ".join("-" * w for w in widths), *(line(r) for r in body)]


def _group_rows(groups: Sequence[GroupRow]) -> list[list[str]]:
    return [[g.name, str(g.segments), size(g.bytes_before), size(g.bytes_after), ratio(g.ratio),
             usd(g.monthly_savings_usd)] for g in groups]


TOPIC_HEAD: Final = ("topic", "segments", "before", "after", "ratio", "saved/month")
FORECAST_HEAD: Final = ("segments", "before", "after (forecast)", "ratio", "saved: range (+/- 2 s.e.)",
                        "likely skipped", "sampled", "saved/month")


def _forecast_rows(ranges: dict[str, Range], groups: Sequence[GroupRow]) -> list[list[str]]:
    """A dry run's rollup: each group's forecast (its strata's ratios and ranges), and its dollars."""
    dollars = {g.name: g.monthly_savings_usd for g in groups}
    return [[name, str(r.segments), size(r.bytes_before), size(r.bytes_after), ratio(r.ratio),
             f"{size(r.saved_low)} .. {size(r.saved_high)}", str(r.segments_skipped) if r.segments_skipped else "",
             str(r.segments_sampled), usd(dollars.get(name, 0.0))] for name, r in ranges.items()]


def rollups(report: Report) -> list[tuple[str, tuple[str, ...], list[list[str]], frozenset[int]]]:
    """The report's tables by topic and by source codec: a real run's rows, or a dry run's forecast."""
    if (e := report.estimate_detail) is not None:
        right = frozenset(range(1, 9))
        return [("topic", ("topic", *FORECAST_HEAD), _forecast_rows(e.forecast.by_topic(), report.by_topic), right),
                ("source codec", ("source codec", *FORECAST_HEAD),
                 _forecast_rows(e.forecast.by_source_codec(), report.by_source_codec), right)]
    right = frozenset({1, 2, 3, 4, 5})
    return [(label, (label, *TOPIC_HEAD[1:]), _group_rows(groups), right)
            for label, groups in (("topic", report.by_topic), ("source codec", report.by_source_codec)) if groups]


AUTO_HEAD: Final = ("topic", "candidate", "ratio", "saved/month", "one-off", "net (horizon)", "")


def _auto_rows(report: Report) -> list[list[str]]:
    rows = []
    for topic, d in sorted(report.auto.items()):
        chosen = d.get("chosen") or {}
        for c in d["candidates"]:
            name = f"{c['codec']}:{c['level']}" if c["level"] is not None else c["codec"]
            mark = "chosen" if (c["codec"], c["level"]) == (chosen.get("codec"), chosen.get("level")) else ""
            rows.append([topic, name, ratio(c["ratio"]), usd(c["monthly_savings_usd"]),
                         usd(c.get("one_off_usd", c["compute_usd"])), usd(c["net_usd"]), mark])
        if not chosen:
            rows.append([topic, "(none)", "", "", "", "", "left alone: nothing pays off"])
    return rows


def _one_off_rows(report: Report) -> list[list[str]]:
    return [[c.item, usd(c.usd), c.detail] for c in report.one_off]


def _skipped_rows(report: Report) -> list[list[str]]:
    return [[s.status, str(s.segments), s.reason] for s in report.skipped]


NOT_PLANNED_HEAD: Final = ("objects", "not planned by the scan, because")


def _not_planned_rows(report: Report) -> list[list[str]]:
    return [[f"{n:,}", reason] for reason, n in report.objects_not_planned.items()]


def _run_rows(report: Report) -> list[list[str]]:
    return [[r.entry.run_id + (" (estimate)" if r.entry.estimate else "")
             + (" (no report: counted from the partitions' state)" if r.entry.counted_from is Counted.STATE else ""),
             r.entry.finished_at[:19], str(r.entry.segments_rewritten), usd(r.entry.monthly_savings_usd),
             usd(r.entry.one_off_usd) if r.entry.counted_from is Counted.REPORT else "not known",
             usd(r.cumulative_monthly_usd)] for r in report.ledger.runs]


RUNS_HEAD: Final = ("run", "finished", "rewritten", "saved/month", "one-off", "cumulative saved/month")


def to_table(report: Report) -> str:
    out = [title(report), ""]
    width = max(len(k) for k, _ in headline(report))
    out += [f"  {k.ljust(width)}  {v}" for k, v in headline(report)]
    for _, head, body, right in rollups(report):
        out += ["", *_grid(head, body, right)]
    out += ["", *_grid(("one-off cost", "usd", "detail"), _one_off_rows(report), frozenset({1}))]
    if report.auto:
        out += ["", "automatic codec choice (net dollars over the horizon):",
                *_grid(AUTO_HEAD, _auto_rows(report), frozenset({2, 3, 4, 5}))]
    if report.skipped:
        out += ["", *_grid(("not rewritten", "segments", "reason"), _skipped_rows(report), frozenset({1}))]
    if report.objects_not_planned:
        out += ["", *_grid(NOT_PLANNED_HEAD, _not_planned_rows(report), frozenset({0}))]
    out += [f"WARNING: {w}" for w in report.warnings]
    return "\n".join(out)


def _md_table(head: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    def esc(c: str) -> str:
        return c.replace("|", "\\|")
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(esc(c) for c in r) + " |" for r in body)]


def to_markdown(report: Report) -> str:
    out = [f"# {title(report)}", ""]
    out += [f"> **{w}**" for w in report.warnings]
    out += [*_md_table(("", ""), headline(report)), ""]
    for label, head, body, _ in rollups(report):
        out += [f"## By {label}" + (" (forecast)" if report.estimate_detail else ""), "", *_md_table(head, body), ""]
    for label, groups in (("storage class", report.by_storage_class), ("partition", report.by_partition)):
        if groups:
            out += [f"## By {label}", "", *_md_table((label, *TOPIC_HEAD[1:]), _group_rows(groups)), ""]
    if report.auto:
        out += ["## Automatic codec choice", "", "Net dollars: storage saved over the horizon minus the one-off "
                "costs (compute measured on sampled batches, requests, originals kept for the grace period).", "",
                *_md_table(AUTO_HEAD, _auto_rows(report)), ""]
    out += ["## One-off costs", "", *_md_table(("item", "usd", "detail"), _one_off_rows(report)), ""]
    if report.skipped:
        out += ["## Not rewritten", "", *_md_table(("status", "segments", "reason"), _skipped_rows(report)), ""]
    if report.objects_not_planned:
        out += ["## Objects not planned", "", *_md_table(NOT_PLANNED_HEAD, _not_planned_rows(report)), ""]
    if report.failed:
        out += ["## Failed", "", *_md_table(("segment", "reason"), [[f.segment, f.reason] for f in report.failed]),
                ""]
    if left_out := listing_note(report):
        out += [f"_{left_out}_", ""]
    out += ["## All runs", "", *_md_table(RUNS_HEAD, _run_rows(report)), ""]
    p = report.prices
    out += [f"Prices: {p['region']}, as of {p['as_of']} ({p['source']}). GB = 2^30 bytes, month = 730 hours."]
    return "\n".join(out) + "\n"


def listing_note(report: Report) -> str:
    """What a large run's report leaves out of its lists (its figures count everything), or ""."""
    listing = report.listing
    parts = [f"{n:,} {what}" for what, n in (("segment rows", listing.segments_omitted),
                                             ("failures", listing.failed_omitted),
                                             ("partitions", listing.partitions_omitted)) if n]
    if not parts:
        return ""
    return (f"Not listed: {', '.join(parts)} (every figure above counts them; each segment's result is in the "
            "run's step documents under runs/<run>/).")


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in report.segments:
        w.writerow({**r.to_json(), "monthly_savings_usd": f"{r.monthly_savings_usd:.6f}"})
    return buf.getvalue()


# --- HTML ---------------------------------------------------------------------------------------------------

BEFORE: Final = "#b0b7c3"
AFTER: Final = "#2a9d8f"
SAVED: Final = "#e76f51"
LINE: Final = "#264653"


def _e(x: object) -> str:
    return html.escape(str(x), quote=True)


def _bars(title_: str, rows: Sequence[tuple[str, Sequence[float]]], colors: Sequence[str],
          fmt: Callable[[float], str], legend: Sequence[str]) -> str:
    """A horizontal bar chart, one group of bars per row (inline SVG)."""
    label_w, chart_w, bar_h, gap = 180, 420, 14, 10
    n = len(colors)
    top = max([v for _, vals in rows for v in vals] + [0.0]) or 1.0
    height = 24 + len(rows) * (n * bar_h + gap)
    parts = [f'<svg class="chart" role="img" aria-label="{_e(title_)}" width="{label_w + chart_w + 120}" '
             f'height="{height}" xmlns="http://www.w3.org/2000/svg">']
    y = 24
    for i, name in enumerate(legend):
        parts.append(f'<rect x="{label_w + i * 120}" y="4" width="12" height="12" fill="{colors[i]}"/>'
                     f'<text x="{label_w + i * 120 + 16}" y="14" class="legend">{_e(name)}</text>')
    for name, vals in rows:
        parts.append(f'<text x="{label_w - 6}" y="{y + n * bar_h / 2 + 4}" text-anchor="end">{_e(name)}</text>')
        for j, v in enumerate(vals):
            w = max(0.0, v) / top * chart_w
            parts.append(f'<rect class="bar" x="{label_w}" y="{y + j * bar_h}" width="{w:.1f}" '
                         f'height="{bar_h - 2}" fill="{colors[j]}"><title>{_e(name)}: {_e(fmt(v))}</title></rect>'
                         f'<text x="{label_w + w + 4:.1f}" y="{y + j * bar_h + bar_h - 4}" class="value">'
                         f'{_e(fmt(v))}</text>')
        y += n * bar_h + gap
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(title_)}</figcaption>{''.join(parts)}</figure>"


def _line(title_: str, points: Sequence[tuple[str, float]], fmt: Callable[[float], str]) -> str:
    """A line chart of a running total over runs (inline SVG)."""
    w, h, left, bottom, right = 660, 220, 100, 40, 60
    top_v = max([v for _, v in points] + [0.0])
    low_v = min([v for _, v in points] + [0.0])
    span = (top_v - low_v) or 1.0
    step = (w - left - right) / max(1, len(points) - 1)

    def xy(i: int, v: float) -> tuple[float, float]:
        return left + i * step, 10 + (h - bottom - 10) * (1 - (v - low_v) / span)

    coords = [xy(i, v) for i, (_, v) in enumerate(points)]
    parts = [f'<svg class="chart" role="img" aria-label="{_e(title_)}" width="{w}" height="{h}" '
             f'xmlns="http://www.w3.org/2000/svg">',
             f'<line x1="{left}" y1="{h - bottom}" x2="{w - right + 10}" y2="{h - bottom}" stroke="#999"/>',
             f'<text x="{left - 6}" y="14" text-anchor="end" class="value">{_e(fmt(top_v))}</text>',
             f'<text x="{left - 6}" y="{h - bottom}" text-anchor="end" class="value">{_e(fmt(low_v))}</text>']
    if len(coords) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
        parts.append(f'<polyline class="series" points="{path}" fill="none" stroke="{LINE}" stroke-width="3"/>')
    for (label, v), (x, y) in zip(points, coords, strict=True):
        parts.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{LINE}">'
                     f'<title>{_e(label)}: {_e(fmt(v))}</title></circle>'
                     f'<text x="{x:.1f}" y="{h - bottom + 16}" text-anchor="middle" class="value">'
                     f'{_e(label[:10])}</text>')
    parts.append("</svg>")
    return f"<figure><figcaption>{_e(title_)}</figcaption>{''.join(parts)}</figure>"


def _html_table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    def cell(c: str) -> str:
        return f'<td class="num">{_e(c)}</td>' if NUMERIC.match(c) else f"<td>{_e(c)}</td>"

    thead = "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>" if any(head) else ""
    return ("<table>" + thead + "<tbody>" + "".join("<tr>" + "".join(cell(c) for c in r) + "</tr>" for r in body)
            + "</tbody></table>")


STYLE: Final = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;max-width:1100px;
color:#1d2430;padding:0 16px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde1e7}
.sub{color:#5b6472;margin-bottom:16px} .banner{background:#fff3cd;border:1px solid #e0c36a;padding:8px 12px;
margin:12px 0;border-radius:6px;font-weight:600} .warn{background:#fde2dc;border-color:#e76f51}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:12px 0}
.card{border:1px solid #dde1e7;border-radius:8px;padding:10px 14px;min-width:150px}
.card b{display:block;font-size:20px} .card span{color:#5b6472;font-size:12px}
table{border-collapse:collapse;margin:8px 0} td,th{border-bottom:1px solid #e6e9ee;padding:4px 10px;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums} th{background:#f4f6f8}
figure{margin:12px 0} figcaption{font-weight:600;margin-bottom:4px}
svg text{font:12px system-ui,sans-serif;fill:#1d2430} svg .value{fill:#5b6472}
.charts{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
footer{color:#5b6472;margin-top:32px;font-size:12px}
"""


def to_html(report: Report) -> str:
    t, ledger = report.totals, report.ledger
    tib = t.monthly_savings_per_tib_usd
    cards = [("saved per month per TiB of such data", "n/a" if tib is None else usd(tib)),
             ("this prefix, saved per year", usd(t.yearly_savings_usd)),
             ("this prefix, saved per month", usd(t.monthly_savings_usd)),
             ("one-off cost", usd(t.one_off_usd)), ("payback", payback(t.payback_months)),
             ("bytes saved", size(t.saved_bytes)), ("ratio after/before", ratio(t.ratio))]
    body = [f"<h1>{_e(title(report))}</h1>",
            f'<div class="sub">generated {_e(report.generated_at[:19])} UTC; prices '
            f'{_e(report.prices["region"])} as of {_e(report.prices["as_of"])}</div>']
    if (e := report.estimate_detail) is not None:
        body.append(f'<div class="banner">ESTIMATE from a dry run: nothing was changed. Savings '
                    f'{_e(usd(e.monthly_savings_usd_low))} .. {_e(usd(e.monthly_savings_usd_high))} per month '
                    f'(+/- 2 standard errors over {e.segments_sampled} sampled segments).</div>')
    body += [f'<div class="banner warn">{_e(w)}</div>' for w in report.warnings]
    body.append('<div class="cards">' + "".join(f"<div class=\"card\"><b>{_e(v)}</b><span>{_e(k)}</span></div>"
                                                for k, v in cards) + "</div>")
    charts = []
    topics = report.by_topic
    if topics:
        charts.append(_bars("Savings per month by topic", [(x.name, [x.monthly_savings_usd]) for x in topics],
                            [SAVED], usd, ["$ saved / month"]))
        charts.append(_bars("Stored .log bytes by topic", [(x.name, [x.bytes_before, x.bytes_after])
                                                          for x in topics], [BEFORE, AFTER], size,
                            ["before", "after"]))
    if (split := report.savings_split) is not None:
        charts.append(_bars("Savings per month by source", [("recompression", [split.recompression_monthly_usd]),
                                                            ("re-batching", [split.rebatching_monthly_usd])],
                            [SAVED], usd, ["$ saved / month"]))
    real = [r for r in ledger.runs if not r.entry.estimate]
    if real:
        charts.append(_line("Cumulative savings per month over runs",
                            [(r.entry.finished_at, r.cumulative_monthly_usd) for r in real], usd))
    if charts:
        body.append('<div class="charts">' + "".join(charts) + "</div>")
    else:
        body.append("<p>No segment was rewritten: nothing to chart.</p>")
    body.append("<h2>Summary</h2>" + _html_table(("", ""), headline(report)))
    for label, head, rows, _ in rollups(report):
        body.append(f"<h2>By {_e(label)}" + (" (forecast)" if report.estimate_detail else "") + "</h2>"
                    + _html_table(head, rows))
    if report.auto:
        body.append("<h2>Automatic codec choice</h2><p>Net dollars: storage saved over the horizon minus the one-off "
                    "costs (compute measured on sampled batches, requests, originals kept for the grace "
                    "period).</p>" + _html_table(AUTO_HEAD, _auto_rows(report)))
    body.append("<h2>One-off costs</h2>" + _html_table(("item", "usd", "detail"), _one_off_rows(report)))
    if report.skipped:
        body.append("<h2>Not rewritten</h2>" + _html_table(("status", "segments", "reason"), _skipped_rows(report)))
    if report.objects_not_planned:
        body.append("<h2>Objects not planned</h2>" + _html_table(NOT_PLANNED_HEAD, _not_planned_rows(report)))
    if report.failed:
        body.append("<h2>Failed</h2>" + _html_table(("segment", "reason"), [[f.segment, f.reason]
                                                                             for f in report.failed]))
    if left_out := listing_note(report):
        body.append(f"<p><em>{_e(left_out)}</em></p>")
    body.append("<h2>All runs</h2>" + _html_table(RUNS_HEAD, _run_rows(report)))
    p = report.prices
    body.append(f"<footer>Prices: {_e(p['source'])}, as of {_e(p['as_of'])}. GB = 2<sup>30</sup> bytes, month = "
                "730 hours. Only .log bytes are counted as saved. Full precision in report.json.</footer>")
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + _e(title(report))
            + f"</title><style>{STYLE}</style></head><body>" + "".join(body) + "</body></html>\n")


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n"
    return {"table": to_table, "md": to_markdown, "csv": to_csv, "html": to_html}[fmt](report) + (
        "\n" if fmt == "table" else "")
