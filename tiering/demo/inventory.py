"""S3 Inventory reports in AWS's CSV format, written as S3 writes them: what the demo plans from (and the
tests and benchmarks of :mod:`tiering.plan.inventory` read).

:func:`write_inventory` writes gzip-compressed CSV data files without a header row, every field
double-quoted, keys URL-encoded with a space as "+", ETags unquoted, times as
``2018-07-18T19:17:48.000Z``; then ``manifest.json`` listing them with their sizes and MD5s, and
``manifest.checksum`` (the MD5 of the manifest). Keys, under ``dest_prefix`` (AWS's
``DEST-PREFIX/SOURCE-BUCKET/CONFIG-ID``)::

    DEST_PREFIX/YYYY-MM-DDTHH-MMZ/manifest.json, manifest.checksum
    DEST_PREFIX/data/<uuid>.csv.gz

Rows stream through: one data file at a time is built in a temporary file, then uploaded.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import itertools
import json
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import BinaryIO, Final
from urllib.parse import quote_plus

from tiering.storage.objects import ObjectInfo, ObjectStore

MANIFEST_VERSION: Final = "2016-11-30"
COLUMNS: Final = ("Bucket", "Key", "Size", "LastModifiedDate", "ETag", "StorageClass")
VERSIONED_COLUMNS: Final = ("Bucket", "Key", "VersionId", "IsLatest", "IsDeleteMarker", "Size", "LastModifiedDate",
                            "ETag", "StorageClass")
_NAMESPACE: Final = uuid.UUID("6f1c3e2a-8d0b-4c55-9a51-3f0e7a2b9c10")  # data file names: uuid5 under this


@dataclass(frozen=True, slots=True)
class Version:
    """One row of an all-versions inventory: an object version, maybe not the latest, maybe a delete marker
    (whose size, ETag and storage class S3 leaves empty)."""

    info: ObjectInfo
    version_id: str
    is_latest: bool = True
    delete_marker: bool = False


def write_inventory(store: ObjectStore, source_bucket: str, dest_prefix: str, rows: Iterable[ObjectInfo | Version], *,
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
