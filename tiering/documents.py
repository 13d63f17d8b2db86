"""The check every versioned document's reader makes first: that it is the kind of document expected, of the
schema version this code writes."""

from __future__ import annotations

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
