"""The layout rules, checked on the source: what may import what, the public surface.

- ``eventbus`` (the runtime: events, bus, log, state) imports nothing of
  ours; ``handlers`` (training semantics) only ``eventbus``; ``adapters``
  (frameworks, the command line) both. Nothing imports pickle, and heavy
  libraries only in ``adapters``.
- Private modules (``_x.py``) are private to the distribution: ``eventbus``,
  ``handlers`` and ``adapters`` may import each other's (within the layering
  above), so the public modules export only what a user needs. No module
  reads another's private names (``from .x import _name``) and no object
  another's private attributes (``x._attr``). Examples, what users copy, use
  only public modules and the names in their ``__all__``.
- Each public name has one home: no object is in two public modules'
  ``__all__`` (names that moved or left in 0.3.0 are in the CHANGELOG's
  migration table). Pipeline order by ``Stage``,
  never a number. (Sizes are not checked: a long module is a smell to look
  at, not a number to squeeze under.)
"""

from __future__ import annotations

import ast
import importlib
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventbus", "handlers", "adapters")
HEAVY = {
    "torch",
    "transformers",
    "ray",
    "matplotlib",
    "rich",
    "numpy",
    "accelerate",
    "opentelemetry",
    "tensorboard",
    "tensorboardX",
    "mlflow",
}
PICKLE = {"pickle", "cPickle", "cloudpickle", "dill"}
FORBIDDEN = {
    "eventbus": {"handlers", "adapters"} | PICKLE | HEAVY,
    "handlers": {"adapters"} | PICKLE | HEAVY,
    "adapters": PICKLE,
}
#: Private names of other libraries read on purpose: the standard library's that typing
#: needs, and the file writer of torch's and tensorboardX's ``SummaryWriter`` (a round's
#: scalars as one summary: 60 us instead of 412 us, ``adapters.tensorboard``).
OTHERS_PRIVATES = {"_SubParsersAction", "_get_file_writer"}


def sources(package: str) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), filename=str(path))


def module_of(relative: str) -> str:
    parts = relative.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute_imports(relative: str, tree: ast.Module) -> Iterator[tuple[str, list[str]]]:
    """Each import as (absolute module, names imported from it)."""
    here = module_of(relative).split(".")
    base = here if relative.endswith("__init__.py") else here[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                up = base[: len(base) - node.level + 1]
                module = ".".join([*up, node.module] if node.module else up)
            else:
                module = node.module or ""
            yield module, [alias.name for alias in node.names]


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` names one of our modules (a private module of a package may
    be imported by its siblings: only private names are off limits)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_the_layering_allows(package: str) -> None:
    offenders = {}
    for relative, tree in sources(package):
        tops = {module.split(".")[0] for module, _ in absolute_imports(relative, tree)}
        if bad := sorted(tops & FORBIDDEN[package]):
            offenders[relative] = bad
    assert offenders == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_private_names_are_read_across_modules(package: str) -> None:
    """``from .x import _name`` or ``other._attr``: a module reaching into another's privates
    (a private module, ``from handlers._run import Run``, is the distribution's own: fine)."""
    offenders: list[str] = []
    for relative, tree in sources(package):
        here = module_of(relative)
        for module, names in absolute_imports(relative, tree):
            if module != here:
                offenders.extend(
                    f"{relative}: imports {name} from {module}"
                    for name in names
                    if name.startswith("_")
                    and not name.startswith("__")
                    and not is_module(f"{module}.{name}")
                )
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in OTHERS_PRIVATES
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                offenders.append(f"{relative}:{node.lineno}: reads .{node.attr}")
    assert offenders == []


@pytest.mark.parametrize("package", PACKAGES)
def test_pipeline_order_is_a_named_stage_never_a_number(package: str) -> None:
    numbers = []
    for relative, tree in sources(package):
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "order":
                value = node.value
                if isinstance(value, ast.UnaryOp):
                    value = value.operand
                if isinstance(value, ast.Constant | ast.BinOp) or (
                    isinstance(value, ast.Attribute) and value.attr == "maxsize"
                ):
                    numbers.append(f"{relative}:{node.lineno}")
    assert numbers == []


def test_every_public_name_has_one_home() -> None:
    homes: dict[int, str] = {}
    twice: list[str] = []
    for module_name in PUBLIC_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # an adapter whose library (its extra) is not installed
            continue
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, (str, int, float, bytes, tuple, frozenset)):
                continue
            where = f"{module_name}.{name}"
            if id(value) in homes:
                twice.append(f"{where} is also exported as {homes[id(value)]}")
            homes[id(value)] = where
    assert twice == []


def test_every_event_of_the_project_is_in_one_module() -> None:
    offenders = []
    for package in PACKAGES:
        for relative, tree in sources(package):
            if relative == "eventbus/_events.py":
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and any(
                    isinstance(base, ast.Name) and base.id == "Event" for base in node.bases
                ):
                    offenders.append(f"{relative}: {node.name}")
    assert offenders == []


#: Every public module with an ``__all__``: the homes of the public names.
PUBLIC_MODULES = [
    "eventbus",
    "eventbus.log",
    "eventbus.options",
    "eventbus.state",
    "eventbus.testing",
    "handlers",
    "adapters",
    "adapters.cli",
    "adapters.report",
    "adapters.transformers",
    "adapters.lightning",
    "adapters.ray",
    "adapters.torchrun",
    "adapters.tensorboard",
    "adapters.mlflow",
    "adapters.otel",
]
#: The most public names the packages may export, all ``__all__``s together: what a user
#: needs, the rest in private modules (issue 39; 224 before 0.3.0).
MOST_PUBLIC_NAMES = 100


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_public_names_are_exported_and_exist(name: str) -> None:
    try:
        module = importlib.import_module(name)
    except ImportError as error:
        pytest.skip(f"{name} needs its extra: {error}")
    exported = module.__all__
    assert len(exported) == len(set(exported))
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == []


def declared_all(tree: ast.Module) -> list[str] | None:
    """A module's ``__all__`` as its source declares it (read, not imported: an adapter's
    module imports its library)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return None


def test_the_public_surface_stays_small() -> None:
    exported = {
        module_of(relative): names
        for package in PACKAGES
        for relative, tree in sources(package)
        if (names := declared_all(tree)) is not None
    }
    assert sum(len(exported[name]) for name in PUBLIC_MODULES) <= MOST_PUBLIC_NAMES


def test_every_public_module_is_listed() -> None:
    """A module no part of whose name is private and that has an ``__all__`` is public:
    it is counted above (a module without one, such as ``adapters.cli.__main__``, is not)."""
    found = set()
    for package in PACKAGES:
        for relative, tree in sources(package):
            name = module_of(relative)
            exports = declared_all(tree) is not None
            if exports and not any(part.startswith("_") for part in name.split(".")):
                found.add(name)
    assert found == set(PUBLIC_MODULES)


@pytest.mark.parametrize("package", PACKAGES)
def test_packages_are_typed(package: str) -> None:
    assert (ROOT / package / "py.typed").exists()


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` -> the modules of ``package`` it imports at load time
    (what a ``TYPE_CHECKING`` block imports does not count)."""
    graph: dict[str, set[str]] = {}
    for relative, tree in sources(package):
        here = module_of(relative)
        found: set[str] = set()
        runtime = ast.Module(
            body=[
                node
                for node in tree.body
                if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
            ],
            type_ignores=[],
        )
        for module, names in absolute_imports(relative, runtime):
            for target in [module, *(f"{module}.{name}" for name in names)]:
                if target.split(".")[0] == package and is_module(target) and target != here:
                    found.add(target)
        graph[here] = found
    return graph


@pytest.mark.parametrize("package", PACKAGES)
def test_dependencies_inside_a_package_run_one_way(package: str) -> None:
    """No import cycle between modules (a package imports its own modules, which
    must not import it back)."""
    graph = module_graph(package)
    cycles = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                cycle = [*path[path.index(nxt) :], nxt]
                if not any(ancestor_of(a, b) for a, b in itertools.pairwise(cycle)):
                    cycles.append(" -> ".join(cycle))
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(node)

    done: set[str] = set()
    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert cycles == []


def ancestor_of(a: str, b: str) -> bool:
    """A package importing its own submodule (or a submodule its package's name) is
    not a layering cycle: the package is the submodule's public face."""
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_examples_use_only_public_modules() -> None:
    """Examples are what users copy: public modules and the names in their ``__all__``
    only, and no command-line internals."""
    exports = {
        module_of(relative): declared_all(tree) or []
        for package in PACKAGES
        for relative, tree in sources(package)
    }
    offenders = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        tree = ast.parse(path.read_text())
        for module, names in absolute_imports(f"examples/{path.name}", tree):
            parts = module.split(".")
            if parts[0] not in PACKAGES:
                continue
            if any(p.startswith("_") for p in parts) or module not in PUBLIC_MODULES:
                offenders.append(f"{path.name}: {module}")
                continue
            offenders.extend(
                f"{path.name}: {name} from {module}"
                for name in names
                if name not in exports[module]
            )
            if module.startswith("adapters.cli"):
                offenders.append(f"{path.name}: {module} (the command line's internals)")
    assert offenders == []
