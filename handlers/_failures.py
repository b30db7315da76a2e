"""Failure gathering: the worker failures of one health-check period, delivered together.

Ray Train hands ``after_exception`` the failures of one health-check poll; here a period is
the poll. A failure belongs to the period its bus time falls in (not its arrival); pending
ones are delivered at a restart or the run's end, so none is lost. A stalled rank is
delivered at once, alone, as ``{rank: RankStalledError}``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from eventbus import (
    Event,
    EventBus,
    FailuresGathered,
    HealthCheckTick,
    RankStalled,
    RunFinished,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._events import RunPosition
from eventbus._stages import Stage
from eventbus._subscription import Subscription

__all__ = ["ExceptionCallbackHandler"]


class ExceptionCallbackHandler:
    """Gathers ``WorkerFailure`` events per health-check period, and emits each
    period's as one ``FailuresGathered``.

    A rank that failed twice in one period is reported with its first failure: the
    cause (a second is usually a consequence).

    Args:
        context_for: gives the run context of an event (the lifecycle
            handler's, in an attachment); by default one is built from it.
    """

    def __init__(self, *, context_for: Callable[[Event], TrainRunContext] | None = None) -> None:
        self._context_for = context_for or TrainRunContext.from_event
        self._pending: list[WorkerFailure] = []
        #: What a resumed run's checkpoint had pending, due at the first tick.
        self._carried: list[WorkerFailure] = []
        self._emit: Callable[[Event], object] | None = None
        #: Figures: failures seen, deliveries made.
        self.failures = 0
        self.deliveries = 0

    def subscribe(self, bus: EventBus, *, order: int = Stage.GATHER_FAILURES) -> Subscription:
        """Gather from ``bus``; each period's failures are emitted on it."""
        self._emit = partial(bus.emit, derived=True)  # one per period: never refused
        return bus.subscribe(
            (WorkerFailure, HealthCheckTick, WorkerGroupRestarted, RunFinished, RankStalled),
            self.handle,
            name="handlers.ExceptionCallbackHandler",
            order=order,
        )

    def handle(self, event: Event) -> None:

        if isinstance(event, WorkerFailure):
            self.failures += 1
            self._pending.append(event)
        elif isinstance(event, HealthCheckTick) and (self._pending or self._carried):
            end = event.end
            # ``not >=``: a failure whose time is no number (NaN) is due, never kept.
            due = [*self._carried, *(f for f in self._pending if not f.time >= end)]
            if due:
                self._carried = []
                self._pending = [f for f in self._pending if f.time >= end]
                self._deliver(due)
        elif isinstance(event, (WorkerGroupRestarted, RunFinished)):
            self.flush()
        elif isinstance(event, RankStalled):
            self.deliveries += 1
            if self._emit is not None:
                context = self._context_for(event)
                index = self.deliveries - 1
                self._emit(
                    FailuresGathered(context=context, index=index, failures=(), stalls=(event,))
                )

    def pending_before(self, seq: int) -> tuple[WorkerFailure, ...]:
        """The failures recorded before event ``seq`` not delivered yet (a snapshot's)."""
        return tuple(f for f in self._pending if f.seq < seq)

    def resume_at(self, position: RunPosition) -> None:
        """Continue from ``position``: its failures pending are due at the first tick."""
        self.failures = position.failures
        self._carried = list(position.pending_failures)

    def flush(self) -> None:
        """Deliver every pending failure now (the run is over)."""
        due, self._pending, self._carried = [*self._carried, *self._pending], [], []
        if due:
            self._deliver(due)

    def _deliver(self, failures: list[WorkerFailure]) -> None:
        first: dict[int, WorkerFailure] = {}
        for failure in failures:
            first.setdefault(failure.rank, failure)
        self.deliveries += 1
        context = self._context_for(failures[0])
        if self._emit is not None:
            self._emit(
                FailuresGathered(
                    context=context, index=self.deliveries - 1, failures=tuple(first.values())
                )
            )
