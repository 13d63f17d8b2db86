"""Tiering and recompression of Kafka log segments kept on S3.

``tiering.kafka`` holds the on-disk format (pure, no I/O of its own); ``tiering.local`` applies it to
segment files on a local disk; ``tiering.cli`` is the command line.
"""

__version__ = "0.1.0"
