"""The proofs of staged and backed-up copies, before anything final changes.

A staged ``.log`` read back is held to the size and records digest of the rewrite and its indexes to a
rebuild; a copy about to be put in place is held to the ETag and size it was verified with at staging (a
server-side copy), or downloaded and checked against its CRC-32C or decoded in full (a PUT of it); a
backup swapped back by a rollback is decoded and must hold the records the state entry names.
"""

from __future__ import annotations

import shutil
from typing import BinaryIO

import crc32c

from tiering.commit.operation import COPY_CHUNK, Context, spool_file, uri
from tiering.errors import ProofError
from tiering.kafka.rewrite import read_back
from tiering.lifecycle.journal import Journal
from tiering.lifecycle.vocabulary import FileRole, Verify
from tiering.storage.objects import (
    ObjectStore,
    PreconditionFailed,
    crc32c_b64,
)


def check_read_back(store: ObjectStore, new: dict[FileRole, str], size: int, digest: str, offset_index: bytes,
                     time_index: bytes, expected_size: int, expected_digest: str) -> None:
    where = uri(store, new[FileRole.LOG])
    if size != expected_size:
        raise ProofError("the staged .log read back has another size", path=where, expected=expected_size,
                         found=size)
    if digest != expected_digest:
        raise ProofError("the staged .log does not hold the source's records", path=where,
                         expected=f"records xxh3 {expected_digest}", found=digest)
    for name, want in ((FileRole.INDEX, offset_index), (FileRole.TIMEINDEX, time_index)):
        got = store.get(new[name])
        if got != want:
            raise ProofError(f"the staged .{name} is not the rebuild of the staged .log", path=uri(store, new[name]),
                             expected=f"{len(want)} bytes", found=f"{len(got)} bytes")


def download_verified(ctx: Context, journal: Journal) -> BinaryIO:
    """The new ``.log`` of a journal entry (staged, or a backup), copied to a spool file and checked again:
    against the CRC-32C it was staged with when S3 reported it (its records were proved as it was written,
    and S3 holds those very bytes), else by decoding it (every CRC and record, the records digest)."""
    store, new = ctx.store, journal.targets[0].log
    assert new.copy is not None
    key = new.copy
    spool = spool_file(ctx)
    try:
        if new.crc32c is not None and ctx.verify is Verify.CHECKSUM:
            crc = 0
            with store.open(key, if_match=new.etag) as body:
                while chunk := body.read(COPY_CHUNK):
                    spool.write(chunk)
                    crc = crc32c.crc32c(chunk, crc)
            if crc != new.crc32c:
                raise ProofError("the staged .log downloaded is not the one staged", path=uri(store, key),
                                 expected=f"CRC-32C {crc32c_b64(new.crc32c)}", found=crc32c_b64(crc))
            spool.seek(0)
            return spool
        with store.open(key, if_match=new.etag) as body:
            shutil.copyfileobj(body, spool, COPY_CHUNK)
        spool.seek(0)
        back = read_back(spool, base_offset=journal.base_offset, path=uri(store, key),
                         decompression_limit=ctx.decompression_limit)
        expected = journal.payload_xxh3
        if expected and back.payload_xxh3 != expected:
            raise ProofError("the object to put in place does not hold the expected records", path=uri(store, key),
                             expected=f"records xxh3 {expected}", found=back.payload_xxh3)
        spool.seek(0)
        return spool
    except PreconditionFailed:  # the GET is pinned to the ETag verified at staging: another object is there
        spool.close()
        raise ProofError("the staged .log is not the one verified", path=uri(store, key),
                         expected=f"ETag {new.etag}") from None
    except BaseException:
        spool.close()
        raise


def copy_source(ctx: Context, journal: Journal) -> str:
    """The ETag of the new ``.log`` to copy into place, checked first: a staged copy must be the very version
    verified when it was staged (its ETag and size); a backup (a rollback) is decoded here, every CRC and
    record, and must hold the records the state entry names. The copy is then held to that ETag."""
    store, new = ctx.store, journal.targets[0].log
    assert new.copy is not None
    key = new.copy
    info = store.head(key)
    if new.etag is not None:
        if info.etag.strip('"') != new.etag.strip('"') or info.size != new.size:
            raise ProofError("the staged .log is not the one verified", path=uri(store, key),
                             expected=f"ETag {new.etag}, {new.size} bytes",
                             found=f"ETag {info.etag}, {info.size} bytes")
        return info.etag
    with store.open(key, if_match=info.etag) as body:
        back = read_back(body, base_offset=journal.base_offset, path=uri(store, key), size=info.size,
                         decompression_limit=ctx.decompression_limit)
    if journal.payload_xxh3 and back.payload_xxh3 != journal.payload_xxh3:
        raise ProofError("the object to put in place does not hold the expected records", path=uri(store, key),
                         expected=f"records xxh3 {journal.payload_xxh3}", found=back.payload_xxh3)
    return info.etag
