"""Per-topic policies with Kafka's semantics: a cluster default, per-topic overrides, one YAML file.

    version: 1
    cluster:                            # the defaults every topic inherits (like a broker's config)
      compression.type: zstd            # zstd lz4 snappy gzip uncompressed|none producer auto
      compression.level: 3              # for the compression.type of this entry (only with one)
      compression.gzip.level: 9         # one codec's level, whichever entry picks the codec
      min.savings.ratio: 0.05           # leave a segment alone unless it shrinks by at least 5 %
      min.segment.age.hours: 1          # by the segment's newest record (its max timestamp)
      storage.tiers:                    # storage class by the age of the newest record
        - {after.days: 30, storage.class: STANDARD_IA}
        - {after.days: 90, storage.class: GLACIER_IR}
      storage.allow.archive: false      # GLACIER / DEEP_ARCHIVE only when true (unreadable without a restore)
      auto.candidates: [zstd:3, zstd:9, lz4, gzip:6]
      auto.horizon.months: 12           # savings counted for auto's choice (no longer than the retention)
      rebatch.enable: false             # merge runs of small batches (docs/rebatching.md)
      rebatch.max.bytes: 1048576        # a merged batch's bound, and never above max.message.bytes
      max.message.bytes: 1048588        # the topic's own limit, when it sets one (Kafka's name and meaning)
      cleanup.policy: delete            # the topic's, as Kafka names it: delete, compact or compact,delete
      compact.enable: false             # key-compact the archive of a compacted topic (docs/key-compaction.md)
      delete.retention.ms: 86400000     # tombstones and markers stay this long after a pass stamped them
      min.compaction.lag.ms: 0          # records this young (from the partition's newest) are not cleaned
      merge.enable: false               # merge runs of small neighbouring segments (docs/merging.md)
      merge.target.bytes: null          # a merged segment's bound (null: the topic's segment.bytes)
      segment.bytes: 1073741824         # the topic's, as Kafka names it (its default)
      segment.index.bytes: 10485760     # the topic's, as Kafka names it (its default)
    topics:
      - topic: payments.encrypted       # an exact name
        compression.type: producer
      - regex: 'clickstream\\..*'       # a regular expression the whole topic name must match
        compression.type: auto

Precedence, key by key (as Kafka resolves a topic config over the broker default): the topic's exact entry,
then the FIRST regex entry in file order whose pattern matches the whole name, then ``cluster``, then the
built-in default. An entry sets only the keys it names; ``storage.tiers`` is one key (a list replaces the
inherited list as a whole). A level belongs to a codec: ``compression.level`` goes with the
``compression.type`` of its own entry (a topic that picks another codec does not inherit it), and
``compression.<codec>.level`` sets that codec's level wherever the codec is chosen.

Every problem is a :class:`PolicyError` naming the key and what was wrong, raised by :func:`load_policy`
before any work starts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from tiering.errors import ConfigError
from tiering.kafka.batch import V2_HEADER_SIZE
from tiering.kafka.codecs import LEVEL_RANGE, Codec
from tiering.kafka.rebatch import DEFAULT_MAX_BYTES as DEFAULT_REBATCH_BYTES
from tiering.lifecycle.vocabulary import StorageClass

POLICY_VERSION: Final = 1
PRODUCER: Final = "producer"
AUTO: Final = "auto"
COMPRESSION_TYPES: Final = ("zstd", "lz4", "snappy", "gzip", "uncompressed", "none", PRODUCER, AUTO)
# Colder classes later (StorageClass's order): a tier list must move objects only this way, each step after more
# days.
STORAGE_ORDER: Final = tuple(StorageClass)
ARCHIVE_CLASSES: Final = frozenset({StorageClass.GLACIER, StorageClass.DEEP_ARCHIVE})
DEFAULT_AUTO_CANDIDATES: Final = ("zstd:3", "zstd:9", "zstd:19", "lz4", "gzip:6")
BUILT_IN: Final[dict[str, Any]] = {
    "compression.type": "zstd",
    "compression.level": None,
    "min.savings.ratio": 0.0,
    "min.segment.age.hours": 0.0,
    "storage.tiers": [],
    "storage.allow.archive": False,
    "auto.candidates": list(DEFAULT_AUTO_CANDIDATES),
    "auto.horizon.months": 12.0,  # how long a rewrite's savings count for auto (at most the topic's retention)
    "rebatch.enable": False,
    "rebatch.max.bytes": DEFAULT_REBATCH_BYTES,
    "max.message.bytes": None,  # the topic's limit on a batch (None: the topic sets none here)
    "cleanup.policy": "delete",
    "compact.enable": False,  # key compaction is opt-in, and only for topics whose cleanup.policy has compact
    "delete.retention.ms": 86_400_000,  # Kafka's default
    "min.compaction.lag.ms": 0,
    "merge.enable": False,  # merging small neighbouring segments is opt-in
    "merge.target.bytes": None,  # None: the topic's segment.bytes
    "segment.bytes": 1 << 30,  # Kafka's defaults
    "segment.index.bytes": 10 << 20,
}
CLEANUP_POLICIES: Final = ("delete", "compact", "compact,delete")
INT32_MAX: Final = (1 << 31) - 1
PER_CODEC_LEVEL: Final = {f"compression.{c.label}.level": c for c in LEVEL_RANGE}
KEYS: Final = frozenset(BUILT_IN) | frozenset(PER_CODEC_LEVEL)
SOURCE_BUILT_IN: Final = "built-in default"
SOURCE_CLUSTER: Final = "cluster"


class PolicyError(ConfigError):
    """The policy file is not valid; the message names the key and the problem."""


@dataclass(frozen=True, slots=True)
class Tier:
    after_days: float
    storage_class: str


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """A topic's effective settings, and where each came from (``sources``: key -> scope)."""

    topic: str
    compression_type: str  # a codec label, "producer" or "auto"
    level: int | None  # the codec's level (None: Kafka's default, or no codec)
    min_savings_ratio: float
    min_age_hours: float
    tiers: tuple[Tier, ...]
    allow_archive: bool
    auto_candidates: tuple[tuple[str, int | None], ...]
    auto_horizon_months: float = 12.0
    sources: Mapping[str, str] = field(default_factory=dict)
    rebatch_enable: bool = False
    rebatch_max_bytes_key: int = DEFAULT_REBATCH_BYTES  # rebatch.max.bytes as set
    max_message_bytes: int | None = None
    cleanup_policy: str = "delete"
    compact_enable: bool = False
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    merge_enable: bool = False
    merge_target_bytes_key: int | None = None  # merge.target.bytes as set
    segment_bytes: int = 1 << 30
    segment_index_bytes: int = 10 << 20

    @property
    def merge_target_bytes(self) -> int:
        """A merged segment's bound: ``merge.target.bytes``, else the topic's ``segment.bytes``."""
        return self.merge_target_bytes_key if self.merge_target_bytes_key is not None else self.segment_bytes

    @property
    def key_compaction(self) -> bool:
        """Whether ``tiering s3 compact-keys`` cleans this topic: opted in, and compacted by Kafka."""
        return self.compact_enable and "compact" in self.cleanup_policy.split(",")

    @property
    def rebatch_max_bytes(self) -> int | None:
        """A merged batch's bound for this topic (``rebatch.max.bytes``, lowered to ``max.message.bytes``), or
        None when re-batching is off."""
        if not self.rebatch_enable:
            return None
        if self.max_message_bytes is None:
            return self.rebatch_max_bytes_key
        return min(self.rebatch_max_bytes_key, self.max_message_bytes)

    @property
    def codec(self) -> Codec | None:
        """The target codec, or None for ``producer`` / ``auto`` (decided elsewhere)."""
        if self.compression_type in (PRODUCER, AUTO):
            return None
        return Codec.parse(self.compression_type)

    def tier_for(self, age_days: float) -> str | None:
        """The coldest class whose rule applies at ``age_days``, or None (stay where it is)."""
        chosen = None
        for t in self.tiers:
            if age_days >= t.after_days:
                chosen = t.storage_class
        return chosen

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "compression.type": self.compression_type, "compression.level": self.level,
                "min.savings.ratio": self.min_savings_ratio, "min.segment.age.hours": self.min_age_hours,
                "storage.tiers": [{"after.days": t.after_days, "storage.class": t.storage_class} for t in self.tiers],
                "storage.allow.archive": self.allow_archive,
                "auto.candidates": [f"{c}:{lvl}" if lvl is not None else c for c, lvl in self.auto_candidates],
                "auto.horizon.months": self.auto_horizon_months, "rebatch.enable": self.rebatch_enable,
                "rebatch.max.bytes": self.rebatch_max_bytes_key, "max.message.bytes": self.max_message_bytes,
                "cleanup.policy": self.cleanup_policy, "compact.enable": self.compact_enable,
                "delete.retention.ms": self.delete_retention_ms, "min.compaction.lag.ms": self.min_compaction_lag_ms,
                "merge.enable": self.merge_enable, "merge.target.bytes": self.merge_target_bytes_key,
                "segment.bytes": self.segment_bytes, "segment.index.bytes": self.segment_index_bytes,
                "sources": dict(self.sources)}


@dataclass(frozen=True, slots=True)
class _Scope:
    name: str  # how a source is shown: "cluster", "topic 'x'", "regex 'y' (topics[3])"
    settings: Mapping[str, Any]
    exact: str | None = None
    pattern: re.Pattern[str] | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    cluster: _Scope
    topics: tuple[_Scope, ...]
    path: str | None = None

    def enables(self, key: str) -> bool:
        """Whether some topic may have boolean ``key`` on: the cluster scope or a topic scope sets it true."""
        return any(scope.settings.get(key) is True for scope in (self.cluster, *self.topics))

    def resolve(self, topic: str) -> TopicPolicy:
        exact = [s for s in self.topics if s.exact == topic]
        regex = next((s for s in self.topics if s.pattern is not None and s.pattern.fullmatch(topic)), None)
        scopes = [*exact[:1], *([regex] if regex else []), self.cluster]
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for key in BUILT_IN:
            values[key], sources[key] = BUILT_IN[key], SOURCE_BUILT_IN
            for scope in scopes:
                if key in scope.settings:
                    values[key], sources[key] = scope.settings[key], scope.name
                    break
        ctype = str(values["compression.type"])
        codec = None if ctype in (PRODUCER, AUTO) else Codec.parse(ctype)
        level, level_source = None, SOURCE_BUILT_IN
        if codec is not None:
            per_codec = f"compression.{codec.label}.level"
            for scope in scopes:  # the nearest scope that sets a level for THIS codec
                if per_codec in scope.settings:
                    level, level_source = scope.settings[per_codec], scope.name
                    break
                if "compression.level" in scope.settings and scope.settings["compression.type"] == ctype:
                    level, level_source = scope.settings["compression.level"], scope.name
                    break
            level = _level(codec, level, f"{level_source}: compression.level for {codec.label}")
        else:
            level = None  # producer / auto: no single codec to take a level
        sources["compression.level"] = level_source
        tiers = tuple(Tier(float(t["after.days"]), str(t["storage.class"])) for t in values["storage.tiers"])
        _check_tiers(tiers, bool(values["storage.allow.archive"]),
                     f"{sources['storage.tiers']} / {sources['storage.allow.archive']}")
        return TopicPolicy(topic, ctype, level, float(values["min.savings.ratio"]),
                           float(values["min.segment.age.hours"]), tiers, bool(values["storage.allow.archive"]),
                           tuple(_candidate(c, "auto.candidates") for c in values["auto.candidates"]),
                           float(values["auto.horizon.months"]), sources, bool(values["rebatch.enable"]),
                           int(values["rebatch.max.bytes"]), values["max.message.bytes"],
                           str(values["cleanup.policy"]), bool(values["compact.enable"]),
                           int(values["delete.retention.ms"]), int(values["min.compaction.lag.ms"]),
                           bool(values["merge.enable"]), values["merge.target.bytes"], int(values["segment.bytes"]),
                           int(values["segment.index.bytes"]))


def _fail(where: str, problem: str, found: object = None) -> PolicyError:
    return PolicyError(f"policy {where}: {problem}" + ("" if found is None else f"; found {found!r}"))


def _level(codec: Codec, level: object, where: str) -> int | None:
    if level is None:
        return None
    if codec not in LEVEL_RANGE:
        raise _fail(where, f"{codec.label} takes no level", level)
    low, high = LEVEL_RANGE[codec]
    if not isinstance(level, int) or isinstance(level, bool) or not low <= level <= high:
        raise _fail(where, f"level out of range for {codec.label} (expected an integer in {low}..{high})", level)
    return level


def _candidate(text: object, where: str) -> tuple[str, int | None]:
    name, _, lvl = str(text).partition(":")
    if name not in COMPRESSION_TYPES or name in (PRODUCER, AUTO):
        raise _fail(where, "a candidate is codec[:level] with a real codec", text)
    codec = Codec.parse(name)
    if not lvl:
        return codec.label, None
    try:
        level = int(lvl)
    except ValueError:
        raise _fail(where, "a candidate's level is an integer", text) from None
    return codec.label, _level(codec, level, where)


def _check_tiers(tiers: tuple[Tier, ...], allow_archive: bool, where: str) -> None:
    last_days, last_rank = -1.0, STORAGE_ORDER.index(StorageClass.STANDARD)
    for t in tiers:
        if t.storage_class not in STORAGE_ORDER:
            raise _fail(f"{where}: storage.tiers", f"unknown storage class (expected one of "
                        f"{', '.join(STORAGE_ORDER[1:])})", t.storage_class)
        rank = STORAGE_ORDER.index(t.storage_class)
        if t.after_days <= last_days or rank <= last_rank:
            raise _fail(f"{where}: storage.tiers", "rules out of order: each must come after more days and move to "
                        "a colder class than the one before", f"{t.after_days:g} days -> {t.storage_class}")
        if t.storage_class in ARCHIVE_CLASSES and not allow_archive:
            raise _fail(f"{where}: storage.tiers", f"{t.storage_class} objects cannot be read without a restore; "
                        "set storage.allow.archive: true to allow it", t.storage_class)
        last_days, last_rank = t.after_days, rank


def _settings(raw: object, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(where, "expected a mapping of settings", type(raw).__name__)
    out: dict[str, Any] = {}
    for key, given in raw.items():
        at = f"{where}.{key}"
        value = given
        if key not in KEYS:
            raise _fail(at, f"unknown key (known: {', '.join(sorted(KEYS))})", key)
        if key == "compression.type":
            if value not in COMPRESSION_TYPES:
                raise _fail(at, f"unknown compression type (expected one of {', '.join(COMPRESSION_TYPES)})", value)
            if value == "uncompressed":
                value = "none"  # Kafka's topic-level name for it
        elif key == "compression.level":
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise _fail(at, "expected an integer", value)
        elif key in PER_CODEC_LEVEL:
            _level(PER_CODEC_LEVEL[key], value, at)
        elif key == "min.savings.ratio":
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1:
                raise _fail(at, "expected a fraction in [0, 1)", value)
        elif key == "auto.horizon.months":
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise _fail(at, "expected months > 0", value)
        elif key == "min.segment.age.hours":
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise _fail(at, "expected hours >= 0", value)
        elif key == "storage.tiers":
            value = _tiers(value, at)
        elif key == "rebatch.max.bytes":
            _bytes(value, at, V2_HEADER_SIZE + 1)
        elif key == "max.message.bytes":
            if value is not None:  # below a batch header's size no batch fits
                _bytes(value, at, V2_HEADER_SIZE + 1)
        elif key == "cleanup.policy":
            value = ",".join(sorted(p.strip() for p in str(value).split(",")))  # Kafka takes a list, any order
            if value not in CLEANUP_POLICIES:
                raise _fail(at, f"unknown cleanup policy (expected one of {', '.join(CLEANUP_POLICIES)})", given)
        elif key in ("delete.retention.ms", "min.compaction.lag.ms"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _fail(at, "expected milliseconds >= 0 (an integer)", value)
        elif key in ("merge.target.bytes", "segment.bytes", "segment.index.bytes"):
            if value is not None or key != "merge.target.bytes":  # Kafka's own bounds: a segment's positions are int32
                _bytes(value, at, 1)
        elif key in ("storage.allow.archive", "rebatch.enable", "compact.enable", "merge.enable"):
            if not isinstance(value, bool):
                raise _fail(at, "expected true or false", value)
        elif key == "auto.candidates":
            if not isinstance(value, list) or not value:
                raise _fail(at, "expected a non-empty list of codec[:level]", value)
            for c in value:
                _candidate(c, at)
        out[key] = value
    if "compression.level" in out and "compression.type" not in out:
        raise _fail(f"{where}.compression.level", "applies to the compression.type of the same entry, which sets "
                    "none; use compression.<codec>.level to set one codec's level")
    if out.get("compression.level") is not None and out.get("compression.type") in (PRODUCER, AUTO):
        raise _fail(f"{where}.compression.level", f"compression.type {out['compression.type']} takes no level "
                    "(auto: give levels in auto.candidates)", out["compression.level"])
    return out


def _bytes(value: object, where: str, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= INT32_MAX:
        raise _fail(where, f"expected a number of bytes in {low}..{INT32_MAX}", value)


def _tiers(value: object, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise _fail(where, "expected a list of {after.days, storage.class}", value)
    out = []
    for i, rule in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(rule, dict) or set(rule) != {"after.days", "storage.class"}:
            raise _fail(at, "a rule has exactly after.days and storage.class", rule)
        days = rule["after.days"]
        if not isinstance(days, int | float) or isinstance(days, bool) or days < 0:
            raise _fail(f"{at}.after.days", "expected days >= 0", days)
        out.append({"after.days": float(days), "storage.class": str(rule["storage.class"])})
    return out


def parse_policy(doc: object, path: str | None = None) -> Policy:
    """A validated :class:`Policy` from a parsed YAML document; every topic scope is resolved once so that
    any invalid combination (a level out of range for the codec a topic ends up with, tiers out of order,
    archive classes not allowed) is reported now, before any work starts."""
    if not isinstance(doc, dict):
        raise _fail("file", "expected a mapping with version, cluster and topics", type(doc).__name__)
    unknown = set(doc) - {"version", "cluster", "topics"}
    if unknown:
        raise _fail(sorted(unknown)[0], "unknown top-level key (known: version, cluster, topics)")
    if doc.get("version", POLICY_VERSION) != POLICY_VERSION:
        raise _fail("version", f"unsupported version (expected {POLICY_VERSION})", doc.get("version"))
    cluster = _Scope(SOURCE_CLUSTER, _settings(doc.get("cluster") or {}, "cluster"))
    entries = doc.get("topics") or []
    if not isinstance(entries, list):
        raise _fail("topics", "expected a list of topic entries", type(entries).__name__)
    scopes: list[_Scope] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        at = f"topics[{i}]"
        if not isinstance(entry, dict) or len({"topic", "regex"} & set(entry)) != 1:
            raise _fail(at, "each entry names exactly one of topic (an exact name) or regex", entry)
        body = {k: v for k, v in entry.items() if k not in ("topic", "regex")}
        settings = _settings(body, at)
        if "topic" in entry:
            name = str(entry["topic"])
            if name in seen:
                raise _fail(f"{at}.topic", "this topic already has an entry", name)
            seen.add(name)
            scopes.append(_Scope(f"topic '{name}' ({at})", settings, exact=name))
        else:
            try:
                pattern = re.compile(str(entry["regex"]))
            except re.error as e:
                raise _fail(f"{at}.regex", f"not a valid regular expression: {e}", entry["regex"]) from None
            scopes.append(_Scope(f"regex '{entry['regex']}' ({at})", settings, pattern=pattern))
    policy = Policy(cluster, tuple(scopes), path)
    policy.resolve("\x00 no entry names this topic")  # the cluster scope alone
    for s in scopes:  # each entry over the cluster default, as a topic it applies to would see it
        Policy(cluster, (_Scope(s.name, s.settings, exact="\x01"),)).resolve("\x01")
        if s.exact is not None:  # and every named topic with the regex entry it also matches
            policy.resolve(s.exact)
    return policy


def load_policy(path: str | Path) -> Policy:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError(f"cannot read the policy file: {e.strerror or e}", path=str(path)) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError(f"the policy file is not valid YAML: {e}", path=str(path)) from None
    try:
        return parse_policy(doc, str(path))
    except PolicyError as e:
        raise PolicyError(e.message, path=str(path)) from None


def policy_ref(policy: Policy | None) -> str | None:
    """How a policy travels in a document (a run's options sent to a Spark job): by its file's path."""
    if policy is None:
        return None
    if policy.path is None:
        raise ConfigError("a policy travels by the path of its file, and this one was not read from a file",
                          expected="a policy file", found="a policy parsed from text")
    return policy.path


def policy_at(path: str | None) -> Policy | None:
    """The policy a document names by :func:`policy_ref` (read and checked), or None."""
    return load_policy(path) if path else None
