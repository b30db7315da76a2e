# The two quick-start commands (`make demo`, `make test`) set everything up
# themselves: a virtual environment in .venv with the project installed from
# this tree. `.ci/run` runs `make test`.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= test,dev

.PHONY: demo test lint typecheck unit bench clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $@

demo: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/eventbus demo

lint: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/mypy

unit: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/python -m pytest

test: lint typecheck unit

bench: $(VENV)/.installed-$(EXTRAS)
	$(BIN)/python benchmarks/bench_dispatch.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
