# The two quick-start commands set everything up themselves, in .venv:
#   make demo   installs the project alone and runs the demo trainer;
#   make test   installs it with every extra the tests exercise (the adapters
#               are tested against the real transformers and ray) and, when
#               missing, Chromium for the browser tests (`make chromium`),
#               then runs ruff, mypy --strict, the whole pytest suite and
#               `make docs`. `.ci/run` runs `make test`.
#   make check  the edit loop, in under a minute: ruff, mypy --strict and the
#               tests not marked slow, browser, crash or adapters (the markers
#               are given by path in tests/conftest.py).
#   make docs   builds the documentation site (MkDocs, Material, the reference
#               from the docstrings by mkdocstrings; mkdocs.yml) into
#               build/site, git-ignored; any warning fails the build (--strict).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --quiet --disable-pip-version-check
# The project and its dependencies go in with uv: every extra in about 20 s where pip takes
# 70 (on the 2-core machine this project is tested on, with no cache). pip installs uv
# itself, and torch: pip's configuration says where a machine keeps its wheels. Compiled
# to bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing else
# would, and each process would compile torch's and ray's imports anew (seconds each).
UV := $(BIN)/uv
INSTALL := $(UV) pip install --quiet --compile-bytecode --python $(BIN)/python
# torch is installed first, pinned to the CPU build this project is tested with:
# an unpinned torch requirement with no torch installed pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
# Where `make docs` writes the documentation site (build/ is git-ignored).
SITE_DIR ?= build/site
# setuptools' default editable install is an import hook, which type checkers
# cannot follow: mypy run on your own code, outside this folder, would not find
# the packages. `strict` installs a tree of links to the packages' files
# (build/__editable__.*, git-ignored) that a .pth puts on the path: the three
# packages alone, not tests/, benchmarks/ or examples/ (`compat` would add this
# whole folder). A file added to or removed from a package needs a reinstall:
# the list of files ($(VENV)/.package-files) changes, and the installs follow.
EDITABLE := --config-setting editable_mode=strict
PACKAGES := eventbus handlers adapters
# `make check`: what the edit loop leaves to `make test`.
QUICK := not slow and not browser and not crash and not adapters
# pytest-xdist workers for `make unit` (the machine this project is tested on has 2 cores).
WORKERS ?= 2
# Debian's chromium and the names other systems give it (tests/_browser.py looks for the same).
CHROMIUM_NAMES := chromium chromium-browser google-chrome

.PHONY: demo test check lint typecheck unit docs chromium bench bench-quick clean FORCE

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(UV): | $(BIN)/python
	$(PIP) install uv

# The files the install links (modules, py.typed, the report's assets), rewritten
# only when that list changes.
$(VENV)/.package-files: FORCE | $(BIN)/python
	@find $(PACKAGES) -type f \( -name '*.py' -o -name py.typed -o -path '*/_assets/*' \) \
		| LC_ALL=C sort > $@.new
	@if cmp -s $@.new $@; then rm -f $@.new; else mv $@.new $@; fi

$(VENV)/.installed-base: pyproject.toml $(VENV)/.package-files | $(UV)
	$(INSTALL) -e . $(EDITABLE)
	touch $@

$(VENV)/.installed-all: pyproject.toml $(VENV)/.package-files | $(UV)
	$(PIP) install $(TORCH)
	$(INSTALL) -e '.[test,dev,plot,transformers,ray,lightning,tensorboard,mlflow,otel,docs]' $(EDITABLE)
	touch $@ $(VENV)/.installed-base

demo: $(VENV)/.installed-base
	$(BIN)/eventbus demo

lint: $(VENV)/.installed-all
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-all
	$(BIN)/mypy

# The whole suite on $(WORKERS) pytest-xdist workers, a file to a worker at a time (its module
# fixtures made once) and the Ray files together on one (one cluster), the longest first
# (tests/conftest.py). `make unit WORKERS=0` runs it in one process.
unit: $(VENV)/.installed-all
	$(BIN)/python -m pytest -n $(WORKERS) --dist loadfile

# tests/adapter_tests is not even collected (importing torch, transformers and ray takes
# seconds), and pytest may cache its rewritten test modules whatever PYTHONDONTWRITEBYTECODE
# says (rewriting them all again takes seconds too).
check: lint typecheck
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -m "$(QUICK)" --ignore=tests/adapter_tests

# NO_MKDOCS_2_WARNING: Material's notice about MkDocs 2, printed at every build.
docs: $(VENV)/.installed-all
	rm -rf $(SITE_DIR)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(SITE_DIR)

test: chromium lint typecheck unit docs

# The browser tests render pages in headless Chromium. Tests never install
# system packages: this does, when none is on PATH and we may (root with
# apt-get, as CI is); it says nothing when one is there. Without it the browser
# tests skip, saying how to install it; under CI=true they fail instead.
chromium:
	@for name in $(CHROMIUM_NAMES); do command -v $$name >/dev/null && exit 0; done; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "make chromium: no Chromium, so the browser tests will skip;" \
			"install it with 'apt-get install chromium' (as root)"; \
		exit 0; \
	fi; \
	echo "make chromium: installing Debian's chromium for the browser tests (apt-get)"; \
	export DEBIAN_FRONTEND=noninteractive; \
	apt-get -qq -o DPkg::Lock::Timeout=300 update >/dev/null && \
	apt-get -qq -o DPkg::Lock::Timeout=300 install -y chromium >/dev/null

# Every performance target, measured now, in one table (about 13 minutes, most of them
# real HF, Lightning and Ray Train jobs); `make bench-quick` is the same in about 3 minutes.
bench: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/check.py

bench-quick: $(VENV)/.installed-bench
	$(BIN)/python benchmarks/check.py --quick

$(VENV)/.installed-bench: $(VENV)/.installed-all
	$(PIP) install -e '.[bench]' $(EDITABLE)
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis $(SITE_DIR) build/__editable__.*
