"""The HTML report rendered by headless Chromium (Debian's ``chromium``): a screenshot that shows its charts.

Chromium is installed by ``make test`` where it can be (root and apt-get); CI sets
TIERING_REQUIRE_CHROMIUM=1 so that a missing browser fails instead of skipping.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests import needs
from tiering.cost.document import LedgerEntry, Report
from tiering.cost.model import CostOptions, build_report
from tiering.cost.prices import GB, load_prices
from tiering.report.render import AFTER, BEFORE, LINE, SAVED, to_html

pytestmark = pytest.mark.slow
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def _need_chromium() -> str:
    if CHROMIUM is None:
        needs.missing(needs.CHROMIUM, "chromium is not installed (apt-get install chromium)")
    return CHROMIUM


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of an 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert (depth, interlace) == (8, 0), (depth, interlace)
    assert color in (2, 6), color
    bpp = 3 if color == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    pixels = [(r[x], r[x + 1], r[x + 2]) for r in rows for x in range(0, stride, bpp)]
    return width, height, pixels


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return int(hex_color[1:3], 16), int(hex_color[3:5], 16), int(hex_color[5:7], 16)


def _report() -> Report:
    now = datetime(2026, 11, 22, tzinfo=UTC)
    topics = {"events": (40, 8), "logs": (25, 7), "metrics": (10, 6)}
    plan, results = [], []
    for topic, (before, after) in topics.items():
        plan.append({"directory": f"{topic}-0", "topic": topic, "partition": 0, "base_offset": 0, "action": "compact",
                     "reason": "", "log": {"key": "k", "size": before * GB, "etag": "e", "storage_class": "STANDARD",
                                           "last_modified": (now - timedelta(days=60)).isoformat()}})
        results.append({"directory": f"{topic}-0", "base_offset": 0, "status": "compacted",
                        "bytes_before": before * GB, "bytes_after": after * GB})
    run = {"run_id": "r3", "bucket": "b", "prefix": "p", "finished_at": now.isoformat(), "settings": {},
           "segments": results, "usage": {"requests": {"_run": {"PutObject": 100}}, "compute_seconds": 7200}}
    ledger = [LedgerEntry(f"r{i}", (now - timedelta(days=30 * (3 - i))).isoformat(), False, 3, 0, 0, 0.4 * i, 0.01)
              for i in (1, 2)]
    return build_report(run, plan, load_prices(), CostOptions(), versioned=False, noncurrent_days=None,
                        ledger=ledger, now=now)


def test_the_page_is_self_contained() -> None:
    page = to_html(_report())
    for external in ("<script", "<link", "src=", "@import", "url("):
        assert external not in page
    assert page.count('<svg class="chart"') == 3


@pytest.mark.chromium
def test_chromium_renders_the_charts(tmp_path: Path) -> None:
    browser = _need_chromium()
    page = tmp_path / "report.html"
    page.write_text(to_html(_report()), encoding="utf-8")
    shot = tmp_path / "report.png"
    common = [browser, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    subprocess.run([*common, "--window-size=1200,1100", f"--screenshot={shot}", page.as_uri()],
                   capture_output=True, timeout=120, check=True)
    width, height, pixels = decode_png(shot.read_bytes())
    assert (width, height) == (1200, 1100)
    counts = Counter(pixels)
    # Each chart's own colour covers a visible area: the bars (saved, before, after) and the line's points.
    for name, color, least in (("saved bars", SAVED, 2000), ("after bars", AFTER, 1500), ("before bars", BEFORE, 1500),
                               ("cumulative line", LINE, 300)):
        assert counts[_rgb(color)] >= least, f"{name}: {counts[_rgb(color)]} pixels of {color}"
    # The DOM Chromium built holds the three charts and the numbers.
    dom = subprocess.run([*common, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    assert dom.count('class="chart"') == 3
    assert "Savings per month by topic" in dom
    assert "Cumulative savings per month over runs" in dom
    print(f"screenshot: {shot}")
