#!/usr/bin/env bash
# The compose stand-in's test (tests/infra/test_standin.py) runs PostgreSQL from Debian's packages, as the
# compose stack's database. Install it when it is missing and this machine can (root with apt-get);
# otherwise say how. CI sets TIERING_REQUIRE_POSTGRES=1, which makes a missing server fail that test
# rather than skip it. Only the binaries are used: no cluster of the package is started.
set -u
if [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing postgresql (Debian package) for the compose stand-in test ..." >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 >/tmp/tiering-postgres.log 2>&1 \
     || { apt-get update >>/tmp/tiering-postgres.log 2>&1 && \
          DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 >>/tmp/tiering-postgres.log 2>&1; }; then
    exit 0
  fi
  echo "could not install postgresql-15 (see /tmp/tiering-postgres.log)" >&2
else
  echo "postgresql-15 is not installed: the compose stand-in test will skip (fix: apt-get install postgresql-15)" >&2
fi
exit 0
