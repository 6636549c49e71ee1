# Starforge: `make run` starts the product on the embedded default; `make test` runs the suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PG_URL ?= postgres://postgres@127.0.0.1:5432/starforge_ci
PYTEST := $(PY) -m pytest

VENV_JOBS := .venv-jobs
VENV_MLFLOW := .venv-mlflow

.PHONY: help venv jobenv engines sandbox-tools run test test-postgres test-sqlite lint bench clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

$(VENV)/.installed: requirements.txt requirements-dev.txt client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	$(PY) -m pip install -q -e client
	touch $@

venv: $(VENV)/.installed ## Create the virtualenv with pinned requirements and the sf client

# A job's own training environment for the real-framework tests (PyTorch CPU, MLflow's client,
# TensorBoard), apart from the server's: tests find it through SF_TEST_JOB_PYTHON.
$(VENV_JOBS)/.installed: requirements-jobs.txt
	$(PYTHON) -m venv $(VENV_JOBS)
	$(VENV_JOBS)/bin/python -m pip install -q -r requirements-jobs.txt
	touch $@

jobenv: $(VENV_JOBS)/.installed ## Create the job environment the real-framework tests train in

$(VENV_MLFLOW)/.installed: requirements-bench.txt
	$(PYTHON) -m venv $(VENV_MLFLOW)
	$(VENV_MLFLOW)/bin/python -m pip install -q -r requirements-bench.txt
	touch $@

# The engines the tests run for real: Ray in the venv, Slurm and munge from Debian.
$(VENV)/.engines: requirements-engines.txt $(VENV)/.installed
	$(PY) -m pip install -q -r requirements-engines.txt
	touch $@

engines: $(VENV)/.engines ## Install Ray (venv) and Slurm + munge (Debian) for the engine suites
	@command -v sbatch >/dev/null && [ -x /usr/sbin/munged ] || .ci/slurm.sh install

# The local executor's job sandbox (jobs/executors/sandbox.py): installed when the server runs
# as root, the only case in which jobs run as other uids and get one.
sandbox-tools: ## Install bubblewrap, passt and nftables (Debian) for the job sandbox, as root
	@if [ "$$(id -u)" = 0 ] && ! { command -v bwrap && command -v pasta && command -v nft && \
		command -v ip; } >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			bubblewrap passt nftables iproute2 >/dev/null; fi

run: venv sandbox-tools ## Start the whole product (SQLite, local executor, its own Redis with a password)
	$(PY) manage.py runstack

# The OpenID provider the identity tests start (npm's oidc-provider, tests/identity/provider).
IDP := tests/identity/provider
$(IDP)/node_modules/.installed: $(IDP)/package.json $(IDP)/package-lock.json
	npm ci --prefix $(IDP) --no-audit --no-fund --silent
	touch $@

test: venv jobenv engines sandbox-tools $(IDP)/node_modules/.installed ## Run the whole suite as five pytest runs, three at a time (.ci/suite.py; starts PostgreSQL, Slurm and Ray when not running)
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@.ci/services.sh start postgres
	@trap '.ci/services.sh stop' EXIT; PG_URL=$(PG_URL) \
		SF_TEST_JOB_PYTHON=$(CURDIR)/$(VENV_JOBS)/bin/python \
		SF_SANDBOX_SOFTWARE=$(CURDIR)/$(VENV_JOBS) $(PY) .ci/suite.py

# One part of the suite at a time, in the foreground, against REDIS_URL (default: db 11 of the
# Redis on 6379). pytest exits 5 when it collected nothing: a suite that ran nothing is a failure.
# The ledger suite, which runs on either database (.ci/suite.py's LEDGER names the same folders).
LEDGER_TESTS := $(addprefix tests/,ledger loops actions reads api console stores executors metering audit)
test-postgres: export REDIS_URL ?= redis://127.0.0.1:6379/11
test-sqlite: export REDIS_URL ?= redis://127.0.0.1:6379/11
test-postgres:
	@echo "== suite on PostgreSQL"; \
	DATABASE_URL=$(PG_URL) $(PYTEST) -q --durations=15; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests ran"; exit 1; fi; exit $$rc

test-sqlite:
	@echo "== ledger suite on the embedded SQLite default"; \
	DATABASE_URL= SF_SQLITE_TEST_DB=$(CURDIR)/var/test-sqlite.db $(PYTEST) -q -m "not postgres and not e2e and not s3" $(LEDGER_TESTS); \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests ran"; exit 1; fi; exit $$rc

lint: venv ## ruff lint and format check, mypy (django-stubs) on the server code
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy jobs starforge metering

bench: venv engines $(VENV_MLFLOW)/.installed ## Every benchmark, the median of 3 runs each (BENCH_REPEAT=N): bench/RESULTS.md
	@.ci/services.sh start
	@trap '.ci/services.sh stop' EXIT; \
	export REDIS_URL=redis://127.0.0.1:$$(cat var/ci-redis-port)/12; \
	$(PY) bench/run.py --repeat $(or $(BENCH_REPEAT),3)

# Each round has its own PostgreSQL database, Redis and (Slurm) slurmctld + slurmd, and stops them.
.PHONY: chaos
chaos: venv engines ## Fault injection: 300 jobs on local and on Slurm while processes are killed and a lender takes its lent GPUs back
	@.ci/services.sh start
	@trap '.ci/services.sh stop' EXIT; \
	$(PY) -m tests.chaos.driver --executor local --jobs 300 --duration 180 && \
	$(PY) -m tests.chaos.driver --executor slurm --jobs 300 --duration 180

clean: ## Remove the virtualenv and var/
	rm -rf $(VENV) var
