#!/usr/bin/env bash
# The fuzz targets (tests/fuzz) build the compiled modules with clang's AddressSanitizer and
# UndefinedBehaviorSanitizer as shared objects. At run time the sanitizer runtime is atheris's, preloaded;
# at link time clang still wants its own static part of it (libclang_rt.asan_static, from Debian's
# libclang-rt-<version>-dev, which `--no-install-recommends` leaves out). Install what is missing when this
# machine can (root with apt-get); otherwise say how. CI sets TIERING_REQUIRE_FUZZ=1, which makes a missing
# clang fail the fuzz test rather than skip it.
set -u
log=/tmp/tiering-clang.log

compiler=""
for c in clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
  if command -v "$c" >/dev/null 2>&1; then compiler="$c"; break; fi
done

runtime_present() {
  local dir
  dir="$("$compiler" --print-runtime-dir 2>/dev/null)" || return 1
  ls "$dir"/libclang_rt.asan*.a >/dev/null 2>&1
}

if [ -n "$compiler" ] && runtime_present; then
  exit 0
fi

if [ -n "$compiler" ]; then
  major="$("$compiler" -dumpversion 2>/dev/null | cut -d. -f1)"
  pkgs="libclang-rt-${major}-dev"
  what="clang's sanitizer runtime"
else
  pkgs="clang libclang-rt-dev"
  what="clang and its sanitizer runtime"
fi

if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing $what for the fuzz targets (Debian: $pkgs) ..." >&2
  # shellcheck disable=SC2086  # a list of package names
  if DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs >"$log" 2>&1 \
     || { DEBIAN_FRONTEND=noninteractive dpkg --configure -a >>"$log" 2>&1
          apt-get update >>"$log" 2>&1 && \
          DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $pkgs >>"$log" 2>&1; }; then
    exit 0
  fi
  echo "could not install $what (see $log)" >&2
else
  echo "$what not installed: the fuzz test will skip or fail (fix: apt-get install $pkgs)" >&2
fi
exit 0
