# The README's commands. `make demo` runs the main job on the embedded default, `make test` runs the
# whole check (install if needed, ruff, mypy, pytest). Both install into .venv/ from requirements.lock.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest demo airflow-ui bench bench-s3 bench-spark lock clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml setup.py tiering/kafka/_walker.c tiering/kafka/_proof.c
	@bash scripts/check-prereqs.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# Byte-compile our own code once: an editable install does not, and where PYTHONDONTWRITEBYTECODE is set every
	@# process (each CLI run, each Spark worker) would compile it again at start-up.
	$(BIN)/python -m compileall -q tiering spark_jobs dags >/dev/null
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check tiering tests bench spark_jobs dags

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	@bash scripts/ensure-chromium.sh
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/python -m tiering demo $(DEMO_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/bench_rewrite.py $(BENCH_ARGS)

airflow-ui: $(STAMP)
	scripts/airflow-ui.sh

bench-s3: $(STAMP)
	$(BIN)/python bench/bench_s3.py $(BENCH_ARGS)

bench-spark: $(STAMP)
	$(BIN)/python bench/bench_spark.py $(BENCH_ARGS)

lock:
	rm -rf /tmp/tiering-lock && $(PYTHON) -m venv /tmp/tiering-lock
	/tmp/tiering-lock/bin/pip install --quiet --upgrade pip setuptools wheel
	/tmp/tiering-lock/bin/pip install --quiet ".[test]"
	{ echo "# Pinned versions of every package the project installs into .venv (Python 3.11, Linux)."; \
	  echo "# Regenerate: make lock (a fresh venv, the top-level requirements of pyproject.toml, pip freeze)."; \
	  /tmp/tiering-lock/bin/pip freeze --all | grep -v -iE '^(kafka-s3-tiering|-e )'; } > requirements.lock

clean:
	rm -rf $(VENV) build *.egg-info tiering/kafka/_walker*.so tiering/kafka/_proof*.so
