"""Key naming of the ``logdir`` layout, as pure functions (no S3 here).

    s3://BUCKET/PREFIX/<topic>-<partition>/<20-digit base offset>.{log,index,timeindex,txnindex,snapshot}
    s3://BUCKET/PREFIX/<topic>-<partition>/{leader-epoch-checkpoint,partition.metadata}   never touched
    s3://BUCKET/PREFIX/_tiering/...                                                        our own objects

Topic names may contain ``.``, ``_`` and ``-``: the partition number is what follows the LAST ``-``.
Kafka renames a partition directory it is deleting, moving or has found stray to
``<topic>-<partition>.<id>-delete`` / ``-future`` / ``-stray``; those, and internal topics (names
starting with ``__``), are left alone unless explicitly included. The reserved prefix has no
``-<partition>`` suffix, so it can never be read as a partition directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import Final

from tiering.errors import ConfigError
from tiering.kafka.files import CLEANED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, parse_segment_name, segment_name

RESERVED_DIR: Final = "_tiering"
PARTITION_FILES: Final = frozenset({"leader-epoch-checkpoint", "partition.metadata"})
# The partition number as Kafka writes it: ASCII digits without leading zeros (``alias-01`` is not
# partition 1 of ``alias``, and ``\d`` would take other scripts' digits too).
_NUMBER: Final = r"(?P<partition>0|[1-9][0-9]{0,9})"
_PARTITION_DIR: Final = re.compile(rf"(?P<topic>.+)-{_NUMBER}")
_SPECIAL_DIR: Final = re.compile(rf"(?P<topic>.+)-{_NUMBER}\.(?P<id>[^.]+)-(?P<kind>delete|future|stray)")
_TOPIC_CHARS: Final = re.compile(r"[A-Za-z0-9._-]{1,249}")


class DirKind(Enum):
    PARTITION = "partition"
    DELETE = "delete"  # Kafka is deleting it
    FUTURE = "future"  # a replica being moved between log directories
    STRAY = "stray"  # a replica the broker no longer hosts
    RESERVED = "reserved"  # our own prefix
    OTHER = "other"  # not Kafka's: never touched


@dataclass(frozen=True, slots=True)
class PartitionDir:
    name: str
    kind: DirKind
    topic: str | None = None
    partition: int | None = None

    @property
    def internal(self) -> bool:
        """Kafka's internal topics (``__consumer_offsets``, ``__cluster_metadata``, ...)."""
        return self.topic is not None and self.topic.startswith("__")


def parse_dir(name: str) -> PartitionDir:
    """What a directory name directly under PREFIX is."""
    if name == RESERVED_DIR:
        return PartitionDir(name, DirKind.RESERVED)
    special = _SPECIAL_DIR.fullmatch(name)
    if special is not None and _TOPIC_CHARS.fullmatch(special["topic"]):
        return PartitionDir(name, DirKind(special["kind"]), special["topic"], int(special["partition"]))
    plain = _PARTITION_DIR.fullmatch(name)
    if plain is not None and _TOPIC_CHARS.fullmatch(plain["topic"]):
        return PartitionDir(name, DirKind.PARTITION, plain["topic"], int(plain["partition"]))
    return PartitionDir(name, DirKind.OTHER)


def normalize_prefix(prefix: str) -> str:
    """``PREFIX`` without leading or trailing slashes (``""`` for the bucket's root)."""
    cleaned = prefix.strip("/")
    if "//" in cleaned:
        raise ConfigError("prefix has an empty path segment", expected="a/b/c", found=prefix)
    return cleaned


def _join(*parts: str) -> str:
    return "/".join(p for p in parts if p)


def partition_key(prefix: str, topic: str, partition: int) -> str:
    """The key prefix of a partition directory, with its trailing slash."""
    return _join(normalize_prefix(prefix), f"{topic}-{partition}") + "/"


def segment_key(prefix: str, topic: str, partition: int, base_offset: int, suffix: str) -> str:
    return dir_segment_key(prefix, f"{topic}-{partition}", base_offset, suffix)


def dir_segment_key(prefix: str, directory: str, base_offset: int, suffix: str) -> str:
    """The key of a segment file in the partition directory named ``directory`` as listed."""
    return _join(normalize_prefix(prefix), directory, segment_name(base_offset, suffix))


def sibling_key(key: str, suffix: str) -> str:
    """The key of the same segment's file with another suffix (``.../00000000000000000042.log`` ->
    ``.../00000000000000000042.index``), built from a key as listed."""
    stem, dot, _ = key.rpartition(".")
    if not dot:
        raise ValueError(f"not a segment file key: {key}")
    return stem + suffix


def swap_key(key: str) -> str:
    """The key a broker restoring the bucket reads as the new version of segment file ``key`` (Kafka's
    ``.swap`` files: :data:`tiering.kafka.files.SWAP_SUFFIX`)."""
    return key + SWAP_SUFFIX


def cleaned_key(prefix: str, directory: str, base_offset: int) -> str:
    """The ``<base>.log.cleaned`` key: while it exists, a broker restoring the bucket ignores every ``.swap``
    file at ``base_offset`` or above (:data:`tiering.kafka.files.CLEANED_SUFFIX`)."""
    return dir_segment_key(prefix, directory, base_offset, LOG_SUFFIX + CLEANED_SUFFIX)


# Our own objects, all under PREFIX/_tiering/:
JOURNAL_DIR: Final = "journal"  # journal/<dir>/<base>.json: one operation in flight per segment
STAGING_DIR: Final = "staging"  # staging/<run>/<dir>/<base>.<suffix>: new objects, verified before the swap
BACKUP_DIR: Final = "backup"  # backup/<run>/<dir>/<base>.<suffix>: the originals, kept for the grace period
LEASES_DIR: Final = "leases"  # leases/<dir>.json: a partition's lease
STATE_DIR: Final = "state"  # state/<dir>.json: what each segment of the partition became
RUNS_DIR: Final = "runs"  # runs/<run>/...: a run's plan, results and documents
REPORTS_DIR: Final = "reports"  # reports/<run or latest>/report.<fmt>, reports/ledger.json


def partition_prefix(prefix: str, directory: str) -> str:
    """The listing prefix of a partition directory (``PREFIX/<topic>-<partition>/``)."""
    return _join(normalize_prefix(prefix), directory) + "/"


def clock_key(prefix: str) -> str:
    """The object whose PUT reads S3's clock (leases and grace periods never use a local one)."""
    return reserved_key(prefix, "clock")


def journal_key(prefix: str, directory: str, base_offset: int) -> str:
    return reserved_key(prefix, JOURNAL_DIR, directory, segment_name(base_offset, ".json"))


def journal_dir(prefix: str, directory: str | None = None) -> str:
    """The listing prefix of the journal: of one partition, or of all (ends with ``/``)."""
    return reserved_key(prefix, JOURNAL_DIR, *([directory] if directory else [])) + "/"


def staging_key(prefix: str, run_id: str, directory: str, base_offset: int, suffix: str) -> str:
    return reserved_key(prefix, STAGING_DIR, run_id, directory, segment_name(base_offset, suffix))


def probe_key(prefix: str, run_id: str, token: str, what: str = "copy-if-match") -> str:
    """A scratch object a run writes to learn ``what`` the store enforces (in staging: cleanup removes
    strays); ``token`` makes it one no other probe writes."""
    return probe_dir(prefix, run_id) + f"{what}-{token}"


def backup_key(prefix: str, run_id: str, directory: str, base_offset: int, suffix: str) -> str:
    return reserved_key(prefix, BACKUP_DIR, run_id, directory, segment_name(base_offset, suffix))


def kept_segment(run_root: str, key: str) -> tuple[str, int] | None:
    """The partition directory and the segment (base offset) a run's kept object ``key`` belongs to, read
    under ``run_root`` (``staging/<run>/`` or ``backup/<run>/``, as listed); None for anything else (a
    probe's scratch object)."""
    directory, _, name = key[len(run_root):].partition("/") if key.startswith(run_root) else ("", "", "")
    parsed = parse_segment_name(name) if directory and "/" not in name else None
    return (directory, parsed[0]) if parsed is not None else None


def probe_dir(prefix: str, run_id: str) -> str:
    """The listing prefix of run ``run_id``'s probes' scratch objects (ends with ``/``)."""
    return reserved_dir(prefix, STAGING_DIR, run_id, "probe")


def reserved_dir(prefix: str, *parts: str) -> str:
    """The listing prefix of one of our directories (``backup/<run>``, ``staging``, ...; ends with ``/``)."""
    return reserved_key(prefix, *parts) + "/"


def lease_key(prefix: str, directory: str) -> str:
    return reserved_key(prefix, LEASES_DIR, f"{directory}.json")


def leases_dir(prefix: str) -> str:
    """The listing prefix of every partition's lease (ends with ``/``)."""
    return reserved_dir(prefix, LEASES_DIR)


def state_key(prefix: str, directory: str) -> str:
    return reserved_key(prefix, STATE_DIR, f"{directory}.json")


def state_dir(prefix: str) -> str:
    """Where every partition's state document is (listed to find the partitions a run left marks in)."""
    return reserved_dir(prefix, STATE_DIR)


def state_directory(prefix: str, key: str) -> str | None:
    """The partition directory whose state document ``key`` is (None: not a state document)."""
    root = state_dir(prefix)
    name = key[len(root):] if key.startswith(root) else ""
    return name.removesuffix(".json") if name.endswith(".json") and "/" not in name else None


# A run's documents, all under runs/<run>/:
#   <kind>.json                     the run document (kind: a RunKind's value: compact, compact-keys, ...)
#   <plan>/manifest.json            a chunked plan (scan, policy, plan): settings, totals, chunk list
#   <plan>/part-NNNNN.jsonl.gz      its chunks, one planned segment per line
#   <step>/<name>.json              step documents (StepDir): a unit's, a chunk's or a step's results
#   <step>-plan/part-NNNNN.jsonl.gz the plan chunks of a run of the engine's kinds, one partition's work a line
#   tier-plan.json                  a storage-tiering run's plan
#   plan.json                       the whole plan, as the CLI of an earlier version kept it (read only)
PLAN_MANIFEST: Final = "manifest.json"
_CHUNK_SUFFIX: Final = ".jsonl.gz"


class PlanName(StrEnum):
    """A run's chunked plans."""

    SCAN = "scan"  # every segment listed, with its verdict
    POLICY = "policy"  # the scan with a policy's record-age verdicts (between the plan's two passes)
    PLAN = "plan"  # what the run does


class StepDir(StrEnum):
    """The directories of a run's step documents, one JSON document each."""

    COMPACT = "compact"  # compact/<unit>.json: a compaction unit's partitions
    USAGE = "usage"  # usage/<step>.json: the S3 requests of a step outside any partition's work
    KEYS = "keys"  # keys/<unit>.json: a key-compaction unit's partition passes
    ROLLBACK = "rollback"  # rollback/<unit>.json: a rollback unit's partitions
    MERGE = "merge"  # merge/<unit>.json: a merge unit's partitions
    TIER = "tier"  # tier/<unit>.json: a storage-tiering unit's partitions
    CLEANUP = "cleanup"  # cleanup/<unit>.json: a cleanup unit's partitions


def _run_key(prefix: str, run_id: str, *parts: str) -> str:
    return reserved_key(prefix, RUNS_DIR, run_id, *parts)


def run_dir(prefix: str, run_id: str) -> str:
    """The listing prefix of all of a run's documents (ends with ``/``)."""
    return _run_key(prefix, run_id) + "/"


def run_result_key(prefix: str, run_id: str, kind: str) -> str:
    """The run document of a run of ``kind`` (a :class:`~tiering.lifecycle.vocabulary.RunKind`)."""
    return _run_key(prefix, run_id, f"{kind}.json")


def plan_dir(prefix: str, run_id: str, name: PlanName) -> str:
    """The listing prefix of the chunked plan ``name`` of a run (ends with ``/``)."""
    return _run_key(prefix, run_id, name.value) + "/"


def plan_manifest_key(prefix: str, run_id: str, name: PlanName) -> str:
    return _run_key(prefix, run_id, name.value, PLAN_MANIFEST)


def plan_chunk_name(index: int) -> str:
    """The name of a plan's ``index``-th chunk (counted from 0)."""
    return f"part-{index:05d}"


def plan_chunk_key(prefix: str, run_id: str, name: PlanName, chunk: str) -> str:
    return _run_key(prefix, run_id, name.value, chunk + _CHUNK_SUFFIX)


def keys_unit_name(index: int) -> str:
    """The name of a key-compaction or merge run's ``index``-th unit (counted from 0)."""
    return f"unit-{index:05d}"


def work_plan_dir(prefix: str, run_id: str, step: StepDir) -> str:
    """The listing prefix of the plan chunks of a run whose units' documents go to ``step`` (ends with ``/``)."""
    return _run_key(prefix, run_id, f"{step.value}-plan") + "/"


def work_plan_chunk_key(prefix: str, run_id: str, step: StepDir, index: int) -> str:
    """The ``index``-th plan chunk (counted from 0) of such a run: one partition's work per line."""
    return _run_key(prefix, run_id, f"{step.value}-plan", plan_chunk_name(index) + _CHUNK_SUFFIX)


def step_dir(prefix: str, run_id: str, step: StepDir) -> str:
    """The listing prefix of a run's documents of one step (ends with ``/``)."""
    return _run_key(prefix, run_id, step.value) + "/"


def step_key(prefix: str, run_id: str, step: StepDir, name: str) -> str:
    return _run_key(prefix, run_id, step.value, f"{name}.json")


def tier_plan_key(prefix: str, run_id: str) -> str:
    """A storage-tiering run's plan."""
    return _run_key(prefix, run_id, "tier-plan.json")


def whole_plan_key(prefix: str, run_id: str) -> str:
    """The one-document plan an earlier version of the CLI kept beside its run document."""
    return _run_key(prefix, run_id, "plan.json")


def report_key(prefix: str, run_id: str, fmt: str = "json") -> str:
    """A run's report (``run_id`` may be ``latest``) in one of its formats."""
    return reserved_key(prefix, REPORTS_DIR, run_id, f"report.{fmt}")


def tier_report_key(prefix: str, run_id: str, fmt: str) -> str:
    """A storage-class tiering run's report (``json`` or ``md``)."""
    return reserved_key(prefix, REPORTS_DIR, run_id, f"tiering.{fmt}")


def ledger_key(prefix: str) -> str:
    return reserved_key(prefix, REPORTS_DIR, "ledger.json")


def reserved_key(prefix: str, *parts: str) -> str:
    """A key under our one reserved prefix (leases, staging, journal, kept originals, results, reports)."""
    return _join(normalize_prefix(prefix), RESERVED_DIR, *parts)
