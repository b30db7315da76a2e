"""Wiring training callbacks onto a bus: gathering, failures, lifecycle, in one call, the
same for a live run, a replay, a benchmark and the adapters."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, Self

import msgspec

from eventbus import (
    AfterRun,
    BeforeRun,
    BudgetReport,
    CheckpointSaved,
    Event,
    EventBus,
    FailuresGathered,
    HealthCheckTick,
    RankStalled,
    RunFinished,
    RunResult,
    RunStarted,
    RunStatus,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from eventbus._events import CallbackCost, RunPosition
from eventbus._stages import Stage
from eventbus._subscription import Subscription, SubscriptionStats

from ._errors import WorkerError
from ._reports import ReportCallbackHandler
from ._user import UserCallbackHandler

if TYPE_CHECKING:
    from ._callback import UserCallback

__all__ = ["CallbackAttachment", "attach_user_callbacks"]

#: Worker exceptions kept for ``after_exception`` at most (the oldest go first).
_MAX_ORIGINALS = 1024


class CallbackAttachment:
    """Training callbacks wired onto a bus, with the gatherers that feed them (ordinary
    subscribers, in ``Stage`` order); its arguments are ``attach_user_callbacks``'s.

    It is also the run's lifecycle handler: ``BeforeRun`` when the run begins and
    ``AfterRun`` when it ends, once each, however it ends; and it keeps the run context.
    """

    def __init__(
        self,
        callbacks: Iterable[UserCallback | Any],
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        announce_checkpoints: bool = False,
    ) -> None:
        self.bus: EventBus | None = None
        self._world_size = world_size
        self._emit: Callable[[Event], object] = _dropped
        self.run_context: TrainRunContext | None = None
        #: What ``AfterRun`` carried (``None`` until the run ended), and the bus sequence
        #: number of the ``RunFinished`` that ended the run.
        self.ended: RunResult | None = None
        self.ended_seq: int | None = None
        #: By handler name: the budget reports that named it over budget.
        self.periods_over_budget: Counter[str] = Counter()
        context_for = self.context_for
        self.reports = ReportCallbackHandler(
            world_size=world_size,
            required_ranks=required_ranks,
            context_for=context_for,
            announce_checkpoints=announce_checkpoints,
        )
        self.failures = ExceptionCallbackHandler(context_for)
        #: Worker exceptions raised in this process, by rank and traceback.
        self._originals: dict[tuple[int, str], Exception] = {}
        self.user = UserCallbackHandler(
            callbacks,
            context_of=context_for,
            exception_of=self.exception_of,
            after_the_end=self.after_the_end,
        )
        self.subscriptions: list[Subscription] = []

    def attach(self, bus: EventBus) -> Self:
        """Subscribe the gatherers (the report gatherer first: ``ValueError``, nothing
        subscribed, if the bus has one already) and every callback's hooks to ``bus``."""
        if self.bus is not None:
            raise RuntimeError("these callbacks are attached already: make another attachment")
        self._emit = partial(bus.emit, derived=True)  # BeforeRun, AfterRun: never refused
        self.subscriptions = [
            self.reports.subscribe(bus, order=Stage.GATHER_REPORTS),
            self.failures.subscribe(bus),
            bus.subscribe(
                (RunStarted, RunFinished, BudgetReport),
                self._lifecycle,
                name="handlers.RunCallbackHandler",
                order=Stage.LIFECYCLE,
            ),
            *self.user.subscribe(bus, order=Stage.CALLBACKS),
        ]
        self.bus = bus
        return self

    def context_for(self, event: Event) -> TrainRunContext:
        """The run context; the first event of a run without ``RunStarted`` begins it."""
        if self.run_context is None:
            context = TrainRunContext.from_event(event)
            if not context.world_size and self._world_size:
                context = msgspec.structs.replace(context, world_size=self._world_size)
            self._begin(context)
            return context
        return self.run_context

    def _begin(self, context: TrainRunContext) -> None:
        self.run_context = context
        self._emit(BeforeRun(context=context))

    def _lifecycle(self, event: Event) -> None:
        """The run's start (the first one counts), its end (the first one), a period's budget."""
        if isinstance(event, BudgetReport):
            self.periods_over_budget.update(event.over_budget)
        elif isinstance(event, RunStarted):
            if self.run_context is None:
                self._begin(TrainRunContext.from_started(event))
        elif isinstance(event, RunFinished) and self.ended is None:
            context = self.context_for(event)
            self.ended_seq = event.seq
            self.ended = result = msgspec.structs.replace(
                self.result(event.status),
                run_id=context.run_id,
                error=event.error,
                stopped_by=event.stopped_by,
                stop_reason=event.stop_reason,
                summary=dict(event.summary),
            )
            self._emit(AfterRun(context=context, result=result))

    def after_the_end(self, event: Event) -> bool:
        """Whether ``event`` came after the run's end (``after_run`` stays the last hook)."""
        ended = self.ended_seq
        return ended is not None and event.seq > ended

    def keep_original(self, failure: WorkerFailure, exc: Exception) -> None:
        """``after_exception`` gets ``exc`` itself for ``failure`` (the log carries its text)."""
        if len(self._originals) >= _MAX_ORIGINALS:  # failures are few; a flood keeps text
            self._originals.pop(next(iter(self._originals)))
        # Keyed by what the failure says, not by the object: handlers get a copy of it.
        self._originals[(failure.rank, failure.traceback)] = exc

    def exception_of(self, failure: WorkerFailure) -> Exception:
        """The worker's own exception if raised in this process, else one rebuilt from text."""
        kept = self._originals.get((failure.rank, failure.traceback))
        return kept if kept is not None else WorkerError.from_failure(failure)

    def position_of(self, event: CheckpointSaved) -> RunPosition | None:
        """Where the run stood at the round of ``event`` (for the state store's snapshot)."""
        position = self.reports.position_at(event.index)
        if position is None or position.checkpoint != event.checkpoint:
            return None
        context = self.run_context
        return msgspec.structs.replace(
            position,
            checkpoint_seq=event.seq,
            start_time=context.start_time if context else 0.0,
            failures=self.failures.failures,
            pending_failures=self.failures.pending_before(event.seq),
        )

    @property
    def callbacks(self) -> list[Any]:
        return self.user.callbacks

    def costs(self) -> tuple[CallbackCost, ...]:
        """What each hook of the training callbacks cost so far, in subscription order."""
        over = self.periods_over_budget
        return tuple(_cost(sub.stats(), over[sub.name]) for sub in self.user.subscriptions)

    def result(self, status: RunStatus = "finished") -> RunResult:
        """The figures so far, as ``after_run`` would get them."""
        context = self.run_context
        reports = self.reports
        return RunResult(
            run_id=context.run_id if context else "",
            status=status,
            rounds=reports.rounds,
            reports=reports.reports,
            rejected=reports.rejected,
            failures=self.failures.failures,
            restarts=reports.restarts,
            last_checkpoint=reports.last_checkpoint,
            checkpoint_mismatches=reports.mismatches,
            callbacks=self.costs(),
        )

    async def finish(self, status: RunStatus = "finished", error: str | None = None) -> None:
        """Publish ``RunFinished`` if the events never did (a log cut short)."""
        if self.bus is not None and self.ended is None:
            context = self.run_context
            run_id = context.run_id if context else "run"
            await self.bus.publish(RunFinished(run_id=run_id, status=status, error=error))

    def cancel(self) -> None:
        """Detach every handler from the bus."""
        for sub in self.subscriptions:
            sub.cancel()


class ExceptionCallbackHandler:
    """Gathers ``WorkerFailure`` events per health-check period (Ray Train's poll, by bus
    time) into one ``FailuresGathered`` each, a rank's first failure (the cause) standing
    for it; pending ones go at a restart or the end. A stalled rank goes at once, alone."""

    def __init__(self, context_for: Callable[[Event], TrainRunContext]) -> None:
        self._context_for = context_for
        self._pending: list[WorkerFailure] = []
        #: What a resumed run's checkpoint had pending, due at the first tick.
        self._carried: list[WorkerFailure] = []
        self._emit: Callable[[Event], object] = _dropped
        #: Figures: failures seen, deliveries made.
        self.failures = 0
        self.deliveries = 0

    def subscribe(self, bus: EventBus) -> Subscription:
        self._emit = partial(bus.emit, derived=True)  # one per period: never refused
        return bus.subscribe(
            (WorkerFailure, HealthCheckTick, WorkerGroupRestarted, RunFinished, RankStalled),
            self.handle,
            name="handlers.ExceptionCallbackHandler",
            order=Stage.GATHER_FAILURES,
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
                self._deliver(due, ())
        elif isinstance(event, (WorkerGroupRestarted, RunFinished)):
            due, self._pending, self._carried = [*self._carried, *self._pending], [], []
            if due:
                self._deliver(due, ())
        elif isinstance(event, RankStalled):
            self._deliver([], (event,))

    def pending_before(self, seq: int) -> tuple[WorkerFailure, ...]:
        """The failures recorded before event ``seq`` not delivered yet (a snapshot's)."""
        return tuple(f for f in self._pending if f.seq < seq)

    def resume_at(self, position: RunPosition) -> None:
        """Continue from ``position``: its failures pending are due at the first tick."""
        self.failures = position.failures
        self._carried = list(position.pending_failures)

    def _deliver(self, failures: list[WorkerFailure], stalls: tuple[RankStalled, ...]) -> None:
        first: dict[int, WorkerFailure] = {}
        for failure in failures:
            first.setdefault(failure.rank, failure)
        self.deliveries += 1
        context = self._context_for(failures[0] if failures else stalls[0])
        self._emit(
            FailuresGathered(
                context=context,
                index=self.deliveries - 1,
                failures=tuple(first.values()),
                stalls=stalls,
            )
        )


def _dropped(event: Event) -> None:
    """Where a handler's events go before it is subscribed: nowhere."""


def _cost(stats: SubscriptionStats, periods_over_budget: int) -> CallbackCost:
    return CallbackCost(
        handler=stats.name,
        calls=stats.calls,
        total=stats.total,
        mean=stats.total / stats.calls if stats.calls else 0.0,
        max=stats.max,
        periods_over_budget=periods_over_budget,
        faults=stats.failed,
        timeouts=stats.timed_out,
        skipped=stats.skipped,
    )


def attach_user_callbacks(
    bus: EventBus,
    callbacks: Iterable[UserCallback | Any],
    *,
    world_size: int | None = None,
    required_ranks: Iterable[int] | None = None,
    announce_checkpoints: bool = False,
) -> CallbackAttachment:
    """Wire training callbacks onto a bus of your own, as a run does (for a replay, or a
    trainer that drives its own bus; ``open_run`` does it for a live run).

    Args:
        bus: the bus, not yet closed.
        callbacks: the training callbacks (``UserCallback``s, or objects with its hooks).
        world_size: the run's ranks; by default the run context's.
        required_ranks: the ranks a round waits for; by default all of them.
        announce_checkpoints: emit a ``CheckpointSaved`` for each round's checkpoint,
            for the state store (a replay has the recorded ones).

    Returns the attachment: its ``run_context``, ``callbacks``, ``costs()``,
    ``result()`` once the run ended, and ``cancel()`` to unsubscribe them all.
    """
    return CallbackAttachment(
        callbacks,
        world_size=world_size,
        required_ranks=required_ranks,
        announce_checkpoints=announce_checkpoints,
    ).attach(bus)
