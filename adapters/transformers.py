"""Hugging Face Trainer adapter: our callbacks, bus and state store behind one ``TrainerCallback``.

The mapping of hooks to events, stopping, state and resume: docs/adapters.md.

HF's ``trainer_state.json`` format (``to_hf_callbacks``, ``from_hf_callbacks``) is importable
without ``transformers``; the Trainer's callback imports it on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._hf_state import from_hf_callbacks, to_hf_callbacks

if TYPE_CHECKING:
    from ._hf_callback import EventBusCallback, run_with_failures

__all__ = [
    "EventBusCallback",
    "from_hf_callbacks",
    "run_with_failures",
    "to_hf_callbacks",
]


def __getattr__(name: str) -> Any:
    """The Trainer callback and ``run_with_failures``: ``transformers`` imported on first use."""
    if name in ("EventBusCallback", "run_with_failures"):
        # Without transformers: an ImportError naming the extra to install.
        from ._hf_callback import EventBusCallback, run_with_failures

        return {"EventBusCallback": EventBusCallback, "run_with_failures": run_with_failures}[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
