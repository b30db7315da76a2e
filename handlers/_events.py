"""Events the handlers derive for user callbacks (they join the event union).

They are outputs of the gathering, recorded in a log like any event, so a
log holding them decodes only once ``handlers`` is imported. ``origin``
names the attachment that derived an event: callbacks attached elsewhere
(say, a replay of that log) ignore it and derive their own.
"""

from __future__ import annotations

from typing import Any

from eventbus import Event, WorkerFailure

from ._context import RunResult, TrainRunContext

__all__ = ["FailuresGathered", "RoundGathered", "RunBegan", "RunEnded"]


class RunBegan(Event, frozen=True, kw_only=True):
    """``before_run`` is due."""

    origin: str
    context: TrainRunContext


class RoundGathered(Event, frozen=True, kw_only=True):
    """One report round: ``metrics[i]`` from the i-th required rank; ``after_report`` is due.

    Each callback gets its own copy of the list; the dicts in it are read-only
    (``FrozenDict``), shared by every callback: none sees another's edits.
    """

    origin: str
    run_id: str
    round: int
    metrics: list[dict[str, Any]]
    checkpoint: str | None = None


class FailuresGathered(Event, frozen=True, kw_only=True):
    """Worker failures of one health-check period; ``after_exception`` is due."""

    origin: str
    run_id: str
    index: int
    failures: tuple[WorkerFailure, ...]


class RunEnded(Event, frozen=True, kw_only=True):
    """``after_run`` is due: every other derived event of the run came before it."""

    origin: str
    result: RunResult
