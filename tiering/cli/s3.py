"""``tiering s3 ...``: scan, compact, roll back and clean up segment prefixes on S3.

The S3 endpoint and credentials come from the standard AWS environment (``AWS_ENDPOINT_URL``,
``AWS_REGION``, the credentials chain) or ``--endpoint-url``; nothing here prints them.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.table import Table

from tiering.cli.args import add_key_map_args, int_at_least, max_keys
from tiering.cli.report import add_cost_args, cost_from_args
from tiering.commit.operation import AUTO_SWAP, Context, SegmentResult, SwapChoice
from tiering.cost.document import MergeFigures
from tiering.cost.forecast import Forecast
from tiering.errors import ConfigError, ExitCode, StorageError
from tiering.kafka.codecs import Codec, check_level
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.vocabulary import Action, Cause, RunKind, Status, Swap, Verify
from tiering.options import (
    CLEANUP,
    CODEC,
    KEY_COMPACTION,
    LEASE_TTL,
    LEVEL,
    MAX_BYTES,
    MAX_SEGMENTS,
    MERGE,
    MIN_AGE,
    POLICY,
    REBATCH,
    REBATCH_MAX_BYTES,
    ROLLBACK,
    SWAP,
    TIERING,
    TOPICS,
    VERIFY,
    add_arguments,
    option,
)
from tiering.plan.document import Plan, PlannedSegment, PlanTotals
from tiering.plan.estimate import (
    DEFAULT_SAMPLE_BYTES,
    DEFAULT_SAMPLE_SEGMENTS,
    Sampling,
    StratifiedSample,
    estimate_work,
)
from tiering.plan.inventory import inventory_objects
from tiering.plan.policy import load_policy
from tiering.plan.scan import ScanOptions, scan_partitions
from tiering.report.publish import cost_config, publish_report
from tiering.report.render import merge_priced_text, to_table, usd
from tiering.run import engine
from tiering.run.cleanup import Cleanup, CleanupFigures, CleanupOptions, CleanupPartition, cleanup
from tiering.run.documents import CompactOptions, RunResult, new_run_id, topic_of, worst
from tiering.run.keycompact import KeyCompaction, KeyCompactOptions, KeyPartition
from tiering.run.merge import MergeOptions, Merging, PlannedMerges, plan_merges
from tiering.run.pipeline import RunSettings, compact, dry_run, plan_run, run_local, scan_run
from tiering.run.rollback import rollback
from tiering.storage.layout import reserved_dir
from tiering.storage.objects import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from tiering.run.tier import TierPlan


def _store(args: argparse.Namespace) -> ObjectStore:
    from tiering.storage.s3 import S3Store, make_client  # noqa: PLC0415 - boto3 loads only for S3 commands

    return S3Store(make_client(endpoint_url=args.endpoint_url, region=args.region), args.bucket)


def _emit_json(out: TextIO, doc: object) -> None:
    json.dump(doc, out, indent=2)
    out.write("\n")


def _console(out: TextIO) -> Console:
    return Console(file=out, highlight=False, width=None if out.isatty() else 160)


def _log(args: argparse.Namespace, line: str) -> None:
    if not args.json or args.verbose:
        print(line, file=sys.stderr, flush=True)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _scan_options(args: argparse.Namespace) -> ScanOptions:
    policy = load_policy(args.policy) if getattr(args, "policy", None) else None
    return ScanOptions(args.codec, args.level, args.topics, args.min_age_minutes, args.include_internal,
                       args.include_special, args.scan_workers, policy,
                       args.rebatch_max_bytes if args.rebatch else None)


def _add_workers_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--workers", type=int_at_least(1), default=1, metavar="N",
                   help=f"partitions {what} at once, each thread with its own S3 client (default %(default)s)")


def _add_inventory_arg(p: argparse.ArgumentParser, stale: str = "every segment's ETag is still checked before "
                       "it is touched, and one that changed since is skipped") -> None:
    p.add_argument("--inventory", default=None, metavar="s3://BUCKET/.../manifest.json",
                   help="plan from this S3 Inventory report (CSV) of the bucket instead of listing it: for buckets "
                        f"too large to list. An inventory is stale: {stale}")


def _source(args: argparse.Namespace, store: ObjectStore) -> Iterator[ObjectInfo] | None:
    """The objects of ``--inventory``'s report, or None: list the prefix."""
    if not getattr(args, "inventory", None):
        return None
    manifest, objects = inventory_objects(store, args.inventory, args.prefix)
    _log(args, f"reading the inventory {args.inventory} ({len(manifest.files)} files, made "
               f"{manifest.created_at.isoformat() if manifest.created_at else 'at an unknown time'}) ...")
    return objects


def _progress(args: argparse.Namespace) -> Callable[[int], None]:
    shown = [0]

    def progress(listed: int) -> None:
        if listed // 100_000 > shown[0] // 100_000:
            _log(args, f"  {listed:,} objects read")
        shown[0] = listed

    return progress


def _settings(args: argparse.Namespace, store: ObjectStore) -> RunSettings:
    codec = Codec.parse(args.codec)
    return RunSettings(store.bucket, args.prefix.strip("/"), getattr(args, "run_id", None) or new_run_id(),
                       codec.label, check_level(codec, args.level), args.lease_ttl_seconds,
                       *RunSettings.modes(getattr(args, "verify", "read-back"), getattr(args, "swap", AUTO_SWAP)))


def _plan_dry(args: argparse.Namespace, store: ObjectStore, settings: RunSettings, budget: CompactOptions,
              sampling: Sampling | None) -> Plan:
    """The run's scan (or --plan) and plan, as a run makes them, written to memory only (see dry_run)."""
    if getattr(args, "plan", None):
        source: ScanOptions | Plan = _load_plan(args, store)
    else:
        source = _scan_options(args)
        _log(args, f"scanning s3://{args.bucket}/{args.prefix} ...")
    prices = cost_config(region=getattr(args, "price_region", None),
                         prices_file=getattr(args, "prices", None))[0] if args.policy else None
    return dry_run(store, settings, source, budget, sampling, inventory=args.inventory, prices=prices,
                   progress=_progress(args), log=lambda line: _log(args, line))


class _Rows:
    """The scan table's rows (segments and bytes by action and skip reason), added up as segments stream by."""

    def __init__(self) -> None:
        self.rows: dict[str, list[int]] = {}

    def add(self, segments: Iterable[PlannedSegment]) -> None:
        for s in segments:
            label = s.action.value if s.action is not Action.SKIP else "skip: " + s.skip_label
            row = self.rows.setdefault(label, [0, 0])
            row[0] += 1
            row[1] += s.size


def _plan_table(plan: Plan, rows: _Rows) -> Table:
    t = Table(title=f"plan for s3://{plan.bucket}/{plan.prefix} → {plan.codec}", title_justify="left")
    for col in ("action", "segments", "bytes"):
        t.add_column(col, justify="right" if col != "action" else "left")
    for key, (n, size) in sorted(rows.rows.items()):
        t.add_row(key, f"{n:,}", _human(size))
    for d in plan.skipped_dirs[:20]:
        t.add_row(f"skip dir {d['directory']}", "", d["reason"])
    if plan.ignored_by_reason:
        t.add_section()
        t.add_row("objects not planned, by reason", "", f"{plan.ignored_count:,} objects")
        for reason, n in sorted(plan.ignored_by_reason.items()):
            t.add_row(f"  {reason}", "", f"{n:,} objects")
    return t


def forecast_table(forecast: Forecast, title: str = "forecast by topic (dry run: nothing changes)") -> Table:
    """The forecast by topic: bytes before, after, the range of the bytes saved, the segments a run would
    likely skip (their stratum's sample saves nothing, or less than the policy asks), and the sample."""
    t = Table(title=title, title_justify="left", show_footer=True)
    total = forecast.total
    t.add_column("topic", footer="total")
    for col, foot in (("segments", f"{total.segments:,}"), ("before", _human(total.bytes_before)),
                      ("after", _human(total.bytes_after)),
                      ("ratio", f"{total.ratio:.3f}" if total.ratio is not None else ""),
                      ("saved (range)", f"{_human(total.saved_bytes)} ({_human(total.saved_low)} – "
                                        f"{_human(total.saved_high)})"),
                      ("likely skipped", f"{total.segments_skipped:,}"), ("sampled", f"{total.segments_sampled:,}")):
        t.add_column(col, footer=foot, justify="right")
    for topic, r in forecast.by_topic().items():
        t.add_row(topic, f"{r.segments:,}", _human(r.bytes_before), _human(r.bytes_after),
                  f"{r.ratio:.3f}" if r.ratio is not None else "",
                  f"{_human(r.saved_bytes)} ({_human(r.saved_low)} – {_human(r.saved_high)})",
                  f"{r.segments_skipped:,}" if r.segments_skipped else "",
                  f"{r.segments_sampled:,}" + ("" if topic not in forecast.topics_not_sampled else " (pooled)"))
    notes = [f"{s.topic} ({s.source_codec}): {s.verdict}, sampled ratio {s.ratio:.3f}"
             for s in forecast.strata if not s.saves]
    notes += [f"{p.segment}: not sampled: {p.error}" for p in forecast.problems]
    if forecast.topics_not_sampled:
        notes.append(f"{len(forecast.topics_not_sampled)} topics had no sample of their own (more topics than "
                     f"--sample-segments {forecast.sample_segments}): the pooled ratio stands for them")
    t.caption = "\n".join(notes) or None
    t.caption_justify = "left"
    return t


def _rewrite_options(args: argparse.Namespace) -> RewriteOptions:
    return RewriteOptions(Codec.parse(args.codec), args.level)


def _write_plan(args: argparse.Namespace, plan: Plan) -> None:
    if args.out is not None:
        args.out.write_text(json.dumps(plan.to_json(), indent=1) + "\n")
        _log(args, f"plan written to {args.out}")


def _cmd_scan(args: argparse.Namespace) -> int:
    """Without --out or a policy the scan streams: it holds a few partitions, never the whole plan."""
    store = _store(args)
    rows = _Rows()
    sampling = Sampling(args.sample_segments, args.sample_bytes) if args.estimate else None
    if args.out is not None or args.policy:  # the plan step of a run without a budget, written to memory
        plan = _plan_dry(args, store, _settings(args, store), CompactOptions(), sampling)
        rows.add(plan.segments)
        totals = plan.totals()
        _write_plan(args, plan)
    else:
        _log(args, f"scanning s3://{args.bucket}/{args.prefix} ...")
        counted, sample = PlanTotals(), StratifiedSample()

        def emit(segments: list[PlannedSegment]) -> None:
            rows.add(segments)
            for seg in segments:
                counted.add(seg)
                if seg.action == Action.COMPACT:
                    sample.add(seg)

        plan = scan_partitions(store, args.prefix, _scan_options(args), emit, source=_source(args, store),
                               progress=_progress(args))
        totals = counted.to_json()
        if sampling is not None:
            plan = replace(plan, estimate=estimate_work(store, sample, _rewrite_options(args),
                                                        segments=sampling.segments, sample_bytes=sampling.bytes))
    _log(args, f"{plan.objects_listed:,} objects, {totals['segments']:,} segments: {totals['to_compact']:,} to "
               f"compact ({_human(totals['bytes_to_compact'])}), {totals['skipped']:,} skipped")
    if args.json:
        _emit_json(args.stdout, plan.summary(totals, args.inventory or "listing"))
    else:
        console = _console(args.stdout)
        console.print(_plan_table(plan, rows))
        if plan.estimate is not None:
            console.print(forecast_table(plan.estimate, "forecast by topic"))
    return 0


def _load_plan(args: argparse.Namespace, store: ObjectStore) -> Plan:
    text = args.plan
    if text.startswith("s3://"):
        bucket, _, key = text[5:].partition("/")
        doc = store.for_bucket(bucket).get_json(key)[0]
    else:
        try:
            doc = json.loads(Path(text).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(f"cannot read the plan: {e}", path=text) from None
    plan = Plan.from_json(doc)
    if (plan.bucket, plan.prefix) != (args.bucket, args.prefix.strip("/")) or plan.codec != Codec.parse(
            args.codec).label:
        raise ConfigError("the plan was made for another bucket, prefix or codec", path=text,
                          expected=f"s3://{args.bucket}/{args.prefix} {args.codec}",
                          found=f"s3://{plan.bucket}/{plan.prefix} {plan.codec}")
    return plan


def _segment_line(i: int, r: SegmentResult) -> str:
    sizes = f" {_human(r.bytes_before)} → {_human(r.bytes_after)}" if r.status is Status.COMPACTED else ""
    why = f": {r.reason}" if r.reason else ""
    return f"[{i}] {r.directory}/{r.base_offset:020d}: {r.status}{' (recovered)' if r.recovered else ''}{sizes}{why}"


def _segment_progress(args: argparse.Namespace) -> Callable[[SegmentResult], None]:
    """A numbered line on stderr for each segment a run finishes (called from the run's worker threads)."""
    done = [0]
    lock = threading.Lock()

    def progress(r: SegmentResult) -> None:
        with lock:
            done[0] += 1
            _log(args, _segment_line(done[0], r))

    return progress


def _run_table(run: RunResult) -> Table:
    totals = run.totals()
    t = Table(title=f"{run.kind} run {run.run_id} on s3://{run.bucket}/{run.prefix}", title_justify="left")
    for col in ("segment", "status", "before", "after", "note"):
        t.add_column(col, justify="right" if col in ("before", "after") else "left")
    for r in run.segments[:200]:
        t.add_row(f"{r.directory}/{r.base_offset:020d}", r.status + (" (recovered)" if r.recovered else ""),
                  _human(r.bytes_before) if r.bytes_before else "", _human(r.bytes_after) if r.bytes_after else "",
                  r.reason)
    if len(run.segments) + run.omitted > 200:
        t.add_row(f"... {len(run.segments) + run.omitted - 200:,} more (see --json and the run's step documents)",
                  "", "", "", "")
    before, after = totals["bytes_before"], totals["bytes_after"]
    ratio = f" (ratio {after / before:.3f}, saved {_human(before - after)})" if before else ""
    counts = ", ".join(f"{k}: {v}" for k, v in totals.items() if k not in ("bytes_before", "bytes_after"))
    objects = (run.usage or {}).get("objects")
    if run.kind is RunKind.MERGE and isinstance(objects, dict):
        t.caption = (f"{counts}; {objects['before']:,} segment objects merged into {objects['after']:,} "
                     f"({_human(before)} of .log bytes, unchanged)")
    elif run.kind is RunKind.CLEANUP:
        t.caption = f"{counts}; {CleanupFigures.of(run).summary(_human)}"
    elif run.kind is RunKind.ROLLBACK:  # what it put back is stored again: no saving to speak of
        t.caption = counts + (f"; .log bytes in place {_human(before)} → {_human(after)}, the originals' again"
                              if before != after else "")
    else:
        t.caption = f"{counts}; {_human(before)} → {_human(after)}{ratio}"
    return t


def _finish_run(args: argparse.Namespace, run: RunResult) -> int:
    if args.json:
        _emit_json(args.stdout, run.to_json())
    elif run.kind is RunKind.CLEANUP and not run.segments:  # nothing past its age: a line says so
        print(f"cleanup run {run.run_id} on s3://{run.bucket}/{run.prefix}: nothing past its age; "
              f"{CleanupFigures.of(run).summary(_human)}", file=args.stdout)
    else:
        _console(args.stdout).print(_run_table(run))
    code = run.exit_code()
    left = run.pending
    why = {ExitCode.INTERNAL: "a proof failed: what was written does not hold the source's records (nothing was "
                              "swapped in; please report it with the run document)",
           ExitCode.INVALID: "segments failed: invalid or unreadable data (see the run document)",
           ExitCode.USAGE: "segments failed: S3 refused requests (access or configuration; see the run document)",
           ExitCode.RETRY: f"{left} segments left for a later run: S3 or the network failed",
           ExitCode.BUSY: f"{left} segments left for a later run: partitions busy or segments changed"}
    later = [r for r in run.segments if r.cause is Cause.LATER_RUN]
    kept = [r for r in run.segments if r.cause is Cause.NOT_RESTORABLE]
    stopped = []  # a rollback that must wait (which runs to roll back first), or cannot restore
    if later:
        stopped.append(f"{len(later)} segments not rolled back: "
                       + "; ".join(sorted({r.reason.removeprefix("not rolled back: ") for r in later})))
    if kept:
        more = f"; {len(kept) - 1} more in the run document" if len(kept) > 1 else ""
        stopped.append(f"{len(kept)} segments not restored ({kept[0].directory}/{kept[0].base_offset}: "
                       f"{kept[0].reason}{more})")
    if stopped:
        why[ExitCode.BUSY] = "; ".join(stopped)
    if code in why:
        print(f"tiering: {run.kind} run {run.run_id}: {why[code]}", file=sys.stderr)
    return code


def _cmd_compact(args: argparse.Namespace) -> int:
    store = _store(args)
    options = _rewrite_options(args)
    settings = _settings(args, store)
    run_id = settings.run_id
    budget = CompactOptions(args.max_segments, args.max_bytes, args.lease_ttl_seconds, args.workers)
    if args.dry_run:
        plan = _plan_dry(args, store, settings, budget, Sampling(args.sample_segments, args.sample_bytes))
        forecast = plan.estimate
        assert forecast is not None  # a dry run's plan holds its forecast
        if args.json:
            _emit_json(args.stdout, {"dry_run": True, "forecast": forecast.to_json(), "plan": plan.to_json()})
        else:
            rows = _Rows()
            rows.add(plan.segments)
            console = _console(args.stdout)
            console.print(_plan_table(plan, rows))
            console.print(forecast_table(forecast))
            console.print("dry run: nothing was written")
        return 0
    ctx = settings.context(store, args.work_dir)
    progress = _segment_progress(args)

    if args.plan:
        _log(args, f"run {run_id}: compacting to {options.codec.label} ...")
        run = compact(store, _load_plan(args, store), ctx, budget, progress=progress)
    else:  # the DAG's steps, in this process: nothing holds the whole plan
        _log(args, f"scanning s3://{args.bucket}/{args.prefix} ...")
        scan_options = _scan_options(args)
        prices = cost_config(region=args.price_region, prices_file=args.prices)[0] if scan_options.policy else None
        scanned = scan_run(store, settings, scan_options, inventory=args.inventory, progress=_progress(args))
        planned = plan_run(store, settings, budget, policy=scan_options.policy, prices=prices)
        _log(args, f"{scanned.objects:,} objects, {scanned.totals.segments:,} segments: {planned.segments:,} to "
                   f"compact ({_human(planned.bytes)}), {planned.totals.skipped:,} skipped")
        _log(args, f"run {run_id}: compacting to {options.codec.label} ...")
        run = run_local(store, settings, ctx, budget, progress=progress)
    return _publish(args, store, ctx.prefix, run, _finish_run(args, run))


def _publish(args: argparse.Namespace, store: ObjectStore, prefix: str, run: RunResult, code: int) -> int:
    """Publish the run's savings report (unless --no-report) and log it; the exit code, worse when it failed."""
    if args.no_report:
        return code
    prices, cost = cost_from_args(args)
    try:
        report, keys = publish_report(store, prefix, run.run_id, prices, cost, kind=run.kind)
    except StorageError as e:  # the run's outcome is on S3 and printed already: only the report is missing
        print(f"tiering: the savings report was not published ('tiering report' can publish it later): {e}",
              file=sys.stderr)
        return code or (ExitCode.RETRY if e.retryable else ExitCode.USAGE)
    _log(args, to_table(report))
    _log(args, f"report: s3://{store.bucket}/{keys['html']} (and .json .md .csv; 'tiering report' prints it)")
    return code


def _cmd_compact_keys(args: argparse.Namespace) -> int:
    store = _store(args)
    options = KeyCompactOptions.from_args(args, max_keys=max_keys(args))
    if args.dry_run:
        return _keys_dry_run(args, store, options)
    run_id = args.run_id or new_run_id()
    swap = SwapChoice(None if args.swap == AUTO_SWAP else Swap(args.swap))
    ctx = Context(store, args.prefix, run_id, work_dir=args.work_dir,
                  verify=Verify(args.verify), swap=swap)

    chosen = " and ".join(([f"topics matching {args.topics!r}"] if args.topics else [])
                          + ([f"the compacted topics of {args.policy}"] if options.policy else []))
    _log(args, f"run {run_id}: key compaction of {chosen} under s3://{args.bucket}/{args.prefix} ...")
    run = engine.run(store, ctx, KeyCompaction(options), _segment_progress(args), source=_source(args, store),
                     workers=args.workers)
    return _publish(args, store, ctx.prefix, run, _finish_run(args, run))


def _keys_dry_run(args: argparse.Namespace, store: ObjectStore, options: KeyCompactOptions) -> int:
    """The partitions a pass would clean and how far it may go, from the listing or the inventory; nothing
    is written."""
    rows: list[dict[str, Any]] = []

    def add(part: KeyPartition) -> None:  # a partition with fewer than two segments in reach: nothing to clean
        if (row := part.preview_json())["segments"]:
            rows.append(row)

    engine.preview(store, args.prefix, KeyCompaction(options), add, source=_source(args, store))
    if args.json:
        _emit_json(args.stdout, {"dry_run": True, "settings": options.to_json(), "partitions": rows})
        return 0
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_topic.setdefault(topic_of(row["directory"]), []).append(row)
    t = Table(title=f"key compaction planned under s3://{args.bucket}/{args.prefix} (dry run: nothing changes)",
              title_justify="left")
    for col in ("topic", "partitions", "segments it may clean", ".log bytes", "delete.retention.ms",
                "min.compaction.lag.ms"):
        t.add_column(col, justify="left" if col == "topic" else "right")
    for topic, parts in sorted(by_topic.items()):
        settings = sorted({(p["delete_retention_ms"], p["min_compaction_lag_ms"]) for p in parts})
        t.add_row(topic, f"{len(parts):,}", f"{sum(p['segments'] for p in parts):,}",
                  _human(sum(p["log_bytes"] for p in parts)), ", ".join(f"{r:,}" for r, _ in settings),
                  ", ".join(f"{lag:,}" for _, lag in settings))
    t.add_row("all topics", f"{len(rows):,}", f"{sum(p['segments'] for p in rows):,}",
              _human(sum(p["log_bytes"] for p in rows)), "", "", style="bold")
    _console(args.stdout).print(t)
    print("dry run: nothing was written. A pass reads its partition's sealed segments in offset order and cleans "
          "all but the last it reads; min.compaction.lag.ms or a full key map may end it earlier, and what it "
          "removes is known only by reading the records.", file=args.stdout)
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    store = _store(args)
    options = MergeOptions.from_args(args)
    where = f"s3://{args.bucket}/{args.prefix}"
    if args.dry_run:
        planned: list[PlannedMerges] = []
        plan_merges(store, args.prefix, options, planned.append, _source(args, store))
        prices = cost_from_args(args)[0]
        figures = [p.figures(prices) for p in planned]
        known = [f for f in figures if f is not None]
        whole = functools.reduce(MergeFigures.plus, known) if known else None
        if args.json:
            _emit_json(args.stdout, {"dry_run": True, "settings": options.settings_json(),
                                     "partitions": [{**p.to_json(), **({"priced": f.to_json()} if f else {})}
                                                    for p, f in zip(planned, figures, strict=True)],
                                     **({"priced": whole.to_json()} if whole else {})})
        else:
            _console(args.stdout).print(_merge_plan_table(planned, figures, where, options))
            if whole is not None:
                print(merge_priced_text(whole), file=args.stdout)
            print("dry run: nothing was written (a group ends earlier where merging finds a gap in offsets; a "
                  "merged index's size is taken as the sum of its sources')", file=args.stdout)
        return 0
    run_id = args.run_id or new_run_id()
    ctx = Context(store, args.prefix, run_id, verify=Verify(args.verify))

    bound = (f"each topic's merge.target.bytes ({args.policy})" if options.policy is not None
             else _human(options.limits.segment_bytes))
    _log(args, f"run {run_id}: merging small neighbouring segments under {where} into segments of at most {bound} ...")
    run = engine.run(store, ctx, Merging(options), _segment_progress(args), source=_source(args, store),
                     workers=args.workers)
    return _publish(args, store, ctx.prefix, run, _finish_run(args, run))


def _merge_plan_table(planned: list[PlannedMerges], figures: list[MergeFigures | None], where: str,
                      options: MergeOptions) -> Table:
    bound = "as the policy says" if options.policy is not None else f"of at most {_human(options.limits.segment_bytes)}"
    t = Table(title=f"merges planned under {where} (segments {bound})", title_justify="left")
    for col in ("partition", "groups", "segments", "objects", ".log bytes merged", "their storage a month"):
        t.add_column(col, justify="left" if col == "partition" else "right")

    def storage(fs: list[MergeFigures | None]) -> str:
        known = [f for f in fs if f is not None]
        if not known:
            return ""
        return f"{usd(sum(f.monthly_before_usd for f in known))} → {usd(sum(f.monthly_after_usd for f in known))}"

    shown = [(p, f) for p, f in zip(planned, figures, strict=True) if p.groups]
    for p, f in shown[:200]:
        t.add_row(p.directory, f"{len(p.groups):,}", f"{p.segments_before:,} → {p.segments_after:,}",
                  f"{p.objects_before:,} → {p.objects_after:,}", _human(p.bytes_merged), storage([f]))
    if len(shown) > 200:
        t.add_row(f"... {len(shown) - 200:,} more partitions", "", "", "", "", "")
    t.add_row("all partitions", f"{sum(len(p.groups) for p in planned):,}",
              f"{sum(p.segments_before for p in planned):,} → {sum(p.segments_after for p in planned):,}",
              f"{sum(p.objects_before for p in planned):,} → {sum(p.objects_after for p in planned):,}",
              _human(sum(p.bytes_merged for p in planned)), storage(figures), style="bold")
    return t


def _cmd_rollback(args: argparse.Namespace) -> int:
    store = _store(args)
    ctx = Context(store, args.prefix, new_run_id())
    _log(args, f"rolling back run {args.target_run}: the originals it replaced, or the classes it moved objects "
               "from ...")
    return _finish_run(args, rollback(store, ctx, args.target_run, args.lease_ttl_seconds, _segment_progress(args),
                                      workers=args.workers))


def _cmd_cleanup(args: argparse.Namespace) -> int:
    store = _store(args)
    ctx = Context(store, args.prefix, new_run_id())
    _log(args, f"cleanup: kept originals older than {args.grace_days:g} days, staging objects and uploads older "
               f"than {args.stale_hours:g} hours ...")
    options = CleanupOptions.from_args(args)
    if args.dry_run:
        return _cleanup_dry_run(args, store, options)
    return _finish_run(args, cleanup(store, ctx, options, _segment_progress(args), workers=args.workers,
                                     source=_source(args, store)))


def _cleanup_dry_run(args: argparse.Namespace, store: ObjectStore, options: CleanupOptions) -> int:
    """What a cleanup would delete, a partition at a time, as its planning finds it (nothing is deleted; no
    probe of the store: its answer only matters to a deletion)."""
    found: list[tuple[str, int, int, int]] = []  # partition, kept originals, their bytes, staging objects

    def add(part: CleanupPartition) -> None:
        found.append((part.directory, len(part.backups), sum(e.size for e in part.backups), len(part.staging)))

    engine.preview(store, args.prefix, Cleanup(replace(options, deletes_checked=True)), add,
                   source=_source(args, store))
    totals = (sum(f[1] for f in found), sum(f[2] for f in found), sum(f[3] for f in found))
    if args.json:
        _emit_json(args.stdout, {"dry_run": True, "settings": {"grace_days": options.grace_days,
                                                               "stale_hours": options.stale_hours},
                                 "partitions": [{"directory": d, "backups": n, "backup_bytes": b, "staging": st}
                                                for d, n, b, st in found],
                                 "totals": {"partitions": len(found), "backups": totals[0],
                                            "backup_bytes": totals[1], "staging": totals[2]}})
        return 0
    t = Table(title=f"what a cleanup of s3://{args.bucket}/{args.prefix} would delete (originals kept over "
                    f"{options.grace_days:g} days, staging objects over {options.stale_hours:g} hours)",
              title_justify="left")
    for col in ("partition", "kept originals", "their bytes", "staging objects"):
        t.add_column(col, justify="left" if col == "partition" else "right")
    for d, n, b, st in found[:200]:
        t.add_row(d, f"{n:,}", _human(b), f"{st:,}")
    if len(found) > 200:
        t.add_row(f"... {len(found) - 200:,} more partitions (see --json)", "", "", "")
    t.add_row(f"all partitions ({len(found):,})", f"{totals[0]:,}", _human(totals[1]), f"{totals[2]:,}", style="bold")
    _console(args.stdout).print(t)
    print("dry run: nothing was deleted (a cleanup keeps what an operation in flight still names, and what a busy "
          "partition holds; incomplete uploads and the leases of finished runs are not counted here)",
          file=args.stdout)
    return 0


def _tier_table(plan: TierPlan) -> Table:
    totals = plan.totals
    t = Table(title=f"storage tiering of s3://{plan.bucket}/{plan.prefix}", title_justify="left")
    for col in ("transition", "objects", "bytes"):
        t.add_column(col, justify="left" if col == "transition" else "right")
    for name, row in sorted(totals.by_transition.items()):
        t.add_row(name, str(row.objects), _human(row.bytes))
    for reason, n in sorted(totals.staying.items()):
        t.add_row(f"[dim]stays: {reason}[/dim]", str(n), "")
    payback = totals.payback_months
    t.caption = (f"saves ${totals.monthly_savings_usd:.6f}/month; one-off ${totals.one_off_usd:.6f} "
                 f"(copy requests, retrieval); payback "
                 + ("never" if payback is None else f"{payback:.1f} months"))
    return t


def _cmd_tier(args: argparse.Namespace) -> int:
    """The tiering DAG's steps in this process: the run (its plan's sums written to the run's tier-plan
    document), then its report (beside the run's other reports). A dry run plans and writes nothing."""
    from tiering.run.tier import SegmentTiering, TierPartition, lifecycle_configuration  # noqa: PLC0415
    from tiering.steps import storage_classes as steps  # noqa: PLC0415

    run = steps.TieringParams(args.bucket, args.prefix.strip("/"), args.run_id or new_run_id(), str(args.policy),
                              args.dry_run, args.include_internal, args.lease_ttl_seconds, args.inventory,
                              args.workers)
    policy = run.policy()  # a bad policy stops here, before any request
    if args.emit_lifecycle:
        config, notes = lifecycle_configuration(policy, args.prefix)
        _emit_json(args.stdout, config)  # as put-bucket-lifecycle-configuration takes it
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        return 0
    store = _store(args)
    prices, _ = cost_from_args(args)
    _log(args, f"planning storage tiers of s3://{args.bucket}/{args.prefix} ...")
    decided: list[SegmentTiering] = []  # a dry run's --json lists every segment's decision

    def each(part: TierPartition) -> None:
        if args.dry_run and args.json:
            decided.extend(part.decided)

    step, planned = steps.tier(store, run, lambda line: _log(args, line), prices=prices, write_plan=not args.dry_run,
                               each=each)
    if args.dry_run:
        if args.json:
            _emit_json(args.stdout, {"dry_run": True, "plan": {**planned.to_json(),
                                                               "segments": [s.to_json() for s in decided]}})
        else:
            _console(args.stdout).print(_tier_table(planned))
            _console(args.stdout).print("dry run: nothing was moved or written")
        return 0
    assert step.run_key is not None  # a run that is not a dry run writes its document
    tiered = RunResult.from_json(store.get_json(step.run_key)[0], f"s3://{args.bucket}/{step.run_key}")
    if args.json:
        _emit_json(args.stdout, {"plan": planned.to_json(), "run": tiered.to_json()})
    else:
        _console(args.stdout).print(_tier_table(planned))
        moved = sum(int(n) for n in (tiered.usage.get("objects_moved") or {}).values())
        _console(args.stdout).print(f"run {run.run_id}: {moved} objects moved in {step.segments} segments")
    code = tiered.exit_code()
    if code != ExitCode.OK:
        failed = tiered.counts.get(Status.FAILED, 0)
        print(f"tiering: tier run {run.run_id}: {failed} segments stopped (see the run document for why)",
              file=sys.stderr)
    try:
        _log(args, f"report: {steps.report(store, run, step, lambda _: None).report}")
    except StorageError as e:  # the run's outcome is on S3 and printed already: only the report is missing
        print(f"tiering: the tiering report was not published: {e}", file=sys.stderr)
        return worst([code, ExitCode.RETRY if e.retryable else ExitCode.USAGE])
    return code


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bucket", required=True, help="the bucket holding the logdir tree")
    p.add_argument("--prefix", required=True, help="PREFIX of s3://BUCKET/PREFIX/<topic>-<partition>/...")
    p.add_argument("--endpoint-url", default=None,
                   help="S3 endpoint (default: AWS_ENDPOINT_URL, else AWS); credentials come from the AWS chain")
    p.add_argument("--region", default=None, help="region (default: AWS_REGION / AWS_DEFAULT_REGION)")
    LEASE_TTL.add_to(p)
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    p.add_argument("-v", "--verbose", action="store_true", help="progress lines on stderr even with --json")


def _scan_args(p: argparse.ArgumentParser, *, codec_required: bool) -> None:
    (replace(CODEC, default=None) if codec_required else CODEC).add_to(p)
    LEVEL.add_to(p)
    TOPICS.add_to(p)
    MIN_AGE.add_to(p)
    p.add_argument("--include-internal", action="store_true", help="include internal topics (names starting __)")
    p.add_argument("--include-special", action="store_true",
                   help="include Kafka's -delete, -future and -stray directories")
    p.add_argument("--scan-workers", type=int, default=8, help="partitions listed at once (default %(default)s)")
    _add_inventory_arg(p)
    add_arguments(p, (POLICY, REBATCH, REBATCH_MAX_BYTES))
    p.add_argument("--sample-segments", type=int_at_least(1), default=DEFAULT_SAMPLE_SEGMENTS, metavar="N",
                   help="ranged GETs the forecast may make: every topic gets one (the largest first when there are "
                        "more topics than N), the rest go by bytes (default %(default)s)")
    p.add_argument("--sample-bytes", type=int_at_least(1), default=DEFAULT_SAMPLE_BYTES, metavar="BYTES",
                   help="bytes read from the start of each sampled segment (default %(default)s)")


def add_s3_commands(verbs: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    s3 = verbs.add_parser("s3", help="scan, compact, roll back and clean up segment prefixes on S3",
                          description="Work on a Kafka logdir tree in S3: s3://BUCKET/PREFIX/<topic>-<partition>/"
                                      "<20-digit base>.{log,index,timeindex}. Our own objects live under "
                                      f"{reserved_dir('PREFIX')}.")
    sub = s3.add_subparsers(dest="s3_command", metavar="VERB", parser_class=parser_class)

    p = sub.add_parser("scan", help="list a prefix and plan what a compaction would do",
                       description="List every partition (paginated, in parallel) and classify each segment: "
                                   "compact, or skip with the reason (active, too young, already compacted, "
                                   "archived, incomplete, empty). Writes a versioned JSON plan with --out.")
    _common(p)
    _scan_args(p, codec_required=False)
    p.add_argument("--out", type=Path, default=None, metavar="PLAN.json", help="write the plan to this file")
    p.add_argument("--estimate", action="store_true", help="estimate the savings by recompressing sampled batches")
    p.set_defaults(func=_cmd_scan)

    p = sub.add_parser("compact", help="recompress sealed segments and swap them in with the commit protocol",
                       description="Scan (or read --plan), then for each planned segment, under its partition's "
                                   "lease: rewrite, stage, verify by reading back, back up the originals, swap "
                                   "(indexes removed, .log replaced only if unchanged, new indexes put). "
                                   "Operations an interrupted run left in flight are finished (or, for another "
                                   "run's, abandoned before their backup) by the next run that covers their "
                                   "partition. Exit 0 done; 1 a segment's data is invalid (left untouched); 4 S3 "
                                   "or the network failed for some segments (retry); 3 some were left to a busy "
                                   "partition or a concurrent writer (run again later).")
    _common(p)
    _scan_args(p, codec_required=True)
    p.add_argument("--plan", default=None, metavar="PLAN.json", help="a plan from 'tiering s3 scan --out' "
                   "(a local path or an s3:// URI) instead of scanning now")
    add_arguments(p, (MAX_SEGMENTS, MAX_BYTES))
    p.add_argument("--dry-run", action="store_true", help="plan and estimate the savings; write nothing")
    p.add_argument("--run-id", default=None, help="name the run (a retry with the same id takes its leases back)")
    _add_workers_arg(p, "compacted")
    p.add_argument("--work-dir", default=None, help="directory for spool files (default: the system's temp dir)")
    add_arguments(p, (VERIFY, SWAP))
    p.add_argument("--no-report", action="store_true", help="do not publish the cost savings report")
    add_cost_args(p)
    p.set_defaults(func=_cmd_compact)

    p = sub.add_parser("compact-keys", help="key-compact compacted topics: one pass of Kafka's log cleaner",
                       description="For each partition of the topics matching --topics, under its lease: one pass "
                                   "of Kafka's log cleaner (cleanup.policy=compact) over its archived segments, "
                                   "with the broker's rules (docs/key-compaction.md): each key's latest record "
                                   "kept, superseded records, records without a key and aborted transactions' "
                                   "data removed, tombstones and markers stamped with a delete horizon and removed "
                                   "on a later pass once it passed. Each segment that changes is staged, checked, "
                                   "backed up and swapped in offset order, so an interrupted pass leaves a prefix "
                                   "of the partition cleaned, as a broker's cleaner would; neighbours are cleaned "
                                   "into one segment as the cleaner groups them (--segment-bytes, --index-bytes; "
                                   "--no-merge: each its own). Run it only on topics "
                                   "that are compacted: it removes every superseded value. Exit 0 done; 1 invalid "
                                   "or unsupported data (legacy batches, an ABORT marker its .txnindex does not "
                                   "name); 3 busy; 4 S3 failed (retry).")
    _common(p)
    _add_inventory_arg(p)
    add_arguments(p, KEY_COMPACTION, but=(LEASE_TTL, option(KEY_COMPACTION, "max_keys")))
    add_key_map_args(p)  # a pass whose map fills up ends there; the partition remembers where, for the next run
    p.add_argument("--dry-run", action="store_true",
                   help="list and plan only: per topic, the partitions a pass would clean, the segments it may "
                        "clean and their bytes, and the cleaner's settings resolved for each; nothing is written")
    p.add_argument("--run-id", default=None, help="name the run (a retry with the same id takes its leases back)")
    p.add_argument("--work-dir", default=None,
                   help="directory for the cleaned segment being staged (default: the system's temp dir)")
    add_arguments(p, (VERIFY, SWAP))
    p.add_argument("--no-report", action="store_true", help="do not publish the cost savings report")
    add_cost_args(p)
    _add_workers_arg(p, "key-compacted")
    p.set_defaults(func=_cmd_compact_keys)

    p = sub.add_parser("tier", help="move old segments to colder storage classes as a policy says",
                       description="Plan and apply storage-class transitions by the age of each segment's newest "
                                   "record (its max timestamp, not LastModified), per the policy's storage.tiers. "
                                   "A transition is an in-place copy with the new class, keeping metadata, tags "
                                   "and encryption, under the partition lease. Objects under 128 KiB never go to "
                                   "IA classes; GLACIER / DEEP_ARCHIVE only where the policy allows them. The "
                                   "plan and a report are written beside the run's other documents; a dry run "
                                   "writes nothing.")
    _common(p)
    add_arguments(p, [option(TIERING, "policy")])
    p.add_argument("--dry-run", action="store_true",
                   help="plan only: what would move, and why the rest stays; nothing is moved or written")
    p.add_argument("--emit-lifecycle", action="store_true",
                   help="print an approximate S3 Lifecycle configuration instead (S3 sees object age, not record "
                        "age: read its notes)")
    p.add_argument("--run-id", default=None, help="name the run (a retry with the same id takes its leases back)")
    add_arguments(p, [option(TIERING, "include_internal")])
    _add_inventory_arg(p)
    add_cost_args(p)
    _add_workers_arg(p, "tiered")
    p.set_defaults(func=_cmd_tier)

    p = sub.add_parser("merge", help="merge runs of small neighbouring segments into fewer, larger ones",
                       description="For each partition of the chosen topics, under its lease: runs of neighbouring "
                                   "sealed segments each smaller than --segment-bytes are merged into segments of "
                                   "at most --segment-bytes, grouped as Kafka's cleaner groups them "
                                   "(docs/merging.md). Every batch is kept byte for byte; the indexes are rebuilt "
                                   "and the .txnindex entries carried over. A merge never crosses a gap in offsets, "
                                   "never touches the active segment or one younger than --min-age-minutes, and is "
                                   "swapped in so that a broker restoring the bucket at any instant loads every "
                                   "offset once (docs/commit-protocol.md). The originals stay in the run's backup "
                                   "for the grace period; 'tiering s3 rollback RUN' splits a merged segment again. "
                                   "Exit 0 done; 1 invalid data; 3 busy; 4 S3 failed (retry).")
    _common(p)
    add_arguments(p, MERGE, but=(LEASE_TTL,))
    p.add_argument("--dry-run", action="store_true",
                   help="list and plan only: the groups, and segments and objects before and after, per partition, "
                        "with their storage a month, GETs and lifecycle transitions priced by the object")
    _add_inventory_arg(p)
    p.add_argument("--run-id", default=None, help="name the run (a retry with the same id takes its leases back)")
    VERIFY.add_to(p)
    p.add_argument("--no-report", action="store_true", help="do not publish the cost report")
    add_cost_args(p)
    _add_workers_arg(p, "merged")
    p.set_defaults(func=_cmd_merge)

    p = sub.add_parser("rollback", help="undo a run: the originals it replaced, the classes it moved objects from",
                       description="Undo run RUN_ID, a partition at a time under its lease. For a compaction, merge "
                                   "or key-compaction run: put back, from the kept backups, every original it "
                                   "replaced whose replacement is still in place (same swap order as a compaction; "
                                   "a merged segment split back into its sources). For a tiering run: move every "
                                   "object it moved back to the class it found it in. Roll runs back newest first: "
                                   "while a later run replaced or moved what RUN_ID wrote, nothing is changed and "
                                   "the run to roll back first is named (exit 3). Exit 3 also if a partition was "
                                   "busy (another run's lease: run again once it expires) or an object cannot be "
                                   "restored, 1 if a backup is gone, 4 if S3 failed.")
    _common(p)
    add_arguments(p, ROLLBACK, but=(LEASE_TTL,))
    _add_workers_arg(p, "rolled back")
    p.set_defaults(func=_cmd_rollback)

    p = sub.add_parser("cleanup", help="delete kept originals past the grace period and abandoned leftovers",
                       description="Release the leases of runs that finished, abort incomplete multipart uploads "
                                   "(billed but invisible to a listing), finish interrupted segment operations, then "
                                   "delete kept originals older than the grace period and abandoned staging objects, "
                                   "a partition at a time under its lease. Ages by S3's clock. Exit 3 if a partition "
                                   "was busy (its objects are left to a later cleanup), 4 if S3 failed.")
    _common(p)
    add_arguments(p, CLEANUP, but=(LEASE_TTL,))
    _add_inventory_arg(p, "an object kept since it was taken waits for a later cleanup, and one rewritten since "
                          "is not deleted")
    _add_workers_arg(p, "cleaned")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, a partition at a time; "
                   "delete nothing")
    p.set_defaults(func=_cmd_cleanup)
