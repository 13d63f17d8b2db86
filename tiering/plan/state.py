"""Our record of what each partition's segments became: ``PREFIX/_tiering/state/<topic>-<partition>.json``.

One small document per partition, written only by the holder of the partition's lease, with a
compare-and-swap (``If-Match``) all the same. The scanner reads it to tell "already compacted" without a
HEAD per object, and to notice a ``.log`` that someone replaced after we compacted it (its ETag is no
longer the one we wrote). Entries are keyed by the segment's base offset:

    {"codec", "level", "run_id", "log_etag", "index_etag", "timeindex_etag", "source_log_etag",
     "bytes_before", "bytes_after"}
"""

from __future__ import annotations

from typing import Any, Final

from tiering.errors import TieringError
from tiering.storage.layout import state_key
from tiering.storage.store import ObjectNotFound, PreconditionFailed, S3Store

STATE_SCHEMA_VERSION: Final = 1
CAS_ATTEMPTS: Final = 5


def _read(store: S3Store, key: str) -> tuple[dict[str, Any], str | None]:
    try:
        doc, etag = store.get_json(key)
    except ObjectNotFound:
        return {"schema_version": STATE_SCHEMA_VERSION, "segments": {}}, None
    if not isinstance(doc, dict) or doc.get("schema_version") != STATE_SCHEMA_VERSION:
        raise TieringError("partition state document of an unknown version", path=f"s3://{store.bucket}/{key}",
                           expected=STATE_SCHEMA_VERSION, found=doc.get("schema_version") if isinstance(doc, dict)
                           else type(doc).__name__)
    return doc, etag


def load_state(store: S3Store, prefix: str, directory: str) -> dict[str, Any]:
    """The partition's segment entries by base offset (as a string); empty when we never touched it."""
    segments: dict[str, Any] = _read(store, state_key(prefix, directory))[0]["segments"]
    return segments


def record_segment(store: S3Store, prefix: str, directory: str, base_offset: int,
                   entry: dict[str, Any] | None) -> None:
    """Set (or with None remove) one segment's entry, retrying the compare-and-swap if the document moved."""
    key = state_key(prefix, directory)
    for _ in range(CAS_ATTEMPTS):
        doc, etag = _read(store, key)
        if entry is None:
            if str(base_offset) not in doc["segments"]:
                return
            doc["segments"].pop(str(base_offset))
        else:
            if doc["segments"].get(str(base_offset)) == entry:
                return
            doc["segments"][str(base_offset)] = entry
        try:
            if etag is None:
                store.put_json(key, doc, if_none_match=True)
            else:
                store.put_json(key, doc, if_match=etag)
            return
        except PreconditionFailed:
            continue
    raise TieringError("the partition state document kept changing under us", path=f"s3://{store.bucket}/{key}",
                       expected=f"a stable document within {CAS_ATTEMPTS} attempts", found="concurrent writers")
