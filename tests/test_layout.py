"""The dependency rule and the public-API rule, checked on the source."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = {"torch", "transformers", "ray", "matplotlib", "rich", "numpy", "accelerate"}
FORBIDDEN = {
    "eventbus": {"handlers", "adapters", "pickle", "cPickle", "cloudpickle", "dill"} | HEAVY,
    "handlers": {"adapters", "pickle", "cPickle", "cloudpickle", "dill"} | HEAVY,
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_the_layering_allows(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_top_levels(path) & FORBIDDEN[package])
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


@pytest.mark.parametrize("package", ["eventbus", "handlers", "adapters"])
def test_public_names_are_exported_and_exist(package: str) -> None:
    module = importlib.import_module(package)
    exported = module.__all__
    assert len(exported) == len(set(exported))
    missing = [name for name in exported if not hasattr(module, name)]
    assert missing == []
    assert (ROOT / package / "py.typed").exists()
