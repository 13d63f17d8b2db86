"""What a test needs from the machine beyond the venv, and the one way a test goes without it: a skip that names
the variable which turns it into a failure. CI sets each of these variables (``.ci/run``), so there a missing
browser, broker or sanitizer fails the run instead of passing it quietly; ``tests/test_suite_skips.py`` holds
every skip in the suite to this module."""

from __future__ import annotations

import os
from typing import Final, NoReturn

import pytest

KAFKA: Final = "TIERING_REQUIRE_KAFKA"
SEAWEEDFS: Final = "TIERING_REQUIRE_SEAWEEDFS"
CHROMIUM: Final = "TIERING_REQUIRE_CHROMIUM"
POSTGRES: Final = "TIERING_REQUIRE_POSTGRES"
FUZZ: Final = "TIERING_REQUIRE_FUZZ"
LIBZSTD: Final = "TIERING_REQUIRE_LIBZSTD"
JAVA: Final = "TIERING_REQUIRE_JAVA"
ROOT: Final = "TIERING_REQUIRE_ROOT"
DOCKER_COMPOSE: Final = "TIERING_REQUIRE_DOCKER_COMPOSE"

# Each variable, with what it asks of the machine and which tests need that.
REQUIRES: Final = {
    KAFKA: "Java 17, Kafka's jars (scripts/fetch-kafka.sh) and confluent-kafka: the tests against a real broker",
    SEAWEEDFS: "SeaweedFS built by scripts/fetch-seaweedfs.sh: the tests against a second, real S3 store",
    CHROMIUM: "Chromium: the HTML report rendered and looked at",
    POSTGRES: "PostgreSQL (scripts/ensure-postgres.sh): the compose stand-in's Airflow database",
    FUZZ: "clang and atheris (scripts/ensure-clang.sh): the compiled readers fuzzed under the sanitizers",
    LIBZSTD: "libzstd 1.5.6 or later to load at run time: the compiled zstd proof",
    JAVA: "a JDK 17 and pyspark's codec jars: our codecs checked against the Java libraries Kafka uses",
    ROOT: "root with ip, unshare and nsenter: private mount and network namespaces (separate hosts, a bare machine)",
    DOCKER_COMPOSE: "Docker's compose plugin: the compose file read by Docker's own loader",
}

# The variables CI does not set, each with why it cannot: every other one it must (the suite-skips test says so).
NOT_IN_CI: Final = {
    DOCKER_COMPOSE: "Docker's compose plugin is in none of the registries CI reaches (Debian's docker-compose is "
                    "1.29, which predates the compose specification the file follows); the compose stand-in "
                    "(tests/infra/test_standin.py) runs the file's services in CI instead",
}


def required(variable: str) -> bool:
    """Whether this run requires what ``variable`` names (it is set to 1)."""
    if variable not in REQUIRES:
        raise KeyError(f"{variable} is not one of tests/needs.py's variables: {', '.join(REQUIRES)}")
    return os.environ.get(variable) == "1"


def missing(variable: str, why: str) -> NoReturn:
    """The test cannot run here for ``why``: a failure where ``variable`` is 1, a skip naming it otherwise (either
    reported at the line that called this)."""
    __tracebackhide__ = True
    if required(variable):
        pytest.fail(f"{why} ({variable}=1: this run requires it)", pytrace=False)
    pytest.skip(f"{why} (set {variable}=1 to make this a failure)")
