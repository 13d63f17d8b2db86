#!/usr/bin/env bash
# Fetch Apache Kafka's jars (broker, tools, Java client; pinned in tools/kafka/pom.xml) into tools/kafka/lib/
# for the broker tests (tests/kafka_broker). Idempotent: skipped when lib/ holds the jars of this very pom.xml
# (tools/kafka/lib/.stamp keeps its sha256). Works offline once Maven's local repository has them.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
dir="$here/tools/kafka"
lib="$dir/lib"
stamp="$lib/.stamp"

command -v java >/dev/null 2>&1 || { echo "fetch-kafka: java not found: install a Java 17+ runtime (e.g. apt-get install openjdk-17-jre-headless)" >&2; exit 2; }
command -v mvn >/dev/null 2>&1 || { echo "fetch-kafka: mvn not found: install Apache Maven 3.6+ (e.g. apt-get install maven)" >&2; exit 2; }

want="$(sha256sum "$dir/pom.xml" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && ls "$lib"/kafka_2.13-*.jar "$lib"/kafka-tools-*.jar >/dev/null 2>&1; then
  echo "fetch-kafka: tools/kafka/lib is up to date ($(ls "$lib"/*.jar | wc -l) jars)"
  exit 0
fi

offline=()
# Offline when every artifact is already in the local repository (no network needed, and faster).
if mvn -q -B -Dstyle.color=never -o -f "$dir/pom.xml" dependency:resolve -DincludeScope=runtime >/dev/null 2>&1; then offline=(-o); fi
# Into lib.new first: a failed fetch leaves the previous lib/ as it was.
rm -rf "$lib.new"
# (-q still writes a colour reset: strip escape sequences; pipefail keeps mvn's exit status)
(cd "$dir" && mvn -q -B -Dstyle.color=never "${offline[@]}" dependency:copy-dependencies -DoutputDirectory=lib.new \
  -DincludeScope=runtime) 2>&1 | sed 's/\x1b\[[0-9;]*m//g'
ls "$lib.new"/kafka_2.13-*.jar "$lib.new"/kafka-tools-*.jar >/dev/null
echo "$want" > "$lib.new/.stamp"
rm -rf "$lib"
mv "$lib.new" "$lib"
echo "fetch-kafka: $(ls "$lib"/*.jar | wc -l) jars in tools/kafka/lib (Kafka $(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$dir/pom.xml"))"
