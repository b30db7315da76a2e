"""Best-checkpoint tracking: the top ``k`` checkpoints by a metric."""

from __future__ import annotations

from typing import Any, Literal

from eventbus import StatefulCallback
from eventbus.events import TrainRunContext

from .._interfaces import UserCallback
from .._metrics import mean_of

__all__ = ["BestCheckpoints"]


class BestCheckpoints(UserCallback, StatefulCallback):
    """Keeps the ``k`` best checkpoints, ranked by the round's mean of ``metric``.

    ``top`` is a list of ``[value, checkpoint]``, best first (lists, so it
    survives a JSON round trip unchanged); ``best`` is the best checkpoint.
    Ties keep the earlier checkpoint first. It tracks only: it deletes nothing.
    """

    state_args = ("metric", "k", "mode")
    state_attributes = ("top",)

    def __init__(self, metric: str, k: int = 3, mode: Literal["min", "max"] = "min") -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.metric = metric
        self.k = k
        self.mode = mode
        self.top: list[list[Any]] = []

    @property
    def state_key(self) -> str:
        return f"BestCheckpoints(metric={self.metric!r}, mode={self.mode!r}, k={self.k})"

    @property
    def best(self) -> str | None:
        return str(self.top[0][1]) if self.top else None

    @property
    def checkpoints(self) -> list[str]:
        return [str(path) for _, path in self.top]

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        if checkpoint is None:
            return
        value = mean_of(metrics, self.metric)
        if value is None:
            return
        sign = 1.0 if self.mode == "min" else -1.0
        entries = [e for e in self.top if e[1] != checkpoint] + [[value, checkpoint]]
        entries.sort(key=lambda e: sign * float(e[0]))  # stable: ties keep the earlier first
        self.top = entries[: self.k]
