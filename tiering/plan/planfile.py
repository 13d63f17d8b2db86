"""A plan of any size: a manifest and chunk files of JSON Lines (gzip), written and read as streams.

    PREFIX/_tiering/runs/<run>/<name>/manifest.json           the plan's settings, totals and chunk list
    PREFIX/_tiering/runs/<run>/<name>/part-00000.jsonl.gz      one planned segment per line

A partition's segments are never split between chunks (one task takes one partition's lease and sees all
of that partition's work). A chunk is closed once it holds ``max_segments`` segments or ``max_bytes`` of
``.log`` bytes to compact, whichever comes first, so both the number of chunks and the work in each stay
bounded. Nothing here holds more than one chunk: a million segments cost the memory of a few thousand.
"""

from __future__ import annotations

import gzip
import heapq
import io
import itertools
import json
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from tiering.documents import check_document
from tiering.errors import ConfigError, InvalidDataError
from tiering.lifecycle.vocabulary import Action, Cause
from tiering.plan.document import PLAN_SCHEMA_VERSION, Plan, PlannedSegment, PlanTotals
from tiering.storage.layout import PlanName, plan_chunk_key, plan_chunk_name, plan_manifest_key
from tiering.storage.objects import ObjectStore

MANIFEST_KIND: Final = "tiering.plan-manifest"
DEFAULT_CHUNK_SEGMENTS: Final = 20_000
DEFAULT_CHUNK_BYTES: Final = 256 << 30  # .log bytes to compact per chunk, unless that makes too many chunks


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One chunk file: where it is and what it holds."""

    name: str
    key: str
    partitions: int
    segments: int
    to_compact: int  # segments to compact or repair
    bytes_to_compact: int
    first: str  # its first and last partition directory, in the chunk's order
    last: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "partitions": self.partitions, "segments": self.segments,
                "to_compact": self.to_compact, "bytes_to_compact": self.bytes_to_compact, "first": self.first,
                "last": self.last}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ChunkInfo:
        return cls(str(doc["name"]), str(doc["key"]), int(doc["partitions"]), int(doc["segments"]),
                   int(doc["to_compact"]), int(doc["bytes_to_compact"]), str(doc["first"]), str(doc["last"]))


@dataclass(frozen=True, slots=True)
class PlanManifest:
    """A chunked plan's document: the plan's settings (a :class:`Plan` without segments), its totals and
    its chunks. ``source`` says where the listing came from (``listing`` or the inventory's manifest URI)."""

    header: Plan
    totals: dict[str, Any]
    chunks: tuple[ChunkInfo, ...]
    source: str = "listing"

    def to_json(self) -> dict[str, Any]:
        head = self.header.to_json()
        head.pop("segments")
        return {**head, "schema_version": PLAN_SCHEMA_VERSION, "kind": MANIFEST_KIND, "totals": self.totals,
                "source": self.source, "chunks": [c.to_json() for c in self.chunks]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PlanManifest:
        check_document(doc, kind=MANIFEST_KIND, version=PLAN_SCHEMA_VERSION, what="a plan manifest")
        header = Plan.from_json({**doc, "kind": "tiering.plan", "segments": []})
        return cls(header, dict(doc["totals"]), tuple(ChunkInfo.from_json(c) for c in doc["chunks"]),
                   str(doc.get("source", "listing")))


class GzipLines:
    """JSON documents as a gzip stream of JSON Lines, compressed as they come: only the compressed bytes are
    held."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._zip = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 31: a gzip stream

    def add(self, docs: Iterable[Any]) -> None:
        lines = "".join(json.dumps(d, separators=(",", ":")) + "\n" for d in docs).encode()
        self._pieces.append(self._zip.compress(lines))

    def finish(self) -> bytes:
        """The whole gzip file (the writer is then spent)."""
        self._pieces.append(self._zip.flush())
        return b"".join(self._pieces)


def json_lines(stream: io.RawIOBase | io.BufferedIOBase | Any, where: str,
               keep: Callable[[bytes], bool] | None = None) -> Iterator[Any]:
    """The documents of a gzip JSON Lines file, one at a time (only the lines ``keep`` accepts, the others
    skipped unparsed); a damaged file raises :class:`InvalidDataError` naming it and the line."""
    done = 0
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as lines:
            for line in lines:
                doc = json.loads(line) if keep is None or keep(line) else None
                done += 1
                if doc is not None:
                    yield doc
    except (OSError, EOFError, ValueError) as e:
        raise InvalidDataError(f"plan chunk is damaged: {e}", path=where, found=f"line {done + 1}") from None


class ChunkWriter:
    """Collects whole partitions into gzip JSON Lines chunks and hands each finished chunk to ``put``
    (name, bytes) -> key. Holds one compressed chunk at a time."""

    def __init__(self, put: Callable[[str, bytes], str], *, max_segments: int = DEFAULT_CHUNK_SEGMENTS,
                 max_work: int | None = None, max_bytes: int | None = None) -> None:
        if min(max_segments, 1 if max_work is None else max_work, 1 if max_bytes is None else max_bytes) < 1:
            raise ConfigError("plan chunks must hold at least one segment and one byte", expected=">= 1",
                              found=f"{max_segments} segments, {max_work} to compact, {max_bytes} bytes")
        self._put = put
        self._limits = (max_segments, max_work, max_bytes)
        self.chunks: list[ChunkInfo] = []
        self.totals = PlanTotals()
        self._open()

    def _open(self) -> None:
        self._lines = GzipLines()
        self._partitions = self._segments = self._todo = self._bytes = 0
        self._first = self._last = ""

    def add(self, segments: Sequence[PlannedSegment]) -> None:
        """One partition's segments (all of them: they stay in one chunk)."""
        if not segments:
            return
        self._lines.add(s.to_json() for s in segments)
        for seg in segments:
            self.totals.add(seg)
        work = [s for s in segments if s.action in (Action.COMPACT, Action.REPAIR)]
        self._first = self._first or segments[0].directory
        self._last = segments[-1].directory
        self._partitions += 1
        self._segments += len(segments)
        self._todo += len(work)
        self._bytes += sum(s.size for s in work if s.action == Action.COMPACT)  # a repair rewrites nothing
        if self._load() >= 1:
            self._flush()

    def _load(self) -> float:
        """How full the chunk is: the sum of its fill by segments, by segments to compact and by their bytes.
        A chunk closes at 1, so a plan of load L (summed over its partitions) makes at most L + 1 chunks."""
        segments, work, size = self._limits
        return (self._segments / segments + (self._todo / work if work else 0.0)
                + (self._bytes / size if size else 0.0))

    @property
    def open_chunk(self) -> str:
        """The name of the chunk the next :meth:`add` goes into."""
        return plan_chunk_name(len(self.chunks))

    def _flush(self) -> None:
        if not self._segments:
            return
        name = self.open_chunk
        key = self._put(name, self._lines.finish())
        self.chunks.append(ChunkInfo(name, key, self._partitions, self._segments, self._todo, self._bytes,
                                     self._first, self._last))
        self._open()

    def close(self) -> tuple[ChunkInfo, ...]:
        self._flush()
        return tuple(self.chunks)


def chunk_limits(max_chunks: int, *, segments: int, work: int, work_bytes: int, min_work: int,
                 min_segments: int = DEFAULT_CHUNK_SEGMENTS, min_bytes: int = DEFAULT_CHUNK_BYTES) -> dict[str, int]:
    """A :class:`ChunkWriter`'s limits for a plan of ``segments`` segments, ``work`` of them to compact
    (``work_bytes`` bytes): the given minimums, raised where needed so that there are at most
    ``max_chunks`` chunks. Each of the three fills then sums to at most a third of ``max_chunks - 1``, so
    the plan's load is at most ``max_chunks - 1`` and it makes at most ``max_chunks`` chunks."""
    if max_chunks < 2:
        raise ConfigError("a plan needs room for at least two chunks", expected=">= 2", found=max_chunks)
    room = max_chunks - 1
    return {"max_segments": max(min_segments, -(-3 * segments // room)),
            "max_work": max(min_work, -(-3 * work // room)),
            "max_bytes": max(min_bytes, -(-3 * work_bytes // room))}


def read_chunk(stream: io.RawIOBase | io.BufferedIOBase | Any, where: str, start: int = 0,
               stop: int | None = None) -> Iterator[PlannedSegment]:
    """The segments of one chunk file (lines ``start`` to ``stop``, counted from 0), one line at a time; the
    lines before ``start`` are skipped unparsed. A damaged chunk raises :class:`InvalidDataError` naming the
    file and line."""
    done = 0
    try:
        with gzip.GzipFile(fileobj=stream, mode="rb") as lines:
            for line in lines:
                if stop is not None and done >= stop:
                    return
                if done >= start:
                    seg = PlannedSegment.from_json(json.loads(line))
                done += 1
                if done > start:
                    yield seg
    except (OSError, EOFError, ValueError, KeyError, TypeError) as e:
        raise InvalidDataError(f"plan chunk is damaged: {e}", path=where, found=f"line {done + 1}") from None


class ChunkedPlan:
    """A chunked plan on S3 under ``PREFIX/_tiering/runs/<run>/<name>/``."""

    def __init__(self, store: ObjectStore, prefix: str, run_id: str, name: PlanName) -> None:
        self.store = store
        self.prefix, self.run_id, self.name = prefix, run_id, name

    @property
    def manifest_key(self) -> str:
        return plan_manifest_key(self.prefix, self.run_id, self.name)

    def writer(self, *, max_segments: int = DEFAULT_CHUNK_SEGMENTS, max_work: int | None = None,
               max_bytes: int | None = None) -> ChunkWriter:
        def put(chunk: str, data: bytes) -> str:
            key = plan_chunk_key(self.prefix, self.run_id, self.name, chunk)
            self.store.put(key, data)
            return key

        return ChunkWriter(put, max_segments=max_segments, max_work=max_work, max_bytes=max_bytes)

    def write_manifest(self, manifest: PlanManifest) -> str:
        self.store.put_json(self.manifest_key, manifest.to_json())
        return self.manifest_key

    def manifest(self) -> PlanManifest:
        return PlanManifest.from_json(self.store.get_json(self.manifest_key)[0])

    def chunk(self, key: str, start: int = 0, stop: int | None = None) -> Iterator[PlannedSegment]:
        with self.store.open(key) as body:
            yield from read_chunk(body, f"s3://{self.store.bucket}/{key}", start, stop)

    def segments(self, manifest: PlanManifest | None = None) -> Iterator[PlannedSegment]:
        for info in (manifest or self.manifest()).chunks:
            yield from self.chunk(info.key)


def by_partition(segments: Iterable[PlannedSegment]) -> Iterator[list[PlannedSegment]]:
    """Consecutive segments of one partition directory, grouped (a chunk keeps partitions together)."""
    group: list[PlannedSegment] = []
    for seg in segments:
        if group and seg.directory != group[0].directory:
            yield group
            group = []
        group.append(seg)
    if group:
        yield group


class SizeTally:
    """Sizes of segments to compact: their count and bytes, and (``keep``) the sizes themselves, 8 bytes each,
    for a budget to choose from."""

    def __init__(self, *, keep: bool) -> None:
        self.count = self.bytes = 0
        self.sizes: array[int] | None = array("q") if keep else None

    def add(self, size: int) -> None:
        self.count += 1
        self.bytes += size
        if self.sizes is not None:
            self.sizes.append(size)


@dataclass(slots=True)
class Budget:
    """``--max-segments`` / ``--max-bytes`` over a plan read as a stream, with the choices of the whole
    plan's largest-first selection (which fills what is left of the bytes with smaller segments). A first
    pass tallies the sizes of the segments to compact (8 bytes each, only when there is a budget); the
    greedy walk over them, largest first (sorted in runs and merged: no more than the sizes in memory),
    finds the size above which every segment fits and, below it, how many of each size still fit; a second
    pass keeps, of each such size, that many in the plan's order (equal sizes: the plan's order decides).
    Repairs are never budgeted."""

    max_segments: int | None
    max_bytes: int | None
    _above: int = 0  # every segment larger than this fits
    _quota: dict[int, int] = field(default_factory=dict)  # size (at most _above) -> how many more fit
    _counted_out: int = -1  # sizes at most this are left out by --max-segments (else by --max-bytes)

    @property
    def limited(self) -> bool:
        return self.max_segments is not None or self.max_bytes is not None

    def tally(self) -> SizeTally:
        return SizeTally(keep=self.limited)

    def measure(self, tallies: Iterable[SizeTally]) -> tuple[int, int]:
        """Decide from the first pass's tallies; how many segments the budget keeps, and their bytes."""
        tallies = list(tallies)
        if not self.limited:
            return sum(t.count for t in tallies), sum(t.bytes for t in tallies)
        runs = []
        for t in tallies:
            assert t.sizes is not None
            for at in range(0, len(t.sizes), 1 << 16):
                runs.append(array("q", sorted(t.sizes[at : at + (1 << 16)], reverse=True)))
        chosen = total = 0
        partial = False
        for size, group in itertools.groupby(heapq.merge(*runs, reverse=True)):
            n = sum(1 for _ in group)
            take = n
            if self.max_segments is not None:
                take = min(take, max(0, self.max_segments - chosen))
            if self.max_bytes is not None:
                take = min(take, max(0, self.max_bytes - total) // size if size else take)
            chosen += take
            total += take * size
            if take < n and not partial:
                partial, self._above = True, size
            if partial and take:
                self._quota[size] = take
            if self.max_segments is not None and chosen >= self.max_segments and self._counted_out < 0:
                self._counted_out = size
        if not partial:
            self._above = -1  # everything fits
        return chosen, total

    def apply(self, seg: PlannedSegment) -> PlannedSegment:
        """The segment as the budget leaves it: unchanged, or skipped as over the budget."""
        if seg.action != Action.COMPACT or not self.limited or seg.size > self._above:
            return seg
        left = self._quota.get(seg.size, 0)
        if left > 0:
            self._quota[seg.size] = left - 1
            return seg
        which = "--max-segments" if seg.size <= self._counted_out else "--max-bytes"
        return replace(seg, action=Action.SKIP, reason=f"over the {which} budget", cause=Cause.BUDGET)
