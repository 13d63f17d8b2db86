"""The journal entry as a typed document: one shape for every operation, the two shapes version 1 wrote read
as it, and a bad one named, not crashed on."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tiering.errors import ConfigError
from tiering.lifecycle.journal import Journal, OpFile, OpSegment, Recorded, read_journal
from tiering.lifecycle.vocabulary import JournalState, OpKind
from tiering.storage.objects import ObjectAttrs

# A one-for-one entry exactly as schema version 1 wrote it (a run in flight across an upgrade must still be
# finished).
WRITTEN_BEFORE: dict[str, Any] = {
    "schema_version": 1, "kind": "compact", "op": "r1.0a1b2c3d", "run_id": "r1", "state": "staged",
    "directory": "orders-0", "base_offset": 42,
    "final": {"log": "p/orders-0/00000000000000000042.log", "index": "p/orders-0/00000000000000000042.index",
              "timeindex": "p/orders-0/00000000000000000042.timeindex"},
    "source": {"log": '"e1"', "index": '"e2"', "timeindex": None},
    "source_sizes": {"log": 1000, "index": 16},
    "new": {"log": "p/_tiering/staging/r1/orders-0/00000000000000000042.log",
            "index": "p/_tiering/staging/r1/orders-0/00000000000000000042.index",
            "timeindex": "p/_tiering/staging/r1/orders-0/00000000000000000042.timeindex", "log_size": 400},
    "attrs": {name: {"metadata": {"tiering-op": "r1.0a1b2c3d"}, "headers": {}, "tags": {"t": "1"},
                     "storage_class": "STANDARD"} for name in ("log", "index", "timeindex")},
    "backup": {"log": "p/_tiering/backup/r1/orders-0/00000000000000000042.log",
               "index": "p/_tiering/backup/r1/orders-0/00000000000000000042.index", "timeindex": None},
    "payload_xxh3": "ab" * 16,
    "entry": {"codec": "zstd", "level": 3, "run_id": "r1", "bytes_before": 1000, "bytes_after": 400},
}


KEY = "p/orders-0/00000000000000000042"
NAME = "orders-0/00000000000000000100"
STAGING = "p/_tiering/staging/r1/orders-0/00000000000000000042"
BACKUP = "p/_tiering/backup/r1/orders-0/00000000000000000042"
MARKED = ObjectAttrs({"tiering-op": "r1.0a1b2c3d"}, {}, {"t": "1"}, "STANDARD")

# A merge's entry as schema version 1 wrote it: sources and targets already, without checksums.
REGROUP_WRITTEN_BEFORE: dict[str, Any] = {
    "schema_version": 1, "kind": "merge", "op": "r2.0a1b2c3d", "run_id": "r2", "state": "swapped",
    "directory": "orders-0", "base_offset": 0,
    "sources": [{"base_offset": b, "files": {"log": {
        "final": f"p/orders-0/{b:020d}.log", "etag": f'"s{b}"', "size": 100,
        "copy": f"p/_tiering/backup/r2/orders-0/{b:020d}.log", "attrs": MARKED.to_json(),
        "last_modified": "2026-01-01T00:00:00+00:00"}}} for b in (0, 7)],
    "targets": [{"base_offset": 0, "files": {"log": {"final": "p/orders-0/00000000000000000000.log", "etag": '"t"',
                                                      "size": 200, "copy": "p/_tiering/staging/r2/orders-0/0.log"}}}],
    "entry": {"run_id": "r2", "bytes_before": 200, "bytes_after": 200, "merged_from": [0, 7]},
}


def test_an_entry_in_place_written_by_version_1_reads_as_one_source_and_one_target() -> None:
    journal = read_journal(copy.deepcopy(WRITTEN_BEFORE), where="s3://b/k")
    assert (journal.kind, journal.state, journal.base_offset, journal.in_place) == (
        OpKind.COMPACT, JournalState.STAGED, 42, True)
    assert journal.sources == (OpSegment(42, {"log": OpFile(f"{KEY}.log", '"e1"', 1000, f"{BACKUP}.log", MARKED),
                                              "index": OpFile(f"{KEY}.index", '"e2"', 16, f"{BACKUP}.index", MARKED)}),)
    assert journal.targets == (OpSegment(42, {name: OpFile(f"{KEY}.{name}", None, 400 if name == "log" else None,
                                                           f"{STAGING}.{name}", MARKED)
                                              for name in ("log", "index", "timeindex")}),)
    assert journal.entry == Recorded(1000, 400, "r1", codec="zstd", level=3)
    assert (journal.payload_xxh3, journal.txn_first, journal.txn_swapped) == ("ab" * 16, False, False)
    # the backups are the originals, with the attributes version 1 gave them; nothing else is copied
    assert [(c.final, c.etag, c.target, c.size) for c in journal.backups()] == [
        (f"{KEY}.log", '"e1"', f"{BACKUP}.log", 1000), (f"{KEY}.index", '"e2"', f"{BACKUP}.index", 16)]
    assert journal.staging() == (f"{STAGING}.log", f"{STAGING}.index", f"{STAGING}.timeindex")
    # written in this version's shape, it reads back the same
    doc = journal.to_json()
    assert (doc["schema_version"], "final" not in doc) == (Journal.SCHEMA_VERSION, True)
    assert read_journal(doc, where="s3://b/k") == journal


def test_a_txnindex_swap_written_by_version_1_keeps_its_order_and_its_backup() -> None:
    doc = copy.deepcopy(WRITTEN_BEFORE)
    doc["kind"], doc["log_crc32c"] = "compact", 12345
    doc["new"]["log_etag"] = '"n1"'
    doc["txn"] = {"final": f"{KEY}.txnindex", "source": '"x1"', "new": None, "backup": f"{BACKUP}.txnindex",
                  "before_log": True, "attrs": MARKED.to_json()}
    journal = read_journal(doc, where="s3://b/k")
    assert journal.target("log") == OpFile(f"{KEY}.log", '"n1"', 400, f"{STAGING}.log", MARKED, crc32c=12345)
    assert journal.source("txnindex") == OpFile(f"{KEY}.txnindex", '"x1"', copy=f"{BACKUP}.txnindex")
    assert (journal.target("txnindex"), journal.txn_first, journal.txn_swapped) == (None, True, True)
    assert f"{BACKUP}.txnindex" in {c.target for c in journal.backups()}
    assert read_journal(journal.to_json(), where="s3://b/k") == journal


def test_a_regroup_written_by_version_1_reads_as_the_same_operation() -> None:
    journal = read_journal(copy.deepcopy(REGROUP_WRITTEN_BEFORE), where="s3://b/k")
    assert (journal.kind, journal.state, journal.in_place, journal.base_offset) == (
        OpKind.MERGE, JournalState.SWAPPED, False, 0)
    assert [s.base_offset for s in journal.sources] == [0, 7]
    assert journal.sources[1].log == OpFile("p/orders-0/00000000000000000007.log", '"s7"', 100,
                                            "p/_tiering/backup/r2/orders-0/00000000000000000007.log", MARKED,
                                            "2026-01-01T00:00:00+00:00")
    assert journal.entry.merged_from == (0, 7)
    assert journal.staging() == ("p/_tiering/staging/r2/orders-0/0.log",)
    assert read_journal(journal.to_json(), where="s3://b/k") == journal


def test_an_entry_of_a_key_compaction_pass_reads_typed() -> None:
    """A key-compaction pass's entry: no codec or level (written as nulls), and the pass's figures, which
    the state does not keep, beside them."""
    doc = copy.deepcopy(WRITTEN_BEFORE)
    doc["entry"] = {"codec": None, "level": None, "key_compaction": {"records_in": 10, "records_out": 4},
                    "run_id": "r1", "source_log_etag": '"e1"', "bytes_before": 1000, "bytes_after": 400,
                    "payload_xxh3": "cd" * 16}
    journal = read_journal(doc, where="s3://b/k")
    assert journal.entry == Recorded(1000, 400, "r1", '"e1"', None, None, "cd" * 16)
    assert journal.to_json()["entry"] == {"run_id": "r1", "source_log_etag": '"e1"', "bytes_before": 1000,
                                          "bytes_after": 400, "payload_xxh3": "cd" * 16}


def test_a_transition_is_a_new_entry() -> None:
    journal = read_journal(copy.deepcopy(WRITTEN_BEFORE), where="s3://b/k")
    moved = journal.advanced(JournalState.BACKED_UP)
    assert (journal.state, moved.state) == (JournalState.STAGED, JournalState.BACKED_UP)
    assert moved.to_json()["state"] == "backed-up"


@pytest.mark.parametrize(("doc", "message"), [
    ({**WRITTEN_BEFORE, "schema_version": 3}, "not a journal entry this version can read"),
    ([1, 2], "not a journal entry this version can read"),
    ({k: v for k, v in WRITTEN_BEFORE.items() if k != "final"}, "malformed"),
    ({**WRITTEN_BEFORE, "state": "half-done"}, "malformed"),
    ({**REGROUP_WRITTEN_BEFORE, "sources": [{"files": {}}]}, "malformed"),
    ({**REGROUP_WRITTEN_BEFORE, "schema_version": 2, "targets": None}, "malformed"),
    ({**REGROUP_WRITTEN_BEFORE, "schema_version": 2, "sources": []}, "malformed"),
    ({**REGROUP_WRITTEN_BEFORE, "schema_version": 2, "kind": "compact"}, "malformed: a compact of 2 segment"),
    ({**REGROUP_WRITTEN_BEFORE, "targets": [{"base_offset": 0, "files": {}}]}, "malformed"),
])
def test_an_unknown_or_malformed_entry_is_named(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        read_journal(doc, where="s3://b/journal/x.json")
    assert caught.value.path == "s3://b/journal/x.json"


# Entries written by version 1's own classes (tiering at b3291ba), one of each shape it wrote, kept as its JSON.
WRITTEN_BY_V1 = Path(__file__).parents[1] / "data" / "journals"


def _v1(name: str) -> Journal:
    doc = json.loads((WRITTEN_BY_V1 / f"v1-{name}.json").read_text())
    assert doc["schema_version"] == 1
    journal = read_journal(doc, where=name)
    assert read_journal(json.loads(json.dumps(journal.to_json())), where=name) == journal  # v2 round trip
    return journal


def test_version_1s_key_compaction_with_a_txnindex_removed_first() -> None:
    journal = _v1("in-place-key-compaction-txnindex")
    assert (journal.kind, journal.state, journal.in_place, journal.txn_first, journal.txn_swapped) == (
        OpKind.COMPACT, JournalState.BACKED_UP, True, True, True)
    log = journal.target("log")
    assert log is not None
    assert (log.etag, log.size, log.crc32c, log.copy) == ('"n1"', 700, 987654321, f"p/_tiering/staging/k1/{NAME}.log")
    assert journal.target("txnindex") is None  # removed, not replaced
    txn = journal.source("txnindex")
    assert txn is not None
    assert (txn.etag, txn.copy, txn.attrs) == ('"x1"', f"p/_tiering/backup/k1/{NAME}.txnindex", None)
    # four originals backed up: three with the marked attributes version 1 gave them, the .txnindex with its own
    backups = {c.target.rsplit(".", 1)[1]: c for c in journal.backups()}
    assert sorted(backups) == ["index", "log", "timeindex", "txnindex"]
    assert backups["txnindex"].attrs is None
    assert backups["log"].attrs is not None
    assert backups["log"].attrs.metadata["tiering-op"] == journal.op
    assert (backups["log"].size, backups["index"].size) == (1500, 24)
    assert journal.payload_xxh3 == "cd" * 16


def test_version_1s_rollback_with_a_txnindex_put_back_after_the_log() -> None:
    journal = _v1("in-place-rollback-txnindex")
    assert (journal.kind, journal.restores_run, journal.txn_first, journal.txn_swapped) == (
        OpKind.ROLLBACK, "k1", False, True)
    assert sorted(journal.sources[0].files) == ["index", "log"]  # no .timeindex and no .txnindex in place
    log = journal.target("log")
    assert log is not None
    # no ETag to hold the backup to: it is decoded before it goes in
    assert (log.etag, log.size, log.copy) == (None, 1500, f"p/_tiering/backup/k1/{NAME}.log")
    assert sorted(journal.targets[0].files) == ["index", "log", "txnindex"]
    assert (journal.backups(), journal.staging()) == ((), ())  # its copies are the rolled-back run's backups
    assert journal.referenced() == {f"p/_tiering/backup/k1/{NAME}{s}" for s in (".log", ".index", ".txnindex")}


def test_version_1s_merge_and_unmerge() -> None:
    merge, unmerge = _v1("regroup-merge"), _v1("regroup-unmerge")
    assert (merge.in_place, merge.state, [s.base_offset for s in merge.sources]) == (False, JournalState.SWAPPED,
                                                                                      [0, 10])
    assert sorted(merge.staging()) == ["p/_tiering/staging/m1/orders-0/00000000000000000000.index",
                                       "p/_tiering/staging/m1/orders-0/00000000000000000000.log"]
    assert len(merge.backups()) == 4
    assert (unmerge.in_place, unmerge.restores_run, unmerge.backups(), unmerge.staging()) == (False, "m1", (), ())
    assert [t.base_offset for t in unmerge.targets] == [0, 10]
