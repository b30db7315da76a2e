"""Wiring training callbacks onto a bus: gathering, failures, lifecycle, in one call, the
same for a live run, a replay, a benchmark and the adapters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Self

import msgspec

from eventbus import (
    CheckpointSaved,
    EventBus,
    RunFinished,
    RunResult,
    RunStatus,
    TrainRunContext,
    WorkerFailure,
)
from eventbus._events import CallbackCost, RunPosition
from eventbus._stages import Stage
from eventbus._subscription import Subscription, SubscriptionStats

from ._errors import WorkerError
from ._failures import ExceptionCallbackHandler
from ._lifecycle import RunCallbackHandler
from ._reports import ReportCallbackHandler
from ._user import UserCallbackHandler

if TYPE_CHECKING:
    from ._callback import UserCallback

__all__ = ["CallbackAttachment", "attach_user_callbacks"]

#: Worker exceptions kept for ``after_exception`` at most (the oldest go first).
_MAX_ORIGINALS = 1024


class CallbackAttachment:
    """Training callbacks wired onto a bus, with the gatherers that feed them (each an
    ordinary subscriber, in ``Stage`` order). ``attach`` subscribes; its arguments are
    ``attach_user_callbacks``'s."""

    def __init__(
        self,
        callbacks: Iterable[UserCallback | Any],
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        announce_checkpoints: bool = False,
    ) -> None:
        self.bus: EventBus | None = None
        self.lifecycle = RunCallbackHandler(
            result_of=self._result, world_size=world_size, costs_of=self.costs
        )
        context_for = self.lifecycle.context_for
        self.reports = ReportCallbackHandler(
            world_size=world_size,
            required_ranks=required_ranks,
            context_for=context_for,
            announce_checkpoints=announce_checkpoints,
        )
        self.failures = ExceptionCallbackHandler(context_for=context_for)
        #: Worker exceptions raised in this process, by rank and traceback.
        self._originals: dict[tuple[int, str], Exception] = {}
        self.user = UserCallbackHandler(
            callbacks,
            context_of=context_for,
            exception_of=self.exception_of,
            after_the_end=self.lifecycle.after_the_end,
        )
        self.subscriptions: list[Subscription] = []

    def attach(self, bus: EventBus) -> Self:
        """Subscribe the gatherers and every callback's hooks to ``bus``; ``ValueError``
        (nothing subscribed) if the bus gathers reports already."""
        if self.bus is not None:
            raise RuntimeError("these callbacks are attached already: make another attachment")
        # The report gatherer first: it refuses a bus that has one already.
        self.subscriptions = [
            self.reports.subscribe(bus, order=Stage.GATHER_REPORTS),
            self.failures.subscribe(bus, order=Stage.GATHER_FAILURES),
            self.lifecycle.subscribe(bus, order=Stage.LIFECYCLE),
            *self.user.subscribe(bus, order=Stage.CALLBACKS),
        ]
        self.bus = bus
        return self

    @property
    def last_checkpoint(self) -> str | None:
        """The checkpoint of the latest complete round (where a restart resumes)."""
        return self.reports.last_checkpoint

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

    def resume_at(self, checkpoint: str, position: RunPosition | None) -> None:
        """Continue from ``checkpoint`` and, given it, the run's ``position`` there."""
        self.reports.resume_at(checkpoint, position)
        if position is not None:
            self.failures.resume_at(position)

    @property
    def run_context(self) -> TrainRunContext | None:
        return self.lifecycle.run_context

    @property
    def callbacks(self) -> list[Any]:
        return self.user.callbacks

    def costs(self) -> tuple[CallbackCost, ...]:
        """What each hook of the training callbacks cost so far, in subscription order
        (the library's own handlers are in ``EventBus.stats()``)."""
        over = self.lifecycle.periods_over_budget
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

    def _result(self, event: RunFinished, context: TrainRunContext) -> RunResult:
        return msgspec.structs.replace(
            self.result(event.status),
            run_id=context.run_id,
            error=event.error,
            stopped_by=event.stopped_by,
            stop_reason=event.stop_reason,
            summary=dict(event.summary),
        )

    async def finish(self, status: RunStatus = "finished", error: str | None = None) -> None:
        """Publish ``RunFinished`` if the events never did (a log cut short)."""
        if self.bus is not None and not self.lifecycle.finished:
            context = self.lifecycle.run_context
            run_id = context.run_id if context else "run"
            await self.bus.publish(RunFinished(run_id=run_id, status=status, error=error))

    def cancel(self) -> None:
        """Detach every handler from the bus."""
        for sub in self.subscriptions:
            sub.cancel()


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
