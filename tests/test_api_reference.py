"""The API reference builds from the docstrings, warnings as errors, and documents
what users look up: ``open_run``'s parameters, ``Reporter``, ``Run``, the
built-ins' arguments, the replay and testing helpers, the bus.

The build is the command ``make docs`` runs (``docs/api/build.py``, pdoc), into
a temporary directory; it needs pdoc (the ``docs`` extra) and, for the
adapters' pages, transformers and ray (what ``make test`` installs).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "docs" / "api" / "build.py"

pytest.importorskip("pdoc", reason="the API reference needs pdoc: pip install -e '.[docs]'")
for _extra in ("transformers", "ray"):
    if importlib.util.find_spec(_extra) is None:
        pytest.skip(
            f"the adapters' reference pages need {_extra}: pip install -e '.[{_extra}]'",
            allow_module_level=True,
        )


class Entries(HTMLParser):
    """Each documented name (a pdoc anchor) -> its signature and docstring, as text."""

    def __init__(self) -> None:
        super().__init__()
        self.signature: dict[str, str] = {}
        self.docstring: dict[str, str] = {}
        self._current = ""
        self._into: dict[str, str] | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if self._into is not None:
            self._depth += 1
        elif tag in ("section", "div") and attributes.get("id"):
            self._current = attributes["id"] or ""
        elif tag == "span" and ("name" in classes or "signature" in classes):
            self._start(self.signature, tag)
        elif tag == "div" and "docstring" in classes:
            self._start(self.docstring, tag)

    def _start(self, into: dict[str, str], tag: str) -> None:
        self._into, self._depth = into, 1
        into.setdefault(self._current, "")

    def handle_endtag(self, tag: str) -> None:
        if self._into is not None:
            self._depth -= 1
            if self._depth == 0:
                self._into = None

    def handle_data(self, data: str) -> None:
        if self._into is not None:
            self._into[self._current] += data


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("api")
    done = subprocess.run(
        [sys.executable, str(BUILD), str(out)],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"the API reference does not build:\n{done.stderr}"
    return out


def page(reference: Path, module: str) -> Entries:
    entries = Entries()
    entries.feed((reference / f"{module.replace('.', '/')}.html").read_text())
    return entries


def test_make_docs_runs_the_build_this_test_runs() -> None:
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None, "the Makefile has no docs target"
    assert "docs/api/build.py" in recipe[1]
    assert re.search(r"^test:.*\bdocs\b", (ROOT / "Makefile").read_text(), re.M)


def test_every_public_module_has_a_page_and_no_private_one(reference: Path) -> None:
    pages = {
        str(p.relative_to(reference).with_suffix("")).replace("/", ".")
        for p in reference.rglob("*.html")
    }
    for module in (
        "eventbus",
        "eventbus.log",
        "eventbus.state",
        "eventbus.testing",
        "handlers",
        "handlers.wiring",
        "adapters.transformers",
        "adapters.ray",
        "adapters.cli",
        "adapters.report",
    ):
        assert module in pages
    assert [p for p in pages if any(part.startswith("_") for part in p.split("."))] == []
    index = (reference / "index.html").read_text()
    assert "handlers.html" in index and "eventbus.html" in index


def test_open_run_documents_its_parameters(reference: Path) -> None:
    handlers = page(reference, "handlers")
    signature = handlers.signature["open_run"]
    for parameter in ("callbacks", "log", "state_dir", "resume_from", "options", "RunKeywords"):
        assert re.search(rf"\b{parameter}\b", signature), parameter
    explained = ("world_size", "period", "timeout", "state_dir", "resume_from", "strict_state")
    for name in explained:
        assert name in handlers.docstring["open_run"], name


def test_run_reporter_and_builtins_are_documented(reference: Path) -> None:
    handlers = page(reference, "handlers")
    for name in ("Run", "Reporter", "Run.workers", "EarlyStopping", "BestCheckpoints"):
        assert handlers.docstring.get(name, "").strip(), f"{name} has no docstring"
    assert re.search(r"\bmetrics\b.*\bcheckpoint\b", handlers.signature["Reporter.report"])
    for name, arguments in {
        "EarlyStopping.__init__": ("metric", "patience", "threshold", "mode"),
        "BestCheckpoints.__init__": ("metric", "k", "mode"),
    }.items():
        for argument in arguments:
            assert re.search(rf"\b{argument}\b", handlers.signature[name]), (name, argument)


def test_replay_and_testing_helpers_are_documented(reference: Path) -> None:
    testing = page(reference, "eventbus.testing")
    assert "types" in testing.signature["replay_log"]
    for name in ("replay_log", "ReplayResult"):
        assert testing.docstring.get(name, "").strip(), f"{name} has no docstring"
    assert page(reference, "eventbus.log").docstring.get("replay_file", "").strip()


def test_the_bus_and_the_adapters_are_documented(reference: Path) -> None:
    bus = page(reference, "eventbus")
    assert "event_types" in bus.signature["EventBus.subscribe"]
    assert bus.docstring["EventBus.subscribe"].strip()
    # exported lazily (transformers is imported on first use), documented all the same
    assert page(reference, "adapters.transformers").docstring["EventBusCallback"].strip()
    assert page(reference, "adapters.ray").docstring["EventBusUserCallback"].strip()
