"""Documents, declared once: a :class:`Document` is a frozen struct whose fields are its JSON (its kind and
schema version among them), read by :func:`read`, which checks both and then every field, and written by
:func:`write`. A :class:`Part` is a struct inside a document. Reading is strict: an unknown field or a wrong
type is an error naming the document and where in it.

(The documents not declared this way yet check themselves with :func:`check_document` and
:func:`known_fields`.)"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

import msgspec

from tiering.errors import ConfigError


class Part(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """A struct inside a document: a field at its default is left out when written, and read as its default
    where it is absent. (Each subclass says ``frozen=True`` again: mypy reads a subclass without it as
    mutable.)"""


class Document(msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag_field="kind"):
    """A document stored on its own. A subclass names its kind (``tag=``, written as the ``kind`` field; a
    document of an earlier version written without one is read as the kind asked for) and declares
    ``schema_version: Literal[N] = N``: each of its fields is written, defaults too, so that a reader of
    another version sees every field it would have to understand."""



def kinds() -> dict[str, type[Document]]:
    """The registry: every kind of document declared (in the modules imported so far), by its kind; a
    :class:`TypeError` for a declaration without its kind or schema version, or a kind declared twice."""
    out: dict[str, type[Document]] = {}
    todo = list(Document.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        kind = cls.__struct_config__.tag
        if not isinstance(kind, str) or "schema_version" not in cls.__struct_fields__:
            raise TypeError(f"{cls.__module__}.{cls.__name__}: a document declares its kind (tag=...) and its "
                            "schema_version")
        if out.setdefault(kind, cls) is not cls:
            raise TypeError(f"{cls.__name__}: kind {kind} is {out[kind].__name__}'s already")
    return out


T = TypeVar("T")
D = TypeVar("D", bound=Document)
P = TypeVar("P", bound=Part)


class _Head(msgspec.Struct):
    """What a reader looks at first (every other field ignored)."""

    kind: object = None
    schema_version: object = None


_DECODERS: dict[type, Any] = {}
_PREPARING = threading.Lock()


def _decoder(cls: type[T]) -> msgspec.json.Decoder[T]:
    """``cls``'s JSON decoder, made once. msgspec learns a struct type on its first decode or conversion and
    does not guard that against threads: two threads learning types that refer to each other at once can
    crash the process (msgspec 0.22: ``tests/test_documents.py`` reproduces it). Making the decoder under a
    lock teaches msgspec the type before any read; every later decode and conversion only looks it up."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        with _PREPARING:
            decoder = _DECODERS.get(cls)
            if decoder is None:
                decoder = _DECODERS[cls] = msgspec.json.Decoder(cls)
    return cast("msgspec.json.Decoder[T]", decoder)


@functools.cache
def kind_of(cls: type[Document]) -> str:
    return str(cls.__struct_config__.tag)


@functools.cache
def version_of(cls: type[Document]) -> int:
    return int(next(f.default for f in msgspec.structs.fields(cls) if f.name == "schema_version"))


def read(data: bytes | Mapping[str, Any], cls: type[D], *, what: str, where: str | None = None) -> D:
    """The document ``data`` holds (its JSON bytes, or that JSON already parsed) as a ``cls``: a
    :class:`ConfigError` naming ``where`` it is, ``what`` it should be and what it is instead when its kind or
    schema version is another, a field is unknown, or a value of the wrong type."""
    kind, version = kind_of(cls), version_of(cls)
    try:
        if isinstance(data, bytes):
            head = _decoder(_Head).decode(data)
        elif isinstance(data, Mapping):
            head = _Head(data.get("kind"), data.get("schema_version"))
        else:
            raise ConfigError(f"not {what}", path=where, expected="a JSON object", found=type(data).__name__)
    except msgspec.ValidationError as e:
        raise ConfigError(f"not {what}", path=where, expected="a JSON object", found=str(e)) from None
    except msgspec.DecodeError as e:
        raise ConfigError(f"not {what}: not JSON", path=where, expected="a JSON object", found=str(e)) from None
    if head.kind not in (None, kind) or head.schema_version != version:
        found = f"{head.kind} v{head.schema_version}" if head.kind else f"v{head.schema_version} (no kind)"
        raise ConfigError(f"not {what} this version can read", path=where, expected=f"{kind} v{version}",
                          found=found)
    decoder = _decoder(cls)
    try:
        if isinstance(data, bytes):
            return decoder.decode(data)
        return msgspec.convert(data, cls, str_keys=True)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{what} unreadable", path=where, expected=f"{kind} v{version}", found=str(e)) from None


def read_part(data: Mapping[str, Any], cls: type[P], *, what: str, where: str | None = None) -> P:
    """A part of a document not declared as one yet (its JSON, parsed), strictly: see :func:`read`."""
    _decoder(cls)
    try:
        return msgspec.convert(data, cls, str_keys=True)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{what} unreadable", path=where, expected=cls.__name__, found=str(e)) from None


def write(doc: Document | Part) -> bytes:
    """The JSON of ``doc``, one field a line with its keys in order (as people read documents in a console)."""
    return json.dumps(to_builtins(doc), indent=1, sort_keys=True).encode()


def to_builtins(doc: Document | Part) -> dict[str, Any]:
    """``doc`` as the JSON object :func:`write` writes, parsed (for a document not declared yet holding it)."""
    out: dict[str, Any] = msgspec.to_builtins(doc, str_keys=True)
    return out



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
