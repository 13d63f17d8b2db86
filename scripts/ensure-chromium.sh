#!/usr/bin/env bash
# The HTML report's test renders the page in headless Chromium (Debian's package). Install it when it is
# missing and this machine can (root with apt-get); otherwise say how. CI sets TIERING_REQUIRE_CHROMIUM=1,
# which makes a missing browser fail the test rather than skip it.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing chromium (Debian package) for the HTML report test ..." >&2
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >/tmp/tiering-chromium.log 2>&1 \
     || { # an install killed half-way leaves dpkg "interrupted", and apt refuses everything until it is finished
          DEBIAN_FRONTEND=noninteractive dpkg --configure -a >>/tmp/tiering-chromium.log 2>&1
          apt-get update >>/tmp/tiering-chromium.log 2>&1 && \
          DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >>/tmp/tiering-chromium.log 2>&1; }; then
    exit 0
  fi
  echo "could not install chromium (see /tmp/tiering-chromium.log)" >&2
else
  echo "chromium is not installed: the HTML report test will skip (fix: apt-get install chromium)" >&2
fi
exit 0
