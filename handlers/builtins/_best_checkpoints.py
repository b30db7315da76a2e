"""Best-checkpoint tracking: the top ``k`` checkpoints by a metric, optionally pruning the rest."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Literal

from eventbus import StatefulCallback, get_logger
from eventbus.events import TrainRunContext

from .._callback import UserCallback
from .._metrics import mean_of

__all__ = ["BestCheckpoints"]

_log = get_logger("handlers.best_checkpoints")


class BestCheckpoints(UserCallback, StatefulCallback):
    """Keeps the ``k`` best checkpoints, ranked by the round's mean of ``metric``.

    ``top`` is a list of ``[value, checkpoint]``, best first (lists, so it
    survives a JSON round trip unchanged); ``best`` is the best checkpoint.
    Ties keep the earlier checkpoint first.

    ``delete_worse=True`` is Ray's ``num_to_keep`` and Lightning's
    ``save_top_k``: a checkpoint that leaves the top ``k`` is deleted from
    disk, except the latest one, which a resume needs (it goes once a newer
    checkpoint arrives, if it is not among the best by then). Off by default:
    it tracks only. A location that is a filesystem root, the current
    directory or one of its parents is never deleted; a deletion that fails
    is a warning, not a failure of the run.
    """

    state_args = ("metric", "k", "mode", "delete_worse")
    state_attributes = ("top", "latest")

    def __init__(
        self,
        metric: str,
        k: int = 3,
        mode: Literal["min", "max"] = "min",
        delete_worse: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.metric = metric
        self.k = k
        self.mode = mode
        self.delete_worse = delete_worse
        self.top: list[list[Any]] = []
        #: The latest checkpoint seen: never deleted, since a resume starts from it.
        self.latest: str | None = None
        #: Checkpoints this callback deleted (this process only).
        self.deleted: list[str] = []

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
        kept_before = {*self.checkpoints, self.latest}
        value = mean_of(metrics, self.metric)
        if value is not None:
            sign = 1.0 if self.mode == "min" else -1.0
            entries = [e for e in self.top if e[1] != checkpoint] + [[value, checkpoint]]
            entries.sort(key=lambda e: sign * float(e[0]))  # stable: ties keep the earlier first
            self.top = entries[: self.k]
        self.latest = checkpoint
        if self.delete_worse:
            for location in kept_before - {*self.checkpoints, checkpoint, None}:
                assert location is not None
                self._delete(location)

    def _delete(self, location: str) -> None:
        path = Path(location)
        try:
            resolved = path.resolve()
            if resolved == Path(resolved.anchor) or resolved in (Path.cwd(), *Path.cwd().parents):
                _log.warning("not deleting a checkpoint at a root or above", checkpoint=location)
                return
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.exists() or path.is_symlink():
                os.unlink(path)
            else:
                return
        except (OSError, ValueError) as exc:  # ValueError: a location no path can be
            _log.warning("could not delete a checkpoint", checkpoint=location, error=str(exc))
            return
        self.deleted.append(location)
