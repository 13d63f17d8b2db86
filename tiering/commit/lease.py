"""Partition leases: at most one run stages or commits a partition at a time (invariant 4).

A lease is a small JSON object at ``PREFIX/_tiering/leases/<topic>-<partition>.json``:

- acquire: ``PutObject`` with ``If-None-Match: *`` (exactly one contender creates it);
- renew: ``PutObject`` with ``If-Match: <our ETag>`` (fails, and we stop, if anyone took it over);
- expiry: by S3's clock only: the lease's ``LastModified`` plus its TTL is before S3's current time (the
  ``Date`` of a response), so hosts with wrong clocks cannot steal a live lease;
- takeover of an expired lease: ``PutObject`` with ``If-Match: <the expired lease's ETag>``: of several
  contenders exactly one wins, and a holder that renewed in the meantime makes them all lose;
- the same owner (a retried task of the same run) takes its own lease back at once;
- release: ``DeleteObject`` with ``If-Match: <our ETag>`` (never deletes a successor's lease);
- at its end a run releases every lease it still holds (:func:`release_leases_of`: one a unit kept for a
  later step, one a killed attempt left, which a retry under the same id finished without needing), and the
  cleanup releases those a finished run could not (:func:`release_finished`).

Renewal is cooperative: the worker calls :meth:`Lease.keep_alive` at checkpoints (every MiB of a
rewrite, before every commit step). The local monotonic clock only decides WHEN to renew; whether a
lease is alive is always judged by S3's clock. Before each step that changes a final key, the protocol
calls :meth:`Lease.check`, which renews unconditionally: a holder that lost its lease stops there.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal, Protocol

from tiering.documents import Document, read, to_builtins
from tiering.errors import ConfigError, ConflictError, StorageError, TieringError
from tiering.options import LEASE_TTL
from tiering.storage.layout import clock_key, leases_dir
from tiering.storage.objects import ObjectInfo, ObjectNotFound, ObjectStore, PreconditionFailed

DEFAULT_TTL_SECONDS: Final[int] = LEASE_TTL.default
ACQUIRE_ATTEMPTS: Final = 4


class LeaseHeld(ConflictError):
    """Another run holds the partition's lease (the partition is skipped, not failed)."""


class LeaseLost(ConflictError):
    """Our lease was taken over (it expired while we were stalled): stop touching the partition."""


class LeaseRecord(Document, frozen=True, tag="tiering.lease"):
    """The lease document (``leases/<topic>-<partition>.json``): who holds the partition and for how long
    after the object's ``LastModified`` (S3's clock: every renewal rewrites it). ``token`` makes each
    write's bytes, and so its ETag, unique."""

    owner: str
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    host: str = ""
    renewals: int = 0
    token: str = ""
    schema_version: Literal[1] = 1

    @classmethod
    def held(cls, doc: object) -> LeaseRecord | None:
        """The record ``doc`` is, or None for a document that is not one (held by nobody we can name: it
        expires by the default TTL)."""
        if not isinstance(doc, Mapping):
            return None
        try:
            return read(doc, cls, what="a lease")
        except ConfigError:
            return None


def lease_ttl(doc: object, record: LeaseRecord | None) -> int:
    """How long a lease lives after its last renewal: its record's TTL; for a document that does not read as
    one (another version's, with a field this one does not know), the longer of the default and a TTL it
    states, so that a live holder running a longer TTL is never taken over early."""
    if record is not None:
        return record.ttl_seconds
    stated = doc.get("ttl_seconds") if isinstance(doc, Mapping) else None
    return max(DEFAULT_TTL_SECONDS, stated) if isinstance(stated, int) and not isinstance(stated, bool) else \
        DEFAULT_TTL_SECONDS


@dataclass
class Lease:
    store: ObjectStore
    key: str
    owner: str
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    etag: str | None = None
    renewals: int = 0
    _renewed_at: float = field(default=0.0, repr=False)

    def _body(self) -> dict[str, object]:
        return to_builtins(LeaseRecord(self.owner, self.ttl_seconds, socket.gethostname(), self.renewals,
                                       secrets.token_hex(8)))

    def acquire(self, prefix: str) -> None:
        """Create the lease, take back our own, or take over an expired one; :class:`LeaseHeld` otherwise.

        Every race ends in one of those: a lease released between our refused create and our read is
        created again, one that changes while we read it is read again (a few times at most)."""
        for _ in range(ACQUIRE_ATTEMPTS):
            try:
                self.etag = self.store.put_json(self.key, self._body(), if_none_match=True)
            except PreconditionFailed:
                if not self._take_over(prefix):
                    continue
            self._renewed_at = time.monotonic()
            return
        raise LeaseHeld(f"the partition's lease changed under us {ACQUIRE_ATTEMPTS} times in a row (other runs "
                        "contend for it)", path=self._where())

    def _take_over(self, prefix: str) -> bool:
        """Take the existing lease if it is ours or expired (True); False when it moved while we looked."""
        try:
            doc, etag = self.store.get_json(self.key)
            info = self.store.head(self.key)
        except ObjectNotFound:  # released in between
            return False
        if info.etag != etag:
            return False
        record = LeaseRecord.held(doc)
        owner = record.owner if record is not None else "?"
        if owner != self.owner:
            ttl = lease_ttl(doc, record)
            age = self.store.now(clock_key(prefix)) - info.last_modified
            if age <= timedelta(seconds=ttl):
                left = ttl - age.total_seconds()
                raise LeaseHeld(f"run {owner} holds the partition's lease (renewed {age.total_seconds():.0f} s "
                                f"ago by S3's clock; it expires in {left:.0f} s unless renewed)", path=self._where())
        try:
            self.etag = self.store.put_json(self.key, self._body(), if_match=etag)
        except (PreconditionFailed, ObjectNotFound):  # another contender won, or the holder released it
            return False
        return True

    def check(self) -> None:
        """Renew now; :class:`LeaseLost` when someone else holds the lease."""
        if self.etag is None:
            raise LeaseLost("the lease is not held", path=self._where())
        self.renewals += 1
        try:
            self.etag = self.store.put_json(self.key, self._body(), if_match=self.etag)
        except (PreconditionFailed, ObjectNotFound):
            self.etag = None
            raise LeaseLost("the partition's lease was taken over: another run owns the partition now",
                            path=self._where()) from None
        self._renewed_at = time.monotonic()

    def keep_alive(self) -> None:
        """Renew when a third of the TTL has passed since the last renewal (local time decides only when)."""
        if time.monotonic() - self._renewed_at >= self.ttl_seconds / 3:
            self.check()

    def release(self) -> None:
        """Delete our lease. A successor's lease is not ours to delete; a release that fails on the way
        (S3 or the network) leaves the lease to expire by its TTL, or to be taken back by a retry of this run."""
        if self.etag is not None:
            with contextlib.suppress(PreconditionFailed, StorageError):
                self.store.delete(self.key, if_match=self.etag, missing_ok=True)
            self.etag = None

    def _where(self) -> str:
        return f"s3://{self.store.bucket}/{self.key}"


class LeaseGuard(Protocol):
    """What the per-segment protocol needs of a lease: renew when due, and stop if it is lost."""

    def keep_alive(self) -> None: ...

    def check(self) -> None: ...


def held_leases(store: ObjectStore, prefix: str) -> Iterator[tuple[ObjectInfo, LeaseRecord | None]]:
    """Every partition's lease as listed, with its record (None for one that is not a lease record); a lease
    released or renewed since the listing is left out (its holder is alive)."""
    for info in store.list(leases_dir(prefix)):
        try:
            doc, etag = store.get_json(info.key)
        except ObjectNotFound:
            continue
        except TieringError:  # not a JSON document (a console's folder marker), or not readable now: no
            yield info, None  # holder we can name, nothing to release
            continue
        if etag == info.etag:
            yield info, LeaseRecord.held(doc)


def _delete_if_unchanged(store: ObjectStore, info: ObjectInfo) -> bool:
    try:
        store.delete(info.key, if_match=info.etag, missing_ok=True)
    except PreconditionFailed:  # renewed or taken over since it was read: not ours to delete now
        return False
    return True


def release_leases_of(store: ObjectStore, prefix: str, owner: str) -> int:
    """Release every lease ``owner`` (a run id) holds, as that run ends; how many there were. A lease renewed
    or taken over since it was read stays."""
    return sum(_delete_if_unchanged(store, info) for info, record in held_leases(store, prefix)
               if record is not None and record.owner == owner)


def release_finished(store: ObjectStore, prefix: str, finished_at: Callable[[str], datetime | None]) -> int:
    """Release the leases of runs that finished (``finished_at``: when the run's document was written, None
    for a run with none) and that no attempt renewed since: a run whose end could not release them (S3
    failing then: the release is best effort, the document is written all the same), or a holder of the
    run's id that renewed its lease while the run ended and then died. How many were released."""
    released = 0
    for info, record in held_leases(store, prefix):
        done = finished_at(record.owner) if record is not None else None
        if done is not None and info.last_modified <= done:
            released += _delete_if_unchanged(store, info)
    return released
