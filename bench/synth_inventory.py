"""Synthetic S3 Inventory reports in AWS's CSV format, for the tests and the benchmark of
:mod:`tiering.plan.inventory`.

    .venv/bin/python bench/synth_inventory.py --segments 1000000   # write and read back, in moto

:func:`write_inventory` writes what S3 writes (see :mod:`tiering.plan.inventory` for the format and its
sources): gzip-compressed CSV data files without a header row, every field double-quoted, keys
URL-encoded with a space as "+", ETags unquoted, times as ``2018-07-18T19:17:48.000Z``; then
``manifest.json`` listing them with their sizes and MD5s, and ``manifest.checksum`` (the MD5 of the
manifest). Keys, under ``dest_prefix`` (AWS's ``DEST-PREFIX/SOURCE-BUCKET/CONFIG-ID``)::

    DEST_PREFIX/YYYY-MM-DDTHH-MMZ/manifest.json, manifest.checksum
    DEST_PREFIX/data/<uuid>.csv.gz

Rows stream through: one data file at a time is built in a temporary file, then uploaded.
:func:`kafka_layout_rows` generates the objects of a Kafka ``logdir`` (seeded, as a generator).

As a script: writes an inventory of ``--segments`` segments (four objects each) to moto in this process,
reads it back with :func:`tiering.plan.inventory.iter_inventory`, and prints the time of each step and the
process's peak RSS (moto's copy of the report included: it keeps objects in this process's memory).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import itertools
import json
import os
import random
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import BinaryIO, Final
from urllib.parse import quote_plus

from moto import mock_aws

from tiering.plan.inventory import iter_inventory, read_manifest
from tiering.storage.store import ObjectInfo, S3Store, make_client

MANIFEST_VERSION: Final = "2016-11-30"
COLUMNS: Final = ("Bucket", "Key", "Size", "LastModifiedDate", "ETag", "StorageClass")
VERSIONED_COLUMNS: Final = ("Bucket", "Key", "VersionId", "IsLatest", "IsDeleteMarker", "Size", "LastModifiedDate",
                            "ETag", "StorageClass")
SEGMENT_FILES: Final = (".log", ".index", ".timeindex", ".snapshot")
GIB: Final = 1 << 30
_NAMESPACE: Final = uuid.UUID("6f1c3e2a-8d0b-4c55-9a51-3f0e7a2b9c10")  # data file names: uuid5 under this


@dataclass(frozen=True, slots=True)
class Version:
    """One row of an all-versions inventory: an object version, maybe not the latest, maybe a delete marker
    (whose size, ETag and storage class S3 leaves empty)."""

    info: ObjectInfo
    version_id: str
    is_latest: bool = True
    delete_marker: bool = False


def write_inventory(store: S3Store, source_bucket: str, dest_prefix: str, rows: Iterable[ObjectInfo | Version], *,
                    rows_per_file: int = 250_000, versioned: bool = False,
                    created_at: datetime | None = None) -> str:
    """Write ``rows`` as an inventory of ``source_bucket`` into ``store``'s bucket under ``dest_prefix``;
    returns the manifest's ``s3://`` URI. ``versioned``: an all-versions inventory (an :class:`ObjectInfo`
    row is then the latest version, a :class:`Version` says otherwise). ``created_at`` (default: now) is
    the manifest's creation time and names its directory."""
    if rows_per_file < 1:
        raise ValueError("rows_per_file must be positive")
    created = (created_at or datetime.now(UTC)).astimezone(UTC)
    base = dest_prefix.strip("/")
    columns = VERSIONED_COLUMNS if versioned else COLUMNS
    it = iter(rows)
    files: list[dict[str, object]] = []
    for number in itertools.count():
        chunk = itertools.islice(it, rows_per_file)
        with tempfile.TemporaryFile() as tmp:
            written = _write_csv_gz(tmp, source_bucket, chunk, versioned)
            if not written:
                break
            name = uuid.uuid5(_NAMESPACE, f"{base}/{created.isoformat()}/{number}")
            key = f"{base}/data/{name}.csv.gz"
            size, md5 = _md5(tmp)
            tmp.seek(0)
            store.upload(key, tmp)
            files.append({"key": key, "size": size, "MD5checksum": md5})
    manifest = {
        "sourceBucket": source_bucket,
        "destinationBucket": f"arn:aws:s3:::{store.bucket}",
        "version": MANIFEST_VERSION,
        "creationTimestamp": str(int(created.timestamp() * 1000)),
        "fileFormat": "CSV",
        "fileSchema": ", ".join(columns),
        "files": files,
    }
    data = json.dumps(manifest, indent=2, separators=(",", " : ")).encode()
    directory = f"{base}/{created.strftime('%Y-%m-%dT%H-%MZ')}"
    store.put(f"{directory}/manifest.json", data)
    store.put(f"{directory}/manifest.checksum", hashlib.md5(data, usedforsecurity=False).hexdigest().encode())
    return f"s3://{store.bucket}/{directory}/manifest.json"


def _write_csv_gz(out: BinaryIO, source_bucket: str, rows: Iterable[ObjectInfo | Version], versioned: bool) -> int:
    """Rows as gzip CSV into ``out``; how many were written."""
    count = 0
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as zipped, \
            io.TextIOWrapper(zipped, encoding="utf-8", newline="") as text:
        writer = csv.writer(text, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for row in rows:
            writer.writerow(_fields(source_bucket, row, versioned))
            count += 1
    return count


def _fields(source_bucket: str, row: ObjectInfo | Version, versioned: bool) -> list[str]:
    if isinstance(row, ObjectInfo):
        row = Version(row, _version_id(row))
    elif not versioned:
        raise ValueError("a Version row in an inventory of current versions only")
    info = row.info
    key = quote_plus(info.key, safe="/")
    modified = info.last_modified.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + \
        f"{info.last_modified.microsecond // 1000:03d}Z"
    if row.delete_marker:
        size, etag, storage_class = "", "", ""
    else:
        size, etag, storage_class = str(info.size), info.etag.strip('"'), info.storage_class
    if not versioned:
        return [source_bucket, key, size, modified, etag, storage_class]
    return [source_bucket, key, row.version_id, _bool(row.is_latest), _bool(row.delete_marker), size, modified, etag,
            storage_class]


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _version_id(info: ObjectInfo) -> str:
    return hashlib.sha256(f"{info.key}\0{info.etag}".encode()).hexdigest()[:32]


def _md5(f: BinaryIO) -> tuple[int, str]:
    f.seek(0)
    md5, size = hashlib.md5(usedforsecurity=False), 0
    while chunk := f.read(1 << 20):
        md5.update(chunk)
        size += len(chunk)
    return size, md5.hexdigest()


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
