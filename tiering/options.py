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
from dataclasses import dataclass
from typing import Any, Final

from tiering.documents import known_fields
from tiering.errors import ConfigError

_JSON_TYPES: Final = {int: "integer", float: "number", str: "string", bool: "boolean"}


@dataclass(frozen=True, slots=True)
class Opt:
    """One option. ``kind``: its Python type (an int is accepted where a float is asked); ``minimum`` and
    ``maximum``: its bounds (a text's length, for text); ``optional``: None is a value too (no bound, no
    filter); a default of None for an option that is not optional makes it required; ``internal``: set by
    the run itself as it starts (its clock), read back from JSON but never asked of a person."""

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

    @property
    def flag(self) -> str:
        return self.cli or "--" + self.name.replace("_", "-")

    @property
    def required(self) -> bool:
        return self.default is None and not self.optional

    def expected(self) -> str:
        """What a value must be, in words."""
        what = {int: "a whole number", float: "a finite number", str: "text", bool: "true or false"}[self.kind]
        if self.choices:
            what = "one of " + ", ".join(self.choices)
        size = "of a length " if self.kind is str else ""
        bounds = [f"{size}>= {self.minimum:g}" if self.minimum is not None else "",
                  f"{size}<= {self.maximum:g}" if self.maximum is not None else ""]
        said = " and ".join(b for b in bounds if b)
        return what + (f" {said}" if said else "") + (" (or null)" if self.optional else "")

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
            parser.add_argument(self.flag, action=argparse.BooleanOptionalAction, default=self.default,
                                help=f"{self.help} (default %(default)s)")
            return

        def parse(text: str) -> Any:
            try:
                value = self.kind(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"expected {self.expected()}, found {text!r}") from None
            try:
                return self.check(value)
            except ConfigError:
                raise argparse.ArgumentTypeError(f"expected {self.expected()}, found {text!r}") from None

        metavar = self.name.rpartition("_")[2].upper()  # what it counts: DAYS, SECONDS, RUN
        if self.required:
            parser.add_argument(self.flag, type=parse, required=True, metavar=metavar, help=self.help)
        else:
            shown = "%(default)g" if self.kind in (int, float) and self.default is not None else "%(default)s"
            parser.add_argument(self.flag, type=parse, default=self.default, metavar=metavar,
                                help=f"{self.help} (default {shown})")


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
    Opt("now", str, None, "S3's clock as the cleanup started (ISO 8601 with its offset)", optional=True,
        internal=True),
    Opt("deletes_checked", bool, None, "whether the store's DeleteObjects honours an ETag", optional=True,
        internal=True),
)

ROLLBACK: Final = (
    Opt("target_run", str, None, "the run to undo (a compaction, merge, key-compaction or tiering run)",
        minimum=1, cli="--run-id"),
    LEASE_TTL,
)
