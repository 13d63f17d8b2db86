#!/usr/bin/env bash
# The compose stack's Airflow api-server (UI + REST + the task execution API). Airflow 3's simple auth
# manager reads each user's password from a JSON file and, for a user missing there, generates one and
# prints it. For a documented login, this writes the file first from AIRFLOW_ADMIN_USER /
# AIRFLOW_ADMIN_PASSWORD (compose: admin / admin unless set in .env). Demo-grade: the simple auth
# manager keeps passwords in plain text; use a real auth manager anywhere that matters.
set -euo pipefail
: "${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:?must name the passwords file}"
python - <<'PY'
import json
import os

path = os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
with open(path, "w", encoding="utf-8") as f:
    json.dump({os.environ["AIRFLOW_ADMIN_USER"]: os.environ["AIRFLOW_ADMIN_PASSWORD"]}, f)
os.chmod(path, 0o600)
PY
exec airflow api-server --port 8080 "$@"
