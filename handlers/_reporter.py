"""A rank's handle on its run: what a worker reports through."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventbus import Report

from ._metric_values import MetricsError, RejectedMetrics, freeze_metrics

if TYPE_CHECKING:
    from ._run import Run

__all__ = ["Reporter"]


class Reporter:
    """One rank's handle: ``await report(metrics, checkpoint=None)``.

    ``report`` copies ``metrics`` at once (into a read-only ``FrozenDict``):
    the worker may reuse or change its dict afterwards, and callbacks still
    see what was reported. Metrics that are not JSON values a log can hold
    are judged at once (the worker may change them afterwards); the run
    rejects them (``ReportRejected`` naming the rank and the path inside the
    metrics) and goes on.

    ``latest_checkpoint`` is the checkpoint of the latest complete round
    (where a restarted worker resumes); ``should_stop`` turns true when a
    callback (say ``EarlyStopping``) or the trainer asked the run to stop.
    """

    def __init__(self, run: Run, rank: int) -> None:
        self.run = run
        self.rank = rank
        self.world_size = run.world_size
        self.attempt = 0
        self._index = 0

    async def report(self, metrics: dict[str, Any], checkpoint: str | None = None) -> None:
        """Report this rank's ``metrics`` for its next round, and the ``checkpoint`` it
        saved, if any (one rank naming it is enough: the round has it).

        The metrics are copied at once (the worker may reuse its dict) and
        callbacks get them read-only. Metrics a log cannot hold are rejected by
        the gathering, naming rank and field; the run goes on.
        """
        run = self.run
        index = self._index
        self._index += 1
        reported: Any
        try:
            reported = freeze_metrics(metrics)
        except MetricsError as exc:  # the gatherer rejects it, naming rank and field
            reported = RejectedMetrics(exc.field, exc.reason)
        await run.bus.publish(
            Report(
                run_id=run.run_id,
                rank=self.rank,
                world_size=self.world_size,
                index=index,
                metrics=reported,
                checkpoint=checkpoint,
            )
        )

    @property
    def reports(self) -> int:
        return self._index

    @property
    def latest_checkpoint(self) -> str | None:
        return self.run.latest_checkpoint

    @property
    def should_stop(self) -> bool:
        return self.run.should_stop
