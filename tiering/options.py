"""The options of the kinds of run, each declared once: its name, type, default, bounds and what it means.

One declaration (:class:`Opt`) gives the command line's flag (:func:`add_arguments`), the Airflow DAG's
param (:meth:`Opt.param`: the JSON-schema keywords and description an ``airflow.sdk.Param`` takes) and
the strict reading of the options' JSON, as the Spark job receives it (:func:`read_options`), so that a
default, a bound or a description cannot differ between them. Light on purpose (the standard library and
the package's errors): a DAG file imports it when Airflow parses it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, ClassVar, Final, Self, cast

from tiering.documents import known_fields
from tiering.errors import ConfigError

_JSON_TYPES: Final = {int: "integer", float: "number", str: "string", bool: "boolean"}
_BINARY_UNITS: Final = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    """A number of bytes, plain or with a binary unit (``134217728``, ``128MiB``, ``1GiB``); a ValueError
    naming what was found otherwise."""
    number = text.rstrip("BKMGib")
    unit = text[len(number):]
    if unit not in _BINARY_UNITS or not number.strip().isdigit():
        raise ValueError(f"expected a size in bytes such as 134217728 or 128MiB, found {text!r}")
    return int(number) * _BINARY_UNITS[unit]


@dataclass(frozen=True, slots=True)
class Opt:
    """One option. ``kind``: its Python type (an int is accepted where a float is asked); ``minimum`` and
    ``maximum``: its bounds (a text's length, for text); ``optional``: None is a value too (no bound, no
    filter); a default of None for an option that is not optional makes it required; ``internal``: set by
    the run itself as it starts (its clock) or by its caller (a price book's region), read back from JSON but
    never asked of a person; ``size``: a number of bytes, which the command line also takes with a binary
    unit (``16MiB``)."""

    name: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False
    internal: bool = False
    cli: str | None = None  # the command line's flag, where it is not --<name with dashes>
    metavar: str | None = None  # what the flag's value is called in --help (default: the name's last word)
    size: bool = False
    clock: bool = False  # text: an ISO 8601 time with its offset (S3's clock as a run started)

    @property
    def flag(self) -> str:
        return self.cli or "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is None and not self.optional

    def expected(self, *, flag: bool = False) -> str:
        """What a value must be, in words (``flag``: as a command line gives it, where null is no value)."""
        what = {int: "a whole number", float: "a finite number", str: "text", bool: "true or false"}[self.kind]
        if self.size:
            what = "a size in bytes"
        if self.clock:
            what = "an ISO 8601 time with its offset"
        if self.choices:
            what = "one of " + ", ".join(self.choices)
        size = "of a length " if self.kind is str else ""
        bounds = [f"{size}>= {_number(self.minimum)}" if self.minimum is not None else "",
                  f"{size}<= {_number(self.maximum)}" if self.maximum is not None else ""]
        said = " and ".join(b for b in bounds if b)
        return what + (f" {said}" if said else "") + (" (or null)" if self.optional and not flag else "")

    def check(self, value: object, where: str | None = None) -> Any:
        """``value`` as this option takes it; a :class:`ConfigError` naming the option otherwise."""
        if value is None and self.optional:
            return None
        ok = (isinstance(value, bool) if self.kind is bool else
              isinstance(value, int | float) and not isinstance(value, bool) if self.kind is float else
              isinstance(value, int) and not isinstance(value, bool) if self.kind is int else
              isinstance(value, str))
        measure = len(value) if isinstance(value, str) else value
        if ok and isinstance(measure, int | float) and not isinstance(measure, bool):
            ok = ((self.minimum is None or measure >= self.minimum) and
                  (self.maximum is None or measure <= self.maximum))
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if ok and self.choices:
            ok = value in self.choices
        if ok and self.clock:
            try:
                ok = datetime.fromisoformat(str(value)).tzinfo is not None
            except ValueError:
                ok = False
        if not ok:
            raise ConfigError(f"option {self.name} is out of its range or of the wrong type", path=where,
                              expected=self.expected(), found=repr(value))
        return float(value) if self.kind is float and isinstance(value, int) else value

    def read(self, doc: Mapping[str, Any], where: str | None = None) -> Any:
        """This option's value in ``doc`` (an options' JSON), checked; its default where ``doc`` has none."""
        return self.check(doc[self.name], where) if self.name in doc else self.default

    def param(self, *, minimum: float | None = None) -> dict[str, Any]:
        """The keyword arguments of the DAG's ``Param`` for this option (``minimum``: a tighter bound than the
        option's, where a DAG's scheduled runs need one)."""
        kinds: Any = _JSON_TYPES[self.kind] if not self.optional else ["null", _JSON_TYPES[self.kind]]
        out: dict[str, Any] = {"default": self.default, "type": kinds,
                               "description": self.help}
        low, high = ("minLength", "maxLength") if self.kind is str else ("minimum", "maximum")
        if minimum is not None or self.minimum is not None:
            out[low] = max(m for m in (minimum, self.minimum) if m is not None)
        if self.maximum is not None:
            out[high] = self.maximum
        if self.choices:
            out["enum"] = list(self.choices)
        return out

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        """The option as a command-line flag, checked as :meth:`check` checks it."""
        if self.kind is bool:
            parser.add_argument(self.flag, dest=self.name, action=argparse.BooleanOptionalAction,
                                default=self.default, help=f"{self.help} (default: {'on' if self.default else 'off'})")
            return

        def parse(text: str) -> Any:
            try:
                value = parse_size(text) if self.size else self.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected {self.expected(flag=True)}, found {text!r}") from None
            try:
                return self.check(value)
            except ConfigError:
                raise argparse.ArgumentTypeError(f"expected {self.expected(flag=True)}, found {text!r}") from None

        metavar = (self.metavar or ("{" + ",".join(self.choices) + "}" if self.choices else None)
                   or self.name.rpartition("_")[2].upper())  # what it counts: DAYS, SECONDS, RUN
        if self.required:
            parser.add_argument(self.flag, dest=self.name, type=parse, required=True, metavar=metavar,
                                help=self.help)
        else:
            shown = ("" if self.default is None else _bytes(self.default) if self.size else  # its help says
                     "%(default)d" if self.kind is int else "%(default)g" if self.kind is float else "%(default)s")
            parser.add_argument(self.flag, dest=self.name, type=parse, default=self.default, metavar=metavar,
                                help=f"{self.help} (default {shown})" if shown else self.help)


def _number(x: float) -> str:
    """A bound as a person writes it: whole numbers in full."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bytes(n: int) -> str:
    """``n`` bytes as a person would write them: in the largest binary unit that divides them."""
    for unit in ("GiB", "MiB", "KiB"):
        if n % _BINARY_UNITS[unit] == 0:
            return f"{n // _BINARY_UNITS[unit]}{unit}"
    return str(n)


def read_options(doc: object, declared: Iterable[Opt], *, what: str, where: str | None = None) -> dict[str, Any]:
    """The options of ``doc`` (a JSON object, as an options' ``to_json`` writes it) by name: a field not
    declared, or a value out of its declaration, is a :class:`ConfigError` naming it; one left out takes its
    default."""
    opts = {o.name: o for o in declared}
    d = known_fields(doc, opts, what=what, where=where)
    for name, o in opts.items():
        if o.required and name not in d:
            raise ConfigError(f"{what} lack option {name}", path=where, expected=f"{name}: {o.expected()}",
                              found="nothing")
    return {name: o.read(d, where) for name, o in opts.items()}


def option(declared: Iterable[Opt], name: str) -> Opt:
    """The option ``name`` of ``declared``."""
    return next(o for o in declared if o.name == name)


def add_arguments(parser: argparse.ArgumentParser, declared: Iterable[Opt], *, but: Iterable[Opt] = ()) -> None:
    """Each option a person gives (not the internal ones, nor those of ``but``) as a flag of ``parser``."""
    skip = {o.name for o in but}
    for o in declared:
        if not o.internal and o.name not in skip:
            o.add_to(parser)


def params(declared: Iterable[Opt], *, prefix: str = "", only: Iterable[str] | None = None
           ) -> dict[str, dict[str, Any]]:
    """The DAG params of the options a person gives (those named in ``only``, if given), by name (``prefix``
    before each: the kind's, in a DAG that runs several), as keyword arguments of ``Param``."""
    chosen = None if only is None else set(only)
    return {prefix + o.name: o.param() for o in declared
            if not o.internal and (chosen is None or o.name in chosen)}


class Options:
    """A kind's options: a frozen dataclass whose JSON, command-line flags and DAG params all come from one
    tuple of declarations (``DECLARED``). A subclass whose fields are not the declared names one for one
    (a bound made of two options, a policy read from the file an option names) converts in :meth:`from_values` and
    :meth:`values`."""

    __slots__ = ()
    DECLARED: ClassVar[tuple[Opt, ...]]
    WHAT: ClassVar[str]  # what the options are called in an error ("merge options")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> Self:
        """The options from their declared values, by name."""
        made: Self = cast(Any, cls)(**values)
        return made

    def values(self) -> dict[str, Any]:
        """The declared values by name (what :meth:`from_values` takes)."""
        return {o.name: getattr(self, o.name) for o in self.DECLARED}

    def to_json(self) -> dict[str, Any]:
        """The options as a Spark job receives them (an internal one not set yet is left out)."""
        internal = {o.name for o in self.DECLARED if o.internal}
        return {name: v for name, v in self.values().items() if v is not None or name not in internal}

    @classmethod
    def from_json(cls, doc: object, where: str | None = None) -> Self:
        """:meth:`to_json` read back strictly (:func:`read_options`; ``where``: the document's origin)."""
        return cls.from_values(read_options(doc, cls.DECLARED, what=cls.WHAT, where=where))

    @classmethod
    def from_args(cls, args: argparse.Namespace, **given: Any) -> Self:
        """The options a command line parsed (:func:`add_arguments`), with ``given`` over them (an option the
        command asks for in its own way); an internal one takes its default."""
        values = {o.name: given[o.name] if o.name in given else o.default if o.internal else getattr(args, o.name)
                  for o in cls.DECLARED}
        return cls.from_values(values)


# The options of every kind
LEASE_TTL: Final = Opt("lease_ttl_seconds", int, 600, "a partition lease not renewed for this long (by S3's "
                       "clock) may be taken over: a crashed run's partitions are free again after it",
                       minimum=1, maximum=86_400)

CLEANUP: Final = (
    Opt("grace_days", float, 7.0, "days kept originals stay after their replacement (what a rollback restores)",
        minimum=0, maximum=36_500),
    Opt("stale_hours", float, 24.0, "hours after which staging objects and incomplete uploads are abandoned",
        minimum=0, maximum=876_000),
    LEASE_TTL,
    Opt("now", str, None, "S3's clock as the cleanup started", optional=True, internal=True, clock=True),
    Opt("deletes_checked", bool, None, "whether the store's DeleteObjects honours an ETag", optional=True,
        internal=True),
)

ROLLBACK: Final = (
    Opt("target_run", str, None, "the run to undo (a compaction, merge, key-compaction or tiering run)",
        minimum=1, cli="--run-id"),
    LEASE_TTL,
)

# What a run chooses its partitions by, and how fresh a segment it leaves
MIN_AGE: Final = Opt("min_age_minutes", int, 15, "leave segments uploaded less than this many minutes ago (S3's "
                     "LastModified: a guard against racing the uploader, not the records' age); such a segment "
                     "ends a run of neighbours a merge or a key-compaction pass takes", minimum=0)
# The bounds of a segment made of neighbours, as a topic's own (Kafka's defaults)
SEGMENT_BYTES: Final = Opt("segment_bytes", int, 1 << 30, "the topic's segment.bytes: a segment made of neighbours "
                           "holds at most this many bytes", minimum=1,
                           maximum=(1 << 31) - 1, size=True, metavar="BYTES")
INDEX_BYTES: Final = Opt("index_bytes", int, 10 << 20, "the topic's segment.index.bytes: the bound of a merged "
                         "segment's .index and .timeindex", minimum=1, maximum=(1 << 31) - 1, size=True,
                         metavar="BYTES")
CODECS: Final = ("zstd", "lz4", "gzip", "snappy", "none")


def _topics(what: str) -> Opt:
    return Opt("topics", str, None, what, minimum=1, optional=True, metavar="REGEX")


TOPICS: Final = _topics("only the topics whose whole names match this regular expression (default: every topic)")


def _policy(what: str) -> Opt:
    return Opt("policy", str, None, f"a policy file (see 'tiering policy'): {what}", minimum=1, optional=True,
               metavar="FILE")


# A compaction's: what segments become, how much of them a run takes, and how each is committed
CODEC: Final = Opt("codec", str, "zstd", "the codec every batch is recompressed with", choices=CODECS)
LEVEL: Final = Opt("level", int, None, "the codec's level (Kafka's compression.<codec>.level; default: Kafka's "
                   "default for the codec)", minimum=-131_072, maximum=22, optional=True)
MAX_SEGMENTS: Final = Opt("max_segments", int, None, "compact at most this many segments this run, largest first "
                          "(default: no limit)", minimum=1, optional=True, metavar="N")
MAX_BYTES: Final = Opt("max_bytes", int, None, "compact at most this many .log bytes this run, largest segments "
                       "first (default: no limit)", minimum=1, optional=True, size=True, metavar="BYTES")
REBATCH: Final = Opt("rebatch", bool, False, "also merge runs of small batches into larger ones, every record "
                     "unchanged (docs/rebatching.md), in every topic; with a policy, its rebatch.enable decides per "
                     "topic instead")
REBATCH_MAX_BYTES: Final = Opt("rebatch_max_bytes", int, 1 << 20, "with rebatch: a merged batch's bound (Kafka's "
                               "default max.message.bytes)", minimum=62, maximum=(1 << 31) - 1, size=True,
                               metavar="BYTES")
POLICY: Final = _policy("it decides each topic's codec (or producer: left alone, auto: chosen by net dollars), "
                        "level, minimum savings ratio and minimum record age; codec and level are then not used")
VERIFY: Final = Opt("verify", str, "checksum", "how each staged file is accepted before anything final changes: "
                    "'checksum' (the CRC-32C S3 reports for what it stored must be the one of the bytes produced; "
                    "nothing is downloaded) or 'read-back' (downloaded and decoded again); a store that reports no "
                    "checksum is read back either way", choices=("checksum", "read-back"))
SWAP: Final = Opt("swap", str, "auto", "how the new .log is put over the original, conditional on its ETag: "
                  "'copy' (a server-side CopyObject from staging with If-Match: nothing is sent again), 'put' "
                  "(downloaded and PUT with If-Match: for stores that ignore a copy's If-Match) or 'auto' ('copy' "
                  "where a probe at the first swap shows the store refuses a copy whose If-Match fails)",
                  choices=("auto", "copy", "put"))

TIERING: Final = (
    Opt("policy", str, None, "the policy YAML file whose storage.tiers say where each topic's objects go by the age "
        "of each segment's newest record (see 'tiering policy')", minimum=1, metavar="FILE"),
    Opt("include_internal", bool, False, "tier the internal topics (names starting __) too"),
    # the price book, as the caller configured it (the command line's --price-region and --prices, or the
    # environment: see tiering.report.publish.cost_config); never a flag of its own
    Opt("prices_region", str, "us-east-1", "the region whose prices say whether a move pays", minimum=1,
        internal=True),
    Opt("prices_file", str, None, "a JSON prices file merged over the built-in list prices", minimum=1,
        optional=True, internal=True),
    LEASE_TTL,
    Opt("now", str, None, "S3's clock as the run started", optional=True, internal=True, clock=True),
)


MERGE: Final = (
    SEGMENT_BYTES,
    INDEX_BYTES,
    TOPICS,
    MIN_AGE,
    _policy("only the topics whose merge.enable is true are merged, each up to its merge.target.bytes (else its "
            "segment.bytes) and segment.index.bytes, leaving segments whose newest record is younger than its "
            "min.segment.age.hours (the segment.bytes and segment.index.bytes given here are then not used)"),
    LEASE_TTL,
)

KEY_COMPACTION: Final = (
    _topics("the compacted topics to clean (their whole names must match); this or the policy is required, "
            "since a pass drops every superseded value"),
    _policy("the topics whose cleanup.policy has compact and compact.enable is true are cleaned, each with its "
            "own delete.retention.ms and min.compaction.lag.ms (the two settings of that name given here are then "
            "not used); with topics, only those of them that also match"),
    Opt("now_ms", int, None, "the pass's clock in epoch milliseconds: horizons stamped now expire at it plus "
        "delete.retention.ms, and horizons before it have passed (default: S3's clock)", minimum=0, optional=True,
        metavar="MS"),
    Opt("delete_retention_ms", int, 86_400_000, "how long tombstones and transaction markers stay after a pass "
        "stamped them (Kafka's delete.retention.ms)", minimum=0, metavar="MS"),
    Opt("min_compaction_lag_ms", int, 0, "leave segments holding records younger than this, relative to the "
        "partition's newest record (Kafka's min.compaction.lag.ms)", minimum=0, metavar="MS"),
    replace(CODEC, default=None, optional=True, help="the codec of batches the pass rebuilds (default: each batch's "
            "own)"),
    replace(LEVEL, help="with a codec: its level (default: Kafka's)"),
    MIN_AGE,
    Opt("max_keys", int, 5_033_164, "the key map's bound in keys (by default a broker's default cleaner thread's, "
        "128 MiB of dedupe buffer at 24 bytes a key filled to 0.9): a pass whose map fills up ends there, and the "
        "next run goes on from that offset; null: no bound", minimum=1, optional=True, metavar="N"),
    Opt("merge", bool, True, "clean neighbours into one segment while their sources fit it, as the broker's "
        "cleaner groups them (within segment.bytes and segment.index.bytes; with a policy, each topic's), swapped "
        "in like a merge (docs/merging.md); off: each segment cleaned into one of its own"),
    SEGMENT_BYTES,
    INDEX_BYTES,
    LEASE_TTL,
)
