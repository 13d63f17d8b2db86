"""S3 Inventory reader: round trips through the synthetic writer, AWS's documented example as an independent
reference, and every refusal (damaged data files, malformed rows, formats and manifests we cannot read)."""

from __future__ import annotations

import gzip
import hashlib
import json
import tracemalloc
import types
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from bench.synth_inventory import kafka_layout_rows
from tests.s3.conftest import BUCKET
from tiering.demo.inventory import COLUMNS, Version, write_inventory
from tiering.errors import ConfigError, InvalidDataError
from tiering.plan.inventory import InventoryManifest, inventory_objects, iter_inventory, read_manifest
from tiering.storage.objects import ObjectInfo, ObjectNotFound
from tiering.storage.s3 import S3Store

SOURCE = "kafka-logs"
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DEST = "inventory/kafka-logs/daily"


def _read(store: S3Store, uri: str, prefix: str = "") -> list[ObjectInfo]:
    return list(iter_inventory(store, read_manifest(store, uri), prefix))


def _key(uri: str) -> str:
    return uri.removeprefix(f"s3://{BUCKET}/")


def _manifest_doc(store: S3Store, uri: str) -> dict[str, Any]:
    doc, _ = store.get_json(_key(uri))
    assert isinstance(doc, dict)
    return doc


def _data_lines(store: S3Store, uri: str) -> list[str]:
    lines: list[str] = []
    for f in _manifest_doc(store, uri)["files"]:
        lines += gzip.decompress(store.get(f["key"])).decode().splitlines()
    return lines


def _obj(key: str, size: int = 100, etag: str = '"0123456789abcdef0123456789abcdef"',
         modified: datetime = NOW - timedelta(hours=3), storage_class: str = "STANDARD") -> ObjectInfo:
    return ObjectInfo(key, size, etag, modified, storage_class)


def _hand_inventory(store: S3Store, lines: list[str], *, columns: str = ", ".join(COLUMNS),
                    source: str = SOURCE, data: bytes | None = None) -> str:
    """An inventory written by hand: ``lines`` as one gzip data file (or ``data`` as its bytes)."""
    body = data if data is not None else gzip.compress("".join(line + "\n" for line in lines).encode())
    key = "hand/data/5e1b2c9d-0000-4000-8000-000000000000.csv.gz"
    store.put(key, body)
    doc = {"sourceBucket": source, "destinationBucket": f"arn:aws:s3:::{BUCKET}", "version": "2016-11-30",
           "creationTimestamp": "1772366400000", "fileFormat": "CSV", "fileSchema": columns,
           "files": [{"key": key, "size": len(body), "MD5checksum": hashlib.md5(body).hexdigest()}]}
    store.put("hand/2026-03-01T12-00Z/manifest.json", json.dumps(doc).encode())
    return f"s3://{BUCKET}/hand/2026-03-01T12-00Z/manifest.json"


def _row(key: str, *, bucket: str = SOURCE, size: str = "100", modified: str = "2026-03-01T09:00:00.000Z",
         etag: str = "0123456789abcdef0123456789abcdef") -> str:
    return ",".join(f'"{v}"' for v in (bucket, key, size, modified, etag, "STANDARD"))


# Round trips through the synthetic writer


def test_every_row_comes_back_as_written_across_several_data_files(store: S3Store) -> None:
    rows = list(kafka_layout_rows(6, 3, prefix="logs", now=NOW, topic_count=2))
    uri = write_inventory(store, SOURCE, DEST, rows, rows_per_file=10, created_at=NOW)
    manifest = read_manifest(store, uri)
    assert len(manifest.files) == 8  # 72 objects, 10 a file
    assert list(iter_inventory(store, manifest)) == rows
    assert uri == f"s3://{BUCKET}/{DEST}/2026-03-01T12-00Z/manifest.json"
    assert all(f.key.startswith(f"{DEST}/data/") and f.key.endswith(".csv.gz") for f in manifest.files)
    raw = store.get(_key(uri))
    assert store.get(_key(uri).replace("manifest.json", "manifest.checksum")).decode() == hashlib.md5(raw).hexdigest()


def test_the_manifest_says_what_aws_says(store: S3Store) -> None:
    uri = write_inventory(store, SOURCE, DEST, [_obj("logs/t-0/00000000000000000000.log")], created_at=NOW)
    manifest = read_manifest(store, uri)
    assert (manifest.source_bucket, manifest.destination_bucket, manifest.file_format, manifest.version) == (
        SOURCE, BUCKET, "CSV", "2016-11-30")
    assert manifest.columns == COLUMNS
    assert manifest.created_at == NOW
    assert _manifest_doc(store, uri)["destinationBucket"] == f"arn:aws:s3:::{BUCKET}"


def test_prefix_keeps_only_the_keys_under_it(store: S3Store) -> None:
    rows = [_obj("logs/t-0/a.log"), _obj("logsX/t-0/b.log"), _obj("other/c.log"), _obj("logs/t-1/d.log")]
    uri = write_inventory(store, SOURCE, DEST, rows, created_at=NOW)
    assert [o.key for o in _read(store, uri, "logs/")] == ["logs/t-0/a.log", "logs/t-1/d.log"]
    assert len(_read(store, uri)) == 4
    with pytest.raises(ConfigError, match="ends with '/'"):
        iter_inventory(store, read_manifest(store, uri), "logs")  # at once, not at the first row


def test_a_runs_prefix_selects_its_objects_and_the_root_every_object(store: S3Store) -> None:
    rows = [_obj("logs/t-0/a.log"), _obj("other/c.log")]
    uri = write_inventory(store, store.bucket, DEST, rows, created_at=NOW)
    assert [o.key for o in inventory_objects(store, uri, "/logs/")[1]] == ["logs/t-0/a.log"]
    assert [o.key for o in inventory_objects(store, uri, "")[1]] == ["logs/t-0/a.log", "other/c.log"]


def test_etags_are_unquoted_in_the_report_and_quoted_as_listings_give_them(store: S3Store) -> None:
    rows = [_obj("a", etag='"d41d8cd98f00b204e9800998ecf8427e"'),
            _obj("b", etag='"9b2cf535f27731c974343645a3985328-12"')]
    uri = write_inventory(store, SOURCE, DEST, rows, created_at=NOW)
    assert [line.split(",")[4] for line in _data_lines(store, uri)] == [
        '"d41d8cd98f00b204e9800998ecf8427e"', '"9b2cf535f27731c974343645a3985328-12"']  # CSV quotes, not ETag's
    assert [o.etag for o in _read(store, uri)] == [r.etag for r in rows]


def test_keys_are_url_encoded_with_space_as_plus_and_decoded_back(store: S3Store) -> None:
    keys = ["logs/a b/x+y.log", "logs/ünïcödé/€ 100%.log", "logs/q?=&#/\"quoted\",comma.log"]
    uri = write_inventory(store, SOURCE, DEST, [_obj(k) for k in keys], created_at=NOW)
    encoded = [line.split(",")[1] for line in _data_lines(store, uri)]
    assert encoded[0] == '"logs/a+b/x%2By.log"'
    assert encoded[1] == '"logs/%C3%BCn%C3%AFc%C3%B6d%C3%A9/%E2%82%AC+100%25.log"'
    assert [o.key for o in _read(store, uri)] == keys


def test_times_are_written_in_utc_and_read_back_timezone_aware(store: S3Store) -> None:
    paris = datetime(2026, 2, 28, 23, 30, 15, 123000, tzinfo=timezone(timedelta(hours=2)))
    uri = write_inventory(store, SOURCE, DEST, [_obj("a", modified=paris)], created_at=NOW)
    assert _data_lines(store, uri)[0].split(",")[3] == '"2026-02-28T21:30:15.123Z"'
    (got,) = _read(store, uri)
    assert got.last_modified == paris
    assert got.last_modified.utcoffset() == timedelta(0)


def test_storage_class_and_size_come_through(store: S3Store) -> None:
    uri = write_inventory(store, SOURCE, DEST, [_obj("a", size=0, storage_class="GLACIER"), _obj("b", size=5 << 40)],
                          created_at=NOW)
    assert [(o.size, o.storage_class) for o in _read(store, uri)] == [(0, "GLACIER"), (5 << 40, "STANDARD")]


def test_a_versioned_inventory_yields_only_current_versions(store: S3Store) -> None:
    live, old, gone = _obj("logs/t-0/live.log"), _obj("logs/t-0/live.log", etag='"old"'), _obj("logs/t-0/gone.log")
    rows: list[ObjectInfo | Version] = [
        live,
        Version(old, "v-old", is_latest=False),
        Version(gone, "v-marker", is_latest=True, delete_marker=True),  # the current version is a delete marker
        Version(gone, "v-gone", is_latest=False),
        Version(_obj("logs/t-0/older-marker.log"), "v-m2", is_latest=False, delete_marker=True),
    ]
    uri = write_inventory(store, SOURCE, DEST, rows, versioned=True, created_at=NOW)
    assert read_manifest(store, uri).columns[2:5] == ("VersionId", "IsLatest", "IsDeleteMarker")
    marker = _data_lines(store, uri)[2].split(",")
    assert (marker[3], marker[4], marker[5], marker[7]) == ('"true"', '"true"', '""', '""')  # no size, no ETag
    assert _read(store, uri) == [live]


def test_rows_of_another_bucket_are_skipped(store: S3Store) -> None:
    uri = _hand_inventory(store, [_row("a"), _row("b", bucket="elsewhere"), _row("c")])
    assert [o.key for o in _read(store, uri)] == ["a", "c"]


def test_a_delete_marker_without_the_versioned_columns_is_skipped_by_its_empty_size(store: S3Store) -> None:
    uri = _hand_inventory(store, [_row("a"), _row("b", size="", etag="")])
    assert [o.key for o in _read(store, uri)] == ["a"]


def test_no_rows_no_files(store: S3Store) -> None:
    uri = write_inventory(store, SOURCE, DEST, [], created_at=NOW)
    assert read_manifest(store, uri).files == ()
    assert _read(store, uri) == []


# Damaged data files


def test_an_md5_that_differs_from_the_manifest_is_reported(store: S3Store) -> None:
    uri = write_inventory(store, SOURCE, DEST, [_obj("a"), _obj("b")], created_at=NOW)
    doc = _manifest_doc(store, uri)
    right = doc["files"][0]["MD5checksum"]
    doc["files"][0]["MD5checksum"] = "0" * 32
    store.put(_key(uri), json.dumps(doc).encode())
    with pytest.raises(InvalidDataError, match="MD5") as e:
        _read(store, uri)
    assert e.value.path == f"s3://{BUCKET}/{doc['files'][0]['key']}"
    assert (e.value.expected, e.value.found) == ("0" * 32, right)


def test_a_size_that_differs_from_the_manifest_is_reported(store: S3Store) -> None:
    uri = write_inventory(store, SOURCE, DEST, [_obj("a")], created_at=NOW)
    doc = _manifest_doc(store, uri)
    doc["files"][0]["size"] += 1
    store.put(_key(uri), json.dumps(doc).encode())
    with pytest.raises(InvalidDataError, match="size differs"):
        _read(store, uri)


def test_a_truncated_gzip_names_the_file_and_the_last_row(store: S3Store) -> None:
    whole = gzip.compress("".join(_row(f"k{i:04d}") + "\n" for i in range(2000)).encode())
    uri = _hand_inventory(store, [], data=whole[: len(whole) // 2])  # the manifest agrees with the cut file
    with pytest.raises(InvalidDataError, match=r"ends early, after row \d+ \(a truncated file\)") as e:
        _read(store, uri)
    assert e.value.path == f"s3://{BUCKET}/hand/data/5e1b2c9d-0000-4000-8000-000000000000.csv.gz"


def test_a_data_file_that_is_not_gzip_is_refused(store: S3Store) -> None:
    uri = _hand_inventory(store, [], data=b'"kafka-logs","a","1","2026-03-01T09:00:00.000Z","e","STANDARD"\n')
    with pytest.raises(InvalidDataError, match="not a valid gzip stream"):
        _read(store, uri)


@pytest.mark.parametrize(("bad", "message"), [
    ('"kafka-logs","short","1"', r"row 2: wrong number of fields \(expected 6, found 3\)"),
    (_row("x", size="12kB"), "row 2: Size is not a byte count"),
    (_row("x", size="-1"), "row 2: Size is not a byte count"),
    (_row("x", modified="yesterday"), "row 2: LastModifiedDate is not an ISO 8601 time in UTC"),
    (_row("x", modified="2026-03-01T09:00:00"), "row 2: LastModifiedDate is not an ISO 8601 time in UTC"),
    (_row("x", etag=""), "row 2: empty ETag"),
    (_row("%FF%FE"), "row 2: the key does not URL-decode to UTF-8"),
    ('"kafka-logs","unterminated', "row 2: not CSV"),
], ids=["fields", "size", "negative-size", "time", "naive-time", "etag", "key-encoding", "quote"])
def test_a_malformed_row_names_the_file_and_the_row(store: S3Store, bad: str, message: str) -> None:
    uri = _hand_inventory(store, [_row("fine"), bad, _row("after")])
    with pytest.raises(InvalidDataError, match=message) as e:
        _read(store, uri)
    assert e.value.path == f"s3://{BUCKET}/hand/data/5e1b2c9d-0000-4000-8000-000000000000.csv.gz"


def test_text_that_is_not_utf8_is_refused(store: S3Store) -> None:
    uri = _hand_inventory(store, [], data=gzip.compress(_row("fine").encode() + b"\n\"kafka-logs\",\"\xff\xfe\"\n"))
    with pytest.raises(InvalidDataError, match="not UTF-8"):
        _read(store, uri)


# Manifests we cannot read


def test_parquet_and_orc_are_refused_with_the_reason(store: S3Store) -> None:
    for doc in (AWS_PARQUET_MANIFEST, AWS_ORC_MANIFEST):
        store.put("m/manifest.json", json.dumps(doc).encode())
        with pytest.raises(ConfigError, match=f"{doc['fileFormat']} inventories cannot be read here .*pyarrow.*"
                                              "configure the inventory's output format as CSV"):
            read_manifest(store, f"s3://{BUCKET}/m/manifest.json")


@pytest.mark.parametrize(("columns", "message"), [
    ("Bucket, Key, LastModifiedDate, ETag", r"lacks the column\(s\) Size"),
    ("Bucket, Size, LastModifiedDate, ETag", r"lacks the column\(s\) Key"),
    ("Bucket, Key, Size, ETag", "lacks LastModifiedDate, which planning needs: the inventory configuration must"),
    ("Bucket, Key, Size", "lacks LastModifiedDate and ETag, which planning needs"),
], ids=["size", "key", "last-modified", "both"])
def test_a_missing_column_is_refused_by_name(store: S3Store, columns: str, message: str) -> None:
    uri = _hand_inventory(store, [], columns=columns)
    with pytest.raises(ConfigError, match=message):
        read_manifest(store, uri)


@pytest.mark.parametrize(("body", "message"), [
    (b"<html>not json</html>", "not an S3 Inventory manifest: not a JSON document"),
    (b'["a", "list"]', "not an S3 Inventory manifest: not a JSON object"),
    (b'{"hello": "world"}', "sourceBucket is missing"),
    (json.dumps({"sourceBucket": "s", "destinationBucket": "Not A Bucket!", "fileFormat": "CSV",
                 "fileSchema": "Bucket, Key", "files": [], "version": "1"}).encode(),
     "destinationBucket is neither"),
], ids=["html", "list", "other-json", "destination"])
def test_a_document_that_is_not_a_manifest_is_refused(store: S3Store, body: bytes, message: str) -> None:
    store.put("m/manifest.json", body)
    with pytest.raises(ConfigError, match=message) as e:
        read_manifest(store, f"s3://{BUCKET}/m/manifest.json")
    assert e.value.path == f"s3://{BUCKET}/m/manifest.json"


@pytest.mark.parametrize(("change", "message"), [
    ({"files": {"key": "x"}}, "files is missing or not a list"),
    ({"files": [{"key": "x", "size": "12", "MD5checksum": "0" * 32}]}, r"files\[0\].size is not a byte count"),
    ({"files": [{"key": "x", "size": 12, "MD5checksum": "abc"}]}, r"files\[0\].MD5checksum is not an MD5"),
    ({"files": [{"size": 12, "MD5checksum": "0" * 32}]}, r"files\[0\].key is missing"),
    ({"creationTimestamp": "2018-01-03"}, "creationTimestamp is not milliseconds"),
    ({"fileSchema": "Bucket, Key, , Size"}, "empty column name"),
    ({"fileSchema": "Bucket, Key, Key, Size"}, "names a column twice"),
    ({"version": 2016}, "version is missing or not a string"),
], ids=["files", "size", "md5", "key", "created", "empty-column", "twice", "version"])
def test_a_manifest_with_a_bad_field_is_refused_by_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        InventoryManifest.from_json({**AWS_CSV_MANIFEST, **change}, "s3://b/manifest.json")


def test_a_manifest_is_named_by_an_s3_uri(store: S3Store) -> None:
    for uri in ("segments/m/manifest.json", "s3://segments", "s3://segments/", "s3://segments/m/",
                "https://segments.s3.amazonaws.com/m/manifest.json"):
        with pytest.raises(ConfigError, match="named by its S3 URI"):
            read_manifest(store, uri)
    with pytest.raises(ObjectNotFound):
        read_manifest(store, f"s3://{BUCKET}/no/such/manifest.json")


# AWS's documented example, written by hand: an independent reference for the reader


# The CSV manifest of "Locating your inventory list", verbatim
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/storage-inventory-location.html).
AWS_CSV_MANIFEST: dict[str, Any] = json.loads("""{
    "sourceBucket": "example-source-bucket",
    "destinationBucket": "arn:aws:s3:::example-inventory-destination-bucket",
    "version": "2016-11-30",
    "creationTimestamp" : "1514944800000",
    "fileFormat": "CSV",
    "fileSchema": "Bucket, Key, VersionId, IsLatest, IsDeleteMarker, Size, LastModifiedDate, ETag, StorageClass, \
IsMultipartUploaded, ReplicationStatus, EncryptionStatus, ObjectLockRetainUntilDate, ObjectLockMode, \
ObjectLockLegalHoldStatus, IntelligentTieringAccessTier, BucketKeyStatus, ChecksumAlgorithm",
    "files": [
        {
            "key": "Inventory/example-source-bucket/2016-11-06T21-32Z/files/\
939c6d46-85a9-4ba8-87bd-9db705a579ce.csv.gz",
            "size": 2147483647,
            "MD5checksum": "f11166069f1990abeb9c97ace9cdfabc"
        }
    ]
}""")

# The same page's ORC and Parquet manifests, verbatim but for the schema strings (shortened).
AWS_ORC_MANIFEST: dict[str, Any] = {
    "sourceBucket": "example-source-bucket", "destinationBucket": "arn:aws:s3:::example-destination-bucket",
    "version": "2016-11-30", "creationTimestamp": "1514944800000", "fileFormat": "ORC",
    "fileSchema": "struct<bucket:string,key:string,version_id:string,is_latest:boolean,size:bigint>",
    "files": [{"key": "inventory/example-source-bucket/data/d794c570-95bb-4271-9128-26023c8b4900.orc",
               "size": 56291, "MD5checksum": "5925f4e78e1695c2d020b9f6eexample"}]}
AWS_PARQUET_MANIFEST: dict[str, Any] = {
    "sourceBucket": "example-source-bucket", "destinationBucket": "arn:aws:s3:::example-destination-bucket",
    "version": "2016-11-30", "creationTimestamp": "1514944800000", "fileFormat": "Parquet",
    "fileSchema": "message s3.inventory { required binary bucket (UTF8); required binary key (UTF8); }",
    "files": [{"key": "inventory/example-source-bucket/data/d754c470-85bb-4255-9218-47023c8b4910.parquet",
               "size": 56291, "MD5checksum": "5825f2e18e1695c2d030b9f6eexample"}]}

# Rows in that schema as S3 writes them: every field quoted, keys URL-encoded (space as "+", per
# cloud-custodian/cloud-custodian#1997), IsLatest/IsDeleteMarker "true"/"false", times and ETags as in the
# rows nextstrain copied from a real inventory (nextstrain/nextstrain.org test/inventory_parsing.test.js):
# a delete marker has an empty ETag (and, per the inventory docs, no size).
AWS_ROWS = [
    '"example-source-bucket","prod/kafka/orders.v1-0/00000000000000000000.log","yw1HMWq1CxxJBxLhshhd83QmfWiooRP0",'
    '"true","false","1073741824","2023-05-20T01:48:18.000Z","711e4fc15f0c16c58e9a0d1262895553","STANDARD","false",'
    '"","SSE-S3","","","","","DISABLED",""',
    '"example-source-bucket","prod/kafka/orders.v1-0/00000000000000000000.log","M7wNtFHS.iPQvEVNRfbvUjk8j1iV3G8H",'
    '"false","false","1073741000","2019-09-04T19:55:09.000Z","0412951533dcdadfa3981f57e6b39579","STANDARD","false",'
    '"","SSE-S3","","","","","DISABLED",""',
    '"example-source-bucket","prod/kafka/orders.v1-0/00000000000000000000.index","K.kzHAimpImiTUdyBX.EBpRTIedPDCK2",'
    '"true","true","","2019-11-08T21:07:14.000Z","","","","","","","","","","",""',
    '"example-source-bucket","reports/Q1+2024/summary%2Bfinal+%E2%82%AC.txt","TPkaMuRION0i5IWhCMwzwm9R21UVjhSO",'
    '"true","false","4096","2019-05-26T20:52:25.000Z","df39017298c469f123898e7963d7f973-3","GLACIER","true",'
    '"COMPLETED","SSE-KMS","","","","","ENABLED","CRC64NVME"',
]


def test_aws_example_manifest_parses_as_documented() -> None:
    m = InventoryManifest.from_json(AWS_CSV_MANIFEST, "s3://example-inventory-destination-bucket/manifest.json")
    assert m.source_bucket == "example-source-bucket"
    assert m.destination_bucket == "example-inventory-destination-bucket"
    assert m.created_at == datetime(2018, 1, 3, 2, 0, tzinfo=UTC)
    assert len(m.columns) == 18
    assert m.columns[:3] == ("Bucket", "Key", "VersionId")
    assert m.columns[-1] == "ChecksumAlgorithm"
    assert [(f.key, f.size, f.md5) for f in m.files] == [(
        "Inventory/example-source-bucket/2016-11-06T21-32Z/files/939c6d46-85a9-4ba8-87bd-9db705a579ce.csv.gz",
        2147483647, "f11166069f1990abeb9c97ace9cdfabc")]


def test_aws_example_inventory_reads_as_the_objects_it_describes(store: S3Store) -> None:
    client = store.client
    dest = "example-inventory-destination-bucket"
    client.create_bucket(Bucket=dest, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    data = gzip.compress("".join(row + "\n" for row in AWS_ROWS).encode())
    doc = json.loads(json.dumps(AWS_CSV_MANIFEST))
    doc["files"][0].update(size=len(data), MD5checksum=hashlib.md5(data).hexdigest())  # ours, not the example's
    S3Store(client, dest).put(doc["files"][0]["key"], data)
    S3Store(client, dest).put("Inventory/example-source-bucket/2016-11-06T21-32Z/manifest.json",
                              json.dumps(doc, indent=4).encode())
    uri = f"s3://{dest}/Inventory/example-source-bucket/2016-11-06T21-32Z/manifest.json"
    objects = list(iter_inventory(store, read_manifest(store, uri)))  # a store of another bucket, its client
    assert objects == [
        ObjectInfo("prod/kafka/orders.v1-0/00000000000000000000.log", 1073741824,
                   '"711e4fc15f0c16c58e9a0d1262895553"', datetime(2023, 5, 20, 1, 48, 18, tzinfo=UTC)),
        ObjectInfo("reports/Q1 2024/summary+final €.txt", 4096, '"df39017298c469f123898e7963d7f973-3"',
                   datetime(2019, 5, 26, 20, 52, 25, tzinfo=UTC), "GLACIER"),
    ]


# Memory and the generator


def test_reading_holds_a_row_at_a_time_not_a_file(store: S3Store) -> None:
    rows = kafka_layout_rows(500, 25, prefix="logs", now=NOW)  # 50,000 objects, one data file
    uri = write_inventory(store, SOURCE, DEST, rows, rows_per_file=50_000, created_at=NOW)
    manifest = read_manifest(store, uri)
    count = 0
    tracemalloc.start()
    try:
        for _ in iter_inventory(store, manifest, "logs/"):
            count += 1
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    compressed = manifest.files[0].size
    assert peak < compressed + (4 << 20), f"peak {peak:,} bytes for a {compressed:,}-byte data file"  # moto's copy


def test_kafka_layout_rows_is_a_seeded_generator_of_segment_files() -> None:
    rows = kafka_layout_rows(4, 3, prefix="logs/", now=NOW, topic_count=2)
    assert isinstance(rows, types.GeneratorType)
    got = list(rows)
    assert got == list(kafka_layout_rows(4, 3, prefix="logs", now=NOW, topic_count=2))
    assert got != list(kafka_layout_rows(4, 3, prefix="logs", now=NOW, topic_count=2, seed=1))
    assert len(got) == 4 * 3 * 4
    assert {o.key.rsplit("/", 1)[0] for o in got} == {"logs/events-000-0", "logs/events-001-0", "logs/events-000-1",
                                                      "logs/events-001-1"}
    first = [o.key.rsplit("/", 1)[1] for o in got[:4]]
    assert first == ["00000000000000000000.log", "00000000000000000000.index", "00000000000000000000.timeindex",
                     "00000000000000000000.snapshot"]
    assert all(o.last_modified <= NOW - timedelta(hours=1) for o in got)
    assert all(o.etag.startswith('"') and len(o.etag) == 34 for o in got)
    logs = [o for o in got if o.key.endswith(".log")]
    assert all(o.size <= 1 << 30 for o in logs)
