"""Failure gathering: the worker failures of one health-check period, delivered together.

A failure belongs to the period its bus time falls in: the tick that ends a
period can be dispatched after failures stamped in the next one (the
dispatcher ends a period when it takes the next batch), so failures are
split by time, not by arrival. Failures still pending when the run finishes
are delivered then: none is lost. Subscribed to a bus, each delivery is
also a ``FailuresGathered`` event, to which training callbacks subscribe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from eventbus import (
    Event,
    EventBus,
    HealthCheckTick,
    RunFinished,
    Stage,
    Subscription,
    WorkerFailure,
)
from eventbus.events import FailuresGathered, TrainRunContext

from ._errors import WorkerError
from ._interfaces import ExceptionCallback

__all__ = ["ExceptionCallbackHandler"]


class ExceptionCallbackHandler:
    """Calls ``after_exception(run_context, {rank: WorkerError})`` once per period with failures.

    A rank that failed twice in one period is reported with its first failure
    (the cause; a second one is usually a consequence).
    """

    def __init__(
        self,
        exception_callbacks: Iterable[ExceptionCallback] = (),
        *,
        context_for: Callable[[Event], TrainRunContext] | None = None,
    ) -> None:
        self.exception_callbacks = list(exception_callbacks)
        self._context_for = context_for or TrainRunContext.from_event
        self._pending: list[WorkerFailure] = []
        #: What a resumed run's checkpoint had pending, due at the first tick.
        self._carried: list[WorkerFailure] = []
        self._bus: EventBus | None = None
        #: Figures: failures seen, after_exception deliveries made.
        self.failures = 0
        self.deliveries = 0

    def subscribe(self, bus: EventBus, *, order: int = Stage.GATHER_FAILURES) -> Subscription:
        self._bus = bus
        bus.derives(FailuresGathered)
        return bus.subscribe(
            (WorkerFailure, HealthCheckTick, RunFinished),
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
        elif isinstance(event, RunFinished):
            self.flush()

    def pending_before(self, seq: int) -> tuple[WorkerFailure, ...]:
        """The failures recorded before event ``seq`` not delivered yet (a snapshot's)."""
        return tuple(f for f in self._pending if f.seq < seq)

    def resume_pending(self, failures: tuple[WorkerFailure, ...]) -> None:
        """Failures a resumed run's checkpoint had pending: due at its first tick (their
        times are another process's clock's, so they are not compared with this one's)."""
        self._carried = list(failures)

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
        if self.exception_callbacks:
            exceptions: dict[int, Exception] = {
                rank: WorkerError.from_failure(f) for rank, f in first.items()
            }
            for callback in self.exception_callbacks:
                callback.after_exception(context, exceptions)
        if self._bus is not None:
            self._bus.emit(
                FailuresGathered(
                    context=context, index=self.deliveries - 1, failures=tuple(first.values())
                ),
                derived=True,
            )
