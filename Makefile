# The two quick-start commands set everything up themselves, in .venv:
#   make demo   installs the project alone and runs the demo trainer;
#   make test   installs it with every extra the tests exercise (the adapters
#               are tested against the real transformers and ray), then runs
#               ruff, mypy --strict and pytest. `.ci/run` runs `make test`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check
# torch is installed first, pinned to the CPU build this project is tested with:
# an unpinned torch requirement with no torch installed pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: demo test lint typecheck unit bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-base: pyproject.toml | $(BIN)/python
	$(PIP) install -e .
	touch $@

$(VENV)/.installed-all: pyproject.toml | $(BIN)/python
	$(PIP) install $(TORCH)
	$(PIP) install -e '.[test,dev,plot,transformers,ray]'
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

test: lint typecheck unit

bench: $(VENV)/.installed-all
	$(BIN)/python benchmarks/bench_dispatch.py
	$(BIN)/python benchmarks/bench_rounds.py
	$(BIN)/python benchmarks/bench_log.py
	$(BIN)/python benchmarks/bench_state.py
	$(BIN)/python benchmarks/bench_hf_handoff.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
