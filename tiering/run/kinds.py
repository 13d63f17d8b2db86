"""The engine's kinds by name: what a caller holding a kind's name and its options as JSON runs (the Spark job,
sent them by the DAG or by a person). Each kind's options are typed once, in its module (``to_json`` and a
strict ``from_json``); nothing here parses arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tiering.errors import ConfigError
from tiering.lifecycle.vocabulary import RunKind
from tiering.run.cleanup import Cleanup, CleanupOptions
from tiering.run.compaction import Compaction, CompactionOptions
from tiering.run.engine import Kind
from tiering.run.keycompact import KeyCompaction, KeyCompactOptions
from tiering.run.merge import MergeOptions, Merging
from tiering.run.rollback import Rollback, RollbackOptions
from tiering.run.tier import Tiering, TierOptions

_READERS: Final[dict[RunKind, Callable[[object, str | None], Kind[Any]]]] = {
    RunKind.COMPACT: lambda doc, where: Compaction(CompactionOptions.from_json(doc, where)),
    RunKind.COMPACT_KEYS: lambda doc, where: KeyCompaction(KeyCompactOptions.from_json(doc, where)),
    RunKind.MERGE: lambda doc, where: Merging(MergeOptions.from_json(doc, where)),
    RunKind.TIER: lambda doc, where: Tiering(TierOptions.from_json(doc, where)),
    RunKind.ROLLBACK: lambda doc, where: Rollback(RollbackOptions.from_json(doc, where)),
    RunKind.CLEANUP: lambda doc, where: Cleanup(CleanupOptions.from_json(doc, where)),
}
ENGINE_KINDS: Final = tuple(_READERS)


def kind_from_json(run_kind: str, options: object, where: str | None = None) -> Kind[Any]:
    """The kind named ``run_kind`` (a :class:`RunKind` value) with ``options`` (its options' ``to_json``)."""
    try:
        reader = _READERS[RunKind(run_kind)]
    except (ValueError, KeyError):
        raise ConfigError("not a kind of the run engine", path=where,
                          expected=", ".join(k.value for k in ENGINE_KINDS), found=run_kind) from None
    return reader(options, where)
