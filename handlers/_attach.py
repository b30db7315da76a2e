"""Wiring user callbacks onto a bus: gathering, failures, lifecycle, in one call.

``open_run`` uses it for live runs, and a log replay uses it on a bus fed
from a recorded log: everything callbacks see is derived from events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from eventbus import CheckpointSaved, EventBus, RunFinished, Stage, Subscription, WorkerFailure
from eventbus.events import RunPosition, RunResult, RunStatus, TrainRunContext

from ._errors import WorkerError
from ._failures import ExceptionCallbackHandler
from ._interfaces import ReportCallback
from ._lifecycle import RunCallbackHandler
from ._reports import ReportCallbackHandler
from ._user import UserCallbackHandler

if TYPE_CHECKING:
    from ._callback import UserCallback

__all__ = ["CallbackAttachment", "attach_user_callbacks"]

#: Worker exceptions kept for ``after_exception`` at most (the oldest go first).
_MAX_ORIGINALS = 1024


class CallbackAttachment:
    """Wires training callbacks onto a bus; keeps the handlers and the run's figures.

    Each stage is an ordinary subscriber (``Stage`` says in which order): the
    gatherers turn raw events into gathered ones, each carrying the run's
    context, and every hook of every training callback subscribes to its
    gathered event. The run context comes from the first ``RunStarted`` (or,
    if there is none, from the first event naming the run).
    ``report_callbacks`` get the gathered rounds too, synchronously, inside
    the bus; ``announce_checkpoints`` emits a ``CheckpointSaved`` for each
    round's checkpoint (a live run does; a replay has the recorded ones). The
    gatherers declare what they derive (``EventBus.derives``), so a replay
    into the bus leaves out the gathered events its log recorded.
    """

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
        self.restarts = 0
        self.lifecycle = RunCallbackHandler(result_of=self._result, world_size=world_size)
        context_for = self.lifecycle.context_for
        self.reports = ReportCallbackHandler(
            report_callbacks,
            world_size=world_size,
            required_ranks=required_ranks,
            context_for=context_for,
            announce_checkpoints=announce_checkpoints,
        )
        self.failures = ExceptionCallbackHandler(context_for=context_for)
        #: Worker exceptions raised in this process, by their failure event (``keep_original``).
        self._originals: dict[int, tuple[WorkerFailure, Exception]] = {}
        self.user = UserCallbackHandler(
            callbacks, context_of=context_for, exception_of=self.exception_of
        )
        self.subscriptions: list[Subscription] = [
            self.failures.subscribe(bus, order=Stage.GATHER_FAILURES),
            self.lifecycle.subscribe(bus, order=Stage.LIFECYCLE),
            self.reports.subscribe(bus, order=Stage.GATHER_REPORTS),
            *self.user.subscribe(bus, order=Stage.CALLBACKS),
        ]

    @property
    def last_checkpoint(self) -> str | None:
        """The checkpoint of the latest complete round (where a restart resumes)."""
        return self.reports.last_checkpoint

    def keep_original(self, failure: WorkerFailure, exc: Exception) -> None:
        """``after_exception`` gets ``exc`` itself for ``failure`` (as in Ray, in one
        process); the log and a replay carry its text form, a ``WorkerError``."""
        if len(self._originals) >= _MAX_ORIGINALS:  # failures are few; a flood keeps text
            self._originals.pop(next(iter(self._originals)))
        self._originals[id(failure)] = (failure, exc)

    def exception_of(self, failure: WorkerFailure) -> Exception:
        kept = self._originals.get(id(failure))
        if kept is not None and kept[0] is failure:
            return kept[1]
        return WorkerError.from_failure(failure)

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
            restarts=self.restarts,
            pending_failures=self.failures.pending_before(event.seq),
        )

    @property
    def run_context(self) -> TrainRunContext | None:
        return self.lifecycle.run_context

    @property
    def callbacks(self) -> list[Any]:
        return self.user.callbacks

    def result(self, status: RunStatus = "finished") -> RunResult:
        """The figures so far, as ``after_run`` would get them."""
        context = self.run_context
        return RunResult(
            run_id=context.run_id if context else "",
            status=status,
            rounds=self.reports.rounds,
            reports=self.reports.reports,
            rejected=self.reports.rejected,
            failures=self.failures.failures,
            restarts=self.restarts,
            last_checkpoint=self.last_checkpoint,
            checkpoint_mismatches=self.reports.mismatches,
        )

    def _result(self, event: RunFinished, context: TrainRunContext) -> RunResult:
        return msgspec.structs.replace(
            self.result(event.status),
            run_id=context.run_id,
            error=event.error,
            stopped_by=event.stopped_by,
            stop_reason=event.stop_reason,
        )

    async def finish(self, status: RunStatus = "finished", error: str | None = None) -> None:
        """Publish ``RunFinished`` if the events never did (a log cut short)."""
        if not self.lifecycle.finished:
            context = self.lifecycle.run_context
            run_id = context.run_id if context else "run"
            await self.bus.publish(RunFinished(run_id=run_id, status=status, error=error))

    def cancel(self) -> None:
        """Detach every handler from the bus."""
        for sub in self.subscriptions:
            sub.cancel()


#: ``attach_user_callbacks(bus, callbacks, ...)``: wire ``callbacks`` onto ``bus`` (report
#: gathering, failure gathering, lifecycle) and get the attachment.
attach_user_callbacks = CallbackAttachment
