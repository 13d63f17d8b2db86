"""The journal entry as a typed document: its JSON form is stable, and a bad one is named, not crashed on."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tiering.errors import ConfigError
from tiering.lifecycle.journal import Journal, Recorded
from tiering.lifecycle.vocabulary import JournalState, OpKind

# An entry exactly as the dict-built journal of the previous version wrote it (a run in flight across an
# upgrade must still be finished).
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


def test_an_entry_written_before_reads_back_and_writes_the_same_json() -> None:
    journal = Journal.from_json(copy.deepcopy(WRITTEN_BEFORE), where="s3://b/k")
    assert (journal.kind, journal.state, journal.base_offset) == (OpKind.COMPACT, JournalState.STAGED, 42)
    assert journal.new.log_size == 400
    assert journal.attrs["log"].tags == {"t": "1"}
    assert journal.entry == Recorded(1000, 400, "r1", codec="zstd", level=3)
    assert journal.to_json() == WRITTEN_BEFORE


def test_an_entry_of_a_key_compaction_pass_reads_typed() -> None:
    """A key-compaction pass's entry: no codec or level (written as nulls), and the pass's figures, which
    the state does not keep, beside them."""
    doc = copy.deepcopy(WRITTEN_BEFORE)
    doc["entry"] = {"codec": None, "level": None, "key_compaction": {"records_in": 10, "records_out": 4},
                    "run_id": "r1", "source_log_etag": '"e1"', "bytes_before": 1000, "bytes_after": 400,
                    "payload_xxh3": "cd" * 16}
    journal = Journal.from_json(doc, where="s3://b/k")
    assert journal.entry == Recorded(1000, 400, "r1", '"e1"', None, None, "cd" * 16)
    assert journal.to_json()["entry"] == {"run_id": "r1", "source_log_etag": '"e1"', "bytes_before": 1000,
                                          "bytes_after": 400, "payload_xxh3": "cd" * 16}


def test_a_transition_is_a_new_entry() -> None:
    journal = Journal.from_json(copy.deepcopy(WRITTEN_BEFORE), where="s3://b/k")
    moved = journal.advanced(JournalState.BACKED_UP)
    assert (journal.state, moved.state) == (JournalState.STAGED, JournalState.BACKED_UP)
    assert moved.to_json()["state"] == "backed-up"


@pytest.mark.parametrize(("doc", "message"), [
    ({**WRITTEN_BEFORE, "schema_version": 2}, "not a journal entry this version can read"),
    ([1, 2], "not a journal entry this version can read"),
    ({k: v for k, v in WRITTEN_BEFORE.items() if k != "final"}, "malformed"),
    ({**WRITTEN_BEFORE, "state": "half-done"}, "malformed"),
])
def test_an_unknown_or_malformed_entry_is_named(doc: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Journal.from_json(doc, where="s3://b/journal/x.json")
    assert caught.value.path == "s3://b/journal/x.json"
