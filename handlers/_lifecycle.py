"""Run lifecycle: ``before_run`` once before anything else, ``after_run`` once at the end,
however the run ends; also the run context, and each handler's periods over budget."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import partial

import msgspec

from eventbus import (
    AfterRun,
    BeforeRun,
    BudgetReport,
    Event,
    EventBus,
    RunFinished,
    RunResult,
    RunStarted,
    TrainRunContext,
)
from eventbus._events import CallbackCost
from eventbus._stages import Stage
from eventbus._subscription import Subscription

__all__ = ["RunCallbackHandler"]

ResultOf = Callable[[RunFinished, TrainRunContext], RunResult]
#: The training callbacks' costs so far (an attachment's ``costs``).
CostsOf = Callable[[], tuple[CallbackCost, ...]]


def _bare_result(event: RunFinished, context: TrainRunContext) -> RunResult:
    return RunResult(
        run_id=context.run_id, status=event.status, error=event.error, summary=dict(event.summary)
    )


class RunCallbackHandler:
    """Emits ``BeforeRun`` when the run begins and ``AfterRun`` when it ends, once each.

    Args:
        result_of: builds the ``RunResult`` that ``AfterRun`` carries (default: status
            and error alone).
        world_size: fills in a context built from an event that lacks it.
        costs_of: the callbacks' costs so far, which ``result`` brings up to date.
    """

    def __init__(
        self,
        *,
        result_of: ResultOf = _bare_result,
        world_size: int | None = None,
        costs_of: CostsOf | None = None,
    ) -> None:
        self._world_size = world_size
        self._emit: Callable[[Event], object] | None = None
        self.run_context: TrainRunContext | None = None
        #: What ``AfterRun`` carried (``None`` until the run ended).
        self.ended: RunResult | None = None
        #: The bus sequence number of the ``RunFinished`` that ended the run.
        self.ended_seq: int | None = None
        #: By handler name: the budget reports that named it over budget.
        self.periods_over_budget: Counter[str] = Counter()
        self._result_of = result_of
        self._costs_of = costs_of

    def subscribe(self, bus: EventBus, *, order: int = Stage.LIFECYCLE) -> Subscription:
        """Follow the run's start and end, and its budget reports, on ``bus``; its
        events are emitted there."""
        self._emit = partial(bus.emit, derived=True)  # once each: never refused
        return bus.subscribe(
            (RunStarted, RunFinished, BudgetReport),
            self.handle,
            name="handlers.RunCallbackHandler",
            order=order,
        )

    @property
    def finished(self) -> bool:
        return self.ended is not None

    @property
    def result(self) -> RunResult | None:
        """The run's result once it ended, its callbacks' costs brought up to now."""
        ended = self.ended
        if ended is None or self._costs_of is None:
            return ended
        return msgspec.structs.replace(ended, callbacks=self._costs_of())

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
        """The run's start (the first one counts), its end, or a period's budget."""
        if isinstance(event, BudgetReport):
            self.periods_over_budget.update(event.over_budget)
        elif isinstance(event, RunStarted):
            if self.run_context is None:
                self._begin(TrainRunContext.from_started(event))
        elif isinstance(event, RunFinished):
            self.finish(event)

    def finish(self, event: RunFinished) -> None:
        """End the run as ``event`` says, unless it has ended already."""
        if self.ended is not None:
            return
        context = self.context_for(event)
        self.ended_seq = event.seq
        self.ended = result = self._result_of(event, context)
        if self._emit is not None:
            self._emit(AfterRun(context=context, result=result))

    def after_the_end(self, event: Event) -> bool:
        """Whether ``event`` came after the run's end (``after_run`` stays the last hook)."""
        ended = self.ended_seq
        return ended is not None and event.seq > ended

    def _begin(self, context: TrainRunContext) -> None:
        self.run_context = context
        if self._emit is not None:
            self._emit(BeforeRun(context=context))
