# The two quick-start commands set everything up themselves, in .venv:
#   make demo   installs the project alone and runs the demo trainer;
#   make test   installs it with every extra the tests exercise (the adapters
#               are tested against the real transformers and ray), then runs
#               ruff, mypy --strict, pytest and `make docs`. `.ci/run` runs
#               `make test`.
#   make docs   builds the API reference from the docstrings (pdoc, through
#               docs/api/build.py) into build/api/index.html, git-ignored;
#               any warning fails the build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check
# torch is installed first, pinned to the CPU build this project is tested with:
# an unpinned torch requirement with no torch installed pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# Where `make docs` writes the API reference (build/ is git-ignored).
API_DIR ?= build/api

.PHONY: demo test lint typecheck unit docs bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-all: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[test,dev,plot,transformers,ray,docs]'
	touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(BIN)/eventbus demo

lint: $(VENV)/.installed-all
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-all
	$(BIN)/mypy

unit: $(VENV)/.installed-all
	$(BIN)/python -m pytest

docs: $(VENV)/.installed-all
	rm -rf $(API_DIR)
	$(BIN)/python docs/api/build.py $(API_DIR)

test: lint typecheck unit docs

# Every performance target, measured now, in one table (about 4 minutes);
# `make bench-quick` is the same in under a minute, for before a commit.
bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/check.py

bench-quick: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/check.py --quick

$(VENV)/.installed-bench: $(VENV)/.installed-all
	$(PIP) install -e '.[bench]'
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis $(API_DIR)
