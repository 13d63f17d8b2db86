"""The local demo: generate sample partitions, rewrite every sealed segment, prove it, show the savings.

Layout under the working directory (replaced on each run)::

    logdir/<topic>-<partition>/<base>.log|.index|.timeindex   the generated "broker" segments
    rewritten/<topic>-<partition>/<base>.log|.index|.timeindex  the rewrites
    summary.json                                                 what the table shows, for machines

Each rewrite is checked end to end: the new ``.log`` is verified from disk (CRCs, every record), its
canonical records and batches digests must equal the source's, and its indexes must be valid and equal
a rebuild. One segment is corrupted on purpose: it must fail with a clear error and be skipped.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from tiering.demo.sample import write_segment
from tiering.errors import ConfigError, TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import LOG_SUFFIX, segment_name
from tiering.kafka.rewrite import RewriteOptions
from tiering.local import reindex_file, rewrite_file, verify_file

MIB: Final = 1024 * 1024
MARKER: Final = ".tiering-demo"
MAX_SCALE: Final = 100.0
# The S3 Standard price used for the headline only (us-east-1, first 50 TB tier, USD per GiB-month).
HEADLINE_PRICE_PER_GIB_MONTH: Final = 0.023


@dataclass(frozen=True, slots=True)
class DemoTopic:
    partition_dir: str
    kind: str
    producer_codec: Codec
    sealed_segments: int
    segment_mib: float


DEMO_TOPICS: Final = (
    DemoTopic("app.events-0", "json", Codec.SNAPPY, 3, 4),
    DemoTopic("app.events-1", "json", Codec.LZ4, 3, 4),
    DemoTopic("service_logs-0", "logs", Codec.NONE, 2, 4),
    DemoTopic("metrics.raw-0", "json", Codec.GZIP, 2, 4),
    DemoTopic("media_blobs-0", "random", Codec.NONE, 2, 2),  # incompressible: every batch kept
    DemoTopic("audit.zstd-0", "json", Codec.ZSTD, 2, 2),
)
CORRUPT_SEGMENT: Final = ("app.events-1", 1)  # (partition dir, index of the sealed segment to damage)


def _generate(root: Path, scale: float, log: Callable[[str], None]) -> tuple[list[tuple[str, Path, bool]], Path]:
    """Write the sample logdir; returns (partition, .log path, sealed) for every segment, and the damaged one."""
    segments = []
    for n, topic in enumerate(DEMO_TOPICS):
        part = root / topic.partition_dir
        part.mkdir(parents=True)
        offset, clock = 0, 0
        for i in range(topic.sealed_segments + 1):
            sealed = i < topic.sealed_segments
            target = int(topic.segment_mib * MIB * scale) if sealed else int(MIB * scale / 4)
            path = part / segment_name(offset, LOG_SUFFIX)
            with path.open("wb") as f:
                seg = write_segment(f, base_offset=offset, kind=topic.kind, codec=topic.producer_codec,
                                    target_bytes=max(target, 1), seed=n * 100 + i, shift_ms=clock)
            reindex_file(path, part)
            segments.append((topic.partition_dir, path, sealed))
            offset, clock = seg.next_offset, clock + 3_600_000
        log(f"generated {topic.partition_dir}: {topic.sealed_segments} sealed segments + 1 active "
            f"({topic.kind} values, producer codec {topic.producer_codec.label})")
    part_dir, index = CORRUPT_SEGMENT
    victim = [p for d, p, sealed in segments if d == part_dir and sealed][index]
    with victim.open("r+b") as f:
        f.seek(victim.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    log(f"corrupted one byte in the middle of {victim} (the demo expects it to be reported and skipped)")
    return segments, victim


def _clear_workdir(workdir: Path) -> None:
    """Empty the demo's working directory, but only one this demo made (it holds our marker file)."""
    marker = workdir / MARKER
    if workdir.exists():
        if not workdir.is_dir() or (any(workdir.iterdir()) and not marker.exists()):
            raise ConfigError("refusing to replace a directory the demo did not create; choose an empty or new --out",
                              path=str(workdir), expected=f"no such directory, an empty one, or one with {MARKER}",
                              found="other files")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    marker.write_text("created by `tiering demo`; the next run replaces this directory\n")


def run_demo(workdir: Path, *, codec: Codec = Codec.ZSTD, level: int | None = None, scale: float = 1.0,
             log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole demo in ``workdir``; returns the summary document (also written to summary.json)."""
    say = log or (lambda _line: None)
    options = RewriteOptions(codec=codec, level=level)
    if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):
        raise ConfigError("demo scale out of range", expected=f"a number in (0, {MAX_SCALE}]", found=scale)
    _clear_workdir(workdir)
    logdir, outdir = workdir / "logdir", workdir / "rewritten"
    segments, corrupt_path = _generate(logdir, scale, say)
    rows: list[dict[str, Any]] = []
    for part, path, sealed in segments:
        row: dict[str, Any] = {"partition": part, "segment": path.name, "bytes_before": path.stat().st_size}
        if not sealed:
            rows.append(row | {"status": "skipped", "reason": "active segment (highest base offset)"})
            continue
        try:
            source = verify_file(path)
            result, written = rewrite_file(path, outdir / part, options)
            assert written.log is not None
            check = verify_file(written.log, indexes=True)
        except TieringError as e:
            say(f"FAILED {path}: {e}")
            rows.append(row | {"status": "failed", "reason": str(e), "expected": path == corrupt_path})
            continue
        stats = result.stats
        proven = (check.records_sha256 == source.records_sha256 and check.batches_sha256 == source.batches_sha256
                  and not check.index_problems and all(check.index_equals_rebuild.values()))
        rows.append(row | {
            "status": "rewritten" if proven else "failed",
            "reason": None if proven else "digests or indexes of the rewrite differ from the source",
            "bytes_after": stats.bytes_out,
            "codecs_before": dict(stats.codecs_before),
            "codecs_after": dict(stats.codecs_after),
            "batches_kept": dict(stats.kept),
            "batches_rewritten": stats.batches_rewritten,
            "records": stats.records,
            "seconds": round(stats.seconds, 3),
            "records_sha256": check.records_sha256,
        })
        say(f"rewrote {part}/{path.name}: {stats.bytes_in:,} -> {stats.bytes_out:,} bytes, digests equal: {proven}")
    done = [r for r in rows if r["status"] == "rewritten"]
    failed = [r for r in rows if r["status"] == "failed"]
    before = sum(r["bytes_before"] for r in done)
    after = sum(r["bytes_after"] for r in done)
    saved_gib = (before - after) / 1024**3
    report: dict[str, Any] = {
        "schema_version": 1,
        "codec": codec.label,
        "level": options.level,
        "segments": rows,
        "totals": {
            "rewritten": len(done),
            "skipped": sum(r["status"] == "skipped" for r in rows),
            "failed": len(failed),
            "bytes_before": before,
            "bytes_after": after,
            "ratio": round(after / before, 4) if before else None,
            "monthly_savings_usd_per_tib_like_this": round(
                (1 - after / before) * 1024 * HEADLINE_PRICE_PER_GIB_MONTH, 2) if before else 0.0,
            "monthly_savings_usd": round(saved_gib * HEADLINE_PRICE_PER_GIB_MONTH, 6),
        },
        "expected_failures_only": all(r.get("expected") for r in failed),
        "summary_path": str(workdir / "summary.json"),
    }
    (workdir / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def render_table(report: dict[str, Any]) -> Table:
    """The demo's result as a table: one row per segment, totals in the footer."""
    t = Table(title=f"Rewrite to {report['codec']} (level {report['level']})", show_footer=True,
              title_justify="left")
    totals = report["totals"]
    t.add_column("partition", footer="total")
    t.add_column("segment")
    t.add_column("codecs before → after")
    t.add_column("before", justify="right", footer=f"{totals['bytes_before'] / MIB:,.1f} MiB")
    t.add_column("after", justify="right", footer=f"{totals['bytes_after'] / MIB:,.1f} MiB")
    saved = 1 - totals["ratio"] if totals["ratio"] is not None else 0.0
    t.add_column("saved", justify="right", footer=f"{saved:.1%}")
    t.add_column("status")
    for r in report["segments"]:
        if r["status"] == "rewritten":
            codecs = f"{'/'.join(r['codecs_before'])} → {'/'.join(r['codecs_after'])}"
            kept = sum(r["batches_kept"].values())
            if r["batches_rewritten"] == 0:
                status = "unchanged, every batch kept: " + "; ".join(r["batches_kept"])
            else:
                status = "rewritten, digests equal" + (f" ({kept} batches kept)" if kept else "")
            t.add_row(r["partition"], r["segment"], codecs, f"{r['bytes_before'] / MIB:,.2f} MiB",
                      f"{r['bytes_after'] / MIB:,.2f} MiB", f"{1 - r['bytes_after'] / r['bytes_before']:.1%}", status)
        else:
            reason = r["reason"] if r["status"] == "skipped" else f"[red]{r['reason']}[/red]"
            t.add_row(r["partition"], r["segment"], "", f"{r['bytes_before'] / MIB:,.2f} MiB", "", "",
                      f"{r['status']}: {reason}")
    t.caption = (f"S3 Standard at ${HEADLINE_PRICE_PER_GIB_MONTH}/GiB-month: 1 TiB like this sample would save "
                 f"${totals['monthly_savings_usd_per_tib_like_this']:,.2f} per month")
    return t
