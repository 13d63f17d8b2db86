"""The object store: S3 through boto3, an in-memory store with S3's semantics, key naming."""
