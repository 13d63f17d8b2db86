"""Kafka's on-disk log format: pure functions over bytes and binary streams, no I/O of their own."""
