"""What callbacks are told about the run: its context and, at the end, its result."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from eventbus import Report, RunStarted, WorkerFailure

__all__ = ["RunResult", "RunStatus", "TrainRunContext"]

RunStatus = Literal["finished", "failed", "cancelled"]


class TrainRunContext(msgspec.Struct, frozen=True, kw_only=True):
    """Immutable facts about one run, given to every callback call.

    ``start_time`` is wall-clock seconds since the epoch when known (from
    ``RunStarted``), else the bus time of the first event of the run.
    """

    run_id: str
    name: str
    world_size: int
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    storage: str | None = None
    start_time: float = 0.0

    @classmethod
    def from_started(cls, event: RunStarted) -> TrainRunContext:
        return cls(
            run_id=event.run_id,
            name=event.name,
            world_size=event.world_size,
            config=dict(event.config),
            storage=event.storage,
            start_time=event.wall_time or event.time,
        )

    @classmethod
    def from_event(cls, event: Report | WorkerFailure | Any) -> TrainRunContext:
        """A context for a run whose ``RunStarted`` was never seen (a partial log)."""
        run_id = str(getattr(event, "run_id", "") or "run")
        return cls(
            run_id=run_id,
            name=run_id,
            world_size=int(getattr(event, "world_size", 0) or 0),
            start_time=float(getattr(event, "time", 0.0)),
        )


class RunResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a run ended, given to ``after_run``."""

    run_id: str
    status: RunStatus
    error: str | None = None
    rounds: int = 0
    reports: int = 0
    rejected: int = 0
    failures: int = 0
    restarts: int = 0
    last_checkpoint: str | None = None
