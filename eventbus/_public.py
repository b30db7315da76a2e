"""The public home of a class, which files record (a log's event types, state keys), so
that they do not change when a private module moves."""

from __future__ import annotations

import sys

__all__ = ["is_private_module", "public_module"]


def is_private_module(module: str) -> bool:
    """Whether a dotted module name has a private segment (``eventbus._bus``)."""
    return any(part.startswith("_") for part in module.split("."))


def public_module(cls: type) -> str:
    """The shortest public package on ``cls``'s module path that exports it under its
    own name (``eventbus`` for ``eventbus._events.Report``); its own module if none does.
    """
    parts = cls.__module__.split(".")
    for length in range(1, len(parts)):
        name = ".".join(parts[:length])
        if is_private_module(name):
            break
        if getattr(sys.modules.get(name), cls.__name__, None) is cls:
            return name
    return cls.__module__
