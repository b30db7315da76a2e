"""Run lifecycle: ``before_run`` once before anything else, ``after_run`` once at the end.

This handler also owns the run context: from the first ``RunStarted``, or,
when a log has none, built from the first event that names the run, in which
case the run begins right then, so ``before_run`` still comes first.
Subscribed to a bus, the start and the end are also ``RunBegan`` and
``RunEnded`` events, to which training callbacks subscribe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec

from eventbus import Event, EventBus, RunFinished, RunStarted, Stage, Subscription
from eventbus.events import RunBegan, RunEnded, RunResult, TrainRunContext

from ._interfaces import RunCallback

__all__ = ["RunCallbackHandler"]

ResultOf = Callable[[RunFinished, TrainRunContext], RunResult]


def _bare_result(event: RunFinished, context: TrainRunContext) -> RunResult:
    return RunResult(run_id=context.run_id, status=event.status, error=event.error)


class RunCallbackHandler:
    """Calls ``before_run`` and ``after_run`` of each callback exactly once.

    ``result_of`` builds the ``RunResult`` given to ``after_run`` (the
    attachment fills in its figures). A second ``RunStarted`` or
    ``RunFinished`` (two runs in one log) is ignored: one handler, one run.
    ``world_size`` fills in a context built from an event that lacks it.
    """

    def __init__(
        self,
        run_callbacks: Iterable[RunCallback] = (),
        *,
        result_of: ResultOf = _bare_result,
        world_size: int | None = None,
    ) -> None:
        self.run_callbacks = list(run_callbacks)
        self._world_size = world_size
        self._bus: EventBus | None = None
        self.run_context: TrainRunContext | None = None
        self.result: RunResult | None = None
        self._result_of = result_of

    def subscribe(self, bus: EventBus, *, order: int = Stage.LIFECYCLE) -> Subscription:
        self._bus = bus
        bus.derives(RunBegan, RunEnded)
        return bus.subscribe(
            (RunStarted, RunFinished), self.handle, name="handlers.RunCallbackHandler", order=order
        )

    @property
    def finished(self) -> bool:
        return self.result is not None

    def context_for(self, event: Event) -> TrainRunContext:
        """The run context; the first event of a run without ``RunStarted`` begins it."""
        if self.run_context is None:
            context = TrainRunContext.from_event(event)
            if not context.world_size and self._world_size:
                context = msgspec.structs.replace(context, world_size=self._world_size)
            self._begin(context)
            return context
        return self.run_context

    def handle(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            if self.run_context is None:
                self._begin(TrainRunContext.from_started(event))
        elif isinstance(event, RunFinished):
            self.finish(event)

    def finish(self, event: RunFinished) -> None:
        if self.result is not None:
            return
        context = self.context_for(event)
        self.result = result = self._result_of(event, context)
        for callback in self.run_callbacks:
            callback.after_run(context, result)
        if self._bus is not None:
            self._bus.emit(RunEnded(context=context, result=result), derived=True)

    def _begin(self, context: TrainRunContext) -> None:
        self.run_context = context
        for callback in self.run_callbacks:
            callback.before_run(context)
        if self._bus is not None:
            self._bus.emit(RunBegan(context=context), derived=True)
