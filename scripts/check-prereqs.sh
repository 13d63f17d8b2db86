#!/usr/bin/env bash
# Checks the programs the project needs before anything is installed, and says what to do if one is
# missing: a clear message, not a stack trace.
set -u
fail=0
need() { echo "missing prerequisite: $1" >&2; echo "  fix: $2" >&2; fail=1; }

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null 2>&1; then
  need "Python 3.11+ ($PY not found)" "install Python 3.11 or newer, or set PYTHON=/path/to/python3.11"
elif ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  need "Python 3.11+ (found $("$PY" --version 2>&1))" "install Python 3.11 or newer, or set PYTHON=..."
elif ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need "Python's venv and ensurepip modules" "apt-get install python3-venv (Debian/Ubuntu)"
fi
if ! command -v java >/dev/null 2>&1; then
  need "Java 17+ (Spark runs on the JVM; java not found on PATH)" "apt-get install openjdk-17-jre-headless, or set JAVA_HOME and PATH"
else
  jv=$(java -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
  major=${jv%%.*}
  if [ -z "$major" ] || [ "$major" -lt 17 ] 2>/dev/null; then
    need "Java 17+ (found '${jv:-unknown}')" "install a Java 17 or newer runtime"
  fi
fi
if ! command -v cc >/dev/null 2>&1 && ! command -v gcc >/dev/null 2>&1; then
  need "a C compiler (the record walker is compiled at install)" "apt-get install gcc python3-dev"
fi
exit $fail
