"""Synthetic S3 Inventory reports of a Kafka ``logdir``, for the tests and the benchmark of
:mod:`tiering.plan.inventory` (written by :func:`tiering.demo.inventory.write_inventory`).

    .venv/bin/python bench/synth_inventory.py --segments 1000000   # write and read back, in moto

:func:`kafka_layout_rows` generates the objects of a Kafka ``logdir`` (seeded, as a generator);
:func:`kept_rows` the originals a run kept of them.

As a script: writes an inventory of ``--segments`` segments (four objects each) to moto in this process,
reads it back with :func:`tiering.plan.inventory.iter_inventory`, and prints the time of each step and the
process's peak RSS (moto's copy of the report included: it keeps objects in this process's memory).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Final

from moto import mock_aws

from tiering.demo.inventory import write_inventory
from tiering.plan.inventory import iter_inventory, read_manifest
from tiering.storage.objects import ObjectInfo
from tiering.storage.s3 import S3Store, make_client

SEGMENT_FILES: Final = (".log", ".index", ".timeindex", ".snapshot")
GIB: Final = 1 << 30


def kafka_layout_rows(partitions: int, segments_per_partition: int, *, prefix: str, now: datetime,
                      topic_count: int = 10, seed: int = 0) -> Iterator[ObjectInfo]:
    """The objects of a Kafka ``logdir`` under ``prefix``: ``partitions`` partitions spread over
    ``topic_count`` topics (``PREFIX/<topic>-<p>/``), each with ``segments_per_partition`` segments of four
    objects (``<20-digit base offset>.log``, ``.index``, ``.timeindex``, ``.snapshot``). Sizes as a broker
    with ``segment.bytes`` = 1 GiB leaves them (the last, active segment smaller), ETags MD5-like, each
    segment an hour or more older than the next, the newest at least an hour older than ``now``. Generated
    one object at a time from ``seed``: nothing is held."""
    rng = random.Random(seed)
    root = prefix.strip("/")
    for number in range(partitions):
        topic = f"events-{number % topic_count:03d}"
        directory = f"{root}/{topic}-{number // topic_count}" if root else f"{topic}-{number // topic_count}"
        base = 0
        for segment in range(segments_per_partition):
            active = segment == segments_per_partition - 1
            log = rng.randrange(GIB // 8, GIB // 2) if active else GIB - rng.randrange(0, 4 << 20)
            records = log // rng.randrange(200, 2000)
            modified = now - timedelta(hours=segments_per_partition - segment, minutes=rng.randrange(60))
            sizes = (log, log // 4096 * 8, log // 4096 * 12, rng.randrange(10, 4096))
            for suffix, size in zip(SEGMENT_FILES, sizes, strict=True):
                yield ObjectInfo(f"{directory}/{base:020d}{suffix}", size, f'"{rng.getrandbits(128):032x}"',
                                 modified.replace(microsecond=0) + timedelta(seconds=rng.randrange(5)))
            base += records


def kept_rows(partitions: int, segments_per_partition: int, *, prefix: str, now: datetime, run_id: str = "compacted",
              seed: int = 0) -> Iterator[ObjectInfo]:
    """The originals a run ``run_id`` kept a month before ``now`` of every segment :func:`kafka_layout_rows`
    generates (with the same arguments): its ``.log``, ``.index`` and ``.timeindex`` under
    ``PREFIX/_tiering/backup/<run>/<topic>-<p>/``, what a cleanup finds past its grace period."""
    root = prefix.strip("/")
    kept = f"{root}/_tiering/backup/{run_id}/" if root else f"_tiering/backup/{run_id}/"
    for info in kafka_layout_rows(partitions, segments_per_partition, prefix=prefix, now=now, seed=seed):
        if not info.key.endswith(".snapshot"):
            below = info.key[len(root) + 1:] if root else info.key
            yield ObjectInfo(kept + below, info.size, info.etag, now - timedelta(days=30))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--segments", type=int, default=1_000_000, help="segments in all (4 objects each)")
    parser.add_argument("--per-partition", type=int, default=100, help="segments per partition")
    parser.add_argument("--rows-per-file", type=int, default=250_000)
    args = parser.parse_args(argv)
    for name, value in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench")):
        os.environ.setdefault(name, value)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    partitions = max(1, args.segments // args.per_partition)
    with mock_aws():
        client = make_client(region="us-east-1")
        client.create_bucket(Bucket="inventory")
        store = S3Store(client, "inventory")
        start = time.perf_counter()
        rows = kafka_layout_rows(partitions, args.per_partition, prefix="logs", now=now)
        uri = write_inventory(store, "segments", "inv/segments/daily", rows, rows_per_file=args.rows_per_file,
                              created_at=now)
        wrote = time.perf_counter() - start
        write_peak = _status_mib("VmHWM")
        before = _status_mib("VmRSS")
        reset = _reset_peak()
        start = time.perf_counter()
        manifest = read_manifest(store, uri)
        count = sum(1 for _ in iter_inventory(store, manifest, "logs/"))
        read = time.perf_counter() - start
        read_peak = _status_mib("VmHWM")
    compressed = sum(f.size for f in manifest.files) / (1 << 20)
    print(f"{partitions * args.per_partition:,} segments, {count:,} objects in {len(manifest.files)} files "
          f"({compressed:.1f} MiB gzip)")
    print(f"write {wrote:.1f} s (peak RSS {write_peak:.0f} MiB), read {read:.1f} s ({count / read:,.0f} objects/s)")
    if reset:
        print(f"reading: RSS {before:.0f} MiB before (moto holds the report), peak {read_peak:.0f} MiB "
              f"(+{read_peak - before:.0f} MiB)")
    return 0


def _status_mib(field: str) -> float:
    """A figure of /proc/self/status (VmRSS, VmHWM) in MiB; ru_maxrss where there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _reset_peak() -> bool:
    """Reset the resident high-water mark (Linux: 5 to /proc/self/clear_refs); False where that cannot be."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
