#!/usr/bin/env bash
# Airflow's UI on our DAGs against an embedded S3: a moto server on 127.0.0.1:${MOTO_PORT:-5055} holding the
# demo bucket (s3://kafka-demo/kafka/logs), and `airflow standalone` (SQLite, http://localhost:8080; the
# admin password is printed by Airflow and stored in $AIRFLOW_HOME/simple_auth_manager_passwords.json.generated).
# Trigger kafka_segment_compaction with {"bucket": "kafka-demo", "prefix": "kafka/logs",
# "min_segment_age_minutes": 0}. Stop with Ctrl-C (the moto server stops with it).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
PORT=${MOTO_PORT:-5055}
export AIRFLOW_HOME=${AIRFLOW_HOME:-$PWD/demo-out-ui/airflow}
export AIRFLOW__CORE__DAGS_FOLDER=$PWD/dags
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AWS_ENDPOINT_URL=http://127.0.0.1:$PORT
export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-demo} AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-demo}
export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}
export TIERING_SPARK_MASTER=${TIERING_SPARK_MASTER:-local[2]}
export TIERING_BUCKET=kafka-demo TIERING_PREFIX=kafka/logs  # the params' defaults, used by scheduled runs
mkdir -p "$AIRFLOW_HOME"
"$BIN/python" -m moto.server -H 127.0.0.1 -p "$PORT" > "$AIRFLOW_HOME/moto.log" 2>&1 &
MOTO=$!
trap 'kill $MOTO 2>/dev/null' EXIT
for _ in $(seq 50); do curl -s "$AWS_ENDPOINT_URL" > /dev/null && break; sleep 0.2; done
"$BIN/python" -c "
from tiering.demo.s3 import BUCKET, PREFIX, seed_demo
from tiering.storage.s3 import S3Store, make_client
client = make_client()
client.create_bucket(Bucket=BUCKET)
seeded = seed_demo(S3Store(client, BUCKET))
print(f'seeded s3://{BUCKET}/{PREFIX}: {len(seeded.originals)} segments on {client.meta.endpoint_url}')
"
PATH="$PWD/$BIN:$PATH" "$BIN/airflow" standalone
