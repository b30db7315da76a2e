"""Names that moved keep working for a while, with a warning that says where they went."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

__all__ = ["moved_names"]


def moved_names(module: str, moved: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``moved`` (old name -> ``"new.module.NewName"``):
    each access warns (``DeprecationWarning``, naming the new place) and returns the
    object from its new home."""

    def __getattr__(name: str) -> object:
        target = moved.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, _, new_name = target.rpartition(".")
        warnings.warn(
            f"{module}.{name} is deprecated: use {target}", DeprecationWarning, stacklevel=2
        )
        return getattr(importlib.import_module(home), new_name)

    return __getattr__
