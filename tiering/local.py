"""Segment files on a local disk: verify, rewrite and re-index them (what the CLI's ``segment`` verbs run).

Outputs are published the way a broker would want to find them: every new file is written to a hidden
temporary name in the output directory and flushed first; then any index of an older generation is
removed, the new ``.log`` is renamed into place, and the new indexes last. A crash at any step leaves
either no ``.log`` of ours, or a new ``.log`` with no index (a broker rebuilds a MISSING index), never a
new ``.log`` beside an old index (a broker trusts a present one). A failed rewrite leaves nothing.
A ``.txnindex`` beside the source is copied as it is (recompression keeps every offset), before the log.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tiering.errors import ConfigError
from tiering.kafka.codecs import DEFAULT_DECOMPRESSION_LIMIT
from tiering.kafka.files import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SNAPSHOT_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    parse_segment_name,
    segment_name,
)
from tiering.kafka.index import DEFAULT_INDEX_INTERVAL_BYTES, AbortedTxn, Indexes, build_indexes, parse_txn_index
from tiering.kafka.keycompact import CleanOptions, CleanStats, PartitionFacts, Segment, clean, survey
from tiering.kafka.merge import Limits, Sizes, merge, merge_runs, next_offset
from tiering.kafka.merge import Source as MergeSource
from tiering.kafka.rebatch import RebatchOptions
from tiering.kafka.rewrite import RewriteOptions, RewriteResult, rewrite_segment
from tiering.kafka.segment import SegmentSummary, check_indexes, verify_segment

READ_BUFFER_BYTES = 1 << 20


def base_offset_of(path: Path, override: int | None = None) -> int:
    """The segment's base offset: ``override`` if given, else the 20-digit number of its file name."""
    if override is not None:
        if override < 0:
            raise ConfigError("base offset must not be negative", path=str(path), expected=">= 0", found=override)
        return override
    parsed = parse_segment_name(path.name)
    if parsed is None or parsed[1] != LOG_SUFFIX:
        raise ConfigError("cannot tell the segment's base offset from its file name (pass --base-offset)",
                          path=str(path), expected="<20-digit base offset>.log", found=path.name)
    return parsed[0]


@contextlib.contextmanager
def open_segment(path: Path) -> Iterator[BinaryIO]:
    """Open a segment for buffered reading, turning a missing or unreadable file into a usage error."""
    with open_segment_file(path) as f:
        yield f


def open_segment_file(path: Path) -> BinaryIO:
    """:func:`open_segment` without the context manager (the caller closes the file)."""
    try:
        return path.open("rb", buffering=READ_BUFFER_BYTES)
    except OSError as e:
        raise ConfigError(f"cannot open the segment: {e.strerror}", path=str(path)) from None


def _read_optional(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def verify_file(path: Path, *, indexes: bool = False, base_offset: int | None = None,
                index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
                decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> SegmentSummary:
    """Verify a ``.log`` (headers, CRCs, every record, offsets, digests) and optionally its indexes.

    Raises an :class:`~tiering.errors.InvalidDataError` at the first problem of the log. Index problems
    are collected in the summary (``valid`` is false when there is any).
    """
    base = base_offset_of(path, base_offset)
    with open_segment(path) as f:
        summary = verify_segment(f, path=str(path), segment_base=base, limit=decompression_limit,
                                 keep_batches=indexes)
    if indexes:
        check_indexes(summary, base, _read_optional(path.with_suffix(INDEX_SUFFIX)),
                      _read_optional(path.with_suffix(TIME_INDEX_SUFFIX)), index_interval_bytes)
    return summary


@dataclass(frozen=True, slots=True)
class Written:
    """Where a command put its outputs."""

    log: Path | None
    index: Path
    time_index: Path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and a.samefile(b)
    except OSError:
        return False


def _temp_in(directory: Path, name: str) -> tuple[BinaryIO, Path]:
    """A new hidden file beside its final name, created with the usual 0666 & ~umask permissions."""
    tmp = directory / f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    return os.fdopen(fd, "wb"), tmp


def _write_temp(directory: Path, name: str, data: bytes) -> Path:
    f, tmp = _temp_in(directory, name)
    try:
        with f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _publish(out_dir: Path, base: int, log_tmp: Path | None, indexes: Indexes) -> Written:
    """Rename the new generation into place in the order the module docstring explains."""
    index = out_dir / segment_name(base, INDEX_SUFFIX)
    time_index = out_dir / segment_name(base, TIME_INDEX_SUFFIX)
    temps: list[Path] = []
    try:
        temps.append(_write_temp(out_dir, index.name, indexes.offset_index))
        temps.append(_write_temp(out_dir, time_index.name, indexes.time_index))
        log = None
        if log_tmp is not None:
            log = out_dir / segment_name(base, LOG_SUFFIX)
            index.unlink(missing_ok=True)
            time_index.unlink(missing_ok=True)
            log_tmp.replace(log)
        temps[0].replace(index)
        temps[1].replace(time_index)
        _fsync_dir(out_dir)
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
    return Written(log, index, time_index)


def _fsync_dir(directory: Path) -> None:
    """Make the renames durable (a directory's entries are flushed with the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the output directory: {e.strerror}", path=str(out_dir)) from None


def rewrite_file(path: Path, out_dir: Path, options: RewriteOptions, *, base_offset: int | None = None,
                 progress: Callable[[int], None] | None = None,
                 rebatch: RebatchOptions | None = None) -> tuple[RewriteResult, Written]:
    """Rewrite ``path`` into ``out_dir/<base>.log`` with rebuilt ``.index`` and ``.timeindex``.

    With ``rebatch``, runs of small batches are merged on the way in (:mod:`tiering.kafka.rebatch`), then
    the rest is recompressed; the output's records digest must equal the source's (a :class:`ProofError`
    otherwise), and ``result.rebatch`` says what was merged.
    On any error nothing is left in ``out_dir`` (the partial output was a temporary file).
    """
    base = base_offset_of(path, base_offset)
    target = out_dir / segment_name(base, LOG_SUFFIX)
    if _same_file(path, target):
        raise ConfigError("the output would overwrite the input segment; choose another --out directory",
                          path=str(path), expected="a different directory", found=str(out_dir))
    with open_segment(path) as src:
        _prepare_out_dir(out_dir)
        size = os.fstat(src.fileno()).st_size
        dst, tmp = _temp_in(out_dir, target.name)
        try:
            with dst:
                result = rewrite_segment(src, dst, base_offset=base, options=options, path=str(path), size=size,
                                         progress=progress, rebatch=rebatch)
                dst.flush()
                os.fsync(dst.fileno())
            # The .txnindex is valid for both generations (same offsets), so it goes first.
            _copy_txn_index(path, out_dir / segment_name(base, TXN_INDEX_SUFFIX))
            written = _publish(out_dir, base, tmp, result.indexes)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return result, written


def _copy_txn_index(log: Path, target: Path) -> None:
    """Recompression keeps every offset, so the aborted-transaction index stays valid: carry it along."""
    source = log.with_suffix(TXN_INDEX_SUFFIX)
    if source.exists():
        tmp = _write_temp(target.parent, target.name, source.read_bytes())
        tmp.replace(target)


def reindex_file(path: Path, out_dir: Path, *, base_offset: int | None = None,
                 index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES,
                 decompression_limit: int = DEFAULT_DECOMPRESSION_LIMIT) -> tuple[SegmentSummary, Written]:
    """Rebuild ``.index`` and ``.timeindex`` of a valid ``.log`` into ``out_dir`` (as ``LogSegment.recover``)."""
    base = base_offset_of(path, base_offset)
    if index_interval_bytes < 0:
        raise ConfigError("index interval must not be negative", expected=">= 0", found=index_interval_bytes)
    with open_segment(path) as f:
        summary = verify_segment(f, path=str(path), segment_base=base, digests=False, limit=decompression_limit)
    _prepare_out_dir(out_dir)
    indexes = build_indexes(base, summary.batches, index_interval_bytes)
    return summary, _publish(out_dir, base, None, indexes)


@dataclass(frozen=True, slots=True)
class KeyCompacted:
    """What :func:`compact_keys_dir` did: the pass's facts and figures, and the segments it cleaned."""

    facts: PartitionFacts
    stats: CleanStats
    cleaned: tuple[int, ...]  # base offsets
    copied: tuple[str, ...]  # the other files of the partition, copied as they were
    merged: tuple[tuple[int, ...], ...] = ()  # each segment cleaned from several: the base offsets it replaced


def _partition_io(directory: Path, out_dir: Path) -> list[Path]:
    """Check a partition directory and a new output directory for it; the partition's ``.log`` files in
    offset order. A directory with a broker's unfinished cleaning or swap (``.cleaned``, ``.swap``) is
    refused: a broker would finish that operation over our files."""
    if not directory.is_dir():
        raise ConfigError("not a partition directory", path=str(directory), expected="a directory of segments")
    if _same_file(directory, out_dir):
        raise ConfigError("the output would overwrite the partition; choose another --out directory",
                          path=str(directory), found=str(out_dir))
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError("the output directory must be new or empty", path=str(out_dir),
                          expected="no files", found="files")
    unfinished = sorted(p.name for p in directory.iterdir() if p.suffix in (".cleaned", ".swap"))
    if unfinished:
        raise ConfigError("the partition holds a broker's unfinished cleaning or swap (start and stop the broker "
                          "once to finish it)", path=str(directory / unfinished[0]))
    return sorted(p for p in directory.glob(f"*{LOG_SUFFIX}") if parse_segment_name(p.name) is not None)


def _aborted(log: Path) -> tuple[AbortedTxn, ...]:
    txn = log.with_suffix(TXN_INDEX_SUFFIX)
    return tuple(parse_txn_index(txn.read_bytes(), path=str(txn))) if txn.exists() else ()


def _segment_files(work: Path, base: int, indexes: Indexes, txn_index: bytes) -> set[str]:
    """A new segment's indexes (and ``.txnindex`` when it has entries) beside its ``.log`` in ``work``; the
    names of its four files."""
    for suffix, data in ((INDEX_SUFFIX, indexes.offset_index), (TIME_INDEX_SUFFIX, indexes.time_index),
                         (TXN_INDEX_SUFFIX, txn_index)):
        if data or suffix != TXN_INDEX_SUFFIX:
            (work / segment_name(base, suffix)).write_bytes(data)
    return {segment_name(base, sfx) for sfx in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)}


@contextlib.contextmanager
def _new_partition(directory: Path, out_dir: Path, done: set[str]) -> Iterator[Path]:
    """A work directory beside ``out_dir`` to write the new files into; afterwards every other file of the
    partition not named in ``done`` (filled in by the caller) is copied as it was, everything is flushed and
    the work directory renamed to ``out_dir``: all or nothing (removed on any error)."""
    _prepare_out_dir(out_dir.parent)
    work = out_dir.parent / f".{out_dir.name}.{secrets.token_hex(6)}.tmp"
    work.mkdir()
    try:
        yield work
        for path in sorted(directory.iterdir()):
            if path.is_file() and path.name not in done:
                shutil.copyfile(path, work / path.name)
        for path in work.iterdir():
            with open(path, "rb+") as f:
                os.fsync(f.fileno())
        _fsync_dir(work)
        if out_dir.exists():
            out_dir.rmdir()
        work.rename(out_dir)
        _fsync_dir(out_dir.parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def compact_keys_dir(directory: Path, out_dir: Path, options: CleanOptions) -> KeyCompacted:
    """One pass of Kafka's log cleaner (:mod:`tiering.kafka.keycompact`) over a partition directory, written to
    ``out_dir`` as a whole partition directory: the cleaned segments (``.log``, rebuilt ``.index``,
    ``.timeindex``, and ``.txnindex`` when it keeps aborted transactions; with ``options.merge``, neighbours
    cleaned into one as the broker groups them), then every other file (the uncleaned segments, the producer
    snapshots but those of merged-away segments, the checkpoints) copied as it was. The source is only read.
    All or nothing, into a new or empty ``out_dir`` (:func:`_partition_io`)."""
    logs = _partition_io(directory, out_dir)
    segments = [Segment(base_offset_of(log, None), functools.partial(open_segment_file, log), _aborted(log), str(log),
                        log.stat().st_size, _size(log.with_suffix(INDEX_SUFFIX)),
                        _size(log.with_suffix(TIME_INDEX_SUFFIX))) for log in logs]
    stats = CleanStats()
    facts = survey(segments, options)
    written: set[str] = set()
    groups = []
    with _new_partition(directory, out_dir, written) as work:
        for seg in clean(segments, facts, options, stats,
                         sink=lambda base: open(work / segment_name(base, LOG_SUFFIX), "wb")):  # noqa: SIM115
            written |= _segment_files(work, seg.base_offset, seg.indexes, seg.txn_index)
            written |= _replaced(seg.sources[1:])
            _as_of(work / segment_name(seg.base_offset, LOG_SUFFIX), directory, seg.sources[-1])
            groups.append(seg.sources)
    copied = tuple(sorted(p.name for p in directory.iterdir() if p.is_file() and p.name not in written))
    return KeyCompacted(facts, stats, tuple(s.base_offset for s in segments[:facts.cleaned]), copied,
                        tuple(g for g in groups if len(g) > 1))


def _replaced(bases: Iterable[int]) -> set[str]:
    """The files of segments merged into a neighbour: not carried over (their producer snapshots neither: the
    broker's cleaner deletes those when it merges)."""
    return {segment_name(base, sfx) for base in bases
            for sfx in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, SNAPSHOT_SUFFIX)}


def _as_of(log: Path, directory: Path, last: int) -> None:
    """A new ``.log`` takes the modification time of the last segment it replaces, as the broker's cleaner sets
    it: what retention falls back on for a segment without timestamps."""
    st = (directory / segment_name(last, LOG_SUFFIX)).stat()
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))


@dataclass(frozen=True, slots=True)
class MergedDir:
    """What :func:`merge_dir` did: each merged segment's base offset with the base offsets it replaced."""

    groups: tuple[tuple[int, ...], ...]
    segments_before: int
    segments_after: int
    files_before: int
    files_after: int


def merge_dir(directory: Path, out_dir: Path, limits: Limits) -> MergedDir:
    """Runs of small neighbouring sealed segments of a partition directory merged into segments up to
    ``limits`` (:func:`tiering.kafka.merge.merge_runs`), written to ``out_dir`` as a whole partition
    directory: the merged segments, then every other file copied as it was, except the producer snapshots
    named by a merged-away base offset (a broker's cleaner removes those when it merges). The active segment
    (the highest base offset) is never merged, nor merged into; a run goes on only where a segment's base
    offset is the offset after its predecessor's last batch (a missing segment, an empty one, or a segment
    whose last records a cleaner removed ends it). The source is only read. All or nothing, into a new or
    empty ``out_dir``."""
    logs = _partition_io(directory, out_dir)
    sealed = logs[:-1]
    sizes, next_offsets = [], {}
    for log in sealed:
        base = base_offset_of(log, None)
        sizes.append(Sizes(base, log.stat().st_size, _size(log.with_suffix(INDEX_SUFFIX)),
                           _size(log.with_suffix(TIME_INDEX_SUFFIX))))
        with open_segment(log) as f:
            next_offsets[base] = next_offset(f, path=str(log))
    end = base_offset_of(logs[-1], None) if logs else 0
    groups = merge_runs(sizes, limits, end, lambda a, b: next_offsets[a.base_offset] == b.base_offset)
    written: set[str] = set()
    with _new_partition(directory, out_dir, written) as work:
        for group in groups:
            sources = [MergeSource(s.base_offset, functools.partial(open_segment_file, p), _aborted(p), str(p))
                       for s in group for p in [directory / segment_name(s.base_offset, LOG_SUFFIX)]]
            target = work / segment_name(group[0].base_offset, LOG_SUFFIX)
            with open(target, "wb") as out:
                merged = merge(sources, out)
            _as_of(target, directory, group[-1].base_offset)
            written |= _segment_files(work, merged.base_offset, merged.indexes, merged.txn_index)
            written |= _replaced(s.base_offset for s in group[1:])
    files_before = sum(1 for p in directory.iterdir() if p.is_file())
    return MergedDir(tuple(tuple(s.base_offset for s in g) for g in groups), len(logs),
                     len(logs) - sum(len(g) - 1 for g in groups), files_before,
                     sum(1 for p in out_dir.iterdir() if p.is_file()))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
