"""The reference (the site's Reference pages, mkdocstrings over the docstrings) builds with
the site, warnings as errors, and documents what users look up: ``open_run``'s parameters,
``Reporter``, ``Run``, the built-ins' arguments, the replay and testing helpers, the bus,
the adapters.

The build is the one ``make docs`` runs (``mkdocs build --strict`` of ``mkdocs.yml``), into a
temporary directory. mkdocstrings reads the source, so no adapter's library is needed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip(
    "mkdocstrings", reason="the site needs the docs extra: pip install -e '.[docs]'"
)

#: Each package's page, and the public modules it documents.
PAGES = {
    "eventbus": (
        "eventbus",
        "eventbus.options",
        "eventbus.log",
        "eventbus.state",
        "eventbus.testing",
    ),
    "handlers": ("handlers",),
    "adapters": (
        "adapters",
        "adapters.transformers",
        "adapters.lightning",
        "adapters.ray",
        "adapters.torchrun",
        "adapters.tensorboard",
        "adapters.mlflow",
        "adapters.otel",
        "adapters.report",
        "adapters.cli",
    ),
}


class Entries(HTMLParser):
    """Each documented name (a heading's anchor) -> its signature and docstring, as text: the
    docstring is the text after the name's heading and signature, up to the next heading."""

    def __init__(self) -> None:
        super().__init__()
        self.signature: dict[str, str] = {}
        self.docstring: dict[str, str] = {}
        self._current = ""
        self._skip: str | None = None  # "heading" or "signature", until its tag closes
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if self._skip is not None:
            self._depth += 1
        elif re.fullmatch(r"h[1-6]", tag) and "doc-heading" in classes and attributes.get("id"):
            self._current = attributes["id"] or ""
            self.signature.setdefault(self._current, "")
            self.docstring.setdefault(self._current, "")
            self._skip, self._depth = "heading", 1
        elif tag == "div" and "doc-signature" in classes:
            self._skip, self._depth = "signature", 1

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None:
            self._depth -= 1
            if self._depth == 0:
                self._skip = None

    def handle_data(self, data: str) -> None:
        if not self._current or self._skip == "heading":
            return
        into = self.signature if self._skip == "signature" else self.docstring
        into[self._current] += data


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        check=False,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"the site does not build:\n{done.stderr[-4000:]}"
    return out


def page(site: Path, package: str) -> Entries:
    entries = Entries()
    entries.feed((site / "reference" / f"{package}.html").read_text())
    return entries


def test_make_docs_builds_the_site_strictly_into_build_site() -> None:
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^docs:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe is not None, "the Makefile has no docs target"
    assert re.search(r"mkdocs build --strict --site-dir \$\(SITE_DIR\)", recipe[1])
    assert re.search(r"^SITE_DIR \?= build/site$", makefile, re.M)
    assert re.search(r"^test:.*\bdocs\b", makefile, re.M)


def public_modules(package: str) -> list[str]:
    """The package and each of its modules no part of whose name starts with ``_`` and
    that exports something (``__all__``)."""
    import importlib
    import pkgutil

    root = importlib.import_module(package)
    found = [package]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        source = Path(str(getattr(info.module_finder, "path", ""))) / (
            info.name.rsplit(".", 1)[1] + ("/__init__.py" if info.ispkg else ".py")
        )
        if re.search(r"^__all__\b.*= \[\s*[^\s\]]", source.read_text(), re.M):
            found.append(info.name)
    return found


def test_the_pages_list_every_public_module() -> None:
    """A new public module gets its place in the reference (``docs/reference/PACKAGE.md``)."""
    for package, modules in PAGES.items():
        assert sorted(public_modules(package)) == sorted(modules), package
        text = (ROOT / "docs" / "reference" / f"{package}.md").read_text()
        assert re.findall(r"^::: (\S+)$", text, re.M) == list(modules), package


def test_every_public_module_is_documented_and_no_private_name(site: Path) -> None:
    for package, modules in PAGES.items():
        names = set(page(site, package).docstring)
        assert set(modules) <= names, (package, set(modules) - names)
        private = [
            n
            for n in names
            if any(p.startswith("_") and not p.endswith("__") for p in n.split("."))
        ]
        assert private == [], private
    nav = (site / "reference" / "index.html").read_text()
    for package in PAGES:
        assert f'href="{package}.html"' in nav, package


def test_every_name_a_module_exports_is_documented(site: Path) -> None:
    import importlib

    for package, modules in PAGES.items():
        names = set(page(site, package).docstring)
        for module in modules:
            exported = getattr(importlib.import_module(module), "__all__", ())
            missing = [n for n in exported if f"{module}.{n}" not in names]
            assert missing == [], (module, missing)


def test_open_run_documents_its_parameters(site: Path) -> None:
    handlers = page(site, "handlers")
    signature = handlers.signature["handlers.open_run"]
    for parameter in ("callbacks", "log", "state_dir", "resume_from", "options", "RunKeywords"):
        assert re.search(rf"\b{parameter}\b", signature), parameter
    explained = ("world_size", "period", "timeout", "state_dir", "resume_from", "strict_state")
    for name in explained:
        assert name in handlers.docstring["handlers.open_run"], name


def test_run_reporter_and_builtins_are_documented(site: Path) -> None:
    handlers = page(site, "handlers")
    for name in ("Run", "Reporter", "Run.workers", "EarlyStopping", "BestCheckpoints"):
        assert handlers.docstring.get(f"handlers.{name}", "").strip(), f"{name} has no docstring"
    assert re.search(
        r"\bmetrics\b.*\bcheckpoint\b", handlers.signature["handlers.Reporter.report"], re.S
    )
    for name, arguments in {
        "EarlyStopping": ("metric", "patience", "threshold", "mode"),
        "BestCheckpoints": ("metric", "k", "mode"),
    }.items():
        for argument in arguments:
            assert re.search(rf"\b{argument}\b", handlers.signature[f"handlers.{name}"]), (
                name,
                argument,
            )


def test_replay_and_testing_helpers_are_documented(site: Path) -> None:
    eventbus = page(site, "eventbus")
    assert "types" in eventbus.signature["eventbus.testing.replay_log"]
    for name in ("eventbus.testing.replay_log", "eventbus.testing.ReplayResult"):
        assert eventbus.docstring.get(name, "").strip(), f"{name} has no docstring"
    assert eventbus.docstring.get("eventbus.log.replay_file", "").strip()


def test_the_bus_and_the_adapters_are_documented(site: Path) -> None:
    eventbus = page(site, "eventbus")
    assert "event_types" in eventbus.signature["eventbus.EventBus.subscribe"]
    assert eventbus.docstring["eventbus.EventBus.subscribe"].strip()
    adapters = page(site, "adapters")
    # exported lazily (transformers is imported on first use), documented all the same
    assert adapters.docstring["adapters.transformers.EventBusCallback"].strip()
    assert adapters.docstring["adapters.ray.EventBusUserCallback"].strip()
