#!/usr/bin/env bash
# Build SeaweedFS (Apache-2.0), the test suite's second S3 store beside moto, from the Go module proxy's
# source of the pinned version, into a cache outside the repository:
#   ${TIERING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tiering}/seaweedfs/<version>/weed
# Idempotent: a no-op once built (offline from then on). The first build takes about 9 minutes on two cores.
# The version is pinned here and in tests/s3/seaweedfs.py (a test keeps them equal).
set -euo pipefail
module="github.com/seaweedfs/seaweedfs"
version="v0.0.0-20261109003541-7506e5f91cd6"  # SeaweedFS 4.53 (its go.mod's replace directives need this source)
cache="${TIERING_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tiering}/seaweedfs/$version"

if [[ -x "$cache/weed" ]]; then
  echo "fetch-seaweedfs: $cache/weed is built"
  exit 0
fi
command -v go >/dev/null 2>&1 || { echo "fetch-seaweedfs: go not found: install Go 1.26+ to build the S3 server the tests use" >&2; exit 2; }

echo "fetch-seaweedfs: building SeaweedFS $version (about 9 minutes on two cores, once) ..." >&2
src="$(go mod download -json "$module@$version" | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
mkdir -p "$cache"
log="$cache/build.log"
# From the module's own directory, so that its go.mod (and its replace directives) rule the build; the
# module cache is read-only, and the build writes only its output (next to the final name first).
if ! (cd "$src" && go build -trimpath -ldflags="-s -w" -o "$cache/weed.new" ./weed) >"$log" 2>&1; then
  echo "fetch-seaweedfs: the build failed (see $log)" >&2
  tail -5 "$log" >&2
  exit 1
fi
mv "$cache/weed.new" "$cache/weed"
echo "fetch-seaweedfs: built $cache/weed ($(du -h "$cache/weed" | cut -f1))"
