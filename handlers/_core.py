"""The run core: what ``open_run`` and the trainers' adapters share of a run's life (its id,
resume, log, wiring, first and last events). It knows no loop: its driver publishes."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    EventBus,
    RunFinished,
    RunResult,
    RunStarted,
    RunStatus,
    StateRestored,
)
from eventbus._events import RunPosition
from eventbus.log import LogRecorder
from eventbus.state import StateStore

from ._attach import CallbackAttachment
from ._ending import log_run_end, stop_of
from ._resume import Resume, appends_to_log
from ._user import training_callbacks

__all__ = ["RunCore"]


class RunCore:
    """One run's identity, wiring, log, and first and last events. Its arguments are
    ``open_run``'s (``world_size=0``: not known until the first report); ``position_of``
    says where the run stood at a checkpoint (default: the gathering's)."""

    def __init__(
        self,
        callbacks: Iterable[Any],
        *,
        name: str,
        world_size: int,
        required_ranks: Iterable[int] | None = None,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
        storage: str | None = None,
        store: StateStore | None = None,
        announce_checkpoints: bool = True,
        position_of: Callable[[CheckpointSaved], RunPosition | None] | None = None,
    ) -> None:
        self.name = name
        self.world_size = world_size
        self.required_ranks = tuple(required_ranks) if required_ranks is not None else None
        self.callbacks = training_callbacks(callbacks)
        self.config = dict(config or {})
        self.storage = storage
        self.store = store
        self._position_of = position_of or self.position_of
        self._announce = announce_checkpoints
        self._requested_id = run_id

        self.run_id = run_id or f"{name}-{uuid.uuid4().hex[:8]}"
        self.resume: Resume | None = None
        self.restored: StateRestored | None = None
        self.attachment: CallbackAttachment | None = None
        self.recorder: LogRecorder | None = None
        #: The health-check period a crash cut, reported when the resumed run begins.
        self.cut_period: BudgetReport | None = None

    @property
    def continues(self) -> bool:
        """Whether this run continues a saved one (where it stood is known)."""
        return self.resume is not None and self.resume.position is not None

    def resumed(
        self,
        resume: Resume | None,
        callbacks: Iterable[Any] | None = None,
        restored: StateRestored | None = None,
    ) -> None:
        """What the run resumes, read before anything started, and the callbacks restored."""
        self.resume = resume
        if callbacks is not None:
            self.callbacks = list(callbacks)
        self.restored = restored
        if self._requested_id is None and resume is not None and resume.run_id and self.continues:
            self.run_id = resume.run_id

    def first_index(self, rank: int) -> int:
        """The index of ``rank``'s first report (a resumed run continues them)."""
        return self.resume.first_index(rank) if self.resume is not None else 0

    def open_log(self, log: str | os.PathLike[str] | None) -> None:
        """Create the log, or append to it for a run that continues it (``appends_to_log``)."""
        if log is not None and self.recorder is None:
            run_dir = self.store.root if self.store is not None else None
            append = appends_to_log(log, resuming=self.continues, run_dir=run_dir)
            self.recorder = LogRecorder(log, run_id=self.run_id, append=append, overwrite=False)

    def open(self, bus: EventBus) -> CallbackAttachment:
        """Wire the run onto ``bus`` before it starts: log, callbacks, gatherers, store."""
        if self.attachment is not None:
            raise RuntimeError(f"run {self.run_id} is open already")
        attachment = self.attachment = CallbackAttachment(
            self.callbacks,
            world_size=self.world_size or None,
            required_ranks=self.required_ranks,
            announce_checkpoints=self._announce,
        )
        if self.recorder is not None:
            self.recorder.attach(bus)
        attachment.attach(bus)
        if self.resume is not None:
            self.resume.apply(attachment, self.world_size)
            tail = self.recorder.appended if self.recorder is not None else None
            self.cut_period = self.resume.continue_bus(bus, tail)
        if self.store is not None:
            self.store.attach(bus, position_of=self._position_of)
        return attachment

    def position_of(self, event: CheckpointSaved) -> RunPosition | None:
        """Where the run stood at the round of ``event`` (saved with the snapshot)."""
        return self.attachment.position_of(event) if self.attachment is not None else None

    def started(self) -> RunStarted:
        """The run's first event; a resumed run keeps the time it first started."""
        position = self.resume.position if self.resume is not None else None
        return RunStarted(
            run_id=self.run_id,
            name=self.name,
            world_size=self.world_size,
            config=self.config,
            storage=self.storage,
            wall_time=position.start_time if position and position.start_time else time.time(),
        )

    def after_start(self) -> list[Event]:
        """What a resumed run says once ``before_run`` has returned."""
        resumed = self.resume.event(self.run_id) if self.resume is not None else None
        return [e for e in (resumed, self.cut_period, self.restored) if e is not None]

    def finished(
        self,
        status: RunStatus,
        error: str | None = None,
        *,
        summary: dict[str, Any] | None = None,
        stopped: tuple[str, str | None] | None = None,
    ) -> RunFinished:
        """The run's last event: its status, and the callback that stopped it."""
        stopped_by, stop_reason = stopped or stop_of(self.callbacks) or (None, None)
        return RunFinished(
            run_id=self.run_id,
            status=status,
            error=error,
            stopped_by=stopped_by,
            stop_reason=stop_reason,
            summary=summary or {},
        )

    @property
    def result(self) -> RunResult | None:
        """``after_run``'s result once the run ended, its callbacks' costs brought up to now."""
        attachment = self.attachment
        if attachment is None or attachment.ended is None:
            return None
        return msgspec.structs.replace(attachment.ended, callbacks=attachment.costs())

    def say_end(self, seconds: float | None = None) -> None:
        """One line on the console for how the run ended (once it has a result)."""
        result = self.result
        if result is not None:
            log_run_end(result, seconds)

    def close_log(self) -> None:
        """Close the log, after the bus's last event (its verdict on the last period)."""
        if self.recorder is not None:
            self.recorder.close()
