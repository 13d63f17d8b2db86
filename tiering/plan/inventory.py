"""S3 Inventory: plan from the report S3 writes daily or weekly instead of listing a huge bucket.

What S3 writes to the destination bucket (AWS S3 User Guide, "Locating your inventory list",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/storage-inventory-location.html)::

    DEST-PREFIX/SOURCE-BUCKET/CONFIG-ID/YYYY-MM-DDTHH-MMZ/manifest.json   what this module reads first
    DEST-PREFIX/SOURCE-BUCKET/CONFIG-ID/YYYY-MM-DDTHH-MMZ/manifest.checksum   MD5 of manifest.json
    DEST-PREFIX/SOURCE-BUCKET/CONFIG-ID/data/<uuid>.csv.gz   the data files the manifest lists

``manifest.json``, as in AWS's CSV example (checked by :meth:`InventoryManifest.from_json`):

| field             | example                                       | checked                                  |
|-------------------|-----------------------------------------------|------------------------------------------|
| sourceBucket      | "example-source-bucket"                       | a non-empty string                       |
| destinationBucket | "arn:aws:s3:::example-inventory-destination…" | an S3 bucket ARN (a bare name is taken)  |
| version           | "2016-11-30"                                  | a string                                 |
| creationTimestamp | "1514944800000" (ms since the epoch, a string)| digits, if present                       |
| fileFormat        | "CSV" (or "ORC", "Parquet")                   | a string; only CSV can be read here      |
| fileSchema        | "Bucket, Key, Size, LastModifiedDate, ETag…"  | CSV: comma-separated column names, unique|
| files             | [{"key", "size", "MD5checksum"}]              | key a string, size >= 0, MD5 32 hex      |

A CSV data file is gzip-compressed, has no header row, and has the manifest's columns in its order
(AWS S3 User Guide, "Amazon S3 inventory list",
https://docs.aws.amazon.com/AmazonS3/latest/userguide/storage-inventory.html). The columns used here:

| column           | what S3 writes                                        | what we make of it                    |
|------------------|-------------------------------------------------------|---------------------------------------|
| Bucket           | the source bucket                                     | rows of another bucket are skipped    |
| Key              | URL-encoded, a space as "+" (form encoding)           | ``unquote_plus``, UTF-8, strict       |
| VersionId        | only in an all-versions inventory                     | not used                              |
| IsLatest         | "true"/"false", only in an all-versions inventory     | only current versions kept            |
| IsDeleteMarker   | "true"/"false", only in an all-versions inventory     | delete markers skipped                |
| Size             | bytes; empty for a delete marker                      | rows with an empty Size skipped       |
| LastModifiedDate | ISO 8601 in UTC, "2018-07-18T19:17:48.000Z"          | a timezone-aware datetime (UTC)       |
| ETag             | unquoted ("a62ca3…", "…-12" for a multipart upload)   | quoted, as ListObjectsV2 returns it   |
| StorageClass     | "STANDARD", "GLACIER", … (optional column)            | "STANDARD" when absent                |

Bucket, Key, Size, LastModifiedDate and ETag are required: the planner compares sizes, ages and ETags.

Each data file is streamed (GET, gzip, CSV: memory holds a read buffer and one row, never a file); its
compressed bytes are counted and hashed on the way, and the size and MD5 the manifest gives are checked
when the file ends. So a damaged file is reported only after some of its rows were yielded: a caller
must treat the iteration as failed as a whole on any error (a plan is either complete or not made).

An inventory is a snapshot, eventually consistent and up to a day or a week old: what it lists is a
candidate, not a fact; the commit protocol's ETag conditions stop work on an object changed since.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import itertools
import os
import re
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, BinaryIO, Final
from urllib.parse import unquote_plus

from tiering.errors import ConfigError, InvalidDataError, StorageError, TieringError
from tiering.lifecycle.vocabulary import StorageClass
from tiering.storage.objects import ObjectInfo, ObjectStore

CSV: Final = "CSV"
UNREADABLE_FORMATS: Final = frozenset({"ORC", "Parquet"})  # real S3 formats, but no reader here (no pyarrow)
REQUIRED_COLUMNS: Final = ("Bucket", "Key", "Size")  # S3 always writes Bucket and Key; Size is an option
PLANNING_COLUMNS: Final = ("LastModifiedDate", "ETag")  # optional fields the inventory must be configured with
_ARN: Final = re.compile(r"arn:aws[a-z-]*:s3:::([^/:]+)")  # partitions: aws, aws-cn, aws-us-gov
_BUCKET_NAME: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_MD5: Final = re.compile(r"[0-9a-f]{32}")
_READ_BYTES: Final = 1 << 16
SHARDS: Final = 256  # spill files of objects grouped from an inventory: memory holds one


@dataclass(frozen=True, slots=True)
class InventoryFile:
    """One data file of an inventory: its key in the destination bucket, its size and the MD5 of its bytes."""

    key: str
    size: int
    md5: str


@dataclass(frozen=True, slots=True)
class InventoryManifest:
    """A ``manifest.json``; ``columns`` is the CSV column order (empty for ORC and Parquet, whose schema is
    not a column list)."""

    source_bucket: str
    destination_bucket: str
    file_format: str
    columns: tuple[str, ...]
    files: tuple[InventoryFile, ...]
    created_at: datetime | None
    version: str

    @classmethod
    def from_json(cls, doc: object, where: str) -> InventoryManifest:
        """The manifest ``doc`` as AWS writes it (see the module docstring); :class:`ConfigError` naming
        ``where`` and the field when it is not one."""

        def fail(what: str, found: object = None) -> ConfigError:
            return ConfigError(f"not an S3 Inventory manifest: {what}", path=where, found=found)

        if not isinstance(doc, Mapping):
            raise fail("not a JSON object", type(doc).__name__)
        fields: Mapping[str, Any] = doc

        def text(name: str) -> str:
            value = fields.get(name)
            if not isinstance(value, str) or not value.strip():
                raise fail(f"{name} is missing or not a non-empty string", _short(value))
            return value.strip()

        source = text("sourceBucket")
        destination = text("destinationBucket")
        m = _ARN.fullmatch(destination)
        if m is not None:
            destination = m.group(1)
        elif not _BUCKET_NAME.fullmatch(destination):
            raise fail("destinationBucket is neither an S3 bucket ARN (arn:aws:s3:::NAME) nor a bucket name",
                       destination)
        file_format = text("fileFormat")
        schema = text("fileSchema")
        columns: tuple[str, ...] = ()
        if file_format.upper() == CSV:
            columns = tuple(c.strip() for c in schema.split(","))
            if not all(columns):
                raise fail("fileSchema has an empty column name", schema)
            if len(set(columns)) != len(columns):
                raise fail("fileSchema names a column twice", schema)
        created_at = None
        if fields.get("creationTimestamp") is not None:
            stamp = fields["creationTimestamp"]
            if not isinstance(stamp, str | int) or isinstance(stamp, bool) or not _digits(str(stamp)):
                raise fail("creationTimestamp is not milliseconds since the epoch", _short(stamp))
            created_at = datetime.fromtimestamp(int(stamp) / 1000, UTC)
        entries = fields.get("files")
        if not isinstance(entries, list):
            raise fail("files is missing or not a list", _short(entries))
        files = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise fail(f"files[{i}] is not an object", _short(entry))
            key, size, md5 = entry.get("key"), entry.get("size"), entry.get("MD5checksum")
            if not isinstance(key, str) or not key:
                raise fail(f"files[{i}].key is missing or empty", _short(key))
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise fail(f"files[{i}].size is not a byte count", _short(size))
            if not isinstance(md5, str) or not _MD5.fullmatch(md5.lower()):
                raise fail(f"files[{i}].MD5checksum is not an MD5 (32 hex digits)", _short(md5))
            files.append(InventoryFile(key, size, md5.lower()))
        version = fields.get("version")
        if not isinstance(version, str):
            raise fail("version is missing or not a string", _short(version))
        return cls(source, destination, file_format, columns, tuple(files), created_at, version)


def read_manifest(store: ObjectStore, uri: str) -> InventoryManifest:
    """The manifest at ``uri`` (``s3://BUCKET/…/manifest.json``, read with ``store``'s client), checked to be
    one this module can read: CSV, with the columns planning needs (:class:`ConfigError` otherwise)."""
    m = re.fullmatch(r"s3://([^/]+)/(.+)", uri.strip())
    if m is None or m.group(2).endswith("/"):
        raise ConfigError("an inventory manifest is named by its S3 URI", expected="s3://BUCKET/PATH/manifest.json",
                          found=uri)
    bucket, key = m.groups()
    try:
        doc, _ = (store if store.bucket == bucket else store.for_bucket(bucket)).get_json(key)
    except StorageError:
        raise
    except TieringError as e:  # not JSON at all
        raise ConfigError(f"not an S3 Inventory manifest: {e.message}", path=uri, expected=e.expected,
                          found=e.found) from None
    if isinstance(doc, Mapping) and isinstance(doc.get("fileFormat"), str):
        _check_format(doc["fileFormat"], uri)  # the first thing to say of an ORC or Parquet manifest
    manifest = InventoryManifest.from_json(doc, uri)
    check_readable(manifest, uri)
    return manifest


def check_readable(manifest: InventoryManifest, where: str) -> None:
    """:class:`ConfigError` unless ``manifest`` is a CSV inventory with the columns planning needs."""
    _check_format(manifest.file_format, where)
    missing = [c for c in REQUIRED_COLUMNS if c not in manifest.columns]
    if missing:
        raise ConfigError(f"the inventory lacks the column(s) {', '.join(missing)}", path=where,
                          expected=", ".join(REQUIRED_COLUMNS), found=", ".join(manifest.columns))
    missing = [c for c in PLANNING_COLUMNS if c not in manifest.columns]
    if missing:
        raise ConfigError(f"the inventory lacks {' and '.join(missing)}, which planning needs: the inventory "
                          "configuration must include the optional fields LastModifiedDate and ETag",
                          path=where, expected=", ".join(PLANNING_COLUMNS), found=", ".join(manifest.columns))


@dataclass(frozen=True, slots=True)
class _Columns:
    """Where each column we use sits in a row; ``None`` for an optional column the inventory lacks."""

    count: int
    bucket: int
    key: int
    size: int
    modified: int
    etag: int
    storage_class: int | None
    latest: int | None
    delete_marker: int | None

    @classmethod
    def of(cls, columns: tuple[str, ...]) -> _Columns:
        at = {name: i for i, name in enumerate(columns)}
        return cls(len(columns), at["Bucket"], at["Key"], at["Size"], at["LastModifiedDate"], at["ETag"],
                   at.get("StorageClass"), at.get("IsLatest"), at.get("IsDeleteMarker"))


def iter_inventory(store: ObjectStore, manifest: InventoryManifest, prefix: str = "") -> Iterator[ObjectInfo]:
    """The current objects of the source bucket whose keys start with ``prefix`` ("" or ending with "/"), in
    the data files' order (no order is promised). Data files are read from the manifest's destination bucket
    with ``store``'s client. Errors: :class:`InvalidDataError` naming the file (and the row) for a file
    that does not match its manifest entry, is not gzip, ends early or holds a malformed row."""
    check_readable(manifest, f"s3://{manifest.destination_bucket}")  # here, not at the first row
    if prefix and not prefix.endswith("/"):
        raise ConfigError("an inventory prefix is empty or ends with '/'", expected="PATH/", found=prefix)
    data = store if store.bucket == manifest.destination_bucket else store.for_bucket(manifest.destination_bucket)
    columns = _Columns.of(manifest.columns)
    return itertools.chain.from_iterable(_read_file(data, file, columns, manifest.source_bucket, prefix)
                                         for file in manifest.files)


def inventory_objects(store: ObjectStore, uri: str, prefix: str) -> tuple[InventoryManifest, Iterator[ObjectInfo]]:
    """The manifest at ``uri`` and the objects its report lists below ``prefix`` (a run's prefix, without its
    slash), after checking that it is an inventory of ``store``'s bucket: what a run plans from instead of a
    listing."""
    manifest = read_manifest(store, uri)
    if manifest.source_bucket != store.bucket:
        raise ConfigError("the inventory lists another bucket", path=uri, expected=store.bucket,
                          found=manifest.source_bucket)
    root = prefix.strip("/")
    return manifest, iter_inventory(store, manifest, root + "/" if root else "")


class _Digest:
    """A stream's bytes passed through, counted and hashed (the MD5 S3 Inventory gives for a data file)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.md5 = hashlib.md5(usedforsecurity=False)
        self.size = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.md5.update(data)
        self.size += len(data)
        return data

    def seek(self, offset: int, /) -> int:
        raise io.UnsupportedOperation("an inventory data file is read once, in order")


def _read_file(store: ObjectStore, file: InventoryFile, columns: _Columns, source_bucket: str,
               prefix: str) -> Iterator[ObjectInfo]:
    """One data file's objects, streamed; its size and MD5 checked when it ends."""
    where = f"s3://{store.bucket}/{file.key}"
    row = 0
    with store.open(file.key) as body:
        digest = _Digest(body)
        try:
            with gzip.GzipFile(fileobj=digest, mode="rb") as unzipped:
                text = io.TextIOWrapper(unzipped, encoding="utf-8", newline="")
                for row, fields in enumerate(csv.reader(text, strict=True), start=1):  # noqa: B007
                    info = _object(fields, columns, source_bucket, prefix)
                    if info is not None:
                        yield info
            while digest.read(_READ_BYTES):  # anything after the last gzip member still counts
                pass
        except InvalidDataError as e:
            raise InvalidDataError(f"row {row}: {e.message}", path=where, expected=e.expected,
                                   found=e.found) from None
        except EOFError:
            raise InvalidDataError(f"the gzip stream ends early, after row {row} (a truncated file)",
                                   path=where, position=digest.size) from None
        except (gzip.BadGzipFile, zlib.error) as e:
            raise InvalidDataError(f"not a valid gzip stream after row {row}: {e}", path=where,
                                   position=digest.size) from None
        except UnicodeDecodeError:
            raise InvalidDataError(f"row {row + 1}: not UTF-8 text", path=where) from None
        except csv.Error as e:
            raise InvalidDataError(f"row {row + 1}: not CSV: {e}", path=where) from None
    if digest.size != file.size:
        raise InvalidDataError("the data file's size differs from the manifest's", path=where,
                               expected=f"{file.size} bytes", found=f"{digest.size} bytes")
    if digest.md5.hexdigest() != file.md5:
        raise InvalidDataError("the data file's MD5 differs from the manifest's MD5checksum", path=where,
                               expected=file.md5, found=digest.md5.hexdigest())


def _object(fields: list[str], c: _Columns, source_bucket: str, prefix: str) -> ObjectInfo | None:
    """The object one CSV row describes, or ``None`` for a row to skip (another bucket, a noncurrent
    version, a delete marker, a key outside ``prefix``); :class:`InvalidDataError` for a malformed row."""
    if len(fields) != c.count:
        raise InvalidDataError("wrong number of fields", expected=c.count, found=len(fields))
    if fields[c.bucket] != source_bucket:
        return None
    if c.delete_marker is not None and fields[c.delete_marker].lower() == "true":
        return None
    if c.latest is not None and fields[c.latest].lower() != "true":
        return None
    size = fields[c.size]
    if not size:
        return None  # a delete marker: it has no size
    try:
        key = unquote_plus(fields[c.key], errors="strict")
    except UnicodeDecodeError:
        raise InvalidDataError("the key does not URL-decode to UTF-8", found=fields[c.key]) from None
    if not key.startswith(prefix):
        return None
    if not key:
        raise InvalidDataError("empty key")
    if not _digits(size):
        raise InvalidDataError("Size is not a byte count", found=size)
    try:
        modified = datetime.fromisoformat(fields[c.modified])
    except ValueError:
        modified = None
    if modified is None or modified.tzinfo is None:
        raise InvalidDataError("LastModifiedDate is not an ISO 8601 time in UTC",
                               expected="YYYY-MM-DDTHH:MM:SS.sssZ", found=fields[c.modified])
    etag = fields[c.etag]
    if not etag:
        raise InvalidDataError("empty ETag")
    storage_class = fields[c.storage_class] if c.storage_class is not None else ""
    return ObjectInfo(key, int(size), etag if etag.startswith('"') else f'"{etag}"', modified.astimezone(UTC),
                      storage_class or StorageClass.STANDARD)


def _check_format(file_format: str, where: str) -> None:
    if file_format.upper() == CSV:
        return
    if file_format in UNREADABLE_FORMATS:
        raise ConfigError(f"{file_format} inventories cannot be read here (no ORC or Parquet reader: pyarrow is "
                          "not installed); configure the inventory's output format as CSV", path=where,
                          expected=CSV, found=file_format)
    raise ConfigError("unknown inventory file format", path=where, expected=CSV, found=file_format)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def spill_grouped(objects: Iterable[ObjectInfo], group: Callable[[ObjectInfo], str | None], *,
                  shards: int = SHARDS) -> Iterator[tuple[str, list[ObjectInfo]]]:
    """The objects of an inventory (which come in no promised order) by the group ``group`` names for each
    (None: left out), each group's objects in key order. Every object is spilled to one of ``shards`` local
    files by its group, then one shard at a time is read back and grouped: memory holds one shard. Every
    object is read before the first group comes. ``group`` must leave out a key holding a tab or a line
    break (an inventory may list one; no Kafka file is named so)."""
    with tempfile.TemporaryDirectory(prefix="tiering-inventory-") as tmp:
        files = [open(os.path.join(tmp, f"{i:04d}.tsv"), "w+", encoding="utf-8", newline="\n")  # noqa: SIM115
                 for i in range(shards)]
        try:
            for info in objects:
                name = group(info)
                if name is None:
                    continue
                f = files[zlib.crc32(name.encode()) % shards]
                f.write(f"{name}\t{info.key}\t{info.size}\t{info.etag}\t{info.last_modified.isoformat()}\t"
                        f"{info.storage_class}\n")
            for f in files:
                f.seek(0)
                groups: dict[str, list[ObjectInfo]] = {}
                for line in f:
                    name, key, size, etag, modified, storage_class = line.rstrip("\n").split("\t")
                    groups.setdefault(name, []).append(
                        ObjectInfo(key, int(size), etag, datetime.fromisoformat(modified), storage_class))
                f.close()
                for name in sorted(groups):
                    yield name, sorted(groups.pop(name), key=lambda o: o.key)
        finally:
            for f in files:
                f.close()
