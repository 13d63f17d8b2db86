"""The report tests use the S3 tests' moto fixtures."""

from tests.s3.conftest import aws_env, store  # noqa: F401 - fixtures, found by name
