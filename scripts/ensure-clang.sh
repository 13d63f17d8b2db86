#!/usr/bin/env bash
# The fuzz targets (tests/fuzz) build the compiled modules with clang's AddressSanitizer and
# UndefinedBehaviorSanitizer (as shared objects: the runtime is atheris's, preloaded, so clang's own runtime
# libraries are not needed). Install Debian's clang when no clang is there and this
# machine can (root with apt-get); otherwise say how. CI sets TIERING_REQUIRE_FUZZ=1, which makes a missing
# clang fail the fuzz test rather than skip it.
set -u
for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
  command -v "$c" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing clang (Debian package) for the fuzz targets ..." >&2
  pkgs="clang"
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs >/tmp/tiering-clang.log 2>&1 \
     || { DEBIAN_FRONTEND=noninteractive dpkg --configure -a >>/tmp/tiering-clang.log 2>&1
          apt-get update >>/tmp/tiering-clang.log 2>&1 && \
          DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs >>/tmp/tiering-clang.log 2>&1; }; then
    exit 0
  fi
  echo "could not install clang (see /tmp/tiering-clang.log)" >&2
else
  echo "clang is not installed: the fuzz test will skip (fix: apt-get install clang)" >&2
fi
exit 0
