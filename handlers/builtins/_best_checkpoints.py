"""Best-checkpoint tracking: the top ``k`` checkpoints by a metric, optionally pruning the rest."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any, Literal

from eventbus import StatefulCallback, TrainRunContext
from eventbus._logging import get_logger
from eventbus._options import Count
from eventbus.options import checked

from .._callback import UserCallback
from .._metrics import mean_of, note_missing_metric

__all__ = ["BestCheckpoints"]

_log = get_logger("handlers.best_checkpoints")


class BestCheckpoints(UserCallback, StatefulCallback, state_name="handlers.BestCheckpoints"):
    """Keeps the ``k`` best checkpoints, ranked by the round's mean of ``metric``.

    ``top`` is a list of ``[value, checkpoint]``, best first (lists survive JSON), ties
    keeping the earlier first; ``best`` is the best checkpoint. A round without ``metric``
    is not ranked, and counted in ``rounds_without_metric``.

    ``delete_worse=True`` (Ray's ``num_to_keep``, Lightning's ``save_top_k``) deletes a
    checkpoint that leaves the top ``k``, but never the latest, which a resume needs, and
    only strictly inside the run's storage root, never through a symlink: locations come
    from reports and snapshots anyone can edit (docs/guides/async-trainer.md).
    """

    state_args = ("metric", "k", "mode", "delete_worse")
    state_attributes = ("top", "latest")
    state_live_args = ("delete_worse",)

    def __init__(
        self,
        metric: str,
        k: int = 3,
        mode: Literal["min", "max"] = "min",
        delete_worse: bool = False,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.metric = metric
        self.k: int = checked("k", k, Count)
        self.mode = mode
        self.delete_worse = delete_worse
        self.top: list[list[Any]] = []
        #: The latest checkpoint seen: never deleted, since a resume starts from it.
        self.latest: str | None = None
        #: Checkpoints this callback deleted (this process only).
        self.deleted: list[str] = []
        self._warned_no_storage = False
        #: Checkpoint rounds that had no finite ``metric`` at any rank (this process only).
        self.rounds_without_metric = 0

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
        # A restored ``latest`` of another JSON kind (an edited snapshot) is no location.
        kept_before = {*self.checkpoints, self.latest if isinstance(self.latest, str) else None}
        value = mean_of(metrics, self.metric)
        if value is not None:
            sign = 1.0 if self.mode == "min" else -1.0
            entries = [e for e in self.top if e[1] != checkpoint] + [[value, checkpoint]]
            entries.sort(key=lambda e: sign * float(e[0]))  # stable: ties keep the earlier first
            self.top = entries[: self.k]
        else:
            self.rounds_without_metric += 1
            note_missing_metric(_log, self, self.metric, self.rounds_without_metric, metrics)
        self.latest = checkpoint
        if self.delete_worse:
            for location in kept_before - {*self.checkpoints, checkpoint, None}:
                assert location is not None
                self._delete(location, run_context.storage)

    def _delete(self, location: str, storage: str | None) -> None:
        """Delete ``location`` if it lies strictly inside ``storage`` (see the class doc)."""
        if storage is None:
            if not self._warned_no_storage:
                self._warned_no_storage = True
                _log.warning(
                    "delete_worse deletes nothing: the run's storage root is unknown",
                    callback=repr(self),
                    hint="only checkpoints inside the run's storage are deleted: "
                    "give open_run storage= or state_dir=",
                )
            return
        try:
            root = Path(storage).resolve()
            target = _inside(Path(location), root)
            if target is None:
                _log.warning(
                    "not deleting a checkpoint outside the run's storage, or the storage itself",
                    callback=repr(self),
                    checkpoint=location,
                    storage=str(root),
                )
                return
            try:
                kind = os.lstat(target).st_mode  # lstat: a symlink is unlinked, not followed
            except FileNotFoundError:
                return  # gone already: nothing deleted
            if stat.S_ISDIR(kind):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        except (OSError, ValueError) as exc:  # ValueError: a location no path can be
            _log.warning(
                "could not delete a checkpoint",
                callback=repr(self),
                checkpoint=location,
                error=str(exc),
            )
            return
        self.deleted.append(location)
        _log.info(
            "deleted a checkpoint",
            callback=repr(self),
            checkpoint=location,
            reason=f"it left the top {self.k} by {self.metric} ({self.mode})",
        )


def _inside(path: Path, root: Path) -> Path | None:
    """Where ``path`` is (its last component not followed) if strictly inside ``root`` and
    neither a filesystem root nor the current directory or one of its parents."""
    last = path.name
    where = path.resolve() if last in ("", ".", "..") else path.parent.resolve() / last
    cwd = Path.cwd()
    if where == root or not where.is_relative_to(root) or where in (cwd, *cwd.parents):
        return None
    return None if where == Path(where.anchor) else where
