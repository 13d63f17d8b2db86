"""The one orchestrator of compaction runs: the steps the Airflow DAG's tasks, the Spark job and the CLI call.

    scan  ->  plan  ->  units of whole partitions (stage, or stage and commit)  ->  commit (per chunk)  ->  collect

- :func:`scan_run` lists the prefix (or reads an S3 Inventory report) into chunk files under
  ``PREFIX/_tiering/runs/<run>/scan/`` (see :mod:`tiering.plan.planfile`), one partition at a time.
- :func:`plan_run` streams the scan through the policy and the budget into ``runs/<run>/plan/``; the
  chunks it returns (names only) are what the commit step maps over.
- :func:`stage_units` cuts the plan's work into units; :func:`run_unit` does one: under each partition's
  lease, it finishes what earlier runs left in flight there, then each planned segment (:func:`partition_work`),
  and writes the results to ``runs/<run>/stage/``. Spark runs units with :func:`stage_unit`: segments are
  left journalled ``staged`` and the leases kept; the CLI runs them in this process with
  :func:`run_local`, committing each segment at once.
- :func:`commit_chunk` finishes every journal entry of a chunk's partitions under their leases (the
  protocol's recovery path: a staged segment is rolled forward), then releases the leases.
- :func:`collect_run` builds the run document from what the steps wrote: the one place results, usage
  and the run document come together.

Every document lives under ``PREFIX/_tiering/runs/<run>/``, so that no step needs a disk shared with
another; XComs carry only keys, chunk names and counts; no step holds more than a chunk of the plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Container, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease
from tiering.commit.operation import AUTO_SWAP, Context, SegmentResult, SwapChoice
from tiering.commit.recover import iter_recover
from tiering.cost.forecast import Range
from tiering.cost.prices import PriceBook, load_prices
from tiering.documents import int_field, known_fields, opt_int
from tiering.errors import ConfigError, TieringError
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.state import Pruning, StateBatch, load_state
from tiering.lifecycle.vocabulary import Action, Cause, Pending, RunKind, Status, Swap, Verify
from tiering.plan.auto import decide_auto, record_age, with_auto
from tiering.plan.document import Plan, PlanCounts, PlannedSegment
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
from tiering.run.documents import (
    DONE_STATUSES,
    RUN_SCOPE,
    CompactOptions,
    RunResult,
    RunTally,
    StepResults,
    StepUsage,
)
from tiering.run.engine import write_results
from tiering.run.segment import Work, pending_bases, run_segment, with_lease
from tiering.storage.aside import WriteAside
from tiering.storage.layout import (
    PlanName,
    StepDir,
    chunk_of,
    parse_plan_manifest_key,
    plan_dir,
    plan_manifest_key,
    run_dir,
    step_dir,
    step_key,
    step_name,
    unit_chunk,
    unit_name,
)
from tiering.storage.objects import ObjectNotFound, ObjectStore

STANDARD: Final = "STANDARD"
DEFAULT_MAX_CHUNKS: Final = 512  # commit tasks of a run at most (Airflow maps up to 1024 by default)
DEFAULT_CHUNK_WORK: Final = 1_000  # segments to compact per commit chunk, unless that makes too many chunks
UNIT_SEGMENTS: Final = 64  # a Spark task's segments at most
UNIT_BYTES: Final = 4 << 30  # and its .log bytes (a partition is never split, so one may be larger)


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
                       lease_ttl_seconds=int_field(d, "lease_ttl_seconds", DEFAULT_TTL_SECONDS), verify=verify,
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
class ChunkRef:
    """A plan chunk a commit task takes: its name, and a label naming its partitions (the task's name)."""

    name: str
    label: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "label": self.label}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ChunkRef:
        return cls(str(doc["name"]), str(doc["label"]))


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
    the forecast's total (a dry run; by topic in the manifest), the operations crashed runs left, and the
    chunks a commit task each takes (none in a dry run)."""

    plan_key: str
    totals: PlanCounts
    segments: int
    bytes: int
    forecast: Range | None
    in_flight: int
    chunks: tuple[ChunkRef, ...]
    dry_run: bool = False

    def dry(self) -> PlanStep:
        """This plan as a dry run takes it: nothing to stage or commit."""
        return dataclasses.replace(self, chunks=(), dry_run=True)

    def to_json(self) -> dict[str, Any]:
        return {"plan_key": self.plan_key, "totals": self.totals.to_json(), "segments": self.segments,
                "bytes": self.bytes, "forecast": self.forecast.to_json() if self.forecast is not None else None,
                "in_flight": self.in_flight, "chunks": [c.to_json() for c in self.chunks], "dry_run": self.dry_run}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PlanStep:
        return cls(str(doc["plan_key"]), PlanCounts.from_json(doc["totals"]), int(doc["segments"]),
                   int(doc["bytes"]), Range.from_json(doc["forecast"]) if doc.get("forecast") else None,
                   int(doc["in_flight"]), tuple(ChunkRef.from_json(c) for c in doc["chunks"]),
                   bool(doc.get("dry_run", False)))


@dataclass(frozen=True, slots=True)
class CommitStep:
    """What :func:`commit_chunk` did: its chunk, the partitions it finished, its segments by status."""

    chunk: str
    partitions: int
    counts: Mapping[str, int]

    def summary(self) -> str:
        return f"{self.partitions:,} partitions: " + (", ".join(f"{n:,} {k}" for k, n in sorted(self.counts.items()))
                                                       or "nothing to finish")

    def to_json(self) -> dict[str, Any]:
        return {"chunk": self.chunk, "partitions": self.partitions, **self.counts}


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
    and write the plan's chunks under ``runs/<run>/plan/``; return its manifest key, totals and chunk names.
    Chunks hold whole partitions, at most ``chunk_work`` segments to compact each (more when that would
    make more than ``max_chunks``: the commit step maps one task per chunk). Streams: memory holds a chunk,
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
    # Results of an earlier attempt of this run id (a DAG run cleared and run again) belong to its plan's
    # chunks, not to this one's: what it compacted is counted from the partitions' state instead.
    store.delete_many([(info.key, info.etag) for step in (StepDir.STAGE, StepDir.COMMIT)
                       for info in store.list(settings.step_dir(step))])
    planned = plan_files(store, settings, PlanName.PLAN)
    writer = planned.writer(**chunk_limits(max_chunks, segments=scan_manifest.totals["segments"],
                                           work=work_count + repairs, work_bytes=work_bytes, min_work=chunk_work))
    sample = StratifiedSample(seed=forecast.seed if forecast is not None else "")
    in_flight = pending_bases(store, settings.prefix)  # operations crashed runs left: their chunks get a commit
    with_pending: set[str] = set()
    for policied_part in by_partition(source.segments()):
        part = [chosen.apply(with_auto(seg, choices, policy) if policy else seg) for seg in policied_part]
        for seg in part:
            if seg.action == Action.COMPACT:
                sample.add(seg)
        if part and part[0].directory in in_flight:
            with_pending.add(writer.open_chunk)
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
                    sum(len(bases) for bases in in_flight.values()),
                    tuple(ChunkRef(c.name, c.first if c.first == c.last else f"{c.first}..{c.last}")
                          for c in chunks if c.to_compact or c.name in with_pending))


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


def manifest_location(uri: str) -> tuple[str, str]:
    """The bucket and key of a plan named by its manifest (:func:`~tiering.storage.layout.plan_manifest_key`)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or parse_plan_manifest_key(key) is None:
        example = plan_manifest_key("PREFIX", "<run>", PlanName.PLAN)
        raise ConfigError("a plan is named by its manifest on S3", expected=f"s3://BUCKET/{example}", found=uri)
    return bucket, key


def load_manifest(store: ObjectStore, uri: str) -> tuple[ChunkedPlan, PlanManifest]:
    """A run's chunked plan from the manifest ``uri`` names (:func:`manifest_location`), read through ``store``
    on that bucket."""
    bucket, key = manifest_location(uri)
    store = store.for_bucket(bucket)
    manifest = PlanManifest.from_json(store.get_json(key)[0])
    run_id, name = parse_plan_manifest_key(key) or ("", PlanName.PLAN)  # checked by manifest_location
    return ChunkedPlan(store, manifest.header.prefix, run_id, name), manifest


@dataclass(frozen=True, slots=True)
class StageUnit:
    """One Spark task's work: lines ``start`` to ``stop`` of a plan chunk (whole partitions)."""

    chunk_key: str
    start: int
    stop: int
    segments: int  # segments to stage in it
    bytes: int

    @property
    def name(self) -> str:
        return unit_name(chunk_of(self.chunk_key), self.start)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> StageUnit:
        return cls(str(doc["chunk_key"]), int(doc["start"]), int(doc["stop"]), int(doc["segments"]),
                   int(doc["bytes"]))


def stage_units(plan: ChunkedPlan, manifest: PlanManifest, *, parallelism: int = 1) -> list[StageUnit]:
    """The plan's work cut into Spark tasks of whole partitions, largest first (the job's tail is short):
    up to 64 segments or 4 GiB each, smaller when that leaves fewer than three tasks per core of the
    cluster (``parallelism``). The driver holds these, never the segments."""
    spread = 3 * max(1, parallelism)
    total = sum(c.to_compact for c in manifest.chunks)
    max_segments = max(1, min(UNIT_SEGMENTS, -(-total // spread)))
    max_bytes = max(1, min(UNIT_BYTES, -(-sum(c.bytes_to_compact for c in manifest.chunks) // spread)))
    units: list[StageUnit] = []
    for info in manifest.chunks:
        if not info.to_compact:
            continue
        line = start = count = size = 0
        for part in by_partition(plan.chunk(info.key)):
            todo = [s for s in part if s.action in (Action.COMPACT, Action.REPAIR)]
            if not todo and not count:
                start = line + len(part)  # nothing to stage before this partition: begin after it
            line += len(part)
            count += len(todo)
            size += sum(s.size for s in todo)
            if count >= max_segments or size >= max_bytes:
                units.append(StageUnit(info.key, start, line, count, size))
                start, count, size = line, 0, 0
        if count:
            units.append(StageUnit(info.key, start, line, count, size))
    return sorted(units, key=lambda u: (-u.bytes, u.chunk_key, u.start))


def partition_work(ctx: Context, directory: str, segments: list[PlannedSegment], *, commit: bool,
                   pruning: Pruning | None = None, progress: Callable[[SegmentResult], None] | None = None) -> Work:
    """What the holder of a partition's lease does there: finish (or abandon) the operations a crashed or
    earlier run left in flight, then each planned segment they did not finish. With ``commit`` a segment is
    swapped in at once (the CLI), else it is left journalled ``staged`` for the commit step (Spark). The
    partition's state changes are written in batches (pruned by ``pruning``)."""

    planned = {s.base_offset: s for s in segments if s.action == Action.COMPACT and s.log is not None}

    def adoptable(journal: Journal) -> bool:
        """This run would stage the very same: the same source objects (each index present or absent as
        planned), codec, level and re-batching."""
        seg = planned.get(journal.base_offset)
        if seg is None or any(journal.source.get(name) != (ref.etag if ref is not None else None)
                              for name, ref in (("log", seg.log), ("index", seg.index),
                                                ("timeindex", seg.timeindex))):
            return False
        own = ctx.for_segment(seg)
        rebatch = own.rebatch.max_bytes if own.rebatch is not None else None
        return (journal.entry.codec, journal.entry.level, journal.entry.rebatch_max_bytes) == (
            own.rewrite.codec.label, own.rewrite.level, rebatch)

    def work(lease: Lease, out: list[SegmentResult]) -> None:
        batch = StateBatch(ctx.store, ctx.prefix, directory, pruning)
        own = dataclasses.replace(ctx, state=batch)
        finished = set()
        with recorded(batch, out):
            for result in iter_recover(own, directory, lease, commit=commit, adoptable=adoptable):
                out.append(result)
                if result.status in (Status.COMPACTED, Status.ROLLED_BACK, Status.STAGED):
                    finished.add(result.base_offset)  # done, or staged (taken over): nothing left to stage
                if progress is not None:
                    progress(result)
            for seg in segments:
                if seg.base_offset in finished:
                    continue
                if batch.full:
                    batch.flush(lease.check)
                started = time.perf_counter()
                out.append(dataclasses.replace(run_segment(own, seg, lease, commit=commit),
                                               seconds=round(time.perf_counter() - started, 3)))
                if progress is not None:
                    progress(out[-1])
            batch.flush(lease.check)

    return work


@contextlib.contextmanager
def recorded(batch: StateBatch, out: list[SegmentResult]) -> Iterator[None]:
    """Work whose state records ``batch`` writes: if it stops (the state write failed, the lease was lost),
    a segment swapped in whose record or journal delete is still queued is reported as left in flight,
    not done (its journal stays; the next run covering the partition finishes and counts it)."""
    try:
        yield
    except TieringError as e:
        unfinished = batch.unfinished()
        for i, r in enumerate(out):
            if r.base_offset in unfinished and r.directory == batch.directory and r.status in DONE_STATUSES:
                out[i] = SegmentResult(r.directory, r.base_offset, Status.FAILED,
                                       f"swapped in, but not recorded ({e}): left in flight for the next run",
                                       error=e.to_dict(), run_id=r.run_id, pending=Pending.TRANSIENT,
                                       recovered=r.recovered, seconds=r.seconds, cause=Cause.TRANSIENT)
        raise


def pruning_of(manifest: PlanManifest, partition: list[PlannedSegment]) -> Pruning:
    """What a state write of this partition may drop: the entries of segments the plan's scan did not find
    there (see :class:`Pruning`; an S3 Inventory's snapshot predates the scan, so only retention's)."""
    listed_at = datetime.fromisoformat(manifest.header.created_at) if manifest.source == "listing" else None
    return Pruning(frozenset(s.base_offset for s in partition), listed_at)


def run_unit(store: ObjectStore, settings: RunSettings, ctx: Context, unit: StageUnit, *, commit: bool,
             pending: dict[str, list[int]] | None = None,
             progress: Callable[[SegmentResult], None] | None = None) -> dict[str, int]:
    """The work of one unit, partition by partition under the run's leases: staged for the commit step
    (kept leases, which it takes back) or committed at once (released leases). The results go to
    ``runs/<run>/stage/<unit>.json``; the counts by status come back."""
    plan = plan_files(store, settings)
    manifest = plan.manifest()
    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    for part in by_partition(plan.chunk(unit.chunk_key, unit.start, unit.stop)):
        todo = [s for s in part if s.action in (Action.COMPACT, Action.REPAIR)]
        if not todo:
            continue
        directory = todo[0].directory
        before = _snapshot(store.requests)
        in_flight = [(directory, b) for b in (pending or {}).get(directory, [])]
        results += with_lease(ctx, directory, settings.lease_ttl_seconds,
                              partition_work(ctx, directory, todo, commit=commit, pruning=pruning_of(manifest, part),
                                             progress=progress),
                              in_flight + [(s.directory, s.base_offset) for s in todo], keep=not commit)
        requests[directory] = dict(_snapshot(store.requests) - before)
    return write_results(store, settings.step_key(StepDir.STAGE, unit.name), results, usage=requests)


def _snapshot(requests: Counter[str]) -> Counter[str]:
    """A copy of a request counter that other threads may be adding to (``run_local`` with several workers
    shares one client: a new operation name can appear while it is copied)."""
    while True:
        try:
            return Counter(requests)
        except RuntimeError:  # the dictionary changed size during the copy
            continue


def stage_unit(store: ObjectStore, unit: dict[str, Any], settings: dict[str, Any],
               work_dir: str | None = None) -> dict[str, int]:
    """Spark executor side: stage the segments of one unit (see :func:`run_unit`), each partition under the
    run's lease, taken here and kept for the commit step. A retried task finds what it staged before in
    the journal and finishes it."""
    run = RunSettings.from_json(settings)
    return run_unit(store, run, run.context(store, work_dir, one_core=True), StageUnit.from_json(unit),
                    commit=False)


def put_usage(store: ObjectStore, settings: RunSettings, step: str) -> None:
    """Record the S3 requests ``store`` made for this run outside any partition's work (``usage/<step>``)."""
    store.put_json(settings.step_key(StepDir.USAGE, step), StepUsage(dict(store.requests)).to_json())


def commit_chunk(store: ObjectStore, settings: RunSettings, name: str, *, ctx: Context | None = None,
                 pending: dict[str, list[int]] | None = None, worked: bool = True, workers: int = 1
                 ) -> CommitStep:
    """Finish every journal entry in the partitions of plan chunk ``name`` (those with work, unless not
    ``worked``, and those with an operation in flight, from ``pending`` or a listing of the journal), under
    their leases, then release them; the results go to ``runs/<run>/commit/<name>.json``. Idempotent: a
    retry finds nothing left to finish. ``workers`` > 1: that many partitions at once, each thread with
    its own client (:meth:`~tiering.storage.objects.ObjectStore.another`: partitions are independent, one
    lease and one journal each, and each partition's requests are counted apart)."""
    plan = plan_files(store, settings)
    manifest = plan.manifest()
    info = next((c for c in manifest.chunks if c.name == name), None)
    if info is None:
        raise ConfigError("no such chunk in the run's plan", path=plan.manifest_key, found=name)
    in_flight = pending_bases(store, settings.prefix) if pending is None else pending
    segments: dict[str, list[PlannedSegment]] = {}
    for s in plan.chunk(info.key):
        segments.setdefault(s.directory, []).append(s)
    partitions = sorted(d for d, part in segments.items()
                        if d in in_flight
                        or (worked and any(s.action in (Action.COMPACT, Action.REPAIR) for s in part)))
    local = threading.local()
    swap = ctx.swap if ctx is not None else settings.swap_choice()  # learnt once for all the partitions

    def one(directory: str) -> tuple[list[SegmentResult], dict[str, int]]:
        if workers == 1:
            own, own_ctx = store, ctx or settings.context(store, swap=swap)
        else:
            if not hasattr(local, "store"):
                local.store = store.another()
                local.ctx = settings.context(local.store, swap=swap)
            own, own_ctx = local.store, local.ctx

        def work(lease: Lease, out: list[SegmentResult]) -> None:
            batch = StateBatch(own, settings.prefix, directory, pruning_of(manifest, segments[directory]))
            with recorded(batch, out):
                out.extend(iter_recover(dataclasses.replace(own_ctx, state=batch), directory, lease))
                batch.flush(lease.check)

        before = Counter(own.requests)
        done = with_lease(own_ctx, directory, settings.lease_ttl_seconds, work,
                          [(directory, b) for b in in_flight.get(directory, [])])
        return done, dict(own.requests - before)

    results: list[SegmentResult] = []
    requests: dict[str, dict[str, int]] = {}
    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="commit") as pool:
        for directory, (done, used) in zip(partitions, pool.map(one, partitions), strict=True):
            results += done
            requests[directory] = used
    counts = write_results(store, settings.step_key(StepDir.COMMIT, name), results, usage=requests)
    return CommitStep(name, len(partitions), counts)


@dataclass(frozen=True, slots=True)
class ChunkOutcome:
    """What a run did in one chunk of its plan: the chunk's planned segments and every final result there
    (see :func:`run_outcomes`), with the S3 requests by partition and the task seconds the steps spent."""

    segments: list[PlannedSegment]
    results: list[SegmentResult]
    requests: dict[str, Counter[str]]
    seconds: float


def run_outcomes(store: ObjectStore, settings: RunSettings) -> Iterator[ChunkOutcome]:
    """The run's results, one plan chunk at a time (memory: a chunk): per segment its final outcome (a
    commit result wins over its staging result), apart from it an operation of another run finished or
    abandoned there, the segments the budget left out, and those an earlier attempt of this very run id
    compacted (the plan found them compacted already, by this run id). Results outside the plan's chunks
    (none is expected) come last, with no segments."""
    docs: dict[str, list[str]] = {}  # a chunk's step documents: its units' staging, then its commit
    for step in (StepDir.STAGE, StepDir.COMMIT):
        for info in store.list(settings.step_dir(step)):
            name = step_name(info.key)
            docs.setdefault(unit_chunk(name) if step is StepDir.STAGE else name, []).append(info.key)
    plan = plan_files(store, settings)
    try:
        chunks = plan.manifest().chunks
    except ObjectNotFound:
        chunks = ()
    for chunk in chunks:
        yield _chunk_outcome(store, settings, list(plan.chunk(chunk.key)), docs.pop(chunk.name, []))
    rest = [key for keys in docs.values() for key in keys]
    if rest:
        yield _chunk_outcome(store, settings, [], rest)


def _chunk_outcome(store: ObjectStore, settings: RunSettings, segments: list[PlannedSegment],
                   keys: list[str]) -> ChunkOutcome:
    by_segment: dict[tuple[str, int, bool], dict[str, Any]] = {}
    earlier: dict[str, list[int]] = {}
    for s in segments:
        if s.cause is Cause.BUDGET:
            by_segment[(s.directory, s.base_offset, False)] = {
                "directory": s.directory, "base_offset": s.base_offset, "status": Status.SKIPPED, "reason": s.reason}
        elif s.compacted_by == settings.run_id:
            earlier.setdefault(s.directory, []).append(s.base_offset)
    requests: dict[str, Counter[str]] = {}
    seconds = 0.0
    for key in keys:
        step = StepResults.from_json(store.get_json(key)[0], f"s3://{store.bucket}/{key}")
        for directory, counts in step.requests.items():
            requests.setdefault(directory, Counter()).update(counts)
        for result in step.results:
            r = result.to_json()
            at = (result.directory, result.base_offset, result.recovered)
            # A commit after its staging: the outcome is the commit's, what the staging measured (stats,
            # seconds) stays; a failure of the earlier result (error, cause, pending) does not.
            merged = {**by_segment.get(at, {}), **r}
            for field in ("error", "cause", "pending"):
                if field not in r:
                    merged.pop(field, None)
            by_segment[at] = merged
            seconds += result.seconds or 0.0
    for directory, bases in sorted(earlier.items()):
        by_segment.update((at, r.to_json()) for at, r in
                          _earlier_attempts(store, settings, directory, bases, by_segment).items())
    results = [SegmentResult.from_json(by_segment[at])
               for at in sorted(by_segment, key=lambda k: (k[0], k[1], not k[2]))]  # a recovery before its segment
    return ChunkOutcome(segments, results, requests, seconds)


def collect_run(store: ObjectStore, settings: RunSettings, *,
                extra: Mapping[str, int | str | None] | None = None) -> RunResult:
    """The run document, folded from :func:`run_outcomes` one chunk at a time: totals, counts by topic and
    reason, the segments up to the listing's limit, and the S3 requests (by partition up to a limit, and
    by the storage class of the partition's compacted segments, which is what the report prices them at).
    ``extra``: more settings of the run to record."""
    tally = RunTally()
    by_class: dict[str, Counter[str]] = {}
    for chunk in run_outcomes(store, settings):
        classes = {(s.directory, s.base_offset): s.log.storage_class for s in chunk.segments if s.log is not None}
        class_of: dict[str, str] = {}
        for result in chunk.results:
            tally.add(result)
            if result.status is Status.COMPACTED:
                class_of[result.directory] = classes.get((result.directory, result.base_offset), STANDARD)
        for directory, counts in chunk.requests.items():
            by_class.setdefault(class_of.get(directory, STANDARD), Counter()).update(counts)
        tally.add_usage(chunk.requests, chunk.seconds)
    for info in store.list(settings.step_dir(StepDir.USAGE)):
        used = StepUsage.from_json(store.get_json(info.key)[0], f"s3://{store.bucket}/{info.key}")
        tally.add_usage({RUN_SCOPE: used.requests})
        by_class.setdefault(STANDARD, Counter()).update(used.requests)
    try:
        header = plan_files(store, settings).manifest().header
        started, estimate = header.created_at, header.estimate
    except ObjectNotFound:
        started, estimate = "", None
    return tally.write(store, RunKind.COMPACT, settings.run_id, settings.prefix, started,
                       {"codec": settings.codec, "level": settings.level,
                        "estimate": estimate.to_json() if estimate is not None else None, **(extra or {})},
                       tally.usage(requests_by_class={k: dict(sorted(v.items())) for k, v in sorted(by_class.items())}))


def _earlier_attempts(store: ObjectStore, settings: RunSettings, directory: str, bases: list[int],
                      reported: Container[tuple[str, int, bool]]) -> dict[tuple[str, int, bool], SegmentResult]:
    """Segments an earlier attempt of this run (killed, then run again with the same id) compacted, counted
    from the partition's state (what is on S3), so that the run's savings are whole whatever attempt did
    the work."""
    try:
        state = load_state(store, settings.prefix, directory)
    except TieringError:  # the work is done and safe; only its count in this document is missing
        return {}
    out = {}
    for base in bases:
        entry = state.get(base)
        if (directory, base, False) not in reported and entry is not None and entry.run_id == settings.run_id:
            out[(directory, base, False)] = SegmentResult(
                directory, base, Status.COMPACTED, "by an earlier attempt of this run", entry.bytes_before,
                entry.bytes_after, run_id=settings.run_id)
    return out


def write_scan(store: ObjectStore, settings: RunSettings, plan: Plan) -> str:
    """A plan made elsewhere (``tiering s3 scan --out``, or in memory) as the run's scan; its manifest key."""
    out = plan_files(store, settings, PlanName.SCAN)
    writer = out.writer()
    for part in by_partition(sorted(plan.segments, key=lambda s: (s.directory, s.base_offset))):
        writer.add(part)
    chunks = writer.close()
    header = dataclasses.replace(plan, segments=(), estimate=None)  # the run's own plan decides on one
    return out.write_manifest(PlanManifest(header, writer.totals.to_json(), chunks, "plan"))


def run_local(store: ObjectStore, settings: RunSettings, ctx: Context, options: CompactOptions,
              progress: Callable[[SegmentResult], None] | None = None) -> RunResult:
    """The run's planned work in this process (the CLI): its units on ``options.workers`` threads, each
    segment committed at once; then the operations left in flight in the plan's other partitions; then
    the run document. Results an earlier attempt of this run id left are replaced."""
    plan = plan_files(store, settings)
    manifest = plan.manifest()
    pending = pending_bases(store, settings.prefix)
    units = stage_units(plan, manifest, parallelism=options.workers)
    with ThreadPoolExecutor(max_workers=max(1, options.workers), thread_name_prefix="compact") as pool:
        list(pool.map(lambda u: run_unit(store, settings, ctx, u, commit=True, pending=pending, progress=progress),
                      units))
    worked = {s.directory for u in units for s in plan.chunk(u.chunk_key, u.start, u.stop)
              if s.action in (Action.COMPACT, Action.REPAIR)}  # a unit's line range may hold partitions without work
    left = {d: b for d, b in pending.items() if d not in worked}
    if left:
        for info in manifest.chunks:
            commit_chunk(store, settings, info.name, ctx=ctx, pending=left, worked=False)
    return collect_run(store, settings, extra={"max_segments": options.max_segments, "max_bytes": options.max_bytes,
                                               "plan_created_at": manifest.header.created_at})


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
