"""Submitting the Spark job; the executors' worker daemon."""
