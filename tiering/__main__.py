"""``python -m tiering``: the same entry point as the ``tiering`` console script."""

from tiering.cli import entrypoint

entrypoint()
