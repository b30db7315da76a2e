"""``open_run``'s workers on ``torchrun`` (TorchElastic), with the run in rank 0:
``open_run(..., engine=TorchrunEngine())`` in a script every torchrun process runs, with
the worker function and callbacks of the local engine. See ``docs/trainers/torchrun.md``.
"""

from __future__ import annotations

try:
    import torch.distributed  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("adapters.torchrun needs torch: pip install torch") from _exc

from ._torchrun_engine import TorchrunEngine

__all__ = ["TorchrunEngine"]
