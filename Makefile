# Switchboard: `make run` serves the Board and the agent API; `make test` runs the suite.
# Both work from a fresh clone: they create .venv, install, and start a project-local
# PostgreSQL when DATABASE_URL is unset.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# Python 3.12 (pinned in .python-version): from PATH, from pyenv, or pyenv's folder.
PYTHON ?= $(shell command -v python3.12 2>/dev/null \
	|| (command -v pyenv >/dev/null 2>&1 && pyenv which python3.12 2>/dev/null) \
	|| ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | sort -V | tail -n 1)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

export DJANGO_SETTINGS_MODULE := board.settings

# Django's SECRET_KEY: the environment's, else a local one generated once and kept
# in the git-ignored .switchboard-secret-key (mode 600). With DEBUG off the settings
# refuse to start without a key. The tests bring their own (tests/settings.py).
SECRET_KEY_FILE := .switchboard-secret-key
SECRET_KEY ?= $(shell [ -s $(SECRET_KEY_FILE) ] || (umask 077 && head -c 48 /dev/urandom | base64 | tr -d '\n=+/' > $(SECRET_KEY_FILE)); cat $(SECRET_KEY_FILE))
export SECRET_KEY

.PHONY: help venv db db-stop migrate demo run test test-long lint fmt system-deps clean bench bench-peers resilience ha ha-stop

# A target's text may name HOST and PORT: it shows their values.
help: ## List the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) \
		| sed -e 's/\$$(HOST)/$(HOST)/g' -e 's/\$$(PORT)/$(PORT)/g' \
		| awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml clients/python/pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "Python 3.12 not found: install it or set PYTHON=/path/to/python3.12" >&2; exit 1; fi
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	$(BIN)/python -m pip install -q -e ./clients/python
	@touch $@

venv: $(STAMP) ## Create .venv and install Switchboard with its dev tools.

# The peers bench/peers.py measures against (pgqueuer, procrastinate): the
# `bench` extra, installed by `make bench` only, never by `make test`.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	@touch $@

system-deps: ## Install the Debian packages the tests need (as root), when missing.
	@scripts/system-deps.sh

db: ## Start (or reuse) the project-local PostgreSQL, unless DATABASE_URL is set.
	@if [ -z "$$DATABASE_URL" ]; then scripts/devdb.sh start; fi

db-stop: ## Stop the project-local PostgreSQL.
	@scripts/devdb.sh stop

# Migrations may build indexes over the whole table: the per-request statement
# timeout must not cancel them halfway.
migrate: venv db ## Apply the database migrations.
	SWITCHBOARD_STATEMENT_TIMEOUT_MS=0 $(BIN)/python manage.py migrate --no-input -v 0

demo: migrate ## Ensure the demo operator login and demo endpoint; print them.
	@$(BIN)/python manage.py ensure_demo --url http://$(HOST):$(PORT)

run: demo ## Serve the Board and the agent API with gunicorn on $(HOST):$(PORT).
	$(BIN)/python manage.py collectstatic --no-input -v 0
	@echo "Serving http://$(HOST):$(PORT)/ (the Board at /board/, the API at /api/v1/), with the sweep loop beside it."
	@scripts/serve.sh $(BIN) $(HOST):$(PORT)

test: system-deps venv db ## Run the test suite against a real PostgreSQL (all but the minutes-long soaks).
	$(BIN)/python -m pytest -m "not long" $(PYTEST_ARGS)

test-long: system-deps venv db ## Run the minutes-long soaks (marked long) that CI runs after make test.
	$(BIN)/python -m pytest -m long $(PYTEST_ARGS)

# QUICK=1: a smoke run of each at tiny sizes (a minute or two; the result files
# say quick). BENCH_ARGS go to every script (e.g. --database-url); a script's own
# flags (sizes, repetitions) by running it alone: python bench/<name>.py --help.
BENCH_QUICK := $(if $(QUICK),--quick,)

bench: venv db $(BENCH_STAMP) ## Run the benchmarks (about 33 min; QUICK=1 for a smoke run); results in bench/results/latest/.
	$(BIN)/python bench/store_vs_sql.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/claim_latency.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/peers.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/doorbell_latency.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/waiting_agents.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/failover_cost.py --start-pair $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/board.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/worker_runtime.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/admission.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/schedule_lateness.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/tracing.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/budgets.py $(BENCH_QUICK) $(BENCH_ARGS)
	$(BIN)/python bench/report.py

bench-peers: venv db $(BENCH_STAMP) ## Only bench/peers.py: every path side by side with pgqueuer and procrastinate.
	$(BIN)/python bench/peers.py $(BENCH_QUICK) $(BENCH_ARGS)

resilience: venv ## Restart PostgreSQL under running agents; count lost todos (must be 0).
	$(BIN)/python scripts/resilience.py

ha: system-deps ## Start a failover pair (Patroni + etcd: primary and synchronous standby); print its DATABASE_URL.
	@scripts/ha.sh start

ha-stop: ## Stop the failover pair (its data stays in .hadata or its temp folder).
	@scripts/ha.sh stop

lint: venv ## Check style with ruff; type-check the core and the Python client strictly with mypy.
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy
	cd clients/python && $(abspath $(BIN))/mypy

fmt: venv ## Format with ruff.
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

clean: ## Stop the databases, delete their data (.pgdata, .hadata or their temp folders) and .venv.
	@scripts/devdb.sh destroy
	@scripts/ha.sh destroy
	rm -rf $(VENV)
