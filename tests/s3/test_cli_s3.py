"""``tiering s3 ...`` against a moto server on loopback (another process talks to it, as in production)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from tests.s3.conftest import PREFIX, TOPIC, seed
from tiering.cli import main
from tiering.demo.inventory import write_inventory
from tiering.errors import ExitCode
from tiering.kafka.files import LOG_SUFFIX
from tiering.storage.layout import segment_key
from tiering.storage.s3 import S3Store, make_client

SECRET = "sEcReT-never-printed-0123456789"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> S3Store:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    name = request.node.name.replace("_", "-")[:50].strip("-").lower()
    client = make_client()
    client.create_bucket(Bucket=name)
    return S3Store(client, name)


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def _run(*argv: str) -> tuple[int, str, str]:
    """The installed CLI in another process (it reaches the moto server through AWS_ENDPOINT_URL)."""
    done = subprocess.run([sys.executable, "-m", "tiering", *argv], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ), check=False)
    return done.returncode, done.stdout, done.stderr


def test_scan_compact_rollback_cleanup_in_another_process(bucket: S3Store, tmp_path: Path) -> None:
    seed(bucket)
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX]
    plan_path = tmp_path / "plan.json"
    code, out, err = _run("s3", "scan", *where, "--min-age-minutes", "0", "--out", str(plan_path), "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["totals"]["to_compact"] == 2
    assert json.loads(plan_path.read_text())["kind"] == "tiering.plan"

    code, out, err = _run("s3", "compact", *where, "--codec", "zstd", "--plan", str(plan_path), "--run-id", "r1",
                          "--json", "--verbose")
    assert code == 0, err
    run = json.loads(out)
    assert run["run_id"] == "r1"
    assert [s["status"] for s in run["segments"]] == ["compacted", "compacted"]
    assert run["totals"]["bytes_after"] < run["totals"]["bytes_before"]
    assert "[1] orders.v1-0/" in err  # progress, one line per segment
    assert SECRET not in out + err

    code, out, _ = _run("s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--json")
    assert code == 0
    assert json.loads(out)["segments"] == []  # everything is compacted already

    code, out, err = _run("s3", "rollback", *where, "--run-id", "r1", "--json")
    assert code == 0, err
    assert {s["status"] for s in json.loads(out)["segments"]} == {"rolled-back"}

    code, out, err = _run("s3", "cleanup", *where, "--grace-days", "0", "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["totals"] == {"partitions": 1, "backups": 6, "backup_bytes": sum(
        i.size for i in bucket.list(f"{PREFIX}/_tiering/backup/")), "staging": 0}
    assert len(list(bucket.list(f"{PREFIX}/_tiering/backup/"))) == 6  # nothing deleted
    code, out, err = _run("s3", "cleanup", *where, "--grace-days", "0", "--dry-run")
    assert code == 0, err
    assert "all partitions (1)" in out
    assert "dry run: nothing was deleted" in out
    # from an S3 Inventory report of the bucket: the same six, found without listing them
    uri = write_inventory(bucket, bucket.bucket, "inventory", list(bucket.list(f"{PREFIX}/")))
    code, out, err = _run("s3", "cleanup", *where, "--grace-days", "0", "--inventory", uri, "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["totals"]["backups"] == 6
    code, out, err = _run("s3", "cleanup", *where, "--grace-days", "0", "--inventory", uri, "--json")
    assert code == 0, err
    assert json.loads(out)["usage"]["cleanup"]["backups_deleted"] == 6
    code, out, err = _run("s3", "cleanup", *where, "--grace-days", "0")
    assert code == 0, err
    assert "nothing past its age; 0 kept originals deleted (0 B)" in out


def test_text_output_shows_the_plan_and_the_run(bucket: S3Store) -> None:
    seed(bucket)
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX]
    code, out, _ = _cli("s3", "scan", *where)
    assert code == 0
    assert "skip: too young" in out  # the default 15-minute grace period
    code, out, err = _cli("s3", "compact", *where, "--codec", "zstd", "--min-age-minutes", "0", "--run-id", "r9")
    assert code == 0, err
    assert "compact run r9" in out
    assert "compacted" in out
    assert "ratio" in out


def test_dry_run_estimates_and_writes_nothing(bucket: S3Store) -> None:
    seed(bucket)
    before = {o.key for o in bucket.list("")}
    code, out, _ = _cli("s3", "compact", "--bucket", bucket.bucket, "--prefix", PREFIX, "--codec", "zstd",
                        "--min-age-minutes", "0", "--dry-run", "--json")
    assert code == 0
    doc: dict[str, Any] = json.loads(out)
    assert doc["dry_run"] is True
    assert doc["forecast"]["total"]["saved_bytes"] > 0
    assert doc["forecast"] == doc["plan"]["estimate"]
    (row,) = doc["forecast"]["by_topic"]
    assert row["topic"] == "orders.v1"
    assert row["bytes_after"] < row["bytes_before"]
    assert row["saved_low"] <= row["saved_bytes"] <= row["saved_high"]
    after = {o.key for o in bucket.list("")}
    assert after == before  # moto's server sends Date: not even a clock object is written


def test_the_dry_run_plans_what_the_run_then_does(bucket: S3Store) -> None:
    """The dry run takes the run's own steps (scan, plan with the budget) with its documents in memory: its plan
    is the plan the real run then writes and follows, segment for segment."""
    from tiering.run.pipeline import RunSettings, plan_files

    seed(bucket)
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX, "--codec", "zstd", "--min-age-minutes", "0",
             "--max-segments", "1"]
    code, out, err = _cli("s3", "compact", *where, "--dry-run", "--json", "--run-id", "same")
    assert code == 0, err
    dry = json.loads(out)["plan"]
    assert not [o.key for o in bucket.list(f"{PREFIX}/_tiering/")]
    code, out, err = _cli("s3", "compact", *where, "--json", "--run-id", "same", "--no-report")
    assert code == 0, err
    planned = plan_files(bucket, RunSettings(bucket.bucket, PREFIX, "same", "zstd", None, 60))
    assert sorted(s["action"] for s in dry["segments"]) == ["compact", "skip", "skip"]  # the active one, the budget
    assert dry["segments"] == [s.to_json() for s in planned.segments()]
    assert [s["base_offset"] for s in json.loads(out)["segments"] if s["status"] == "compacted"] == [
        s["base_offset"] for s in dry["segments"] if s["action"] == "compact"]


def test_a_corrupt_segment_makes_exit_code_1_and_the_rest_proceeds(bucket: S3Store) -> None:
    originals = seed(bucket)
    base = sorted(originals)[0]
    key = f"{PREFIX}/orders.v1-0/{base:020d}.log"
    data = bytearray(originals[base].log)
    data[100] ^= 1
    bucket.put(key, bytes(data))
    code, out, _ = _cli("s3", "compact", "--bucket", bucket.bucket, "--prefix", PREFIX, "--codec", "zstd",
                        "--min-age-minutes", "0", "--json")
    assert code == 1
    statuses = {s["base_offset"]: s for s in json.loads(out)["segments"]}
    assert statuses[base]["status"] == "failed"
    assert statuses[base]["error"]["error"] == "CorruptBatchError"
    assert [s["status"] for b, s in statuses.items() if b != base] == ["compacted"]
    assert bucket.get(key) == bytes(data)


def test_a_missing_bucket_is_a_usage_error(bucket: S3Store) -> None:
    code, out, err = _cli("s3", "scan", "--bucket", "no-such-bucket-here", "--prefix", PREFIX, "--json")
    assert code == 2
    assert "s3://no-such-bucket-here" in err
    assert "NoSuchBucket" in err or "404" in err
    assert json.loads(out)["type"] == "error"
    assert SECRET not in out + err


def test_help_explains_the_verbs() -> None:
    code, out, _ = _cli("s3", "--help")
    assert code == 0
    for verb in ("scan", "compact", "rollback", "cleanup"):
        assert verb in out


def test_an_unreachable_endpoint_is_a_retryable_failure_that_never_prints_its_credentials() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    env = {**os.environ, "AWS_MAX_ATTEMPTS": "2", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET}
    done = subprocess.run([sys.executable, "-m", "tiering", "s3", "compact", "--bucket", "b", "--prefix", "p",
                           "--codec", "zstd", "--endpoint-url", f"http://admin:{SECRET}@127.0.0.1:{port}", "--json"],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert done.returncode == ExitCode.RETRY, done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert [line for line in done.stderr.splitlines() if line.startswith("tiering:")] == [
        f"tiering: s3://b: head_bucket: could not connect to S3 at http://127.0.0.1:{port}; retryable"]
    doc = json.loads(done.stdout)
    assert (doc["exit_code"], doc["error"]["error"], doc["error"]["retryable"]) == (4, "TransportError", True)


def test_rebatch_compacts_tiny_batches_estimates_them_and_the_report_shows_the_split(bucket: S3Store,
                                                                                     tmp_path: Path) -> None:
    from tests.s3.test_rebatch_s3 import PER_SEGMENT, tiny_segment
    from tiering.kafka.files import LOG_SUFFIX
    from tiering.storage.layout import segment_key

    for base in (0, PER_SEGMENT, 2 * PER_SEGMENT):
        bucket.put(segment_key(PREFIX, "clicks", 0, base, LOG_SUFFIX), tiny_segment(base))
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX, "--codec", "zstd", "--min-age-minutes", "0"]
    estimates = []
    for extra in ([], ["--rebatch"]):
        code, out, err = _cli("s3", "compact", *where, "--dry-run", "--json", *extra)
        assert code == 0, err
        estimates.append(json.loads(out)["forecast"]["total"]["saved_bytes"])
    assert estimates[1] > estimates[0] > 0  # merged, one-record batches compress far better
    code, out, err = _cli("s3", "compact", *where, "--rebatch", "--rebatch-max-bytes", "65536", "--json")
    assert code == 0, err
    segments = json.loads(out)["segments"]
    assert [s["status"] for s in segments] == ["compacted", "compacted"]
    assert all(s["stats"]["rebatch"]["batches_out"] < PER_SEGMENT // 10 for s in segments)
    code, out, err = _cli("report", "--bucket", bucket.bucket, "--prefix", PREFIX)
    assert code == 0, err
    assert f"2 segments, {2 * PER_SEGMENT:,} ->" in out
    assert "saved by re-batching" in out
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ncluster: {compression.type: zstd}\n")
    code, _, err = _cli("s3", "compact", *where, "--rebatch", "--policy", str(policy))
    assert code == ExitCode.USAGE
    assert "set rebatch.enable in the policy" in err


def test_compact_keys_cleans_the_chosen_topics_and_the_report_shows_what_went(bucket: S3Store) -> None:
    from tests.kafka.test_keycompact import NOW
    from tests.s3 import test_keycompact_s3 as K
    from tiering.kafka.files import LOG_SUFFIX
    from tiering.kafka.merge import DEFAULT_INDEX_BYTES, DEFAULT_SEGMENT_BYTES, Limits
    from tiering.storage.layout import segment_key

    parts = K.partition(aborts=True)
    for base, (log, _) in parts.items():  # the same partition under another topic, not chosen: left alone
        bucket.put(segment_key(PREFIX, "orders.delete", 0, base, LOG_SUFFIX), log)
    K.upload(bucket, parts)
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX, "--min-age-minutes", "0"]
    code, _, err = _cli("s3", "compact-keys", *where)
    assert code == ExitCode.USAGE
    assert "--topics" in err
    code, out, err = _cli("s3", "compact-keys", *where, "--topics", r"profiles\..*", "--now-ms", str(NOW), "--json",
                          "--run-id", "keys-cli")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "compact-keys"
    # By default the sealed neighbours are cleaned into one as the broker's cleaner groups them (Kafka's
    # segment.bytes and segment.index.bytes): the four sealed segments become one.
    assert doc["totals"]["merged"] == 4
    K.check_cleaned(bucket, K.expected(parts, NOW, Limits(DEFAULT_SEGMENT_BYTES, DEFAULT_INDEX_BYTES)))
    assert all(bucket.get(segment_key(PREFIX, "orders.delete", 0, b, LOG_SUFFIX)) == log
               for b, (log, _) in parts.items())
    code, out, err = _cli("report", "--bucket", bucket.bucket, "--prefix", PREFIX, "--json")
    assert code == 0, err
    report = json.loads(out)
    kc = report["key_compaction"]
    assert kc["segments"] == 4
    assert kc["aborted_records_removed"] == 2
    assert kc["saved_bytes"] == report["totals"]["bytes_before"] - report["totals"]["bytes_after"] > 0
    # the objects' storage saved (the merge's figures) includes the .log bytes the cleaner dropped
    assert 0 < kc["monthly_savings_usd"] < report["totals"]["monthly_savings_usd"]
    assert report["merging"]["objects_before"] > report["merging"]["objects_after"]
    code, out, err = _cli("report", "--bucket", bucket.bucket, "--prefix", PREFIX)
    assert "saved by key compaction" in out
    code, out, err = _cli("report", "--bucket", bucket.bucket, "--prefix", PREFIX, "--run-id", "keys-cli",
                          "--price-region", "eu-west-1", "--json")  # priced again from the run document
    assert code == 0, err
    assert json.loads(out)["key_compaction"]["segments"] == 4
    assert json.loads(out)["prices"]["region"] == "eu-west-1"
    parts = K.partition(aborts=True)  # the same under another prefix, with --no-merge: each segment its own
    K.upload(bucket, parts, prefix=PREFIX + "2")
    code, out, err = _cli("s3", "compact-keys", "--bucket", bucket.bucket, "--prefix", PREFIX + "2",
                          "--min-age-minutes", "0", "--topics", r"profiles\..*", "--now-ms", str(NOW), "--json",
                          "--no-merge")
    assert code == 0, err
    assert json.loads(out)["totals"]["compacted"] == 3


def test_a_key_compaction_dry_run_says_what_a_pass_would_clean_and_writes_nothing(bucket: S3Store) -> None:
    """``s3 compact-keys --dry-run``: the chosen topics' partitions, the segments a pass may clean (those it
    reads but the last) and their bytes, the cleaner's settings; from a listing and from an S3 Inventory report
    alike; no object written, and the real pass then cleans what the dry run named."""
    from tests.kafka.test_keycompact import NOW
    from tests.s3 import test_keycompact_s3 as K
    from tiering.kafka.merge import DEFAULT_INDEX_BYTES, DEFAULT_SEGMENT_BYTES

    parts = K.partition(aborts=True)
    for base, (log, _) in parts.items():  # the same partition under another topic, not chosen
        bucket.put(segment_key(PREFIX, "orders.delete", 0, base, LOG_SUFFIX), log)
    K.upload(bucket, parts)
    uri = write_inventory(bucket, bucket.bucket, "inventory/daily", list(bucket.list(PREFIX + "/")))
    listed = {i.key: i.etag for i in bucket.list("")}
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX, "--min-age-minutes", "0", "--topics", r"profiles\..*",
             "--now-ms", str(NOW), "--delete-retention-ms", "5000", "--dry-run"]
    code, out, err = _cli("s3", "compact-keys", *where, "--json")
    assert code == 0, err
    doc = json.loads(out)
    sealed = sorted(parts)[:-1]  # the pass reads every segment; the last one it only reads
    logs = {b: len(log) for b, (log, _) in parts.items()}
    assert doc["dry_run"] is True
    assert doc["partitions"] == [{"directory": f"{K.TOPIC}-0", "now_ms": NOW, "segments": len(sealed),
                                  "log_bytes": sum(logs[b] for b in sealed), "delete_retention_ms": 5000,
                                  "min_compaction_lag_ms": 0, "merge": [DEFAULT_SEGMENT_BYTES, DEFAULT_INDEX_BYTES]}]
    code, out, err = _cli("s3", "compact-keys", *where, "--json", "--inventory", uri)
    assert code == 0, err
    assert json.loads(out)["partitions"] == doc["partitions"]
    code, out, err = _cli("s3", "compact-keys", *where)
    assert code == 0, err
    assert K.TOPIC in out
    assert "orders.delete" not in out
    assert "nothing was written" in out
    assert {i.key: i.etag for i in bucket.list("")} == listed
    code, out, err = _cli("s3", "compact-keys", *where[:-1], "--json", "--no-report")
    assert code == 0, err
    cleaned = {s["base_offset"] for s in json.loads(out)["segments"] if s["status"] == "merged"}
    assert cleaned == set(sealed)


def test_merge_plans_merges_then_rolls_back_in_another_process(bucket: S3Store) -> None:
    originals = seed(bucket, segments=6, segment_bytes=20_000)
    where = ("--bucket", bucket.bucket, "--prefix", PREFIX, "--min-age-minutes", "0", "--segment-bytes", "1MiB")
    listed = sorted(info.key for info in bucket.list(PREFIX + "/"))
    code, out, err = _run("s3", "merge", *where, "--dry-run")
    assert code == 0, err
    assert "18 → 6" in out  # five sealed segments and the active one: 18 segment objects, 6 after
    assert "nothing was written" in out
    assert "5 into 1: 15 objects -> 3" in out, out
    assert sorted(info.key for info in bucket.list(PREFIX + "/")) == listed
    code, out, err = _run("s3", "merge", *where, "--dry-run", "--json")
    assert code == 0, err
    priced = json.loads(out)["priced"]
    sealed = [i for i in bucket.list(PREFIX + "/") if i.key.endswith((".log", ".index", ".timeindex"))
              and int(i.key.rsplit("/", 1)[1][:20]) < max(originals)]
    # in Standard, each object billed by its bytes ($0.023 per GiB-month): the same bytes after, in 3 objects
    assert priced["objects_before"] == len(sealed) == 15
    assert priced["monthly_before_usd"] == pytest.approx(sum(i.size for i in sealed) / (1 << 30) * 0.023)
    assert priced["monthly_after_usd"] == pytest.approx(priced["monthly_before_usd"])
    assert priced["reads_before_usd"] == pytest.approx(15 * 0.0004 / 1000)
    code, out, err = _run("s3", "merge", *where, "--run-id", "merge-cli", "--json", "-v")
    assert code == 0, err
    run = json.loads(out)
    assert run["totals"]["merged"] == 5
    assert run["usage"]["objects"] == {"before": 15, "after": 3}
    report = bucket.get_json(f"{PREFIX}/_tiering/reports/merge-cli/report.json")[0]
    assert (report["merging"]["objects_before"], report["merging"]["objects_after"]) == (15, 3)
    assert "merge report" in err
    assert "5 into 1: 15 objects -> 3" in err
    first = min(originals)
    assert bucket.get(f"{PREFIX}/orders.v1-0/{first:020d}.log") == b"".join(
        originals[b].log for b in sorted(originals)[:-1])
    code, out, err = _run("s3", "rollback", "--bucket", bucket.bucket, "--prefix", PREFIX, "--run-id", "merge-cli",
                          "--workers", "2")
    assert code == 0, err
    assert "rolled-back: 5" in out
    assert "saved" not in out  # a rollback stores the originals again: no saving (nor a negative one) to report
    assert f"[5] orders.v1-0/{max(b for b in originals if b != max(originals)):020d}: rolled-back" in err  # a line each
    for base, original in originals.items():
        assert bucket.get(f"{PREFIX}/orders.v1-0/{base:020d}.log") == original.log


def test_merge_plans_from_an_s3_inventory_as_from_a_listing_and_skips_what_changed_since(bucket: S3Store) -> None:
    """``s3 merge --inventory``: the dry run plans the same groups as from a listing; the run merges them, each
    source checked against the ETag the (stale) inventory gives, so a segment rewritten since is not merged."""
    originals = seed(bucket, segments=6, segment_bytes=20_000)
    uri = write_inventory(bucket, bucket.bucket, "inventory/daily", list(bucket.list(PREFIX + "/")))
    where = ["--bucket", bucket.bucket, "--prefix", PREFIX, "--segment-bytes", "1MiB", "--min-age-minutes", "0",
             "--json"]
    listed = json.loads(_cli("s3", "merge", *where, "--dry-run")[1])
    code, out, err = _cli("s3", "merge", *where, "--dry-run", "--inventory", uri)
    assert code == 0, err
    assert json.loads(out)["partitions"] == listed["partitions"]
    assert [p["groups"] for p in listed["partitions"]] == [[sorted(originals)[:-1]]]
    bases = sorted(originals)
    changed = segment_key(PREFIX, TOPIC, 0, bases[2], LOG_SUFFIX)  # uploaded again since the inventory: the
    upload = bucket.client.create_multipart_upload(Bucket=bucket.bucket, Key=changed)  # same bytes in one part,
    part = bucket.client.upload_part(Bucket=bucket.bucket, Key=changed, UploadId=upload["UploadId"], PartNumber=1,
                                     Body=bucket.get(changed))
    bucket.client.complete_multipart_upload(Bucket=bucket.bucket, Key=changed, UploadId=upload["UploadId"],
                                            MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    assert bucket.head(changed).etag.endswith('-1"')  # another ETag than the inventory's
    code, out, err = _cli("s3", "merge", *where, "--inventory", uri, "--no-report", "--run-id", "from-inventory")
    doc = json.loads(out)
    by_base = {s["base_offset"]: s for s in doc["segments"]}
    assert by_base[bases[2]]["status"] == "skipped", by_base
    assert "changed after planning" in by_base[bases[2]]["reason"], by_base
    # the two after it merged; the two before it stay as they are (each merge they could join held it)
    assert [by_base[b]["status"] for b in bases[:2]] == ["skipped", "skipped"], by_base
    assert doc["totals"]["merged"] == 2, doc["totals"]
    assert code == ExitCode.BUSY, err  # a source changed since planning: left for a re-plan, and said so
