"""Runs over a bucket: the pipeline's steps, compaction, rollback, cleanup, tiering."""
