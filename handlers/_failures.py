"""Failure gathering: the worker failures of one health-check period, delivered together.

Ray Train hands ``after_exception`` the failures of one health-check poll as
``{rank: exception}``; here a period is the poll. A failure belongs to the
period its bus time falls in: the tick that ends a period can be dispatched
after failures stamped in the next one (the dispatcher ends a period when it
takes the next batch), so failures are split by time, not by arrival.
Failures still pending when the worker group restarts or the run finishes
are delivered then, so ``after_exception`` hears of a failure before the
restarted group's first round (as Ray Train does) and before ``after_run``:
none is lost. Each delivery is a ``FailuresGathered`` event, to which training
callbacks subscribe.

A stalled rank (``RankStalled``) is the verdict of a health check already, so
it is delivered at once, alone: ``after_exception`` gets
``{rank: RankStalledError}``, as Ray's for a worker failing its health check.
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

    A rank that failed twice in one period is reported with its first failure:
    that is the cause, and a second one is usually a consequence. It owns the
    run's count of failures, and the failures a checkpoint leaves pending.

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
        """A failure to keep, a tick that ends a period, a restart or the run's end, or
        a stalled rank, delivered at once."""
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
        """Continue from ``position``: its count of failures, and the failures it had
        pending, due at the first tick (their times are another process's clock's,
        so they are not compared with this one's)."""
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
