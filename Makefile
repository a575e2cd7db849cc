# rlrun developer entry points. `make run` and `make test` set everything up on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
CONSTRAINTS := constraints/cpu.txt
CONFIG ?= configs/reverse_text.toml
export OMP_NUM_THREADS := 1
export MKL_NUM_THREADS := 1
export TOKENIZERS_PARALLELISM := false
export PIP_CONSTRAINT := $(abspath $(CONSTRAINTS))

.PHONY: setup run test test-slow test-gpu proto lint bench crd chart clean

setup: $(STAMP)

# Re-runs only when the dependency declarations change; otherwise `make setup` is instant.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) torch==2.13.0
	$(BIN)/python -m pip install --quiet -c $(CONSTRAINTS) -e '.[dev]'
	touch $(STAMP)

run: setup
	$(BIN)/rlrun local $(CONFIG)

test: setup
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu

proto: setup
	$(BIN)/python -m rlrun.common.protogen

lint: setup
	$(BIN)/ruff check services tests examples
	$(BIN)/ruff format --check services tests examples

bench: setup
	for name in inference env-server trainer orchestrator async stack; do $(BIN)/rlrun bench $$name || exit 1; done

crd: setup
	$(BIN)/python -m rlrun.operator.crd

chart: setup
	$(BIN)/python -m pytest -q tests/chart

clean:
	rm -rf $(VENV) outputs .pytest_cache
