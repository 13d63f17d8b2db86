# The README's commands. `make demo` runs the main job on the embedded default, `make test` runs the
# whole check (install if needed, Kafka's jars for the broker tests, ruff, mypy, pytest), `make check` the inner
# loop (ruff, mypy and the tests that start no real component). All install into .venv/ from requirements.lock;
# only `make test` needs Maven (scripts/fetch-kafka.sh).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test check lint typecheck pytest demo demo-kafka airflow-ui bench bench-s3 bench-rebatch bench-keycompact bench-keycompact-kafka bench-merge bench-spark bench-scan bench-plan-scale chaos fuzz kafka-jars seaweedfs spark-artifact \
	test-kafka kafka-fixtures lock clean

install: $(STAMP)

$(STAMP): requirements.lock infra/docker/requirements-postgres.txt pyproject.toml setup.py tiering/kafka/_walker.c \
		tiering/kafka/_proof.c tiering/kafka/_records.c tiering/kafka/_records.h tiering/kafka/_keymap.c
	@bash scripts/check-prereqs.sh
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	@# The compose stack's database drivers, as its image has them (the compose stand-in's test uses them).
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r infra/docker/requirements-postgres.txt
	@# (setuptools warns that an editable install has a folder named like the package: it is meant to.)
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# Byte-compile our own code once: an editable install does not, and where PYTHONDONTWRITEBYTECODE is set every
	@# process (each CLI run, each Spark worker) would compile it again at start-up.
	$(BIN)/python -m compileall -q tiering spark_jobs dags >/dev/null
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check tiering tests bench spark_jobs dags

typecheck: $(STAMP)
	$(BIN)/mypy

# Two worker processes (pytest-xdist); each file's tests, and all the broker tests, run in one of them
# (tests/conftest.py). PYTEST_WORKERS=0 runs everything in this process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP) kafka-jars seaweedfs
	@bash scripts/ensure-chromium.sh
	@bash scripts/ensure-clang.sh
	@bash scripts/ensure-postgres.sh
	@mkdir -p build && rm -f build/junit.xml
	@# Each suite's tests and seconds at the end (tests/suite_times.py), whether pytest passed or not.
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --no-loadscope-reorder --durations=40 --junitxml=build/junit.xml \
		$(PYTEST_ARGS); status=$$?; \
		if [ -f build/junit.xml ]; then $(BIN)/python -m tests.suite_times build/junit.xml; fi; exit $$status

# The inner loop: ruff, mypy, and the tests that are not `slow` and start no real component (each has its marker in
# pyproject.toml: no broker, Java, Spark, SeaweedFS, Airflow, Chromium, PostgreSQL, root's namespaces, Docker or
# clang), in two workers; nothing to fetch or install beyond the venv. Every TIERING_REQUIRE_* is 1 here, so a test
# of this selection that would go without something fails instead of skipping: it needs that thing's marker.
CHECK_MARKERS := not slow and not kafka and not java and not seaweedfs and not spark and not airflow and not chromium \
	and not root and not postgres and not docker and not clang
CHECK_REQUIRE := TIERING_REQUIRE_KAFKA=1 TIERING_REQUIRE_SEAWEEDFS=1 TIERING_REQUIRE_CHROMIUM=1 \
	TIERING_REQUIRE_POSTGRES=1 TIERING_REQUIRE_FUZZ=1 TIERING_REQUIRE_LIBZSTD=1 TIERING_REQUIRE_JAVA=1 \
	TIERING_REQUIRE_ROOT=1 TIERING_REQUIRE_DOCKER_COMPOSE=1
check: lint typecheck
	$(CHECK_REQUIRE) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --no-loadscope-reorder --durations=20 \
		-m "$(CHECK_MARKERS)" $(PYTEST_ARGS)

# Apache Kafka's jars (pinned in tools/kafka/pom.xml) into the git-ignored tools/kafka/lib/, for the tests that
# run a real broker; cached: a no-op once fetched.
# Without Java or Maven it says so in one line; the broker tests then skip, except where TIERING_REQUIRE_KAFKA=1
# (CI), where that fails the run.
kafka-jars:
	@bash scripts/fetch-kafka.sh || [ "$$TIERING_REQUIRE_KAFKA" != 1 ]

# SeaweedFS, the tests' second S3 store (pinned in scripts/fetch-seaweedfs.sh), built with Go from the module proxy's
# source into ~/.cache/tiering/seaweedfs/ (outside the repository); a no-op once built. Without Go it says so in
# one line; the SeaweedFS tests then skip, except where TIERING_REQUIRE_SEAWEEDFS=1 (CI).
seaweedfs:
	@bash scripts/fetch-seaweedfs.sh || [ "$$TIERING_REQUIRE_SEAWEEDFS" != 1 ]

test-kafka: $(STAMP) kafka-jars
	$(BIN)/python -m pytest -q tests/kafka_broker $(PYTEST_ARGS)

# The restore story on a real broker, to watch: Kafka 4.3 writes, S3 (moto) holds, tiering s3 compact rewrites, a
# broker restarted on the result serves every record again (a table per partition; exit 1 on any difference).
demo-kafka: $(STAMP) kafka-jars
	$(BIN)/python -m tests.kafka_broker.demo $(DEMO_ARGS)

kafka-fixtures: $(STAMP) kafka-jars
	$(BIN)/python -m tests.kafka_broker.make_fixtures

# Fuzz the compiled code that reads segment bytes (tests/fuzz): each target for FUZZ_SECONDS (default 300) under
# AddressSanitizer and UndefinedBehaviorSanitizer, compared with its Python reference; a table at the end.
FUZZ_SECONDS ?= 300
fuzz: $(STAMP)
	@bash scripts/ensure-clang.sh
	$(BIN)/python -m tests.fuzz.run --seconds $(FUZZ_SECONDS) --json bench/out/fuzz.json $(FUZZ_ARGS)

# The chaos suite's long mode: many seeded trials (SIGKILLs, a flaky S3, racing runs, a mirror) and a table.
chaos: $(STAMP)
	$(BIN)/python bench/chaos.py --json bench/out/chaos.json $(CHAOS_ARGS)

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/python -m tiering demo $(DEMO_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/bench_rewrite.py $(BENCH_ARGS)

airflow-ui: $(STAMP)
	scripts/airflow-ui.sh

bench-s3: $(STAMP)
	$(BIN)/python bench/bench_s3.py $(BENCH_ARGS)

bench-rebatch: $(STAMP)
	$(BIN)/python bench/bench_rebatch.py $(BENCH_ARGS)

bench-keycompact: $(STAMP)
	$(BIN)/python bench/bench_keycompact.py $(BENCH_ARGS)

bench-keycompact-kafka: $(STAMP) kafka-jars
	$(BIN)/python -m tests.kafka_broker.bench_cleaner $(BENCH_ARGS)

bench-merge: $(STAMP)
	$(BIN)/python bench/bench_merge.py $(BENCH_ARGS)

bench-spark: $(STAMP)
	$(BIN)/python bench/bench_spark.py $(BENCH_ARGS)

spark-artifact: $(STAMP)  # dist/tiering-job-env.tar.gz: the Spark executors' environment (docs/dag.md)
	$(BIN)/python -m tiering.spark.artifact --out dist

bench-scan: $(STAMP)
	$(BIN)/python bench/bench_scan.py $(BENCH_ARGS)

bench-plan-scale: $(STAMP)
	$(BIN)/python bench/bench_plan_scale.py $(BENCH_ARGS)

lock:
	rm -rf /tmp/tiering-lock && $(PYTHON) -m venv /tmp/tiering-lock
	/tmp/tiering-lock/bin/pip install --quiet --upgrade pip setuptools wheel
	/tmp/tiering-lock/bin/pip install --quiet ".[test]"
	{ echo "# Pinned versions of every package the project installs into .venv (Python 3.11, Linux)."; \
	  echo "# Regenerate: make lock (a fresh venv, the top-level requirements of pyproject.toml, pip freeze)."; \
	  /tmp/tiering-lock/bin/pip freeze --all | grep -v -iE '^(kafka-s3-tiering|-e )'; } > requirements.lock

clean:
	rm -rf $(VENV) build *.egg-info tiering/kafka/_walker*.so tiering/kafka/_proof*.so tiering/kafka/_records*.so
