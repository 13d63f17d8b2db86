"""Run test code at an exact protocol step: before a matching S3 request is sent, or after S3 executed it
and before the caller sees the answer (botocore's ``before-parameter-build`` and ``after-call`` events)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tiering.storage.s3 import S3Store

Match = Callable[[Mapping[str, Any]], bool]


class Step:
    """Call ``action`` once (or ``times`` times) at the first requests of ``operation`` (e.g. ``PutObject``)
    whose parameters satisfy ``match``: before the request is built, or with ``after`` once S3 answered
    (then with the ``after-call`` event's arguments: ``parsed`` is the answer, which it may change).
    ``fired`` counts the calls."""

    def __init__(self, store: S3Store, operation: str, match: Match, action: Callable[..., None], *,
                 after: bool = False, times: int = 1) -> None:
        self.match, self.action, self.after, self.left, self.fired = match, action, after, times, 0
        self._mark = f"step-matched-{id(self)}"  # several steps may watch the same operation
        events = store.client.meta.events
        events.register(f"before-parameter-build.s3.{operation}", self._before)
        events.register(f"after-call.s3.{operation}", self._after)

    def _fire(self, **kwargs: Any) -> None:
        self.left -= 1
        self.fired += 1
        self.action(**kwargs)

    def _before(self, params: Mapping[str, Any], context: dict[str, Any], **_: Any) -> None:
        if self.left > 0 and self.match(params):
            if self.after:
                context[self._mark] = True
            else:
                self._fire()

    def _after(self, context: dict[str, Any], **kwargs: Any) -> None:
        if context.pop(self._mark, False) and self.left > 0:
            self._fire(**kwargs)


def key_ends(suffix: str, **conditions: bool) -> Match:
    """Requests on a key ending with ``suffix``; ``IfMatch=True`` etc. also require that parameter."""
    def match(params: Mapping[str, Any]) -> bool:
        return str(params.get("Key", "")).endswith(suffix) and all(
            (name in params) == wanted for name, wanted in conditions.items())
    return match
