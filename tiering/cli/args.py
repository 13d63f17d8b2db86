"""Argument types the command line's parsers share."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from tiering.kafka.keycompact import DEFAULT_KEY_MAP_BYTES, KEY_MAP_SLOT_BYTES, keys_in_map
from tiering.kafka.merge import Limits
from tiering.options import parse_size


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


def byte_size(least: int) -> Callable[[str], int]:
    """An argparse type: a number of bytes, plain or with a binary unit (``134217728``, ``128MiB``, ``1GiB``),
    of at least ``least``."""

    def parse(text: str) -> int:
        try:
            value = parse_size(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected at least {least} bytes, found {value}")
        return value

    return parse


def add_key_map_args(p: argparse.ArgumentParser) -> None:
    """``--key-map-bytes`` (the broker's dedupe buffer) or ``--max-keys``: how far one key-compaction pass goes."""
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--key-map-bytes", type=byte_size(KEY_MAP_SLOT_BYTES), default=DEFAULT_KEY_MAP_BYTES,
                       metavar="BYTES",
                       help="the key map's size, as the broker's log.cleaner.dedupe.buffer.size a cleaner thread "
                            "(e.g. 128MiB, the default): a pass maps at most the keys a broker's cleaner would "
                            "(24 bytes a key, filled to 0.9) and ends there; the next pass goes on from that "
                            "offset")
    bound.add_argument("--max-keys", type=int_at_least(1), default=None, metavar="N",
                       help="bound the key map to N keys instead")


def max_keys(args: argparse.Namespace) -> int:
    """The key map's bound in keys, from :func:`add_key_map_args`'s options."""
    return int(args.max_keys) if args.max_keys is not None else keys_in_map(args.key_map_bytes)


def merge_limits(args: argparse.Namespace) -> Limits:
    """The bounds of a merged segment, from the options :data:`~tiering.options.SEGMENT_BYTES` and
    :data:`~tiering.options.INDEX_BYTES` add."""
    return Limits(args.segment_bytes, args.index_bytes)
