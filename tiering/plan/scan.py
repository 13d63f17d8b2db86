"""The scanner: list a ``logdir`` prefix and decide, per segment, what a compaction run may touch.

Listing is paginated and runs one partition per worker thread (boto3 clients are thread-safe); nothing
is read but listings and, per partition, our own small state document. Each segment gets an action:

- ``compact``: sealed, readable, unchanged since we last saw it (or never compacted to this codec);
- ``repair``: we compacted it, then something (a mirroring tool) put another ``.log`` back beside the
  indexes we rebuilt: those indexes no longer match their log and must go (a broker rebuilds a missing
  index, but trusts a present one);
- ``skip``, with the reason: the active segment (highest base offset), uploaded within the grace period,
  already compacted to the target codec, archived (GLACIER / DEEP_ARCHIVE: unreadable without a restore),
  incomplete (index files without a ``.log``), empty, or too large to be a Kafka segment.

Partition directories Kafka is deleting, moving or found stray (``-delete``, ``-future``, ``-stray``)
and internal topics (``__*``) are skipped unless included. The result is a plan
(:mod:`tiering.plan.document`)."""

from __future__ import annotations

import itertools
import re
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, Final

from tiering.errors import ConfigError
from tiering.kafka.batch import V2_HEADER_SIZE
from tiering.kafka.codecs import Codec, check_level
from tiering.kafka.files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_segment_name,
)
from tiering.kafka.rewrite import MAX_SEGMENT_BYTES
from tiering.lifecycle.state import Outcome, PartitionState, SegmentState, after_moves, load_state
from tiering.lifecycle.vocabulary import Action, Cause, FileRole, StorageClass
from tiering.options import MIN_AGE
from tiering.plan.document import MAX_IGNORED_LISTED, Committed, ObjectRef, Plan, PlannedSegment
from tiering.plan.inventory import SHARDS, spill_grouped
from tiering.plan.policy import AUTO, PRODUCER, Policy
from tiering.storage.layout import (
    PARTITION_FILES,
    STATE_DIR,
    DirKind,
    PartitionDir,
    clock_key,
    normalize_prefix,
    parse_dir,
    partition_prefix,
    reserved_dir,
)
from tiering.storage.objects import ObjectInfo, ObjectStore

DEFAULT_MIN_AGE_MINUTES: Final[int] = MIN_AGE.default
DEFAULT_SCAN_WORKERS: Final = 8
ARCHIVED_CLASSES: Final = frozenset({StorageClass.GLACIER, StorageClass.DEEP_ARCHIVE})  # GLACIER_IR is readable at once
PARTITION_FILE: Final = "partition file: kept as it is"
SNAPSHOT: Final = "producer-state snapshot: kept as it is"
NOT_KAFKA: Final = "not a Kafka file"
PLACEHOLDER: Final = "directory placeholder (a zero-byte key ending in /)"
CLOCK_ROUNDING: Final = timedelta(seconds=1)  # stores round LastModified to the second, some of them up
INVENTORY_SHARDS: Final = SHARDS


@dataclass(frozen=True, slots=True)
class ScanOptions:
    codec: str
    level: int | None = None
    topics: str | None = None  # a regex the whole topic name must match
    min_age_minutes: int = DEFAULT_MIN_AGE_MINUTES
    include_internal: bool = False
    include_special: bool = False  # -delete / -future / -stray directories
    workers: int = DEFAULT_SCAN_WORKERS
    policy: Policy | None = None  # per-topic codec, level and minimum savings (codec and level: the default)
    rebatch_max_bytes: int | None = None  # re-batching for every topic (a policy sets it per topic instead)

    def __post_init__(self) -> None:
        if self.codec not in (PRODUCER, AUTO):  # those two come only from a policy
            codec = Codec.parse(self.codec)
            object.__setattr__(self, "codec", codec.label)
            object.__setattr__(self, "level", check_level(codec, self.level))
        if self.min_age_minutes < 0:
            raise ConfigError("--min-age-minutes must not be negative", expected=">= 0", found=self.min_age_minutes)
        if self.workers < 1:
            raise ConfigError("scan workers must be at least 1", expected=">= 1", found=self.workers)
        if self.rebatch_max_bytes is not None:
            if self.policy is not None:
                raise ConfigError("re-batching for every topic and a policy: set rebatch.enable in the policy "
                                  "(per topic) instead", found=self.policy.path)
            if not V2_HEADER_SIZE < self.rebatch_max_bytes < 1 << 31:
                raise ConfigError("the re-batching bound is out of range",
                                  expected=f"{V2_HEADER_SIZE + 1}..{(1 << 31) - 1}", found=self.rebatch_max_bytes)
        if self.topics is not None:
            try:
                re.compile(self.topics)
            except re.error as e:
                raise ConfigError(f"--topics is not a valid regular expression: {e}", found=self.topics) from None


def _dir_skip_reason(d: PartitionDir, o: ScanOptions) -> str | None:
    if d.kind is DirKind.OTHER:
        return "not a Kafka partition directory (<topic>-<partition>)"
    if d.kind in (DirKind.DELETE, DirKind.FUTURE, DirKind.STRAY) and not o.include_special:
        return f"Kafka '-{d.kind.value}' directory (pass --include-special to include it)"
    if d.internal and not o.include_internal:
        return "internal topic (pass --include-internal to include it)"
    if o.topics is not None and d.topic is not None and not re.fullmatch(o.topics, d.topic):
        return "topic does not match --topics"
    return None


def classify_partition(d: PartitionDir, dir_key: str, objects: Iterable[ObjectInfo], state: PartitionState,
                       now: datetime, o: ScanOptions, ignored: Callable[[str, str], None],
                       in_place: Callable[[SegmentState, ObjectInfo], None] | None = None) -> list[PlannedSegment]:
    """Segments of one partition directory (its objects listed under ``dir_key``), each with its action and
    reason (pure: no S3 here). ``in_place`` is told of each of our entries whose ``.log`` is the one listed."""
    assert d.topic is not None
    assert d.partition is not None
    groups: dict[int, dict[str, ObjectInfo]] = {}
    for info in objects:
        file = info.key[len(dir_key):]
        if file in PARTITION_FILES:
            ignored(info.key, PARTITION_FILE)
            continue
        parsed = parse_segment_name(file) if "/" not in file else None
        if parsed is None:
            ignored(info.key, PLACEHOLDER if (info.size == 0 and file.endswith("/")) or not file else NOT_KAFKA)
            continue
        groups.setdefault(parsed[0], {})[parsed[1]] = info
    with_log = [base for base, g in groups.items() if LOG_SUFFIX in g]
    active = max(with_log) if with_log else None
    grace = timedelta(minutes=o.min_age_minutes)
    target = o
    # PlannedSegment's codec, level, min_savings_ratio and re-batching bound, from a policy (else the run's bound)
    per_topic: dict[str, Any] = {"rebatch_max_bytes": o.rebatch_max_bytes}
    if o.policy is not None:
        tp = o.policy.resolve(d.topic)
        target = replace(o, codec=tp.compression_type, level=tp.level, policy=None,
                         rebatch_max_bytes=tp.rebatch_max_bytes)
        per_topic = {"codec": target.codec, "level": target.level, "min_savings_ratio": tp.min_savings_ratio,
                     "rebatch_max_bytes": tp.rebatch_max_bytes}
    out = []
    for base in sorted(groups):
        g = groups[base]
        if (snapshot := g.get(SNAPSHOT_SUFFIX)) is not None:
            ignored(snapshot.key, SNAPSHOT)  # producer state of the partition, not a segment file
        if set(g) <= {SNAPSHOT_SUFFIX}:
            continue
        log = g.get(LOG_SUFFIX)
        refs = {FileRole.LOG: log, FileRole.INDEX: g.get(INDEX_SUFFIX), FileRole.TIMEINDEX: g.get(TIME_INDEX_SUFFIX),
                FileRole.TXNINDEX: g.get(TXN_INDEX_SUFFIX)}
        ours = after_moves(state.get(base), state.tiered.get(base, ()), refs)  # a tiering run's copy not followed
        action, reason, cause = _classify(base, log, refs, active, ours, now, grace, target)
        if action == Action.COMPACT and target.codec == PRODUCER:
            action, cause = Action.SKIP, Cause.POLICY
            reason = "policy: compression.type producer (keep what the producer wrote)"
        files: dict[str, Any] = {k: ObjectRef.of(v) if v else None for k, v in refs.items()}
        own = per_topic if action == Action.COMPACT else {}  # a repair rewrites nothing: no codec of its own
        done = ours is not None and log is not None and ours.compacted and ours.log_etag == log.etag
        if done and in_place is not None and ours is not None and log is not None:
            in_place(ours, log)
        seg = PlannedSegment(d.name, d.topic, d.partition, base, action, reason, **files, **own,
                             compacted_by=ours.run_id if done and action == Action.SKIP and ours else None, cause=cause)
        if action == Action.SKIP:
            for ref in (seg.log, seg.index, seg.timeindex, seg.txnindex):
                if ref is not None:
                    ignored(ref.key, object_reason(seg))
        out.append(seg)
    return out


def object_reason(seg: PlannedSegment) -> str:
    """Why the objects of a skipped segment are not planned, in a few words (the segment's reason is the
    detail): the label a scan counts them by."""
    if seg.cause is Cause.ARCHIVED:
        classes = sorted({r.storage_class for r in (seg.log, seg.index, seg.timeindex)
                          if r is not None and r.storage_class in ARCHIVED_CLASSES})
        return f"archived storage class {' and '.join(classes)}: restore first"
    objects = {Cause.ACTIVE: "active segment", Cause.EMPTY: "empty .log", Cause.INVALID: "invalid segment",
               Cause.POLICY: "policy: left as the producer wrote it",
               Cause.REMEMBERED: "nothing to gain, as the last run found"}  # where the objects read otherwise
    return objects.get(seg.cause, seg.skip_label) if seg.cause is not None else seg.skip_label


def _classify(base: int, log: ObjectInfo | None, refs: dict[FileRole, ObjectInfo | None], active: int | None,
              ours: SegmentState | None, now: datetime, grace: timedelta,
              o: ScanOptions) -> tuple[Action, str, Cause | None]:
    if log is None:
        return Action.SKIP, "incomplete: index files without a .log (orphans; a broker ignores them)", Cause.INCOMPLETE
    # A rewrite with re-batching is another target than one without; a plain target is met by either.
    covers = ours is not None and (o.rebatch_max_bytes is None or ours.rebatch_max_bytes == o.rebatch_max_bytes)
    if ours is not None and ours.outcome is not None:  # a rewrite of this very object gave nothing, or it was invalid
        same_target = o.codec == AUTO or ((ours.codec, ours.level) == (o.codec, o.level) and covers)
        if ours.log_etag == log.etag and (same_target or ours.outcome in (Outcome.INVALID, Outcome.UNREADABLE)):
            codec = f"{ours.codec} " if ours.codec is not None else ""
            return Action.SKIP, (f"{ours.outcome} last time ({codec}by run {ours.run_id}): not read "
                          "again until the .log or the target codec changes"), Cause.REMEMBERED
        ours = None
    if ours is not None and ours.log_etag != log.etag:
        etags = {FileRole.INDEX: ours.index_etag, FileRole.TIMEINDEX: ours.timeindex_etag}
        stale = [k for k in (FileRole.INDEX, FileRole.TIMEINDEX) if (r := refs[k]) and etags[k] == r.etag]
        if stale:
            return Action.REPAIR, (f"the .log was replaced after run {ours.run_id} compacted it (a mirroring tool?); "
                            f"our rebuilt {' and '.join(stale)} no longer match it and are removed"), None
        ours = None  # a new original: judged like any other segment
    if base == active:
        return (Action.SKIP, "active: the highest base offset of its partition (a broker may still append to it)",
                Cause.ACTIVE)
    archived = [f"the .{name} is {r.storage_class}" for name in (FileRole.LOG, FileRole.INDEX, FileRole.TIMEINDEX)
                if (r := refs[name]) is not None and r.storage_class in ARCHIVED_CLASSES]
    if archived:  # the .txnindex is never read or replaced
        return (Action.SKIP, f"archived: {' and '.join(archived)} (cannot be read or replaced without a restore)",
                Cause.ARCHIVED)
    youngest = max(r.last_modified for r in refs.values() if r is not None)
    # No grace, no age check; else an object is old enough once S3's clock says so, allowing for a store that
    # rounds LastModified up to the next second.
    if grace and now - youngest + CLOCK_ROUNDING < grace:
        minutes = max(0, int((now - youngest).total_seconds() // 60))
        return (Action.SKIP,
                f"too young: uploaded {minutes} min ago, within the {o.min_age_minutes}-minute grace period",
                Cause.TOO_YOUNG)
    if log.size == 0:
        return Action.SKIP, "empty: the .log holds no batches", Cause.EMPTY
    if log.size > MAX_SEGMENT_BYTES:
        return Action.SKIP, f"invalid: {log.size} bytes is beyond Kafka's 2 GiB segment limit", Cause.INVALID
    if ours is not None and o.codec == AUTO and ours.codec is not None:  # (key compaction records no codec)
        return (Action.SKIP, f"already compacted: {ours.codec} (chosen automatically) by run {ours.run_id}",
                Cause.ALREADY_COMPACTED)
    if ours is not None and ours.codec == o.codec and ours.level == o.level and covers:
        return Action.SKIP, f"already compacted: {o.codec} by run {ours.run_id}", Cause.ALREADY_COMPACTED
    return Action.COMPACT, "sealed", None


@dataclass(frozen=True, slots=True)
class Listed:
    """One partition directory's objects (in key order) and our state document of it."""

    directory: PartitionDir
    dir_key: str
    objects: list[ObjectInfo]
    state: PartitionState


def scan_partitions(store: ObjectStore, prefix: str, options: ScanOptions, emit: Callable[[list[PlannedSegment]], None],
                    *, source: Iterator[ObjectInfo] | None = None, progress: Callable[[int], None] | None = None
                    ) -> Plan:
    """Scan ``prefix`` one partition at a time, handing each partition's planned segments to ``emit``; the
    plan's settings and totals come back (its ``segments`` stay empty). Memory is bounded by a few
    partitions, not by the bucket. ``source``: the objects of an S3 Inventory report instead of a listing
    (see :func:`inventory_partitions`)."""
    root = normalize_prefix(prefix)
    now = store.now(clock_key(root))
    ignored_by_reason: Counter[str] = Counter()
    ignored_keys: list[dict[str, str]] = []
    skipped_dirs: list[dict[str, str]] = []

    def ignored(key: str, reason: str) -> None:
        ignored_by_reason[reason] += 1
        if len(ignored_keys) < MAX_IGNORED_LISTED:
            ignored_keys.append({"key": key, "reason": reason})

    def wanted(name: str) -> PartitionDir | None:
        d = parse_dir(name)
        if d.kind is DirKind.RESERVED:
            return None
        reason = _dir_skip_reason(d, options)
        if reason is not None:
            skipped_dirs.append({"directory": d.name, "reason": reason})
            return None
        return d

    if source is None:
        partitions: Iterable[Listed] = _listed_partitions(store, root, options, wanted)
    else:
        partitions = inventory_partitions(store, root, source, wanted, ignored)
    listed = 0
    committed = CommittedTally()
    for part in partitions:
        listed += len(part.objects)
        emit(classify_partition(part.directory, part.dir_key, part.objects, part.state, now, options, ignored,
                                committed.add))
        if progress is not None:
            progress(listed)
    return Plan(store.bucket, root, options.codec, options.level, options.min_age_minutes, options.topics,
                now.isoformat(), skipped_dirs=tuple(sorted(skipped_dirs, key=lambda d: d["directory"])),
                ignored_keys=tuple(ignored_keys), ignored_count=ignored_by_reason.total(),
                ignored_by_reason=dict(ignored_by_reason), objects_listed=listed, committed=committed.totals())


class CommittedTally:
    """Every generation in a scan's partitions, by run and the storage class of the ``.log`` in place: the
    entry in place and its lineage below, each generation once."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], tuple[int, int, int, str | None]] = {}

    def add(self, entry: SegmentState, log: ObjectInfo) -> None:
        for g in entry.lineage():
            n, before, after, at = self._by.get((g.run_id, log.storage_class), (0, 0, 0, None))
            latest = at if g.recorded_at is None or (at is not None and at >= g.recorded_at) else g.recorded_at
            self._by[(g.run_id, log.storage_class)] = (n + 1, before + g.bytes_before, after + g.bytes_after, latest)

    def totals(self) -> tuple[Committed, ...]:
        return tuple(Committed(run, cls, *figures) for (run, cls), figures in sorted(self._by.items()))


def scan(store: ObjectStore, prefix: str, options: ScanOptions, progress: Callable[[int], None] | None = None,
         *, source: Iterator[ObjectInfo] | None = None) -> Plan:
    """The whole plan in memory (for a CLI run or a test); :func:`scan_partitions` streams it."""
    segments: list[PlannedSegment] = []
    plan = scan_partitions(store, prefix, options, segments.extend, source=source, progress=progress)
    return replace(plan, segments=tuple(segments))


def _listed_partitions(store: ObjectStore, root: str, options: ScanOptions,
                       wanted: Callable[[str], PartitionDir | None]) -> Iterator[Listed]:
    """Partition directories listed in parallel (``options.workers`` at once), yielded in name order; at
    most twice as many listings are held as there are workers."""
    names = [d for p in store.list_dirs(root + "/" if root else "")
             if (d := wanted(p[len(root) + 1 if root else 0 :].rstrip("/"))) is not None]

    def one(d: PartitionDir) -> Listed:
        key = partition_prefix(root, d.name)
        return Listed(d, key, list(store.list(key)), load_state(store, root, d.name))

    with ThreadPoolExecutor(max_workers=options.workers, thread_name_prefix="scan") as pool:
        window: deque[Future[Listed]] = deque()
        todo = iter(names)
        for d in itertools.islice(todo, 2 * options.workers):
            window.append(pool.submit(one, d))
        while window:
            yield window.popleft().result()
            for d in itertools.islice(todo, 1):
                window.append(pool.submit(one, d))


def inventory_partitions(store: ObjectStore, root: str, objects: Iterator[ObjectInfo],
                         wanted: Callable[[str], PartitionDir | None], ignored: Callable[[str, str], None],
                         *, shards: int = INVENTORY_SHARDS) -> Iterator[Listed]:
    """Partitions from an inventory's objects, which come in no promised order (:func:`spill_grouped` by
    their directory: memory holds one shard). Our state documents are read only for partitions the inventory
    shows one for (an inventory is stale: a segment compacted since is planned again, and its changed ETag
    stops it)."""
    base = root + "/" if root else ""
    state_dir = reserved_dir(root, STATE_DIR)
    with_state: set[str] = set()
    decided: dict[str, PartitionDir | None] = {}

    def directory(info: ObjectInfo) -> str | None:
        if not info.key.startswith(base):
            return None
        if info.key.startswith(state_dir):
            with_state.add(info.key[len(state_dir):].removesuffix(".json"))
            return None
        name, slash, _ = info.key[len(base):].partition("/")
        if not slash:
            return None  # an object directly under PREFIX, not in a directory: not listed either
        if name not in decided:
            decided[name] = wanted(name)
        if decided[name] is None:
            return None
        if any(c in info.key for c in "\t\n\r"):
            ignored(info.key, NOT_KAFKA)
            return None
        return name

    for name, found in spill_grouped(objects, directory, shards=shards):
        d = decided[name]
        assert d is not None
        state = load_state(store, root, name) if name in with_state else PartitionState()
        yield Listed(d, partition_prefix(root, name), found, state)
