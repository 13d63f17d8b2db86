"""Key compaction on S3: one pass of Kafka's log cleaner (:mod:`tiering.kafka.keycompact`) over each
partition's archived segments, each cleaned segment swapped in by the commit protocol.

Per partition, under its lease: the journals a crashed run left are finished first; the segments are
listed; the cleaner's first pass reads them (headers, and the cleaned range's records for the key map);
its second pass makes each cleaned segment in offset order, and each one that changed is staged, backed
up and swapped (:func:`~tiering.commit.stage.stage_cleaned`, :func:`~tiering.commit.finish.finish`)
before the next one is made. So whatever stops a pass (a crash, a changed source, S3 failing) leaves the
segments below some offset cleaned and the rest as they were: the state a broker's cleaner leaves when it
stops between two groups, which the next pass (a later run) cleans from.

A segment whose cleaned ``.txnindex`` loses entries (a pass that lets an ABORT marker go, once its
transaction's data is gone) has it replaced too, before its ``.log``
(``docs/commit-protocol.md`` says why that order).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, BinaryIO, ClassVar, Final

from tiering.commit.finish import finish
from tiering.commit.lease import DEFAULT_TTL_SECONDS, Lease
from tiering.commit.operation import Context, SegmentResult
from tiering.commit.regroup import stage_cleaned_group
from tiering.commit.stage import stage_cleaned
from tiering.errors import ConfigError, InvalidDataError, ProofError, UnsupportedError
from tiering.kafka.codecs import Codec
from tiering.kafka.index import AbortedTxn, parse_txn_index
from tiering.kafka.keycompact import (
    DEFAULT_DELETE_RETENTION_MS,
    DEFAULT_MAX_KEYS,
    CleanedSegment,
    CleanOptions,
    CleanStats,
    Segment,
    clean,
    survey,
)
from tiering.kafka.merge import Limits
from tiering.lifecycle.state import load_state, record_keys_checkpoint, record_keys_run
from tiering.lifecycle.vocabulary import Cause, RunKind, Status
from tiering.options import KEY_COMPACTION, MIN_AGE, Options
from tiering.plan.document import PlannedSegment
from tiering.plan.policy import Policy, policy_at, policy_ref
from tiering.plan.scan import ScanOptions
from tiering.run import engine
from tiering.run.documents import limits_json, limits_of
from tiering.run.segment import guarded, stale_after_recovery
from tiering.storage.layout import StepDir, clock_key
from tiering.storage.objects import ObjectInfo, ObjectStore

NO_CHECKPOINT: Final = -1  # a whole pass: the partition's checkpoint is cleared
# Segments the pass cannot read past: the cleaned range ends before them.
_UNREADABLE: Final = frozenset({Cause.ARCHIVED, Cause.UNREADABLE, Cause.INCOMPLETE})
# Segments a broker may still append to, or written too recently: read (for producers), never cleaned.
_LAST: Final = frozenset({Cause.ACTIVE, Cause.TOO_YOUNG})


@dataclass(frozen=True, slots=True)
class KeyCompactOptions(Options):
    """One key-compaction run: the cleaner's settings and which partitions (declared in
    :data:`tiering.options.KEY_COMPACTION`)."""

    DECLARED: ClassVar = KEY_COMPACTION
    WHAT: ClassVar = "key-compaction options"

    now_ms: int | None = None  # the pass's clock (None: the store's, read once at the start)
    delete_retention_ms: int = DEFAULT_DELETE_RETENTION_MS
    min_compaction_lag_ms: int = 0
    codec: str | None = None  # a rebuilt batch's codec (None: its own)
    level: int | None = None
    topics: str | None = None
    min_age_minutes: int = MIN_AGE.default  # segments uploaded more recently end the cleaned range
    lease_ttl_seconds: int = DEFAULT_TTL_SECONDS
    # Which topics, and their delete.retention.ms and min.compaction.lag.ms: those whose cleanup.policy has
    # compact and compact.enable is true (the two values above are then not used).
    policy: Policy | None = None
    # the key map's bound (None: none), by default a broker's default cleaner thread's: a full map ends a pass
    # early, the next run goes on
    max_keys: int | None = DEFAULT_MAX_KEYS
    # Clean neighbours into one segment as the broker's cleaner groups them, within these bounds (with a policy:
    # each topic's segment.bytes and segment.index.bytes); None: each segment into one of its own.
    merge: Limits | None = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.max_keys is not None and self.max_keys < 1:
            raise ConfigError("the key map's bound must be at least one key", expected=">= 1", found=self.max_keys)
        for name in ("delete_retention_ms", "min_compaction_lag_ms"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name.replace('_', '.')} must not be negative", expected=">= 0",
                                  found=getattr(self, name))
        if self.topics is None and self.policy is None:
            raise ConfigError("key compaction needs the topics to clean: a policy (cleanup.policy compact and "
                              "compact.enable) or a regular expression of topic names", expected="--policy or --topics",
                              found="neither")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> KeyCompactOptions:
        merge = Limits(values["segment_bytes"], values["index_bytes"]) if values["merge"] else None
        return cls(values["now_ms"], values["delete_retention_ms"], values["min_compaction_lag_ms"], values["codec"],
                   values["level"], values["topics"], values["min_age_minutes"], values["lease_ttl_seconds"],
                   policy_at(values["policy"]), values["max_keys"], merge)

    def values(self) -> dict[str, Any]:
        """The declared values (the policy by its file's path)."""
        bounds = self.merge or Limits()
        return {"topics": self.topics, "policy": policy_ref(self.policy), "now_ms": self.now_ms,
                "delete_retention_ms": self.delete_retention_ms, "min_compaction_lag_ms": self.min_compaction_lag_ms,
                "codec": self.codec, "level": self.level, "min_age_minutes": self.min_age_minutes,
                "max_keys": self.max_keys, "merge": self.merge is not None, "segment_bytes": bounds.segment_bytes,
                "index_bytes": bounds.index_bytes, "lease_ttl_seconds": self.lease_ttl_seconds}

    def settings_json(self, now_ms: int) -> dict[str, Any]:
        """The run document's settings of a pass at ``now_ms``."""
        doc = {"now_ms": now_ms, "codec": self.codec, "level": self.level, "topics": self.topics,
               "min_age_minutes": self.min_age_minutes, "max_keys": self.max_keys}
        if self.policy is not None:
            return {**doc, "policy": self.policy.path}
        return {**doc, "delete_retention_ms": self.delete_retention_ms,
                "min_compaction_lag_ms": self.min_compaction_lag_ms}

    def topic_settings(self, topic: str) -> tuple[int, int, Limits | None] | None:
        """``topic``'s delete.retention.ms, min.compaction.lag.ms and merge bounds, or None when the policy
        leaves it alone."""
        retention, lag = self.delete_retention_ms, self.min_compaction_lag_ms
        if self.policy is not None:
            tp = self.policy.resolve(topic)
            if not tp.key_compaction:
                return None
            retention, lag = tp.delete_retention_ms, tp.min_compaction_lag_ms
        return retention, lag, self.limits_for(topic)

    def limits_for(self, topic: str) -> Limits | None:
        """The merge bounds of ``topic``'s cleaned segments (None: no merging)."""
        if self.merge is None or self.policy is None:
            return self.merge
        tp = self.policy.resolve(topic)
        return Limits(tp.segment_bytes, tp.segment_index_bytes)


def stats_delta(after: CleanStats, before: CleanStats) -> dict[str, int]:
    """What one segment added to a pass's figures (``keys`` is the partition's, not summed)."""
    doc = {f.name: getattr(after, f.name) - getattr(before, f.name) for f in dataclasses.fields(CleanStats)}
    doc["keys"] = after.keys
    return doc


def _chain(segments: list[PlannedSegment]) -> tuple[list[PlannedSegment], list[PlannedSegment]]:
    """The segments a pass reads (in offset order; the last one is only read, never cleaned) and the ones
    past them."""
    listed = [s for s in segments if s.log is not None]
    chain: list[PlannedSegment] = []
    for i, seg in enumerate(listed):
        if seg.cause in _UNREADABLE:
            return chain, listed[i:]
        chain.append(seg)
        if seg.cause in _LAST:
            return chain, listed[i + 1:]
    return chain, []


def partition_pass(ctx: Context, store: ObjectStore, segments: list[PlannedSegment], options: CleanOptions,
                   lease: Lease, out: list[SegmentResult], progress: Callable[[SegmentResult], None] | None = None
                   ) -> None:
    """One pass over one partition's listed segments, under its lease: results appended to ``out``."""
    def report(r: SegmentResult) -> None:
        out.append(r)
        if progress is not None:
            progress(r)

    directory = segments[0].directory
    if stale_after_recovery(ctx, segments, lease, report, "cleaned"):
        return
    chain, past = _chain(segments)
    for seg in past:
        report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, f"past the cleaned range: {seg.reason}"
                             if seg.cause is not None else "past the cleaned range", cause=seg.cause))
    if len(chain) < 2:
        for seg in chain:
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, seg.reason, cause=seg.cause))
        return

    # A pass whose key map filled up ended early: the next one goes on from where it ended (Kafka's
    # checkpoint). A whole pass clears it, so the next maps the whole range again (an archive gets no new
    # data: a pass over nothing dirty would never let a stamped tombstone go).
    state = load_state(store, ctx.prefix, directory)
    checkpoint = state.keys_checkpoint
    start = checkpoint if checkpoint is not None and chain[0].base_offset <= checkpoint <= chain[-1].base_offset \
        else 0
    try:
        # A segment this very run swapped already (a retry of a run that stopped) is not cleaned again: its
        # backup holds the original, which a second swap would replace with this run's own output.
        done = {s.base_offset for s in chain if (e := state.get(s.base_offset)) is not None and e.compacted
                and e.run_id == ctx.run_id and s.log is not None and e.log_etag == s.log.etag}
        end = _clean_chain(ctx, store, chain, replace(options, first_dirty_offset=start), lease, report, done)
    except InvalidDataError as e:  # the pass read something it cannot clean: the segments it had not done stay
        reported = {r.base_offset for r in out if r.directory == directory}
        cause = Cause.UNSUPPORTED if isinstance(e, UnsupportedError) else Cause.INVALID
        for seg in chain:
            if seg.base_offset not in reported:
                report(SegmentResult(seg.directory, seg.base_offset, Status.FAILED, f"not cleaned: the pass read {e}",
                                     error=e.to_dict(), cause=cause))
        return
    if end is not None and (None if end == NO_CHECKPOINT else end) != checkpoint:
        lease.check()
        record_keys_checkpoint(store, ctx.prefix, directory, None if end == NO_CHECKPOINT else end)


def _clean_chain(ctx: Context, store: ObjectStore, chain: list[PlannedSegment], options: CleanOptions,
                 lease: Lease, report: Callable[[SegmentResult], None], ours: set[int]) -> int | None:
    """Both passes of the cleaner over ``chain``; each cleaned segment swapped in before the next is made.
    The checkpoint the partition keeps when the pass is done: where it ended if its key map filled up, else
    ``NO_CHECKPOINT``; None when it stopped (the checkpoint stays as it was)."""
    def opener(seg: PlannedSegment) -> Callable[[], Any]:
        assert seg.log is not None
        log = seg.log

        def open_log() -> Any:
            lease.keep_alive()
            return store.open(log.key, if_match=log.etag)
        return open_log

    sources = [Segment(s.base_offset, opener(s), tuple(parse_txn_index(store.get(s.txnindex.key),
                                                                       path=s.txnindex.key))
                       if s.txnindex is not None else (), f"s3://{store.bucket}/{s.log.key}" if s.log else "",
                       s.size, s.index.size if s.index else 0, s.timeindex.size if s.timeindex else 0)
               for s in chain]
    by_base = {s.base_offset: s for s in chain}
    aborted = {s.base_offset: list(s.aborted) for s in sources}  # each .txnindex as the pass read it
    mark = time.perf_counter()  # each result's seconds: the pass's time since the previous one (survey included)
    facts = survey(sources, options)
    stats = CleanStats()
    with tempfile.TemporaryDirectory(prefix="tiering-keys-", dir=ctx.work_dir) as work:
        def sink(base: int) -> BinaryIO:
            return open(os.path.join(work, f"{base}.log"), "wb")

        previous = dataclasses.replace(stats)
        noted = False
        done: set[int] = set()
        stopped: SegmentResult | None = None
        for cleaned in clean(sources, facts, options, stats, sink=sink):
            seg = by_base[cleaned.base_offset]
            figures = stats_delta(stats, previous)
            previous = dataclasses.replace(stats)
            done.update(cleaned.sources)
            path = os.path.join(work, f"{seg.base_offset}.log")
            if len(cleaned.sources) > 1:  # neighbours cleaned into one, as the broker's cleaner groups them
                group = [by_base[b] for b in cleaned.sources]
                if not noted:
                    lease.check()
                    record_keys_run(store, ctx.prefix, seg.directory, ctx.run_id)
                    noted = True
                results = _swap_group(ctx, group, cleaned, path, figures, lease, ours)
                os.unlink(path)
                seconds, mark = round(time.perf_counter() - mark, 3), time.perf_counter()
                results = [replace(results[0], seconds=seconds), *results[1:]]
                for r in results:
                    report(r)
                if any(r.status not in (Status.MERGED, Status.SKIPPED) for r in results):
                    stopped = results[0]
                    break
                continue
            if seg.base_offset in ours:
                result = SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED,
                                       "already cleaned by this run (an earlier attempt swapped it)", seg.size,
                                       seg.size, cause=Cause.ALREADY_COMPACTED)
            else:
                if not noted and _changed(figures):  # before its first swap here: rollbacks go latest first
                    lease.check()
                    record_keys_run(store, ctx.prefix, seg.directory, ctx.run_id)
                    noted = True
                result = _swap_one(ctx, seg, cleaned, path, figures, lease, aborted[seg.base_offset])
            result, mark = replace(result, seconds=round(time.perf_counter() - mark, 3)), time.perf_counter()
            os.unlink(path)
            report(result)
            if result.status is not Status.COMPACTED and result.cause not in (Cause.NOTHING_TO_CLEAN,
                                                                        Cause.ALREADY_COMPACTED):
                stopped = result
                break
    for seg in chain:
        if seg.base_offset in done:
            continue
        if stopped is not None:
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, f"not cleaned: the pass stopped at "
                                 f"segment {stopped.base_offset}", cause=Cause.PASS_STOPPED))
        elif seg.cause in _LAST:
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, seg.reason, cause=seg.cause))
        elif facts.end_offset < facts.upper:
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED,
                                 f"past where this pass's key map filled up ({len(facts.key_map):,} keys, offset "
                                 f"{facts.end_offset}): the next pass goes on from there", cause=Cause.UNCLEANABLE))
        else:
            report(SegmentResult(seg.directory, seg.base_offset, Status.SKIPPED, "past the first uncleanable offset "
                                 f"{facts.upper} (an open transaction, min.compaction.lag.ms, or the range's "
                                 "end)", cause=Cause.UNCLEANABLE))
    if stopped is not None:
        return None
    return facts.end_offset if facts.end_offset < facts.upper else NO_CHECKPOINT


def _changed(figures: dict[str, int]) -> bool:
    """Whether a cleaned segment differs from its source (some batch dropped or rebuilt)."""
    return not figures["batches_copied"] == figures["batches_in"] == figures["batches_out"]


def _swap_group(ctx: Context, group: list[PlannedSegment], cleaned: CleanedSegment, path: str,
                figures: dict[str, int], lease: Lease, ours: set[int]) -> list[SegmentResult]:
    """Stage and swap a segment cleaned from several neighbours (a merge of what the cleaner kept of them);
    every problem becomes a result. A group that holds a segment this very run swapped already is left: its
    backup keeps the original, which a second swap would replace with this run's own output."""
    first = group[0]
    # The first result's bytes_before is its own segment's: the figures carry the group's.
    stats: dict[str, object] = {"key_compaction": {**figures, "group_bytes_before": sum(s.size for s in group)}}
    if ours & {s.base_offset for s in group}:
        return [SegmentResult(s.directory, s.base_offset, Status.SKIPPED, "already cleaned by this run (an earlier "
                              "attempt swapped it)", s.size, s.size, cause=Cause.ALREADY_COMPACTED) for s in group]
    results: list[SegmentResult] = []

    def attempt() -> SegmentResult:
        with open(path, "rb") as log:
            journal, etag = stage_cleaned_group(ctx, group, log, cleaned.size, cleaned.indexes, cleaned.txn_index,
                                                lease)
        results.extend(finish(ctx, journal, etag, lease))
        return results[0]

    result = guarded(ctx, first, attempt)
    out = results or [result]
    return [replace(out[0], stats={**(out[0].stats or {}), **stats}), *out[1:]]


def _swap_one(ctx: Context, seg: PlannedSegment, cleaned: CleanedSegment, path: str, figures: dict[str, int],
              lease: Lease, before: list[AbortedTxn]) -> SegmentResult:
    """Stage and swap one cleaned segment (or say why not); every problem becomes a result."""
    d, base = seg.directory, seg.base_offset
    stats: dict[str, object] = {"key_compaction": figures}
    if not _changed(figures):
        return SegmentResult(d, base, Status.SKIPPED, "nothing to clean: every batch stays as it is", seg.size,
                             seg.size, stats=stats, cause=Cause.NOTHING_TO_CLEAN)
    def attempt() -> SegmentResult:
        where = f"s3://{ctx.store.bucket}/{seg.txnindex.key}" if seg.txnindex else None
        after = parse_txn_index(cleaned.txn_index)
        if not set(after) <= set(before):
            raise ProofError("the cleaned .txnindex holds an entry the original does not", path=where,
                             expected=f"a subset of {len(before)} entries", found=f"{len(after)} entries")
        with open(path, "rb") as log:
            staged = stage_cleaned(ctx, seg, log, cleaned.size, cleaned.indexes, lease,
                                   txn_index=None if after == before else cleaned.txn_index)
        [result] = finish(ctx, staged.journal, staged.etag, lease, indexes=staged.indexes)
        return staged.result if result.status == staged.result.status else result

    result = guarded(ctx, seg, attempt)
    return replace(result, stats={**(result.stats or {}), **stats})


def now_ms_of(store: ObjectStore, prefix: str, options: KeyCompactOptions) -> int:
    if options.now_ms is not None:
        return options.now_ms
    return int(store.now(clock_key(prefix)).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class KeyPartition(engine.OnListedSegments):
    """One partition's pass: its listed segments and the cleaner's settings for its topic (resolved from the
    policy by the planner: JSON-able, it travels to Spark executors)."""

    segments: tuple[PlannedSegment, ...]
    now_ms: int
    delete_retention_ms: int
    min_compaction_lag_ms: int
    codec: str | None = None
    level: int | None = None
    max_keys: int | None = None
    merge: Limits | None = None

    @property
    def directory(self) -> str:
        return self.segments[0].directory

    def in_reach(self) -> list[PlannedSegment]:
        """The segments this pass may clean, as the listing shows them: those it reads but the last, which it
        only reads. min.compaction.lag.ms and a full key map may end it earlier: only reading says."""
        return _chain(list(self.segments))[0][:-1]

    def preview_json(self) -> dict[str, Any]:
        """What a dry run says of this partition's pass."""
        reach = self.in_reach()
        return {"directory": self.directory, "now_ms": self.now_ms, "segments": len(reach),
                "log_bytes": sum(s.size for s in reach),
                "delete_retention_ms": self.delete_retention_ms, "min_compaction_lag_ms": self.min_compaction_lag_ms,
                "merge": None if self.merge is None else limits_json(self.merge)}

    def clean_options(self, ctx: Context) -> CleanOptions:
        return CleanOptions(self.now_ms, self.delete_retention_ms, self.min_compaction_lag_ms,
                            max_keys=self.max_keys,
                            codec=Codec.parse(self.codec) if self.codec is not None else None, level=self.level,
                            index_interval_bytes=ctx.index_interval_bytes,
                            decompression_limit=ctx.decompression_limit, merge=self.merge)

    def to_json(self) -> dict[str, Any]:
        return {"segments": [s.to_json() for s in self.segments], "now_ms": self.now_ms,
                "delete_retention_ms": self.delete_retention_ms, "min_compaction_lag_ms": self.min_compaction_lag_ms,
                "codec": self.codec, "level": self.level, "max_keys": self.max_keys,
                **({"merge": limits_json(self.merge)} if self.merge else {})}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> KeyPartition:
        return cls(tuple(PlannedSegment.from_json(s) for s in doc["segments"]), int(doc["now_ms"]),
                   int(doc["delete_retention_ms"]), int(doc["min_compaction_lag_ms"]), doc.get("codec"),
                   doc.get("level"), doc.get("max_keys"), limits_of(doc["merge"]) if doc.get("merge") else None)


@dataclass(frozen=True, slots=True)
class KeyCompaction(engine.PartitionsOnly):
    """Key compaction as a kind of run (:mod:`tiering.run.engine`): one pass of the cleaner per partition of
    the chosen topics, at the clock read when the run starts."""

    options: KeyCompactOptions

    run_kind: ClassVar[RunKind] = RunKind.COMPACT_KEYS
    label: ClassVar[str] = "key compaction"
    step: ClassVar[StepDir] = StepDir.KEYS
    plans_ahead: ClassVar[bool] = False

    @property
    def lease_ttl_seconds(self) -> int:
        return self.options.lease_ttl_seconds

    def started(self, store: ObjectStore, prefix: str) -> KeyCompaction:
        return KeyCompaction(replace(self.options, now_ms=now_ms_of(store, prefix, self.options)))

    @property
    def now_ms(self) -> int:
        if self.options.now_ms is None:
            raise ConfigError("a key-compaction pass has no clock before it starts", expected="now_ms", found=None)
        return self.options.now_ms

    def partitions(self, store: ObjectStore, prefix: str, emit: Callable[[KeyPartition], None],
                   source: Iterator[ObjectInfo] | None) -> None:
        options = ScanOptions("none", topics=self.options.topics, min_age_minutes=self.options.min_age_minutes)
        engine.listed(store, prefix, options, lambda segments: self.partition(store, segments), emit, source)

    def partition(self, store: ObjectStore, segments: list[PlannedSegment]) -> KeyPartition | None:
        chosen = self.options.topic_settings(segments[0].topic)
        if chosen is None:
            return None
        retention, lag, merge = chosen
        return KeyPartition(tuple(segments), self.now_ms, retention, lag, self.options.codec, self.options.level,
                            self.options.max_keys, merge)

    def partition_from_json(self, doc: Mapping[str, Any]) -> KeyPartition:
        return KeyPartition.from_json(doc)

    def work(self, ctx: Context, part: KeyPartition, lease: Lease, out: list[SegmentResult],
             progress: Callable[[SegmentResult], None] | None) -> None:
        partition_pass(ctx, ctx.store, list(part.segments), part.clean_options(ctx), lease, out, progress)

    def settings_json(self) -> dict[str, Any]:
        return self.options.settings_json(self.now_ms)

    def options_json(self) -> dict[str, Any]:
        return self.options.to_json()

    def figures(self, results: Iterable[SegmentResult]) -> dict[str, Counter[str]]:
        return {}
