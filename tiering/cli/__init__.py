"""The ``tiering`` command line: ``main(argv) -> int``, one place that maps errors to exit codes.

Exit codes (the contract automation relies on, :class:`tiering.errors.ExitCode`): 0 ok, 1 the data is
invalid (corrupt, unsupported), 2 usage or configuration error, 3 busy/conflict (work left to a later run:
a partition held by another run, a segment changed by another writer), 4 a transient S3 or network
failure (retry). Text for people on stdout, progress on stderr, ``--json`` for machines.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from tiering import __version__
from tiering.cli.args import add_key_map_args, int_at_least, max_keys, merge_limits
from tiering.errors import ConfigError, ExitCode, InvalidDataError, TieringError, exit_code
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT, Codec, check_level
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES
from tiering.kafka.keycompact import DEFAULT_DELETE_RETENTION_MS, CleanOptions
from tiering.kafka.rebatch import DEFAULT_MAX_BYTES as DEFAULT_REBATCH_BYTES
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.records import Record
from tiering.kafka.rewrite import RewriteOptions, RewriteResult
from tiering.kafka.segment import DecodedBatch, SegmentSummary, iter_decoded
from tiering.local import compact_keys_dir, merge_dir, open_segment, reindex_file, rewrite_file, verify_file
from tiering.options import INDEX_BYTES, SEGMENT_BYTES, add_arguments

if TYPE_CHECKING:
    from tiering.cost.forecast import Forecast
    from tiering.run.documents import RunResult

EXIT_OK = ExitCode.OK
EXIT_INVALID = ExitCode.INVALID
EXIT_USAGE = ExitCode.USAGE

CODEC_CHOICES = [c.label for c in Codec]
DEMO_TOOL_LOG = "demo.log"  # in the demo's work directory: what Airflow, Spark and the libraries print


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors raise instead of exiting, so ``main`` keeps one exit-code mapping."""

    def error(self, message: str) -> Any:  # argparse's signature says NoReturn
        raise ConfigError(f"{message} (see: {self.prog} --help)")


def _out(args: argparse.Namespace) -> TextIO:
    stream: TextIO = args.stdout
    return stream


def _print_json(args: argparse.Namespace, doc: object) -> None:
    json.dump(doc, _out(args), separators=(",", ":") if getattr(args, "lines", False) else None,
              indent=None if getattr(args, "lines", False) else 2, sort_keys=False)
    _out(args).write("\n")


def _console(args: argparse.Namespace) -> Console:
    out = _out(args)
    # A pipe or a file gets full lines (rich would wrap tables at 80 columns); a terminal its own width.
    return Console(file=out, highlight=False, width=None if out.isatty() else 160)


@contextmanager
def _progress(label: str, total: int, enabled: bool) -> Iterator[Callable[[int], None] | None]:
    """A byte progress bar on stderr while long work runs (only when stderr is a terminal)."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda done: bar.update(task, completed=done)


# --- segment dump ------------------------------------------------------------------------------


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _record_json(r: Record) -> dict[str, object]:
    return {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key_size": -1 if r.key is None else len(r.key),
        "value_size": -1 if r.value is None else len(r.value),
        "key_b64": _b64(r.key),
        "value_b64": _b64(r.value),
        "headers": [{"key": hk.decode("utf-8", "replace"), "value_b64": _b64(hv)} for hk, hv in r.headers],
    }


def _preview(data: bytes | None, width: int = 60) -> str:
    if data is None:
        return "null"
    text = data[:width].decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else "." for ch in text)
    return repr(text + ("…" if len(data) > width else ""))


def _batch_line(b: DecodedBatch) -> str:
    j = b.to_json()
    parts = [f"baseOffset: {j['base_offset']}", f"lastOffset: {j['last_offset']}", f"count: {j['record_count']}",
             f"position: {j['position']}", f"size: {j['size']}", f"magic: {j['magic']}",
             f"compresscodec: {j['codec']}", f"{j['timestamp_type']}: {j['max_timestamp']}",
             f"producerId: {j['producer_id']}", f"producerEpoch: {j['producer_epoch']}",
             f"baseSequence: {j['base_sequence']}", f"isTransactional: {str(j['is_transactional']).lower()}",
             f"isControl: {str(j['is_control']).lower()}", f"partitionLeaderEpoch: {j['partition_leader_epoch']}",
             f"crc: {j['crc']}"]
    if j["delete_horizon_ms"] is not None:
        parts.append(f"deleteHorizonMs: {j['delete_horizon_ms']}")
    if j["control_type"] is not None:
        parts.append(f"endTxnMarker: {j['control_type']}")
    return " ".join(parts)


def _cmd_dump(args: argparse.Namespace) -> int:
    out = _out(args)
    with open_segment(args.path) as f:
        for batch in iter_decoded(f, path=str(args.path), limit=args.decompression_limit):
            if args.json:
                doc = batch.to_json()
                if args.deep:
                    doc["records"] = [_record_json(r) for r in batch.records]
                out.write(json.dumps(doc, separators=(",", ":")) + "\n")
                continue
            out.write(_batch_line(batch) + "\n")
            if args.deep:
                for r in batch.records:
                    headers = ", ".join(f"{hk.decode('utf-8', 'replace')}={_preview(hv, 20)}" for hk, hv in r.headers)
                    out.write(f"| offset: {r.offset} timestamp: {r.timestamp} keySize: "
                              f"{-1 if r.key is None else len(r.key)} valueSize: "
                              f"{-1 if r.value is None else len(r.value)} headers: [{headers}] "
                              f"key: {_preview(r.key, 30)} value: {_preview(r.value)}\n")
    return EXIT_OK


# --- segment verify ----------------------------------------------------------------------------


def _summary_table(summary: SegmentSummary, title: str) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    j = summary.to_json()
    for key in ("size_bytes", "batch_count", "record_count", "control_batch_count", "empty_batch_count", "magics",
                "codecs", "first_offset", "last_offset", "max_timestamp", "records_sha256", "batches_sha256"):
        t.add_row(key, str(j[key]))
    return t


def _cmd_verify(args: argparse.Namespace) -> int:
    try:
        summary = verify_file(args.path, indexes=args.indexes, base_offset=args.base_offset,
                              index_interval_bytes=args.index_interval_bytes,
                              decompression_limit=args.decompression_limit)
    except InvalidDataError as e:
        if args.json:
            _print_json(args, {"path": str(args.path), "valid": False, "error": e.to_dict()})
            return EXIT_INVALID
        raise
    valid = not summary.index_problems
    if args.json:
        _print_json(args, summary.to_json())
    else:
        console = _console(args)
        console.print(_summary_table(summary, str(args.path)))
        for name in summary.index_missing:
            console.print(f"note: no .{name} beside the log (a broker rebuilds a missing index)")
        broken = {p.file for p in summary.index_problems}
        for name, same in summary.index_equals_rebuild.items():
            if name in broken:
                continue
            console.print(f".{name}: valid, {'equal to' if same else 'differs from'} a rebuild "
                          f"(index.interval.bytes={args.index_interval_bytes}; a broker's own index may differ "
                          "and still be valid)")
        for problem in summary.index_problems:
            console.print(f"invalid: {problem}")
        console.print("valid" if valid else "INVALID")
    return EXIT_OK if valid else EXIT_INVALID


# --- segment rewrite / reindex -----------------------------------------------------------------


def _rewrite_table(result: RewriteResult, title: str) -> Table:
    t = Table(title=title, show_header=False, title_justify="left")
    t.add_column("field", style="bold")
    t.add_column("value")
    st = result.stats
    ratio_ = f"{st.bytes_out / st.bytes_in:.6g}" if st.bytes_in else "n/a"
    t.add_row("bytes in → out", f"{st.bytes_in:,} → {st.bytes_out:,} (ratio {ratio_})")
    t.add_row("saved", f"{st.bytes_in - st.bytes_out:,} bytes")
    t.add_row("batches", f"{st.batches:,} ({st.batches_rewritten:,} recompressed)")
    for reason, n in st.kept.items():
        t.add_row("  kept as they were", f"{n:,}: {reason}")
    t.add_row("records", f"{st.records:,}")
    t.add_row("codecs before", json.dumps(dict(st.codecs_before)))
    t.add_row("codecs after", json.dumps(dict(st.codecs_after)))
    t.add_row("records xxh3", f"{st.payload_xxh3} (every written batch proven to hold these records)")
    if (rb := result.rebatch) is not None:
        t.add_row("re-batched", f"{rb.batches_in:,} → {rb.batches_out:,} batches "
                  f"({rb.batches_merged:,} merged into {rb.runs_merged:,})")
        sample = (f", estimated from {rb.measured_batches:,} of the {rb.batches_merged:,} merged batches"
                  if rb.recompressed_is_estimate else "")
        t.add_row("  saved by re-batching", f"{rb.saved_by_rebatching:,} bytes (beyond recompressing the "
                  f"merged batches one by one{sample})")
        for reason, n in sorted(rb.refusals.items()):
            if n:
                t.add_row("  runs ended by", f"{n:,}: {reason}")
        t.add_row("records sha256", f"{rb.records_sha256} (the source's records, all in the output: proven)")
        t.add_row("batches sha256", "changed (batches merged)" if rb.batches_sha256_out != rb.batches_sha256_in
                  else "unchanged")
    t.add_row("seconds", f"{st.seconds:.3f}")
    return t


def _cmd_rewrite(args: argparse.Namespace) -> int:
    options = RewriteOptions(
        codec=Codec.parse(args.codec), level=args.level, force=args.force,
        deep_validation=not args.no_deep_validation, proof=not args.no_proof,
        index_interval_bytes=args.index_interval_bytes, decompression_limit=args.decompression_limit)
    size = args.path.stat().st_size if args.path.exists() else 0
    rebatch = RebatchOptions(options.codec, options.level, args.rebatch_max_bytes,
                             args.decompression_limit) if args.rebatch else None
    with _progress(f"rewrite {args.path.name}", size, not args.json) as progress:
        result, written = rewrite_file(args.path, args.out, options, base_offset=args.base_offset,
                                       progress=progress, rebatch=rebatch)
    doc = result.to_json()
    doc["outputs"] = {"log": str(written.log), "index": str(written.index), "timeindex": str(written.time_index)}
    if args.json:
        _print_json(args, doc)
    else:
        _console(args).print(_rewrite_table(result, f"{args.path} → {written.log}"))
    return EXIT_OK


def _cmd_reindex(args: argparse.Namespace) -> int:
    summary, written = reindex_file(args.path, args.out, base_offset=args.base_offset,
                                    index_interval_bytes=args.index_interval_bytes,
                                    decompression_limit=args.decompression_limit)
    doc = {"path": str(args.path), "batches": summary.batch_count, "index_interval_bytes": args.index_interval_bytes,
           "index": str(written.index), "index_bytes": written.index.stat().st_size,
           "timeindex": str(written.time_index), "timeindex_bytes": written.time_index.stat().st_size}
    if args.json:
        _print_json(args, doc)
    else:
        _out(args).write(f"wrote {doc['index']} ({doc['index_bytes']} bytes) and {doc['timeindex']} "
                         f"({doc['timeindex_bytes']} bytes) from {summary.batch_count} batches\n")
    return EXIT_OK


def _cmd_compact_keys(args: argparse.Namespace) -> int:
    if args.delete_retention_ms < 0 or args.min_compaction_lag_ms < 0:
        raise ConfigError("--delete-retention-ms and --min-compaction-lag-ms must not be negative",
                          expected=">= 0", found=min(args.delete_retention_ms, args.min_compaction_lag_ms))
    codec = Codec.parse(args.codec) if args.codec else None
    options = CleanOptions(args.now_ms if args.now_ms is not None else int(time.time() * 1000),
                           args.delete_retention_ms, args.min_compaction_lag_ms, args.first_dirty_offset,
                           max_keys(args), codec, check_level(codec, args.level) if codec is not None else None,
                           merge=None if args.no_merge else merge_limits(args))
    done = compact_keys_dir(args.path, args.out, options)
    doc = {"path": str(args.path), "out": str(args.out), "now_ms": options.now_ms,
           "first_uncleanable_offset": done.facts.upper, "end_offset": done.facts.end_offset,
           "segments_cleaned": list(done.cleaned),
           "merged": [{"base_offset": g[0], "sources": list(g)} for g in done.merged],
           "files_copied": list(done.copied), **done.stats.to_json()}
    if args.json:
        _print_json(args, doc)
        return EXIT_OK
    st = done.stats
    t = Table(title=f"{args.path} → {args.out}", show_header=False, box=None)
    t.add_row("segments cleaned", f"{len(done.cleaned)} (below offset {done.facts.upper:,}; the rest copied)")
    if done.merged:
        t.add_row("merged", f"{sum(len(g) for g in done.merged):,} of them into {len(done.merged):,} (as the broker "
                  f"groups neighbours within --segment-bytes {args.segment_bytes:,})")
    if done.facts.cleaned and done.facts.end_offset < done.facts.upper:
        t.add_row("key map full", f"cleaned up to offset {done.facts.end_offset:,}: run again with "
                  f"--first-dirty-offset {done.facts.end_offset} for the rest")
    t.add_row("records", f"{st.records_in:,} → {st.records_out:,} ({st.keys:,} keys)")
    t.add_row("bytes", f"{st.bytes_in:,} → {st.bytes_out:,}")
    t.add_row("batches", f"{st.batches_in:,} → {st.batches_out:,} ({st.batches_copied:,} copied as they were, "
              f"{st.batches_emptied:,} kept without records)")
    t.add_row("dropped", f"{st.superseded_dropped:,} superseded, {st.no_key_dropped:,} without a key, "
              f"{st.tombstones_dropped:,} tombstones past their horizon, {st.aborted_records_dropped:,} aborted, "
              f"{st.markers_dropped:,} markers")
    t.add_row("stamped", f"{st.tombstones_stamped:,} tombstones and {st.markers_stamped:,} markers, horizon "
              f"{options.now_ms + options.delete_retention_ms}")
    _console(args).print(t)
    return EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    done = merge_dir(args.path, args.out, merge_limits(args))
    doc = {"path": str(args.path), "out": str(args.out), "segment_bytes": args.segment_bytes,
           "index_bytes": args.index_bytes, "merged": [{"base_offset": g[0], "sources": list(g)} for g in done.groups],
           "segments_before": done.segments_before, "segments_after": done.segments_after,
           "files_before": done.files_before, "files_after": done.files_after}
    if args.json:
        _print_json(args, doc)
        return EXIT_OK
    t = Table(title=f"{args.path} → {args.out}", show_header=False, box=None)
    n = len(done.groups)
    t.add_row("segments", f"{done.segments_before:,} → {done.segments_after:,} ({n:,} merged segment"
              f"{'' if n == 1 else 's'}, each at most {args.segment_bytes:,} bytes)")
    t.add_row("files", f"{done.files_before:,} → {done.files_after:,}")
    for group in done.groups[:20]:
        t.add_row(f"  {group[0]:020d}.log", f"from {len(group)} segments ({group[0]:,} to {group[-1]:,})")
    if len(done.groups) > 20:
        t.add_row("", f"... {len(done.groups) - 20:,} more (see --json)")
    _console(args).print(t)
    return EXIT_OK


# --- demo ----------------------------------------------------------------------------------------


def _cmd_demo(args: argparse.Namespace) -> int:
    from tiering.demo.local import render_table, run_demo  # noqa: PLC0415 - the demos load only when run

    demo = run_demo(args.out, codec=Codec.parse(args.codec), level=args.level, scale=args.scale,
                    log=None if args.json else lambda line: print(line, file=sys.stderr))
    if args.json:
        _print_json(args, demo.to_json())
    else:
        console = _console(args)
        console.print(render_table(demo))
        console.print(f"outputs under {args.out}; JSON summary: {demo.summary_path}")
    return EXIT_OK if demo.failed == 0 or demo.expected_failures_only else EXIT_INVALID


def _cmd_pipeline_demo(args: argparse.Namespace) -> int:
    from tiering.demo.s3 import run_pipeline_demo  # noqa: PLC0415 - Airflow and moto load only here
    from tiering.report.render import headline, ratio, title, usd  # noqa: PLC0415

    started = time.monotonic()
    # Progress goes to the terminal's stderr as it was when the demo started: while the demo runs, stdout and
    # stderr (Airflow, Spark, library warnings) go to the tool log unless --verbose.
    terminal = os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1)
    quiet = not args.verbose

    def log(line: str) -> None:
        if not args.json or args.verbose:
            terminal.write(f"[{time.monotonic() - started:5.1f} s] {line}\n")

    try:
        with contextlib.nullcontext() if quiet else redirect_stdout(sys.stderr):
            demo = run_pipeline_demo(args.out, codec=Codec.parse(args.codec), level=args.level, scale=args.scale,
                                     spark_master=args.spark_master, log=log,
                                     tool_log=DEMO_TOOL_LOG if quiet else None)
    finally:
        terminal.close()
    if args.json:
        _print_json(args, demo.to_json())
        return EXIT_OK if demo.ok else EXIT_INVALID
    first, second = demo.runs
    console = _console(args)
    console.print(demo_forecast_table(demo.dry_run.forecast, first.result))
    console.print(pipeline_table(first.result))
    report = first.report
    console.print(f"\n[bold]{title(report)}[/bold]")
    for key, value in headline(report):
        console.print(f"  {key:<28} {value}", markup=False)
    again = second.report
    why = ", ".join(f"{s.segments} {s.reason}" for s in again.skipped)
    console.print(f"\nrun 2 (planned from an S3 Inventory report): {again.totals.segments_rewritten} rewritten, "
                  f"{again.totals.segments_skipped} skipped", markup=False)
    console.print(f"  why skipped: {why}", markup=False)
    console.print(f"  segment objects it changed: {len(demo.changed_by_second_run)} (the dry run's: "
                  f"{len(demo.dry_run.changed)})", markup=False)
    console.print("\nreports (HTML, with JSON, Markdown and CSV beside them on S3, gone with the demo's S3 server):")
    for path in demo.local_copies:
        console.print(f"  {path}", markup=False)
    if quiet:
        console.print(f"Airflow's and Spark's own output: {args.out / DEMO_TOOL_LOG} (or run with --verbose)",
                      markup=False)
    t = report.totals
    if t.monthly_savings_per_tib_usd is not None:
        console.print(f"\n[bold]At real scale: {usd(t.monthly_savings_per_tib_usd)} saved per month for each TiB "
                      f"of segments like these ({usd(12 * t.monthly_savings_per_tib_usd)} a year), at the measured "
                      f"ratio {ratio(t.ratio)}.[/bold]")
    return EXIT_OK if demo.ok else EXIT_INVALID


def demo_forecast_table(forecast: Forecast, run: RunResult) -> Table:
    """The dry run's forecast by topic beside what the real run then did."""
    from tiering.report.render import ratio, size  # noqa: PLC0415 - the demos load only when run

    t = Table(title="forecast (dry run) beside the real run, by topic", title_justify="left")
    for col in ("topic", "before", "forecast after", "forecast ratio (range)", "forecast", "real after",
                "real ratio", "real run"):
        t.add_column(col, justify="left" if col in ("topic", "forecast", "real run") else "right")
    outcomes: dict[str, list[str]] = {}
    for topic, status, cause, n in run.outcome_rows():
        outcomes.setdefault(topic, []).append(f"{n} {status}" + (f" ({cause.label})" if cause else ""))
    unreadable = Counter(problem.topic for problem in forecast.problems)
    for topic, r in forecast.by_topic().items():
        n, before, after = run.topics.get(topic, (0, 0, 0))
        low, high = r.ratio_range
        predicted = (f"{r.segments_skipped} of {r.segments} likely skipped" if r.segments_skipped else
                     f"{r.segments} to compact")
        if unreadable.get(topic):
            predicted += f" ({unreadable[topic]} unreadable in the sample)"
        real = [f"{n} compacted"] if n else []
        t.add_row(topic, size(r.bytes_before), size(r.bytes_after),
                  f"{ratio(r.ratio)} ({low:.3f}–{high:.3f})", predicted,
                  size(after) if n else "", ratio(after / before) if before else "1.000 (nothing saved)",
                  ", ".join(real + outcomes.get(topic, [])))
    t.caption = ("ratio: .log bytes after / before. A real ratio counts the segments it compacted; a topic it "
                 "skipped whole saved nothing (1.000).")
    t.caption_justify = "left"
    return t


def pipeline_table(run: RunResult) -> Table:
    """A run document as a table: one row per topic, then what was skipped or failed and why."""
    t = Table(title=f"run {run.run_id}: compaction to {run.settings['codec']}", title_justify="left",
              show_footer=True)
    rows = run.topics
    notes = {f"{topic}: {status}" + (f" ({cause.label})" if cause else ""): n
             for topic, status, cause, n in run.outcome_rows()}
    before, after = run.bytes_before, run.bytes_after
    t.add_column("topic", footer="total")
    t.add_column("segments", justify="right", footer=str(sum(r[0] for r in rows.values())))
    t.add_column("before", justify="right", footer=f"{before / 2**20:,.2f} MiB")
    t.add_column("after", justify="right", footer=f"{after / 2**20:,.2f} MiB")
    t.add_column("saved", justify="right", footer=f"{1 - after / before:.1%}" if before else "")
    for topic, (n, b, a) in sorted(rows.items()):
        t.add_row(topic, str(n), f"{b / 2**20:,.2f} MiB", f"{a / 2**20:,.2f} MiB", f"{1 - a / b:.1%}")
    for note, n in sorted(notes.items()):
        t.add_row(f"[dim]{note}[/dim]", str(n), "", "", "")
    return t


# --- parser ----------------------------------------------------------------------------------------


_nonneg_int = int_at_least(0)


def _add_segment_args(p: argparse.ArgumentParser, *, index_interval: bool = True) -> None:
    p.add_argument("path", type=Path, help="a segment file: <20-digit base offset>.log")
    p.add_argument("--base-offset", type=_nonneg_int, default=None,
                   help="the segment's base offset, when the file is not named after it")
    p.add_argument("--decompression-limit", type=_nonneg_int, default=DEFAULT_DECOMPRESSION_LIMIT,
                   metavar="BYTES",
                   help="largest decompressed records section accepted per batch: a larger one (a bomb, or a "
                        "lying length) is reported as invalid data (default %(default)s)")
    if index_interval:
        p.add_argument("--index-interval-bytes", type=_nonneg_int, default=DEFAULT_INDEX_INTERVAL_BYTES,
                       metavar="N", help="Kafka's index.interval.bytes for the indexes (default %(default)s)")


# Command groups that work on local files only: their parser is built without the others', so that a command
# of theirs does not load what the S3 commands, the report and the demos need (boto3, Airflow, ...).
LOCAL_GROUPS = frozenset({"segment", "partition"})


def build_parser(*, local_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line, or with ``local_only`` its :data:`LOCAL_GROUPS` alone."""
    parser = _Parser(
        prog="tiering",
        description="Recompress and re-index Kafka log segments, exactly as Kafka would write them.",
        epilog="Exit codes: 0 ok, 1 invalid data (corrupt or unsupported), 2 usage or configuration error.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    verbs = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    segment = verbs.add_parser("segment", help="work on one local segment file",
                               description="Read, verify, recompress and re-index one Kafka segment file.")
    seg = segment.add_subparsers(dest="segment_command", metavar="VERB", parser_class=_Parser)

    p = seg.add_parser("dump", help="print batches (and records with --deep)",
                       description="Print every batch of a segment like kafka-dump-log. With --json, one JSON "
                                   "object per batch per line (JSON Lines); --deep adds the records (keys and "
                                   "values base64-encoded).")
    _add_segment_args(p, index_interval=False)
    p.add_argument("--deep", action="store_true", help="also print every record (kafka-dump-log --deep-iteration)")
    p.add_argument("--json", action="store_true", help="JSON Lines on stdout")
    p.set_defaults(func=_cmd_dump)

    p = seg.add_parser("verify", help="check CRCs, every record, offsets (and indexes); exit 0 valid, 1 invalid",
                       description="Check every batch: header sanity, CRC-32C (v2) or CRC-32 (v0/v1), "
                                   "decompression within the limit, every record (count, offsets, varints, "
                                   "lengths), offsets increasing across batches. Prints the canonical "
                                   "records_sha256 and batches_sha256 digests. With --indexes, also judges "
                                   "the .index and .timeindex beside the log like kafka-dump-log "
                                   "--verify-index-only (sorted, in range, each entry naming the batch at its "
                                   "position) and says whether each equals a rebuild.")
    _add_segment_args(p)
    p.add_argument("--indexes", action="store_true", help="also verify the .index and .timeindex beside the log")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_verify)

    p = seg.add_parser("rewrite", help="recompress every batch into DIR/<base>.log with rebuilt indexes",
                       description="Recompress every batch with the target codec, keeping every offset and "
                                   "header field; prove each rewritten batch decodes to the original records; "
                                   "write DIR/<base>.log, .index and .timeindex (rebuilt as Kafka's "
                                   "LogSegment.recover does). Control batches, batches already in the target "
                                   "codec (unless --force) and batches that would not shrink are copied as "
                                   "they are. On invalid input: exit 1 and nothing is left in DIR.")
    _add_segment_args(p)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--codec", required=True, choices=CODEC_CHOICES, help="target codec")
    p.add_argument("--level", type=int, default=None,
                   help="codec level as Kafka's compression.<codec>.level (gzip 1-9, lz4 1-17, zstd -131072-22; "
                        "default: Kafka's)")
    p.add_argument("--force", action="store_true", help="recompress batches already in the target codec too")
    p.add_argument("--rebatch", action="store_true",
                   help="first merge runs of consecutive small batches into larger ones (every record's offset, "
                        "timestamp, key, value and headers unchanged; never control, transactional or "
                        "delete-horizon batches, never across producers, leader epochs or timestamp types, never "
                        "a producer's last batch; see docs/rebatching.md); the output's records digest must "
                        "equal the source's")
    p.add_argument("--rebatch-max-bytes", type=int, default=DEFAULT_REBATCH_BYTES, metavar="N",
                   help="records in a merged batch at most (default %(default)s: Kafka's default max.message.bytes)")
    p.add_argument("--no-deep-validation", action="store_true",
                   help="skip the per-record walk (CRC and decompression are still checked)")
    p.add_argument("--no-proof", action="store_true",
                   help="skip decoding each rewritten batch again and comparing it with the original")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_rewrite)

    p = seg.add_parser("reindex", help="rebuild .index and .timeindex of a segment into DIR",
                       description="Rebuild the offset and time indexes of a valid segment exactly as Kafka's "
                                   "LogSegment.recover does, into DIR/<base>.index and DIR/<base>.timeindex.")
    _add_segment_args(p)
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_reindex)

    partition = verbs.add_parser("partition", help="work on one local partition directory",
                                 description="Work on a Kafka partition directory (<topic>-<partition>/).")
    part = partition.add_subparsers(dest="partition_command", metavar="VERB", parser_class=_Parser)
    p = part.add_parser("compact-keys", help="one pass of Kafka's log cleaner into DIR (compacted topics)",
                        description="Clean the partition's sealed segments as one pass of Kafka's log cleaner "
                                    "does (cleanup.policy=compact): each key's latest value stays, superseded "
                                    "values and records without a key go, tombstones and transaction markers "
                                    "are stamped with a delete horizon and go on a later pass after it, aborted "
                                    "transactions' data goes, every producer's last batch stays (as a header "
                                    "without records when emptied). Writes a whole partition directory to DIR: "
                                    "the cleaned segments with rebuilt .index, .timeindex and .txnindex, and "
                                    "every other file as it was. The rules and their sources: "
                                    "docs/key-compaction.md.")
    p.add_argument("path", type=Path, metavar="PARTITION_DIR", help="the partition directory (only read)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (created if needed)")
    p.add_argument("--now-ms", type=int, default=None, metavar="MS",
                   help="the pass's clock in epoch milliseconds (default: now): horizons stamped now expire at "
                        "this + --delete-retention-ms")
    p.add_argument("--delete-retention-ms", type=int, default=DEFAULT_DELETE_RETENTION_MS, metavar="MS",
                   help="how long tombstones and markers stay once stamped (default %(default)s: Kafka's)")
    p.add_argument("--min-compaction-lag-ms", type=int, default=0, metavar="MS",
                   help="leave segments holding records this much younger than the partition's newest (default 0)")
    p.add_argument("--first-dirty-offset", type=int, default=0, metavar="OFFSET",
                   help="where the key map starts: the end_offset a previous pass printed (Kafka's cleaner "
                        "checkpoint; default 0)")
    add_key_map_args(p)
    p.add_argument("--codec", default=None, choices=CODEC_CHOICES,
                   help="codec of the batches rebuilt (default: each batch's own)")
    p.add_argument("--level", type=int, default=None, help="with --codec: its level (default: Kafka's)")
    add_arguments(p, (SEGMENT_BYTES, INDEX_BYTES))
    p.add_argument("--no-merge", action="store_true", help="clean each segment into one of its own")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_compact_keys)

    p = part.add_parser("merge", help="merge runs of small neighbouring segments into DIR",
                        description="Merge runs of neighbouring sealed segments smaller than --segment-bytes into "
                                    "segments up to it, by the rules of Kafka's log cleaner (a group stays within "
                                    "segment.bytes, its indexes within segment.index.bytes, its offsets within "
                                    "2^31 of its base). Every batch is copied as it is, the .index and .timeindex "
                                    "rebuilt as a broker rebuilds them, the .txnindex entries kept. The active "
                                    "segment is never merged, and a run ends where a segment does not start at the "
                                    "offset after its predecessor's last batch. Writes a whole "
                                    "partition directory to DIR; a broker started on it serves every record.")
    p.add_argument("path", type=Path, metavar="PARTITION_DIR", help="the partition directory (only read)")
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="output directory (new or empty)")
    add_arguments(p, (SEGMENT_BYTES, INDEX_BYTES))
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_merge)

    if local_only:
        return parser
    from tiering.cli.policy import add_policy_commands  # noqa: PLC0415 - see LOCAL_GROUPS
    from tiering.cli.report import add_report_command  # noqa: PLC0415
    from tiering.cli.s3 import add_s3_commands  # noqa: PLC0415

    p = verbs.add_parser("demo-local", help="the same on the local disk: generate partitions, rewrite, savings",
                         description="Generate sample Kafka partitions on the local disk (several topics and "
                                     "producer codecs, an incompressible topic, an already-zstd topic, a corrupt "
                                     "segment), rewrite every sealed segment, verify the digests of each rewrite "
                                     "against its source and print what was saved.")
    p.add_argument("--out", type=Path, default=Path("demo-out"), metavar="DIR",
                   help="working directory (default %(default)s; replaced on each run)")
    p.add_argument("--codec", default="zstd", choices=CODEC_CHOICES, help="target codec (default %(default)s)")
    p.add_argument("--level", type=int, default=None, help="codec level (default: Kafka's default for the codec)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the sample's size (default %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.set_defaults(func=_cmd_demo)

    p = verbs.add_parser("demo", help="the whole pipeline on an embedded S3: scan, Spark, verified swap, savings",
                         description="Start a moto S3 server on 127.0.0.1, fill a bucket with a realistic Kafka "
                                     "logdir tree (JSON events from snappy/lz4/gzip producers, log lines, an "
                                     "already-zstd topic, an incompressible one, an index-less and a corrupt "
                                     "segment, an internal topic), run the Airflow DAG kafka_segment_compaction "
                                     "twice with dag.test() and local Spark, and print the savings. No AWS "
                                     "account is used.")
    p.add_argument("--out", type=Path, default=Path("demo-out"), metavar="DIR",
                   help="working directory (default %(default)s; replaced on each run)")
    p.add_argument("--codec", default="zstd", choices=CODEC_CHOICES, help="target codec (default %(default)s)")
    p.add_argument("--level", type=int, default=None, help="codec level (default: Kafka's default for the codec)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the segments' size (default %(default)s)")
    p.add_argument("--spark-master", default="local[2]", help="Spark master (default %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout (progress lines are not shown)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help=f"show Airflow's and Spark's own output on stderr (else it goes to DIR/{DEMO_TOOL_LOG})")
    p.set_defaults(func=_cmd_pipeline_demo)
    add_s3_commands(verbs, _Parser)
    add_report_command(verbs, _Parser)
    add_policy_commands(verbs, _Parser)
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    err = stderr if stderr is not None else sys.stderr
    out = stdout if stdout is not None else sys.stdout
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(local_only=bool(argv) and argv[0] in LOCAL_GROUPS)
    args: argparse.Namespace | None = None

    def fail(code: int, line: str, doc: dict[str, object]) -> int:
        print(f"tiering: {line}", file=err)
        if args is not None and getattr(args, "json", False):  # machines get the error as JSON too
            print(json.dumps({"type": "error", "exit_code": code, "error": doc}), file=out)
        return code

    try:
        try:
            with redirect_stdout(out):  # --help and --version print to stdout and exit
                args = parser.parse_args(argv)
        except SystemExit as e:
            return e.code if isinstance(e.code, int) else EXIT_OK
        args.stdout = out
        func = getattr(args, "func", None)
        if func is None:
            parser.print_help(err)
            return EXIT_USAGE
        code: int = func(args)
        return code
    except TieringError as e:
        code = exit_code(e)
        return fail(code, f"invalid: {e}" if isinstance(e, InvalidDataError) else str(e), e.to_dict())
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # the machine's side: permissions, a full disk, a directory where a file was expected
        where = f"{e.filename}: " if e.filename else ""
        return fail(EXIT_USAGE, f"{where}{e.strerror or e}",
                    {"error": type(e).__name__, "message": e.strerror or str(e), "path": e.filename})
    except KeyboardInterrupt:
        print("tiering: interrupted", file=err)
        return ExitCode.INTERRUPTED


def entrypoint() -> None:
    sys.exit(main())
