"""Argument types the command line's parsers share."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(least: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``least`` (a usage error, naming what was found, otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, found {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected an integer of at least {least}, found {value}")
        return value

    return parse
