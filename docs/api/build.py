"""Build the API reference from the docstrings, with pdoc; any warning fails the build.

Usage (what ``make docs`` runs; the output directory defaults to ``build/api``)::

    python docs/api/build.py [OUTPUT_DIR]

The reference covers the public modules (pdoc leaves out ``_private`` ones).
Docstrings are reST-flavoured (``name`` literals), hence ``restructuredtext``.
Names a module exports lazily, through a module ``__getattr__`` (the Trainer
callback of ``adapters.transformers``), are resolved first, so pdoc sees
them: documenting the adapters needs their extras (transformers, ray)
installed, as ``make test`` does.
"""

from __future__ import annotations

import importlib
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = (
    "eventbus",
    "eventbus.log",
    "eventbus.state",
    "eventbus.testing",
    "handlers",
    "handlers.wiring",
    "adapters",
    "adapters.transformers",
    "adapters.ray",
    "adapters.tensorboard",
    "adapters.mlflow",
    "adapters.otel",
    "adapters.cli",
    "adapters.report",
)


def resolve_lazy_exports(name: str) -> None:
    """Set each name of ``__all__`` a module's ``__getattr__`` provides on first use,
    so pdoc (which reads the module's ``__dict__``) documents it."""
    module = importlib.import_module(name)
    for export in getattr(module, "__all__", ()):
        if export not in vars(module):
            setattr(module, export, getattr(module, export))


def build(output: Path) -> list[str]:
    """Write the reference into ``output``; return the warnings raised on the way."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # anyio's AsyncContextManagerMixin (a base of EventBus and Run) annotates its
        # private slot with a name it imports for type checkers only: nothing of ours.
        mixin = r"Error parsing type annotation .* for anyio\.AsyncContextManagerMixin"
        warnings.filterwarnings("ignore", message=mixin)
        import pdoc
        import pdoc.render

        for name in MODULES:
            resolve_lazy_exports(name)
        # ``name`` literals, no fields or directives: reST renders them as written.
        pdoc.render.configure(
            docformat="restructuredtext", footer_text="train-eventbus API reference"
        )
        pdoc.pdoc(*MODULES, output_directory=output)
    return [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught]


def main(argv: list[str]) -> int:
    output = Path(argv[1]) if len(argv) > 1 else ROOT / "build" / "api"
    sys.path.insert(0, str(ROOT))  # document this checkout, whatever is installed
    started = time.perf_counter()
    problems = build(output)
    if problems:
        print("\n".join(["API reference: warnings are errors", *problems]), file=sys.stderr)
        return 1
    took = time.perf_counter() - started
    print(f"API reference: {output / 'index.html'} ({len(MODULES)} modules, {took:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
