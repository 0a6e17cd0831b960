# optirack: `make help` lists the targets. Everything that touches the rack runs as root.
SHELL := /bin/bash
VENV ?= $(CURDIR)/.venv
PY := $(VENV)/bin/python
TOPO ?= topologies/paper-testbed.yaml
PYTEST_ARGS ?=
# unit tests run on every core (pytest-xdist; --dist loadfile: a module's tests on one worker, so that what a module
# computes once for its tests, a module-scoped fixture or a cache, is computed once, not on each worker; tests/conftest.py
# puts the longest modules first); integration tests one at a time, as they share one emulated rack. make test runs the
# two at the same time (scripts/run_tests.py): the unit tests and the install test (marked install: root, pip, no rack),
# niced, on the cores the integration tests leave idle while they wait on containers and daemons
UNIT_WORKERS ?= auto
export VENV

.PHONY: help setup test test-unit test-integration lint controller image rack-up rack-down rack-status \
        rack-cli demo demo-quick bench report clean

help:
	@echo "make setup             install everything this machine needs (idempotent, as root)"
	@echo "make test              setup, lint, then all tests: the integration tests, and beside them the unit and"
	@echo "                       install tests (scripts/run_tests.py)"
	@echo "make test-unit         unit tests only (no root, fast; needs the venv)"
	@echo "make test-integration  integration and install tests only (root, OVS, Mininet, Docker, Ryu; pip)"
	@echo "make lint              ruff, and the type checker (mypy) over controller/"
	@echo "make controller        run the controller in the foreground (TOPO=$(TOPO))"
	@echo "make image             build the worker image if its inputs changed"
	@echo "make rack-up           build the emulated rack (TOPO=...); it stays up"
	@echo "make rack-status       bridges, ports, rates, circuits and controller connections"
	@echo "make rack-cli          build a new rack in the foreground with Mininet's CLI; exiting tears it down"
	@echo "                       (not a CLI on a rack already up: take that down first with make rack-down)"
	@echo "make rack-down         remove everything the rack made (safe to repeat); engines' image stores stay"
	@echo "make clean             build outputs, and the engines' and registry's caches (takes a rack down)"
	@echo "make demo              reproduce the paper's experiment (a new record in results/records/)"
	@echo "make demo-quick        the same, case (a) once (make demo ARGS=--quick, about 2 min; a record, not a result)"
	@echo "make bench             run every benchmark in turn, as root on the emulated rack (the trace replay"
	@echo "                       among them: the longest); each prints its figures"
	@echo "make report            rebuild the results tables of README.md and docs/ from results/records/"

setup:
	@bash scripts/setup.sh

lint: setup
	$(VENV)/bin/ruff check --no-cache controller emulation containers profiles simulator scripts evidence tests
	$(VENV)/bin/mypy controller

test: setup lint
	$(PY) -m scripts.run_tests --workers $(UNIT_WORKERS) -- $(PYTEST_ARGS)

test-unit:
	$(PY) -m pytest -m "not integration and not install" -n $(UNIT_WORKERS) --dist loadfile tests $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest -m "integration or install" tests $(PYTEST_ARGS)

controller: setup
	$(VENV)/bin/optirack-controller --optirack-rack $(TOPO) $(ARGS)

rack-up: setup
	$(VENV)/bin/optirack-rack up --topo $(TOPO) $(ARGS)

rack-down:
	@if [ -x $(VENV)/bin/optirack-rack ]; then $(VENV)/bin/optirack-rack down; else echo "no venv: nothing was set up"; fi

rack-status:
	$(VENV)/bin/optirack-rack status $(ARGS)

rack-cli: setup
	$(VENV)/bin/optirack-rack cli --topo $(TOPO)

image:
	@bash scripts/build-image.sh

bench: setup
	$(PY) scripts/bench_reconfig.py
	$(PY) scripts/bench_allreduce.py
	$(PY) scripts/bench_placement.py
	$(PY) scripts/bench_store.py
	$(PY) scripts/bench_simulate.py --runs 1  # 16,384 GPUs x 100,000 jobs once (about 6 min); --runs 3 for the docs figure
	$(PY) scripts/bench_loopback.py
	$(PY) scripts/bench_failover.py
	$(PY) scripts/replay_trace.py  # the trace check: traces/trace16.csv on topologies/trace16.yaml, fixed, regroup, defrag; writes results/replay/

# Every results table of README.md and docs/*.md, from the committed records (--check: compare only).
report:
	$(PY) -m evidence.report $(ARGS)

# Also the caches rack-down keeps: each emulated engine's image store and the registry's storage.
clean:
	rm -rf build .pytest_cache .ruff_cache
	@if [ -x $(VENV)/bin/optirack-rack ]; then $(VENV)/bin/optirack-rack down --purge; fi

# The main job: the paper's experiment on the default rack (a new record in results/records/). ARGS="--quick" for a short run.
demo: setup
	$(PY) -m evidence.demo $(ARGS)

demo-quick: setup
	$(PY) -m evidence.demo --quick $(ARGS)
