"""``open_run``'s workers on ``torchrun`` (TorchElastic), with the run in rank 0.

``open_run(..., engine=TorchrunEngine())`` in a script every torchrun
process runs: rank 0 hosts the run (its bus, callbacks, state store and
log), every rank runs its worker, and the others' reports, checkpoints and
failures reach rank 0 over torchrun's own c10d store, never waiting for it.
The worker function and the callbacks are those of the local engine and of
``adapters.ray.RayEngine``. See ``docs/trainers/torchrun.md``.
"""

from __future__ import annotations

try:
    import torch.distributed  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError("adapters.torchrun needs torch: pip install torch") from _exc

from ._torchrun_engine import TorchrunEngine

__all__ = ["TorchrunEngine"]
