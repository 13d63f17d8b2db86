"""The check every versioned document's reader makes first: that it is the kind of document expected, of the
schema version this code writes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tiering.errors import ConfigError


def check_document(doc: object, *, kind: str | None, version: int, what: str, where: str | None = None,
                   advice: str = "") -> dict[str, Any]:
    """``doc`` itself when it is a JSON object of ``kind`` (``None``: a kind of document that carries no
    ``kind`` field) and of schema ``version``; otherwise a :class:`ConfigError` saying that it is not ``what``
    this version can read (``advice`` appended), with what was expected and what was found."""
    if isinstance(doc, dict) and doc.get("schema_version") == version and (kind is None or doc.get("kind") == kind):
        return doc
    if isinstance(doc, dict):
        found = f"{doc['kind']} v{doc.get('schema_version')}" if "kind" in doc else f"v{doc.get('schema_version')}"
    else:
        found = type(doc).__name__
    raise ConfigError(f"not {what} this version can read{advice}", path=where,
                      expected=f"{kind} v{version}" if kind is not None else f"v{version}", found=found)


def known_fields(doc: object, allowed: Iterable[str], *, what: str, where: str | None = None) -> dict[str, Any]:
    """``doc`` itself when it is a JSON object whose fields are all among ``allowed``; otherwise a
    :class:`ConfigError` naming ``what`` it should be and the fields it does not know."""
    fields = set(allowed)
    if not isinstance(doc, dict):
        raise ConfigError(f"not {what}: expected a JSON object", path=where, expected="an object",
                          found=type(doc).__name__)
    unknown = sorted(set(doc) - fields)
    if unknown:
        raise ConfigError(f"{what} has fields this version does not know", path=where,
                          expected=", ".join(sorted(fields)), found=", ".join(unknown))
    return doc


def opt_int(doc: dict[str, Any], name: str, default: int | None) -> int | None:
    """Field ``name`` of ``doc``: an integer, null, or ``default`` where it is absent (a ValueError or
    TypeError for anything else)."""
    value = doc.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer or null, found {value!r}")
    return value


def opt_str(doc: dict[str, Any], name: str) -> str | None:
    """Field ``name`` of ``doc``: a string, or null where it is absent or null."""
    value = doc.get(name)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or null, found {value!r}")
    return value
