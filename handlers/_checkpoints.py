"""The checkpoints of gathered rounds: where a restart resumes, and what gets snapshotted.

A round's checkpoint is known once every required rank reported (the gatherer
tells). The latest one is where a restarted worker group resumes; in a live
run each one is also announced as ``CheckpointSaved``, on which the state
store snapshots every stateful callback (a replay has the recorded ones).
"""

from __future__ import annotations

from typing import Any

from eventbus import CheckpointSaved, EventBus

from ._context import TrainRunContext
from ._metrics import mean_metrics
from ._reports import ReportCallbackHandler

__all__ = ["CheckpointTracker"]


class CheckpointTracker:
    """A ``ReportCallback`` of the gatherer: keeps ``last``, and with ``announce``
    emits a ``CheckpointSaved`` for each round's checkpoint."""

    def __init__(self, bus: EventBus, reports: ReportCallbackHandler, *, announce: bool) -> None:
        self.bus = bus
        self.reports = reports
        self.announce = announce
        self.last: str | None = None

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        if checkpoint is None:
            return
        self.last = checkpoint
        if self.announce:
            self.bus.emit(
                CheckpointSaved(
                    run_id=run_context.run_id,
                    checkpoint=checkpoint,
                    index=self.reports.rounds - 1,
                    ranks=self.reports.required_ranks,
                    metrics=mean_metrics(metrics),
                ),
                derived=True,
            )
