# Everything installs into .venv on first use; nothing global is touched.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SOURCES := schemas store streams workflows cli devstack migrations benchmarks

.PHONY: install lint typecheck check-generated test test-fast dev bench bench-tracing bench-peers bench-backlog bench-scaleout bench-metrics bench-round-trips kafka clean

# pip only installs uv; its pip-compatible installer does the rest.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv
	$(BIN)/python -m uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev,test,tracing]'
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

check-generated: $(STAMP)
	$(BIN)/python -m schemas.generate --check

# The whole suite: lint, types, generated code, then every test against real
# Postgres and a real Apache Kafka the suite starts itself, once, shared by
# PYTEST_WORKERS processes (the end-to-end tests mostly wait on I/O). A module
# runs on one worker, so its module-scoped servers start once; the longest
# modules go first (tests/conftest.py). mypy checks the types while the tests
# run, and the target fails if either does. pytest's exit code 5 (no test ran)
# fails the target like any other.
PYTEST_WORKERS ?= 6
# Compiled up front, the tests' worker and CLI subprocesses load bytecode
# instead of compiling every module at each start, PYTHONDONTWRITEBYTECODE or not.
test: lint check-generated
	$(BIN)/python -m compileall -q $(SOURCES) tests
	$(BIN)/mypy > $(VENV)/mypy.log 2>&1 & typing=$$!; \
	$(BIN)/pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15; tests=$$?; \
	wait $$typing; types=$$?; \
	echo "mypy:"; cat $(VENV)/mypy.log; \
	test $$tests -eq 0 && test $$types -eq 0

# Unit tests only: no services.
test-fast: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider tests/unit

# The embedded stack: Postgres, the Tansu broker, a worker with every role, a sample workflow.
dev: $(STAMP)
	$(BIN)/wfjobs dev

bench: $(STAMP)
	$(BIN)/python -m benchmarks.end_to_end

# Jobs/s with WFJOBS_TRACING on and off, alternating rounds on one Postgres and one Kafka.
bench-tracing: $(STAMP)
	$(BIN)/python -m benchmarks.tracing

# Side by side with pgqueuer, procrastinate and a bare SKIP LOCKED queue, on one Postgres.
bench-peers: $(STAMP)
	$(BIN)/python -m uv pip install --quiet --compile-bytecode --python $(BIN)/python -e '.[dev,test,tracing,bench]'
	$(BIN)/python -m benchmarks.peers

# Per-job cost with 1 000, 10 000 and 100 000 jobs queued.
bench-backlog: $(STAMP)
	$(BIN)/python -m benchmarks.backlog

# Each store call of a job (submit, claim, checkpoint, complete) timed alone.
bench-round-trips: $(STAMP)
	$(BIN)/python -m benchmarks.round_trips

# Drain jobs/s with 1, 2 and 4 worker processes, and against claim loops per process.
bench-scaleout: $(STAMP)
	$(BIN)/python -m benchmarks.scaleout

# Drain jobs/s and worker CPU per job with WFJOBS_METRICS on and off, alternating rounds.
bench-metrics: $(STAMP)
	$(BIN)/python -m benchmarks.metrics

# A single Apache Kafka 4.x broker (KRaft) on a free 127.0.0.1 port, until Ctrl-C.
kafka: $(STAMP)
	$(BIN)/python -m devstack.services kafka

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
