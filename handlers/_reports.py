"""Report gathering: one FIFO per rank, one round per report of every required rank.

Ranks report at their own pace: rank 0 may be several reports ahead. A round
is released only when every required rank has a report waiting; then exactly
one report per required rank is taken, in rank order. The count of required
ranks still missing a report is kept up to date, so a report costs O(1) and
a round O(required ranks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from eventbus import (
    CheckpointMismatch,
    Event,
    EventBus,
    Report,
    ReportRejected,
    Subscription,
    WorkerGroupRestarted,
)

from ._context import TrainRunContext
from ._interfaces import ReportCallback
from ._metrics import SCALAR_TYPES as _SCALARS
from ._metrics import json_problem

__all__ = ["ReportCallbackHandler"]

ContextFor = Callable[[Event], TrainRunContext]


class ReportCallbackHandler:
    """Gathers ``Report`` events into rounds and calls ``after_report`` of each callback.

    ``world_size`` defaults to the run's (the context's, or the first
    report's); ``required_ranks`` to all ranks. A ``WorkerGroupRestarted``
    discards partial rounds and sets both anew. Bad reports become
    ``ReportRejected`` events naming rank and field; ranks that name
    different checkpoints for one round give a ``CheckpointMismatch`` and
    the round has no checkpoint. Nothing already gathered is lost either way.
    """

    def __init__(
        self,
        report_callbacks: Iterable[ReportCallback],
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        context_for: ContextFor | None = None,
    ) -> None:
        self.report_callbacks = list(report_callbacks)
        self._context_for = context_for or _first_event_context()
        self._bus: EventBus | None = None
        self.world_size = 0
        self.required_ranks: tuple[int, ...] = ()
        self._queues: list[deque[Report]] = []
        self._required: list[bool] = []
        self._last_index: list[int] = []
        self._missing = 0
        self._configured = False
        #: Figures: reports accepted, rounds released, reports rejected, partial reports discarded.
        self.reports = 0
        self.rounds = 0
        self.rejected = 0
        self.discarded = 0
        self.mismatches = 0
        if world_size is not None:
            self._configure(world_size, required_ranks)
        elif required_ranks is not None:
            raise ValueError("required_ranks needs world_size")

    # --- wiring ------------------------------------------------------------------

    def subscribe(self, bus: EventBus, *, order: int = -100) -> Subscription:
        """Gather from ``bus`` (inline, so rounds follow publish order exactly)."""
        self._bus = bus
        return bus.subscribe(
            (Report, WorkerGroupRestarted),
            self.on_report,
            name="handlers.ReportCallbackHandler",
            order=order,
        )

    def handle(self, event: Event) -> None:
        if type(event) is Report:
            self.on_report(event)
        elif isinstance(event, WorkerGroupRestarted):
            self.on_restart(event)

    # --- rules -------------------------------------------------------------------

    def _configure(self, world_size: int, required_ranks: Iterable[int] | None) -> None:
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {world_size}")
        required = sorted(set(range(world_size) if required_ranks is None else required_ranks))
        if not required or required[0] < 0 or required[-1] >= world_size:
            raise ValueError(
                f"required ranks {required} must be a non-empty subset of 0..{world_size - 1}"
            )
        self.world_size = world_size
        self.required_ranks = tuple(required)
        self._queues = [deque() for _ in range(world_size)]
        self._last_index = [-1] * world_size
        self._required = [False] * world_size
        for rank in required:
            self._required[rank] = True
        self._missing = len(required)
        self._configured = True

    def on_report(self, report: Report) -> None:
        """The hot path: every check is a comparison or a C-level type scan."""
        if type(report) is not Report:  # the subscription also routes restarts here
            if isinstance(report, WorkerGroupRestarted):
                self.on_restart(report)
            return
        if not self._configured:
            world_size = self._context_for(report).world_size or report.world_size
            try:
                self._configure(world_size, None)
            except ValueError as exc:
                self._reject(report, "world_size", str(exc))
                return
        rank = report.rank
        world_size = self.world_size
        if not 0 <= rank < world_size:
            self._reject(report, "rank", f"rank {rank} is outside world size {world_size}")
            return
        if report.world_size != world_size:
            reason = f"{report.world_size}, but the run has {world_size}"
            self._reject(report, "world_size", reason)
            return
        index = report.index
        last_index = self._last_index
        if index <= last_index[rank]:
            last = last_index[rank]
            reason = (
                f"{index} is negative" if index < 0 else f"{index} after {last}: not increasing"
            )
            self._reject(report, "index", reason)
            return
        metrics = report.metrics
        flat = type(metrics) is dict
        if flat:
            for key, value in metrics.items():
                if type(key) is not str or type(value) not in _SCALARS:
                    flat = False
                    break
        if not flat:  # nested values, subclasses, or a real problem
            problem = json_problem(metrics)
            if problem is not None:
                self._reject(report, *problem)
                return
        if not self._required[rank]:
            reason = f"rank {rank} is not required (required: {list(self.required_ranks)})"
            self._reject(report, "rank", reason)
            return
        last_index[rank] = index
        self.reports += 1
        queue = self._queues[rank]
        if not queue:
            self._missing -= 1
            if self._missing == 0:
                queue.append(report)
                self._release()
                return
        queue.append(report)

    def _release(self) -> None:
        queues = self._queues
        required = self.required_ranks
        while True:
            reports = [queues[r].popleft() for r in required]
            self._missing = sum(1 for r in required if not queues[r])
            self._deliver(reports)
            if self._missing:
                return

    def _deliver(self, reports: Sequence[Report]) -> None:
        first = reports[0]
        checkpoint = first.checkpoint
        for report in reports:
            if report.checkpoint != checkpoint:
                self._mismatch(reports)
                checkpoint = None
                break
        self.rounds += 1
        context = self._context_for(first)
        metrics = [report.metrics for report in reports]
        for callback in self.report_callbacks:
            callback.after_report(context, metrics, checkpoint)

    def _mismatch(self, reports: Sequence[Report]) -> None:
        self.mismatches += 1
        if self._bus is not None:
            self._bus.emit(
                CheckpointMismatch(
                    run_id=reports[0].run_id,
                    round=self.rounds,
                    checkpoints={r.rank: r.checkpoint for r in reports},
                ),
            )

    def on_restart(self, event: WorkerGroupRestarted) -> None:
        """Drop partial rounds; the group may have a new size and required ranks."""
        self.discarded += sum(len(q) for q in self._queues)
        try:
            self._configure(event.world_size, event.required_ranks or None)
        except ValueError as exc:
            self._reject(event, "required_ranks", str(exc))
            if self._configured:  # keep the old group, minus the partial rounds the restart ended
                self._configure(self.world_size, self.required_ranks)

    def _reject(self, event: Any, field: str, reason: str) -> None:
        self.rejected += 1
        if self._bus is not None:
            self._bus.emit(
                ReportRejected(
                    run_id=event.run_id, rank=getattr(event, "rank", -1), field=field, reason=reason
                ),
            )


def _first_event_context() -> ContextFor:
    """Used alone, the handler builds the run context from the first event it sees."""
    holder: list[TrainRunContext] = []

    def context_for(event: Event) -> TrainRunContext:
        if not holder:
            holder.append(TrainRunContext.from_event(event))
        return holder[0]

    return context_for
