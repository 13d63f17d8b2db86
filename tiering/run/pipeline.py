"""Compaction's scan and plan, and its runs through the engine: the steps the Airflow DAG's tasks, the Spark
job and the CLI call.

    scan  ->  plan  ->  the engine's compaction (units of whole partitions, each segment swapped in)  ->  report

- :func:`scan_run` lists the prefix (or reads an S3 Inventory report) into chunk files under
  ``PREFIX/_tiering/runs/<run>/scan/`` (see :mod:`tiering.plan.planfile`), one partition at a time.
- :func:`plan_run` streams the scan through the policy (record ages, automatic codecs) and the budget
  (largest first) into ``runs/<run>/plan/``.
- The plan is carried out by the run engine's compaction (:class:`~tiering.run.compaction.Compaction`,
  :func:`compaction_kind`): in this process with :func:`run_local` (the CLI), or by the Spark job, one
  task per unit; the engine writes the run document.

Every document lives under ``PREFIX/_tiering/runs/<run>/``, so that no step needs a disk shared with
another; XComs carry only keys and counts; no step holds more than a chunk of the plan.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS
from tiering.commit.operation import AUTO_SWAP, Context, SegmentResult, SwapChoice
from tiering.cost.forecast import Range
from tiering.cost.prices import PriceBook, load_prices
from tiering.documents import known_fields, opt_int, to_builtins
from tiering.errors import ConfigError
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.vocabulary import Action, Swap, Verify
from tiering.options import LEASE_TTL
from tiering.plan.auto import decide_auto, record_age, with_auto
from tiering.plan.document import Plan, PlanCounts
from tiering.plan.estimate import Sampling, StratifiedSample, WorkSample, estimate_work
from tiering.plan.inventory import inventory_objects
from tiering.plan.planfile import (
    Budget,
    ChunkedPlan,
    PlanManifest,
    SizeTally,
    by_partition,
    chunk_limits,
)
from tiering.plan.policy import AUTO, Policy
from tiering.plan.scan import ScanOptions, scan_partitions
from tiering.run import engine
from tiering.run.compaction import Compaction, CompactionOptions
from tiering.run.documents import (
    CompactOptions,
    RunResult,
    StepUsage,
)
from tiering.run.segment import pending_bases
from tiering.storage.aside import WriteAside
from tiering.storage.layout import (
    PlanName,
    StepDir,
    plan_dir,
    run_dir,
    step_dir,
    step_key,
)
from tiering.storage.objects import ObjectStore

DEFAULT_MAX_CHUNKS: Final = 512  # a plan's chunks at most
DEFAULT_CHUNK_WORK: Final = 1_000  # segments to compact per chunk, unless that makes too many chunks


@dataclass(frozen=True, slots=True)
class RunSettings:
    """What every step of one run needs; small and JSON-able (it travels to Spark executors)."""

    bucket: str
    prefix: str
    run_id: str
    codec: str | None = None  # what a compaction rewrites to (None: a run of a kind that rewrites nothing)
    level: int | None = None
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    verify: Verify = Verify.CHECKSUM  # how staged files are accepted
    swap: Swap | None = None  # how the new .log goes over the original; None ("auto"): learnt from the store

    @staticmethod
    def modes(verify: str, swap: str) -> tuple[Verify, Swap | None]:
        """The verification and swap modes as people write them (a DAG param, an option), typed; ``"auto"``
        is the swap learnt from the store."""
        try:
            typed = Verify(verify)
        except ValueError:
            raise ConfigError("unknown verification mode", expected=" or ".join(v.value for v in Verify),
                              found=verify) from None
        if swap == AUTO_SWAP:
            return typed, None
        try:
            return typed, Swap(swap)
        except ValueError:
            raise ConfigError("unknown swap mode", expected=" or ".join([AUTO_SWAP, *(m.value for m in Swap)]),
                              found=swap) from None

    @property
    def compaction_codec(self) -> str:
        """The codec a compaction rewrites to (the settings of a compaction always name one)."""
        if self.codec is None:
            raise ConfigError("a compaction's settings name no codec", expected="codec: a codec's name", found=None)
        return self.codec

    @property
    def swap_text(self) -> str:
        """The swap mode as people write it (``"auto"`` where it is learnt)."""
        return self.swap.value if self.swap is not None else AUTO_SWAP

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verify": self.verify.value, "swap": self.swap_text}

    @classmethod
    def from_json(cls, doc: object, where: str | None = None) -> RunSettings:
        """:meth:`to_json` read back; a field it does not write, one missing or of the wrong type is an error
        naming it (``where``: the document's origin)."""
        d = known_fields(doc, (f.name for f in dataclasses.fields(cls)), what="a run's settings", where=where)
        try:
            verify, swap = cls.modes(str(d.get("verify", Verify.CHECKSUM.value)), str(d.get("swap", AUTO_SWAP)))
            text = {name: d[name] for name in ("bucket", "prefix", "run_id")}
            if not all(isinstance(v, str) for v in text.values()):
                raise TypeError(f"bucket, prefix and run_id must be strings, found {text}")
            codec = d.get("codec")
            if codec is not None and not isinstance(codec, str):
                raise TypeError(f"codec must be a codec's name or null, found {codec!r}")
            return cls(**text, codec=codec, level=opt_int(d, "level", None),
                       lease_ttl_seconds=LEASE_TTL.read(d, where), verify=verify,
                       swap=swap)
        except KeyError as e:
            raise ConfigError("a run's settings lack a field", path=where, expected=str(e), found=sorted(d)) from None
        except TypeError as e:
            raise ConfigError(f"a run's settings of the wrong type: {e}", path=where,
                              expected="the fields to_json writes", found=str(d)) from None

    def swap_choice(self) -> SwapChoice:
        """The run's swap mode, to share among the contexts of its partitions (learnt once when "auto")."""
        return SwapChoice(self.swap)

    def context(self, store: ObjectStore, work_dir: str | None = None, *, one_core: bool = False,
                swap: SwapChoice | None = None) -> Context:
        """``one_core``: the rewrite proves inline instead of on a second thread (a Spark task has one core)."""
        options = (RewriteOptions(Codec.parse(self.codec), self.level, proof_thread=not one_core)
                   if self.codec is not None else None)
        return Context(store, self.prefix, self.run_id, options, work_dir=work_dir, verify=self.verify,
                       swap=swap or self.swap_choice())

    def step_key(self, step: StepDir, name: str) -> str:
        """The key of the run's document ``name`` of ``step``."""
        return step_key(self.prefix, self.run_id, step, name)

    def step_dir(self, step: StepDir) -> str:
        return step_dir(self.prefix, self.run_id, step)


@dataclass(frozen=True, slots=True)
class ScanStep:
    """What :func:`scan_run` wrote: the scan manifest's key, the objects read, the plan's counts."""

    scan_key: str
    objects: int
    totals: PlanCounts

    def to_json(self) -> dict[str, Any]:
        return {"scan_key": self.scan_key, "objects": self.objects, "totals": self.totals.to_json()}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ScanStep:
        return cls(str(doc["scan_key"]), int(doc["objects"]), PlanCounts.from_json(doc["totals"]))


@dataclass(frozen=True, slots=True)
class PlanStep:
    """What :func:`plan_run` wrote: the plan manifest's key, its counts, the segments and bytes to compact,
    the forecast's total (a dry run; by topic in the manifest), the operations crashed runs left (the
    compaction finishes them first) and the plan's chunks."""

    plan_key: str
    totals: PlanCounts
    segments: int
    bytes: int
    forecast: Range | None
    in_flight: int
    chunks: int
    dry_run: bool = False

    def dry(self) -> PlanStep:
        """This plan as a dry run takes it: nothing is carried out."""
        return dataclasses.replace(self, dry_run=True)

    def to_json(self) -> dict[str, Any]:
        return {"plan_key": self.plan_key, "totals": self.totals.to_json(), "segments": self.segments,
                "bytes": self.bytes, "forecast": self.forecast.to_json() if self.forecast is not None else None,
                "in_flight": self.in_flight, "chunks": self.chunks, "dry_run": self.dry_run}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PlanStep:
        return cls(str(doc["plan_key"]), PlanCounts.from_json(doc["totals"]), int(doc["segments"]),
                   int(doc["bytes"]), Range.from_json(doc["forecast"]) if doc.get("forecast") else None,
                   int(doc["in_flight"]), int(doc["chunks"]), bool(doc.get("dry_run", False)))


@dataclass(frozen=True, slots=True)
class RunHeadline:
    """A compaction run's numbers for a task log and its XCom: segments by outcome, bytes, ratio."""

    run_id: str
    segments: int
    compacted: int
    failed: int
    skipped: int
    bytes_before: int
    bytes_after: int

    @property
    def ratio(self) -> float | None:
        return round(self.bytes_after / self.bytes_before, 4) if self.bytes_before else None

    def to_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "segments": self.segments, "compacted": self.compacted,
                "failed": self.failed, "skipped": self.skipped, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "saved_bytes": self.bytes_before - self.bytes_after,
                "ratio": self.ratio}


def to_stderr(line: str) -> None:
    """A progress line on stderr: stdout is for a command's result (one JSON document under ``--json``)."""
    print(line, file=sys.stderr, flush=True)


def plan_files(store: ObjectStore, settings: RunSettings, name: PlanName = PlanName.PLAN) -> ChunkedPlan:
    """The run's scan (``name="scan"``) or plan as chunk files under ``runs/<run>/<name>/``."""
    return ChunkedPlan(store, settings.prefix, settings.run_id, name)


def scan_run(store: ObjectStore, settings: RunSettings, options: ScanOptions, *, inventory: str | None = None,
             progress: Callable[[int], None] | None = None) -> ScanStep:
    """Scan the prefix (a listing, or the S3 Inventory report whose ``manifest.json`` is ``inventory``) into
    chunk files under ``runs/<run>/scan/``; the manifest's key and the totals."""
    out = plan_files(store, settings, PlanName.SCAN)
    writer = out.writer()
    source = inventory_objects(store, inventory, settings.prefix)[1] if inventory is not None else None
    header = scan_partitions(store, settings.prefix, options, writer.add, source=source, progress=progress)
    chunks = writer.close()
    out.write_manifest(PlanManifest(header, writer.totals.to_json(), chunks, inventory or "listing"))
    put_usage(store, settings, "scan")
    return ScanStep(out.manifest_key, header.objects_listed, writer.totals.counts())


def plan_run(store: ObjectStore, settings: RunSettings, budget: CompactOptions, *, forecast: Sampling | None = None,
             policy: Policy | None = None, prices: PriceBook | None = None, max_chunks: int = DEFAULT_MAX_CHUNKS,
             chunk_work: int = DEFAULT_CHUNK_WORK, log: Callable[[str], None] = to_stderr) -> PlanStep:
    """From the run's scan, apply the policy (record ages, automatic codecs) and the budget (largest first)
    and write the plan's chunks under ``runs/<run>/plan/``; return its manifest key, totals and the number of
    chunks. Chunks hold whole partitions, at most ``chunk_work`` segments to compact each (more when that
    would make more than ``max_chunks``). Streams: memory holds a chunk,
    with a budget 8 bytes per segment to compact (their sizes), and samples. ``forecast`` adds the dry run's
    forecast, reading what it allows (sampled batches). ``log``: progress lines (the automatic codec
    choices), never on stdout."""
    scanned = plan_files(store, settings, PlanName.SCAN)
    scan_manifest = scanned.manifest()
    source = scanned
    # Pass 1: the record-age minimum (one ranged read per segment, so its verdicts are written down), the
    # sizes the budget needs, and what the automatic codec choice samples.
    chosen = Budget(budget.max_segments, budget.max_bytes)
    sizes: dict[str | None, SizeTally] = {None: chosen.tally()}  # by auto topic; None: every other segment
    topics: dict[str, WorkSample] = {}
    repairs = 0
    policied = plan_files(store, settings, PlanName.POLICY) if policy is not None else None
    writer = policied.writer() if policied is not None else None
    clock = datetime.fromisoformat(scan_manifest.header.created_at)
    for listed in by_partition(scanned.segments(scan_manifest)):
        part = [record_age(store, seg, policy, clock) for seg in listed] if policy is not None else listed
        for seg in part:
            if seg.action == Action.REPAIR:
                repairs += 1
            elif seg.action == Action.COMPACT:
                auto = seg.codec == AUTO
                sizes.setdefault(seg.topic if auto else None, chosen.tally()).add(seg.size)
                if auto:
                    topics.setdefault(seg.topic, WorkSample(seed=seg.topic)).add(seg)
        if writer is not None:
            writer.add(part)
    if policied is not None and writer is not None:
        policied.write_manifest(PlanManifest(scan_manifest.header, writer.totals.to_json(), writer.close(),
                                             scan_manifest.source))
        source = policied
    choices = decide_auto(store, topics, policy, prices or load_prices(), log=log) if policy and topics else {}
    work_count, work_bytes = chosen.measure(t for topic, t in sizes.items()
                                            if topic is None or choices[topic]["chosen"] is not None)
    # Pass 2: the plan's chunks, sized so that there are at most max_chunks of them.
    # Results of an earlier attempt of this run id (a DAG run cleared and run again) belong to its plan, not
    # to this one: what it compacted is counted from the partitions' state instead.
    store.delete_many([(info.key, info.etag) for info in store.list(settings.step_dir(StepDir.COMPACT))])
    planned = plan_files(store, settings, PlanName.PLAN)
    writer = planned.writer(**chunk_limits(max_chunks, segments=scan_manifest.totals["segments"],
                                           work=work_count + repairs, work_bytes=work_bytes, min_work=chunk_work))
    sample = StratifiedSample(seed=forecast.seed if forecast is not None else "")
    in_flight = pending_bases(store, settings.prefix)  # operations crashed runs left: finished first
    for policied_part in by_partition(source.segments()):
        part = [chosen.apply(with_auto(seg, choices, policy) if policy else seg) for seg in policied_part]
        for seg in part:
            if seg.action == Action.COMPACT:
                sample.add(seg)
        writer.add(part)
    chunks = writer.close()
    header = scan_manifest.header  # a plan made elsewhere keeps the policy and choices it was made with
    if policy is not None:
        header = dataclasses.replace(header, policy=policy.path, auto=choices or None)
    rewrite = RewriteOptions(Codec.parse(settings.compaction_codec), settings.level)
    estimate = (estimate_work(store, sample, rewrite, segments=forecast.segments, sample_bytes=forecast.bytes)
                if forecast is not None else None)
    header = dataclasses.replace(header, estimate=estimate)
    planned.write_manifest(PlanManifest(header, writer.totals.to_json(), chunks, scan_manifest.source))
    put_usage(store, settings, "plan")
    return PlanStep(planned.manifest_key, writer.totals.counts(), sum(c.to_compact for c in chunks),
                    sum(c.bytes_to_compact for c in chunks), header.estimate.total if header.estimate else None,
                    sum(len(bases) for bases in in_flight.values()), len(chunks))


def dry_run(store: ObjectStore, settings: RunSettings, source: ScanOptions | Plan, budget: CompactOptions,
            sampling: Sampling | None, *, inventory: str | None = None, prices: PriceBook | None = None,
            progress: Callable[[int], None] | None = None, log: Callable[[str], None] = to_stderr) -> Plan:
    """A run's first steps as a real run takes them, on the bucket as it is: :func:`scan_run` with ``source``'s
    options (or ``source``, a plan made elsewhere, as the scan, as :func:`compact` takes it), then
    :func:`plan_run` (with the forecast ``sampling`` allows, if any). Their documents stay in memory
    (:class:`~tiering.storage.aside.WriteAside`): nothing is written to S3. The plan, whole."""
    aside = WriteAside(store, run_dir(settings.prefix, settings.run_id))
    if isinstance(source, Plan):
        write_scan(aside, settings, source)
        policy = None
    else:
        scan_run(aside, settings, source, inventory=inventory, progress=progress)
        policy = source.policy
    plan_run(aside, settings, budget, forecast=sampling, policy=policy, prices=prices, log=log)
    for name in (PlanName.SCAN, PlanName.POLICY):  # memory holds the plan alone from here
        aside.delete_many([(info.key, info.etag) for info in aside.list(plan_dir(settings.prefix, settings.run_id,
                                                                                 name))])
    planned = plan_files(aside, settings)
    manifest = planned.manifest()
    return dataclasses.replace(manifest.header, segments=tuple(planned.segments(manifest)))


def put_usage(store: ObjectStore, settings: RunSettings, step: str) -> None:
    """Record the S3 requests ``store`` made for this run outside any partition's work (``usage/<step>``)."""
    store.put_json(settings.step_key(StepDir.USAGE, step), to_builtins(StepUsage(dict(store.requests))))


def write_scan(store: ObjectStore, settings: RunSettings, plan: Plan) -> str:
    """A plan made elsewhere (``tiering s3 scan --out``, or in memory) as the run's scan; its manifest key."""
    out = plan_files(store, settings, PlanName.SCAN)
    writer = out.writer()
    for part in by_partition(sorted(plan.segments, key=lambda s: (s.directory, s.base_offset))):
        writer.add(part)
    chunks = writer.close()
    header = dataclasses.replace(plan, segments=(), estimate=None)  # the run's own plan decides on one
    return out.write_manifest(PlanManifest(header, writer.totals.to_json(), chunks, "plan"))


def compaction_kind(settings: RunSettings, budget: CompactOptions) -> Compaction:
    """The engine's compaction of the run's own plan (``runs/<run>/plan/``), as ``settings`` and ``budget`` set it."""
    return Compaction(CompactionOptions(settings.run_id, budget.lease_ttl_seconds, budget.max_segments,
                                        budget.max_bytes))


def run_local(store: ObjectStore, settings: RunSettings, ctx: Context, options: CompactOptions,
              progress: Callable[[SegmentResult], None] | None = None) -> RunResult:
    """The run's plan carried out in this process (the CLI), through the engine: the operations crashed runs
    left in flight finished first, then its units on ``options.workers`` threads, each segment swapped in at
    once; then the run document. An earlier attempt of this run id is counted from the partitions' state (its
    step documents are replaced)."""
    return engine.run(store, ctx, compaction_kind(settings, options), progress, workers=options.workers)


def collect_planned(store: ObjectStore, settings: RunSettings, options: CompactOptions) -> RunResult:
    """The run document of a run that carries out nothing: a dry run, whose plan holds the forecast."""
    kind = compaction_kind(settings, options).started(store, settings.prefix)
    assert kind.header is not None  # read by started()
    return engine.collect(store, settings.context(store), kind, engine.RunPlan((), ()), kind.header.created_at,
                          Counter())


def compact(store: ObjectStore, plan: Plan, ctx: Context, options: CompactOptions,
            progress: Callable[[SegmentResult], None] | None = None) -> RunResult:
    """Compact what ``plan`` selected, in this process, through the same steps as the DAG: the plan becomes
    the run's scan, the budget is applied (largest first), then :func:`run_local`."""
    settings = RunSettings(store.bucket, ctx.prefix, ctx.run_id, ctx.rewrite.codec.label, ctx.rewrite.level,
                           options.lease_ttl_seconds, ctx.verify, ctx.swap.mode)
    write_scan(store, settings, plan)
    plan_run(store, settings, options)
    return run_local(store, settings, ctx, options, progress)


def safe_run_id(run_id: str) -> str:
    """An Airflow run id made key-safe: it names S3 keys and lease owners."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", run_id)


def run_summary(run: RunResult) -> tuple[RunHeadline, str]:
    """Headline numbers and a plain-text table (per topic, then the other outcomes' reasons) for task logs."""
    totals = run.totals()
    before, after = totals["bytes_before"], totals["bytes_after"]
    headline = RunHeadline(run.run_id, totals["segments"], totals.get("compacted", 0), totals.get("failed", 0),
                           totals.get("skipped", 0), before, after)
    reasons: Counter[str] = Counter()
    for _, status, cause, n in run.outcome_rows():
        reasons[f"{status}: {cause.label}" if cause else status.value] += n
    lines = [f"{'topic':<32} {'segments':>8} {'before':>14} {'after':>14} {'ratio':>6}"]
    for topic, (n, b, a) in sorted(run.topics.items()):
        lines.append(f"{topic:<32} {n:>8} {b:>14,} {a:>14,} {a / b if b else 0:>6.3f}")
    lines.append(f"{'total':<32} {headline.compacted:>8} {before:>14,} {after:>14,} "
                 f"{after / before if before else 0:>6.3f}")
    for reason, n in sorted(reasons.items()):
        lines.append(f"  {n:>6} {reason}")
    return headline, "\n".join(lines)
