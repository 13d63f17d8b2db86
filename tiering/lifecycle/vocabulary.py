"""The lifecycle's vocabulary, typed: what a plan does with a segment, the kinds of runs and operations,
journal states, what became of a segment and why it was left as it was, why work is pending, and how a
staged generation is accepted and swapped in. Every document and decision speaks in these enums; none
matches their text.
"""

from __future__ import annotations

from enum import Enum, StrEnum
from typing import Final


class Action(StrEnum):
    """What a plan does with a segment."""

    COMPACT = "compact"  # rewrite it with the run's codec (and re-batch, or clean its keys) and swap it in
    REPAIR = "repair"  # rebuild indexes the bucket lacks or holds wrong; the .log stays as it is
    SKIP = "skip"  # leave it as it is (its cause and reason say why)


class RunKind(StrEnum):
    """What a run does (its run document is ``runs/<run>/<kind>.json``)."""

    COMPACT = "compact"  # recompress (and re-batch) sealed segments
    COMPACT_KEYS = "compact-keys"  # one pass of Kafka's log cleaner over compacted topics
    ROLLBACK = "rollback"  # restore the originals a run replaced
    TIER = "tier"  # move objects to other storage classes
    MERGE = "merge"  # runs of small neighbouring segments merged into fewer, larger ones
    CLEANUP = "cleanup"  # what the grace period no longer keeps deleted


class OpKind(StrEnum):
    COMPACT = "compact"  # the originals replaced by a rewrite
    ROLLBACK = "rollback"  # a rewrite replaced by the originals kept in a backup
    MERGE = "merge"  # neighbouring segments replaced by one holding all their batches
    UNMERGE = "unmerge"  # a merged segment replaced by the segments it was made of (a merge's rollback)


class JournalState(StrEnum):
    STAGED = "staged"  # the new generation is in staging and verified; nothing final changed
    BACKED_UP = "backed-up"  # the originals are in the backup too; the swap may start
    SWAPPED = "swapped"  # a merge's new segments are in place as .swap objects: it only rolls forward now


class Status(StrEnum):
    """What became of one segment in a run."""

    COMPACTED = "compacted"
    ROLLED_BACK = "rolled-back"
    MERGED = "merged"  # merged with its neighbours into one segment (named by the first one's base offset)
    REPAIRED = "repaired"  # our indexes removed from beside a .log someone else put back
    STAGED = "staged"  # staged, not swapped in yet (a result of earlier versions' Spark staging)
    SKIPPED = "skipped"
    FAILED = "failed"
    ABORTED = "aborted"  # given up before the .log was replaced (it changed or vanished)
    SUPERSEDED = "superseded"  # swapped, then another writer replaced the segment: its objects are kept
    MOVED = "moved"  # storage tiering: objects moved to another storage class
    EXPIRED = "expired"  # cleanup: what runs kept of it (originals, staging objects) deleted past its age


class Counted(StrEnum):
    """Where a ledger entry's figures come from."""

    REPORT = "report"  # the run's savings report (its run document)
    STATE = "state"  # the partitions' states: the generations a run committed, found by a later run's scan (the
    # run itself ended before its report: killed, or run without one)


class Unrun(StrEnum):
    """What the report says of a planned segment no run outcome speaks for: a dry run's forecast of it, or
    a plan the run recorded nothing for. A report row's status is a :class:`Status` or one of these."""

    ESTIMATED = "estimated"  # a dry run: its stratum's sampled ratio applied to a planned segment
    LIKELY_SKIPPED = "likely skipped"  # a dry run: its stratum's sample saves nothing (or too little)
    PLANNED = "planned"  # a dry run: planned, but not estimated
    NOT_RUN = "not run"  # planned, and the run recorded no result for it


class Cause(StrEnum):
    """Why a segment is left as it is: what decisions read (the human reason beside it is the detail)."""

    ACTIVE = "active"  # the highest base offset of its partition
    TOO_YOUNG = "too young"  # uploaded (or, by a policy, written) too recently
    ALREADY_COMPACTED = "already compacted"
    ARCHIVED = "archived"
    INCOMPLETE = "incomplete"  # index files without a .log
    EMPTY = "empty"
    INVALID = "invalid"
    REMEMBERED = "remembered"  # a rewrite of this very object gave nothing, or it was invalid or unreadable
    POLICY = "policy"  # compression.type producer
    AUTO_DECLINED = "auto declined"  # no candidate codec pays off
    BUDGET = "budget"  # over --max-segments / --max-bytes
    NO_SAVINGS = "no savings"  # the rewrite would not shrink it
    BELOW_MIN_SAVINGS = "below min savings"  # it would shrink less than the policy's min.savings.ratio
    UNREADABLE = "unreadable"  # S3 will not give us the bytes (SSE-C without its key, an archived object)
    PROOF_FAILED = "proof failed"  # what we wrote, or what storage holds, is not the source's records
    NOTHING_TO_CLEAN = "nothing to clean"  # a key-compaction pass keeps every batch of it as it is
    UNCLEANABLE = "uncleanable"  # past a key-compaction pass's first uncleanable offset
    PASS_STOPPED = "pass stopped"  # noqa: S105 (a cause, not a password): a key-compaction pass stopped at an earlier segment of the partition
    UNSUPPORTED = "unsupported"  # work this version cannot do on that data (the reason says what)
    BUSY = "busy"  # another run holds the partition or an operation on the segment, or a writer changed it
    TRANSIENT = "transient"  # S3 or the network failed (throttling, 5xx, a connection cut): a later run retries
    ABANDONED = "abandoned"  # an operation given up before its swap: the segment is planned anew (or is gone)
    REPLACED = "replaced"  # swapped in, then another writer replaced the segment: its objects are kept
    NOT_RESTORABLE = "not restorable"  # a rollback finds the .log gone, or not the one the run put in place
    BACKUP_MISSING = "backup missing"  # a rollback's kept original is not there
    RESTORED = "restored"  # a rollback finds the segment put back already (by an earlier attempt)
    LATER_RUN = "later run"  # a later run replaced what a rollback would restore: that one is rolled back first
    REFUSED = "refused"  # the settings, the store or its permissions refuse the work (a configuration problem)
    LOCAL_ERROR = "local error"  # this machine's side: a full disk, an unwritable work directory
    NOTHING_TO_MOVE = "nothing to move"  # storage tiering: every object is in its class already
    NOTHING_TO_MERGE = "nothing to merge"  # no neighbour to merge with (large, alone, or past a gap in offsets)

    @classmethod
    def named(cls, text: object) -> Cause | None:
        """The cause whose value ``text`` is; None for any other text (a reason written before causes were)."""
        return cls(text) if isinstance(text, str) and text in cls.__members__.values() else None

    @property
    def label(self) -> str:
        """The cause as people read it beside a count ("5 over the budget")."""
        return _LABELS.get(self, self.value)


_LABELS: Final = {
    Cause.INCOMPLETE: "index without its .log",
    Cause.REMEMBERED: "nothing to gain, as an earlier run found",
    Cause.POLICY: "left as the producer wrote it (policy)",
    Cause.AUTO_DECLINED: "no codec pays off (auto)",
    Cause.BUDGET: "over the budget",
    Cause.BELOW_MIN_SAVINGS: "below min.savings.ratio",
    Cause.TRANSIENT: "S3 failing (retry)",
    Cause.REPLACED: "replaced by another writer",
    Cause.LATER_RUN: "replaced by a later key-compaction run",
}


# The causes a finished rewrite is not swapped in for: remembered, so the object is not read again.
NOTHING_TO_GAIN: Final = frozenset({Cause.NO_SAVINGS, Cause.BELOW_MIN_SAVINGS})


class Verify(StrEnum):
    """How a staged generation is accepted before anything final changes."""

    CHECKSUM = "checksum"  # S3 reports, for what it stored, the CRC-32C of the bytes the rewrite produced
    READ_BACK = "read-back"  # downloaded again and decoded: for stores without S3's additional checksums


class Swap(StrEnum):
    """How the new ``.log`` is put over the original, both conditional on the original's ETag."""

    COPY = "copy"  # a server-side CopyObject from staging with If-Match: no byte crosses the wire again
    PUT = "put"  # downloaded, checked and PUT with If-Match: for stores that ignore a copy's If-Match


class Pending(Enum):
    """Why work the run was asked to do is still to do, and what makes a later run succeed."""

    BUSY = "busy"  # another run held the partition, or a writer changed the segment: plan again, retry
    TRANSIENT = "transient"  # S3 or the network failed (throttling, 5xx, a connection cut): retry


class FileRole(StrEnum):
    """A segment's files, by the part each plays (its suffix names it: ``<base>.log``, ``<base>.index``, ...).
    An operation, a plan and a tiering move name the files they touch by these."""

    LOG = "log"  # the record batches
    INDEX = "index"  # the offset index
    TIMEINDEX = "timeindex"  # the time index
    TXNINDEX = "txnindex"  # the aborted transactions (only where the segment has some)


class TierAction(StrEnum):
    """What storage tiering does with an object: move it to another storage class, or leave it."""

    MOVE = "move"
    STAY = "stay"


class StayCause(StrEnum):
    """Why an object, or a whole segment, stays in its storage class (the reason beside it is the detail)."""

    NOT_TIERED = "not tiered"  # the segment: not sealed (active, empty, invalid, ...), or its age unreadable
    TOO_YOUNG = "not old enough"  # for any tier of its topic's policy
    ALREADY_THERE = "already there"  # in the target class, or a colder one
    TOO_SMALL = "under the minimum billable size"  # the target bills it as larger than it is
    MIN_DURATION = "under the minimum duration"  # moving it now bills the rest of its class's minimum days
    NO_SAVING = "no saving"  # per-object minimum size and metadata overhead outweigh the cheaper class


class StorageClass(StrEnum):
    """The S3 storage classes the platform reads, prices and moves objects to (S3 reports others too: a
    field that holds what S3 said stays a string, compared with these)."""

    STANDARD = "STANDARD"
    INTELLIGENT_TIERING = "INTELLIGENT_TIERING"
    STANDARD_IA = "STANDARD_IA"
    ONEZONE_IA = "ONEZONE_IA"
    GLACIER_IR = "GLACIER_IR"
    GLACIER = "GLACIER"
    DEEP_ARCHIVE = "DEEP_ARCHIVE"
