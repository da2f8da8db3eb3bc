# Everything installs into .venv on first use; nothing global is touched.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint typecheck check-generated test test-fast dev bench bench-peers kafka clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,test]'
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
# modules go first (tests/conftest.py). pytest's exit code 5 (no test ran)
# fails the target like any other.
PYTEST_WORKERS ?= 4
test: lint typecheck check-generated
	$(BIN)/pytest -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations=15

# Unit tests only: no services.
test-fast: $(STAMP)
	$(BIN)/pytest -p no:cacheprovider tests/unit

# The embedded stack: Postgres, the Tansu broker, a worker with every role, a sample workflow.
dev: $(STAMP)
	$(BIN)/wfjobs dev

bench: $(STAMP)
	$(BIN)/python -m benchmarks.end_to_end

# Side by side with pgqueuer, procrastinate and a bare SKIP LOCKED queue, on one Postgres.
bench-peers: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,test,bench]'
	$(BIN)/python -m benchmarks.peers

# A single Apache Kafka 4.x broker (KRaft) on a free 127.0.0.1 port, until Ctrl-C.
kafka: $(STAMP)
	$(BIN)/python -m devstack.services kafka

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
