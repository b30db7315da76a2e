"""A rank's handle on its run: what a worker reports through."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from eventbus import EventBus, Report, RunFinished, Stage, WorkerGroupRestarted
from eventbus.events import RoundGathered

from ._metric_values import MetricsError, RejectedMetrics, freeze_metrics

if TYPE_CHECKING:
    from ._run import Run

__all__ = ["Reporter", "RoundsMoved"]


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
        self._index = run.first_index(rank)

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

    async def sync(self) -> None:
        """Wait until every report this rank made was gathered into a round (or
        discarded by a restart) and the callbacks have handled that round.

        What a data-parallel step does anyway (ranks meet at every gradient
        all-reduce): a worker that syncs after each report reads
        ``should_stop`` exactly as of its latest round, so when a run stops no
        longer depends on how its tasks were scheduled.
        """
        run = self.run
        while True:
            await run.bus.wait_idle()
            attachment = run.attachment
            if attachment is None or not attachment.reports.waiting_from(self.rank):
                return
            await run.rounds_moved.wait()

    @property
    def reports(self) -> int:
        """The index of this rank's next report (reports made, in a run not resumed)."""
        return self._index

    @property
    def latest_checkpoint(self) -> str | None:
        return self.run.latest_checkpoint

    @property
    def should_stop(self) -> bool:
        return self.run.should_stop


class RoundsMoved:
    """Wakes ``Reporter.sync`` when a round is gathered, the group restarts or the run
    ends; subscribed to the bus at the first wait, so runs that never sync pay nothing."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus
        self._event: anyio.Event | None = None

    async def wait(self) -> None:
        if self._event is None:
            self._event = anyio.Event()
            moved = (RoundGathered, WorkerGroupRestarted, RunFinished)
            self._bus.subscribe(moved, self._moved, name="Reporter.sync", order=Stage.OBSERVE)
        await self._event.wait()

    def _moved(self, event: object) -> None:
        assert self._event is not None
        self._event.set()
        self._event = anyio.Event()
