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
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

from rich.table import Table

from tiering.demo.sample import write_segment
from tiering.errors import ConfigError, TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.files import LOG_SUFFIX, segment_name
from tiering.kafka.rewrite import RewriteOptions, RewriteStats
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


class LocalStatus(StrEnum):
    REWRITTEN = "rewritten"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class LocalRow:
    """One segment of the local demo and what became of it (``stats``: its rewrite's, when there was one)."""

    partition: str
    segment: str
    bytes_before: int
    status: LocalStatus
    reason: str | None = None
    expected: bool = False  # a failure the demo caused on purpose (its corrupt segment)
    stats: RewriteStats | None = None
    records_sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"partition": self.partition, "segment": self.segment,
                               "bytes_before": self.bytes_before, "status": str(self.status), "reason": self.reason}
        if self.status is LocalStatus.FAILED:
            doc["expected"] = self.expected
        if (st := self.stats) is not None:
            doc |= {"bytes_after": st.bytes_out, "codecs_before": dict(st.codecs_before),
                    "codecs_after": dict(st.codecs_after), "batches_kept": dict(st.kept),
                    "batches_rewritten": st.batches_rewritten, "records": st.records,
                    "seconds": round(st.seconds, 3), "records_sha256": self.records_sha256}
        return doc


@dataclass(frozen=True, slots=True)
class LocalDemo:
    """The local demo's result: every segment's row, the totals over those rewritten, the savings."""

    codec: str
    level: int | None
    rows: tuple[LocalRow, ...]
    summary_path: str

    def _count(self, status: LocalStatus) -> int:
        return sum(r.status is status for r in self.rows)

    @property
    def bytes_before(self) -> int:
        return sum(r.bytes_before for r in self.rows if r.status is LocalStatus.REWRITTEN)

    @property
    def bytes_after(self) -> int:
        return sum(r.stats.bytes_out for r in self.rows if r.status is LocalStatus.REWRITTEN and r.stats)

    @property
    def ratio(self) -> float | None:
        return self.bytes_after / self.bytes_before if self.bytes_before else None

    @property
    def monthly_savings_usd_per_tib(self) -> float:
        """At S3 Standard's first-tier price, a TiB of segments like these."""
        return (1 - self.ratio) * 1024 * HEADLINE_PRICE_PER_GIB_MONTH if self.ratio is not None else 0.0

    @property
    def failed(self) -> int:
        return self._count(LocalStatus.FAILED)

    @property
    def expected_failures_only(self) -> bool:
        return all(r.expected for r in self.rows if r.status is LocalStatus.FAILED)

    def to_json(self) -> dict[str, Any]:
        saved_gib = (self.bytes_before - self.bytes_after) / 1024**3
        return {
            "schema_version": 1, "codec": self.codec, "level": self.level,
            "segments": [r.to_json() for r in self.rows],
            "totals": {
                "rewritten": self._count(LocalStatus.REWRITTEN), "skipped": self._count(LocalStatus.SKIPPED),
                "failed": self.failed, "bytes_before": self.bytes_before, "bytes_after": self.bytes_after,
                "ratio": round(self.ratio, 4) if self.ratio is not None else None,
                "monthly_savings_usd_per_tib_like_this": round(self.monthly_savings_usd_per_tib, 2),
                "monthly_savings_usd": round(saved_gib * HEADLINE_PRICE_PER_GIB_MONTH, 6),
            },
            "expected_failures_only": self.expected_failures_only,
            "summary_path": self.summary_path,
        }


def run_demo(workdir: Path, *, codec: Codec = Codec.ZSTD, level: int | None = None, scale: float = 1.0,
             log: Callable[[str], None] | None = None) -> LocalDemo:
    """Run the whole demo in ``workdir``; its result (also written to summary.json)."""
    say = log or (lambda _line: None)
    options = RewriteOptions(codec=codec, level=level)
    if not (math.isfinite(scale) and 0 < scale <= MAX_SCALE):
        raise ConfigError("demo scale out of range", expected=f"a number in (0, {MAX_SCALE}]", found=scale)
    _clear_workdir(workdir)
    logdir, outdir = workdir / "logdir", workdir / "rewritten"
    segments, corrupt_path = _generate(logdir, scale, say)
    rows: list[LocalRow] = []
    for part, path, sealed in segments:
        size = path.stat().st_size
        if not sealed:
            rows.append(LocalRow(part, path.name, size, LocalStatus.SKIPPED, "active segment (highest base offset)"))
            continue
        try:
            source = verify_file(path)
            result, written = rewrite_file(path, outdir / part, options)
            assert written.log is not None
            check = verify_file(written.log, indexes=True)
        except TieringError as e:
            say(f"FAILED {path}: {e}")
            rows.append(LocalRow(part, path.name, size, LocalStatus.FAILED, str(e), expected=path == corrupt_path))
            continue
        stats = result.stats
        proven = (check.records_sha256 == source.records_sha256 and check.batches_sha256 == source.batches_sha256
                  and not check.index_problems and all(check.index_equals_rebuild.values()))
        rows.append(LocalRow(part, path.name, size, LocalStatus.REWRITTEN if proven else LocalStatus.FAILED,
                             None if proven else "digests or indexes of the rewrite differ from the source",
                             stats=stats, records_sha256=check.records_sha256))
        say(f"rewrote {part}/{path.name}: {stats.bytes_in:,} -> {stats.bytes_out:,} bytes, digests equal: {proven}")
    demo = LocalDemo(codec.label, options.level, tuple(rows), str(workdir / "summary.json"))
    (workdir / "summary.json").write_text(json.dumps(demo.to_json(), indent=2) + "\n")
    return demo


def render_table(demo: LocalDemo) -> Table:
    """The demo's result as a table: one row per segment, totals in the footer."""
    t = Table(title=f"Rewrite to {demo.codec} (level {demo.level})", show_footer=True, title_justify="left")
    t.add_column("partition", footer="total")
    t.add_column("segment")
    t.add_column("codecs before → after")
    t.add_column("before", justify="right", footer=f"{demo.bytes_before / MIB:,.1f} MiB")
    t.add_column("after", justify="right", footer=f"{demo.bytes_after / MIB:,.1f} MiB")
    t.add_column("saved", justify="right", footer=f"{1 - demo.ratio if demo.ratio is not None else 0.0:.1%}")
    t.add_column("status")
    for r in demo.rows:
        if r.status is LocalStatus.REWRITTEN and (st := r.stats) is not None:
            codecs = f"{'/'.join(st.codecs_before)} → {'/'.join(st.codecs_after)}"
            kept = sum(st.kept.values())
            if st.batches_rewritten == 0:
                status = "unchanged, every batch kept: " + "; ".join(st.kept)
            else:
                status = "rewritten, digests equal" + (f" ({kept} batches kept)" if kept else "")
            t.add_row(r.partition, r.segment, codecs, f"{r.bytes_before / MIB:,.2f} MiB",
                      f"{st.bytes_out / MIB:,.2f} MiB", f"{1 - st.bytes_out / r.bytes_before:.1%}", status)
        else:
            reason = r.reason if r.status is LocalStatus.SKIPPED else f"[red]{r.reason}[/red]"
            t.add_row(r.partition, r.segment, "", f"{r.bytes_before / MIB:,.2f} MiB", "", "", f"{r.status}: {reason}")
    t.caption = (f"S3 Standard at ${HEADLINE_PRICE_PER_GIB_MONTH}/GiB-month: 1 TiB like this sample would save "
                 f"${demo.monthly_savings_usd_per_tib:,.2f} per month")
    return t
