# One-command set-up: every target installs what it needs into .venv first (torch 2.13.0 CPU, pinned).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-cuda lint bench

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,lint]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/prefect-gliner2 demo

test: setup
	$(PY) -m pytest -q

test-cuda: setup
	CUBLAS_WORKSPACE_CONFIG=:4096:8 $(PY) -m pytest -q tests/test_training_session_cuda.py

lint: setup
	$(VENV)/bin/ruff check session_core tasks flows deployments tests bench
	$(VENV)/bin/mypy

bench: setup
	$(PY) bench/run_all.py
