# Two commands on a fresh machine: `make run` (the service on SQLite under ./var) and `make test` (the suite).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
HOST   ?= 127.0.0.1
PORT   ?= 8000
# pytest-xdist workers (auto: one per core)
JOBS   ?= auto

.PHONY: run test lint format test-fast install install-dev lock migrate openapi docs cases clean differential

UV_VERSION := 0.13.9

# The virtual environment holds exactly what uv.lock pins (the project itself editable, with the dev extras).
$(VENV)/.installed: pyproject.toml uv.lock
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "uv==$(UV_VERSION)"
	UV_PROJECT_ENVIRONMENT=$(VENV) $(VENV)/bin/uv sync --frozen --inexact --extra dev --compile-bytecode --quiet
	touch $@

# After changing dependencies in pyproject.toml: refresh the lock (then commit uv.lock).
lock: $(VENV)/.installed
	$(VENV)/bin/uv lock

install install-dev: $(VENV)/.installed

run: $(VENV)/.installed
	$(VENV)/bin/preflight serve --host $(HOST) --port $(PORT)

migrate: $(VENV)/.installed
	$(VENV)/bin/preflight migrate

test: $(VENV)/.installed
	$(PY) -m pytest -n $(JOBS)

# The pure domain (rules, memory model, rendering) and the launch cases: no database, no processes.
test-fast: $(VENV)/.installed
	$(PY) -m pytest -n $(JOBS) tests/domain tests/cases

# What CI checks before the suite: lint (ruff) and types (mypy: strict on service/domain).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# ruff's automatic fixes (import order, pyupgrade), then ruff format's layout
format: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Regenerate the checked-in documents that tests keep in sync.
openapi: $(VENV)/.installed
	$(PY) -m service.api.openapi > openapi/openapi.json

docs: $(VENV)/.installed
	$(PY) -m service.domain.rules.catalogue > docs/rules.md

# The handed launch cases alone (tests/cases/handed: real launches with the verdict vLLM reached).
cases: $(VENV)/.installed
	$(PY) -m pytest tests/cases/test_handed.py

clean:
	rm -rf $(VENV) var .pytest_cache

# Preflight's verdicts beside vLLM's own (parser + create_engine_config, no GPU) on seeded drawn launches; writes
# docs/differential.md. Builds its throw-away environment on first use (~6 GB, plus ~5 GB of wheels and releases).
differential: $(VENV)/.installed
	$(PY) scripts/vllm_differential.py --vllm 0.33.0:2000 --vllm 0.24.0:500 --vllm 0.13.0:500 --vllm 0.10.2:500 --docs
