"""Wiring user callbacks onto a bus: gathering, failures, lifecycle, in one call.

``open_run`` uses it for live runs, and a log replay uses it on a bus fed
from a recorded log: everything callbacks see is derived from events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from eventbus import EventBus, RunFinished, Subscription

from ._checkpoints import CheckpointTracker
from ._context import RunResult, TrainRunContext
from ._failures import ExceptionCallbackHandler
from ._interfaces import ReportCallback, UserCallback
from ._lifecycle import RunCallbackHandler
from ._reports import ReportCallbackHandler
from ._user import UserCallbackHandler

__all__ = ["CallbackAttachment", "attach_user_callbacks"]

# Gathering runs before any callback for the same event; the lifecycle first of all
# (it owns the run context), failures before it (flushed before ``after_run``).
_ORDER_FAILURES = -300
_ORDER_LIFECYCLE = -200
_ORDER_REPORTS = -100


class CallbackAttachment:
    """The handlers wired by ``attach_user_callbacks``, with the run's figures."""

    def __init__(
        self,
        bus: EventBus,
        callbacks: Iterable[UserCallback | Any],
        *,
        world_size: int | None = None,
        required_ranks: Iterable[int] | None = None,
        report_callbacks: Iterable[ReportCallback] = (),
        announce_checkpoints: bool = False,
    ) -> None:
        self.bus = bus
        self.user = UserCallbackHandler(callbacks)
        self.restarts = 0
        self.lifecycle = RunCallbackHandler(
            [self.user], result_of=self._result, world_size=world_size
        )
        self.reports = ReportCallbackHandler(
            [self.user, *report_callbacks],
            world_size=world_size,
            required_ranks=required_ranks,
            context_for=self.lifecycle.context_for,
        )
        self.failures = ExceptionCallbackHandler(
            [self.user], context_for=self.lifecycle.context_for
        )
        self.checkpoints = CheckpointTracker(bus, self.reports, announce=announce_checkpoints)
        self.reports.report_callbacks.append(self.checkpoints)
        self.subscriptions: list[Subscription] = [
            self.failures.subscribe(bus, order=_ORDER_FAILURES),
            self.lifecycle.subscribe(bus, order=_ORDER_LIFECYCLE),
            self.reports.subscribe(bus, order=_ORDER_REPORTS),
            *self.user.subscribe(bus),
        ]

    @property
    def last_checkpoint(self) -> str | None:
        """The checkpoint of the latest complete round (where a restart resumes)."""
        return self.checkpoints.last

    @property
    def run_context(self) -> TrainRunContext | None:
        return self.lifecycle.run_context

    @property
    def callbacks(self) -> list[Any]:
        return self.user.callbacks

    def result(self, status: str = "finished") -> RunResult:
        """The figures so far, as ``after_run`` would get them."""
        context = self.run_context
        return RunResult(
            run_id=context.run_id if context else "",
            status=status,  # type: ignore[arg-type]
            rounds=self.reports.rounds,
            reports=self.reports.reports,
            rejected=self.reports.rejected,
            failures=self.failures.failures,
            restarts=self.restarts,
            last_checkpoint=self.last_checkpoint,
        )

    def _result(self, event: RunFinished, context: TrainRunContext) -> RunResult:
        return msgspec.structs.replace(
            self.result(event.status), run_id=context.run_id, error=event.error
        )

    async def finish(self, status: str = "finished", error: str | None = None) -> None:
        """Publish ``RunFinished`` if the events never did (a log cut short)."""
        if not self.lifecycle.finished:
            context = self.lifecycle.run_context
            run_id = context.run_id if context else "run"
            await self.bus.publish(RunFinished(run_id=run_id, status=status, error=error))  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Detach every handler from the bus."""
        for sub in self.subscriptions:
            sub.cancel()


def attach_user_callbacks(
    bus: EventBus,
    callbacks: Iterable[UserCallback | Any],
    *,
    world_size: int | None = None,
    required_ranks: Iterable[int] | None = None,
    report_callbacks: Iterable[ReportCallback] = (),
    announce_checkpoints: bool = False,
) -> CallbackAttachment:
    """Wire ``callbacks`` onto ``bus``: report gathering, failure gathering, lifecycle.

    The run context comes from the first ``RunStarted`` (or, if there is
    none, from the first event naming the run). ``report_callbacks`` get
    the gathered rounds too, synchronously, inside the bus;
    ``announce_checkpoints`` emits a ``CheckpointSaved`` for each round's
    checkpoint (a live run does; a replay has the recorded ones).
    """
    return CallbackAttachment(
        bus,
        callbacks,
        world_size=world_size,
        required_ranks=required_ranks,
        report_callbacks=report_callbacks,
        announce_checkpoints=announce_checkpoints,
    )
