"""Event types: one tagged union of frozen msgspec structs.

Every message on the bus, in a log or on the wire is an ``Event`` subclass, so
it decodes to exactly one class by its ``type`` tag, and anything unknown or
malformed is a validation error instead of a crash or code execution.
Exceptions travel as type name, message and traceback text: never pickled.
"""

from __future__ import annotations

import traceback as _traceback
from typing import Any, ClassVar, Literal

import msgspec

__all__ = [
    "SCHEMA_VERSION",
    "BudgetReport",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Event",
    "EventPlaceholder",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "Report",
    "ReportRejected",
    "RunFinished",
    "RunStarted",
    "StateRestored",
    "StateSnapshotted",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "event_types",
]

#: Bumped whenever an event changes shape incompatibly; logs carry it.
SCHEMA_VERSION = 1

Metrics = dict[str, Any]


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", tag=True):
    """Base of every event.

    ``seq`` and ``time`` are stamped by the bus when it dispatches the event
    (``-1`` / ``0.0`` before that), so the order of a run is explicit in its
    log. A publisher may set ``time`` itself (a replay keeps recorded times);
    ``seq`` always comes from the bus.
    """

    seq: int = -1
    time: float = 0.0

    _registry: ClassVar[dict[str, type[Event]]] = {}
    _generation: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Every subclass joins the union that codecs decode, user events included.
        Event._registry[cls.__name__] = cls
        Event._generation += 1


def event_types() -> tuple[type[Event], ...]:
    """All event classes defined so far (the tagged union that logs decode)."""
    return tuple(Event._registry.values())


# --- training events ---------------------------------------------------------


class Report(Event, frozen=True, kw_only=True):
    """What one rank reported: its ``index``-th report of the run."""

    run_id: str
    rank: int
    world_size: int
    index: int
    metrics: Metrics
    checkpoint: str | None = None


class WorkerFailure(Event, frozen=True, kw_only=True):
    """An exception that escaped a worker, carried as text (never pickled)."""

    run_id: str
    rank: int
    error_type: str
    message: str
    traceback: str = ""
    retryable: bool = False

    @classmethod
    def from_exception(
        cls, run_id: str, rank: int, exc: BaseException, *, retryable: bool = False
    ) -> WorkerFailure:
        return cls(
            run_id=run_id,
            rank=rank,
            error_type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(_traceback.format_exception(exc)),
            retryable=retryable,
        )


class CheckpointSaved(Event, frozen=True, kw_only=True):
    """A checkpoint was written for report round ``index`` by ``ranks``."""

    run_id: str
    checkpoint: str
    index: int
    ranks: tuple[int, ...] = ()
    metrics: Metrics = msgspec.field(default_factory=dict)


class WorkerGroupRestarted(Event, frozen=True, kw_only=True):
    """Workers restarted: partial report rounds are discarded.

    ``required_ranks`` is the set of ranks a round needs from now on (it may
    shrink or grow in elastic runs); empty means every rank of ``world_size``.
    """

    run_id: str
    world_size: int
    required_ranks: tuple[int, ...] = ()


class ReportRejected(Event, frozen=True, kw_only=True):
    """A report that could not be accepted, and why (the run goes on)."""

    run_id: str
    rank: int
    field: str
    reason: str


class CheckpointMismatch(Event, frozen=True, kw_only=True):
    """Ranks named different checkpoints for one round; the round has none."""

    run_id: str
    round: int
    checkpoints: dict[int, str | None]


# --- lifecycle -----------------------------------------------------------------


class RunStarted(Event, frozen=True, kw_only=True):
    run_id: str
    name: str
    world_size: int
    config: dict[str, Any] = msgspec.field(default_factory=dict)
    storage: str | None = None
    wall_time: float = 0.0


class RunFinished(Event, frozen=True, kw_only=True):
    run_id: str
    status: Literal["finished", "failed", "cancelled"]
    error: str | None = None


class HealthCheckTick(Event, frozen=True, kw_only=True):
    """End of health-check period ``period`` (clock times ``start``..``end``)."""

    period: int
    start: float
    end: float


# --- diagnostics ---------------------------------------------------------------


class HandlerFailed(Event, frozen=True, kw_only=True):
    handler: str
    event_seq: int
    event_type: str
    error_type: str
    message: str
    traceback: str = ""


class HandlerTimedOut(Event, frozen=True, kw_only=True):
    """A handler call ran past its deadline.

    ``outcome`` says what happened to it: ``cancelled`` (async, interrupted),
    ``abandoned`` (blocking, left running in its worker thread) or ``overrun``
    (plain sync, which cannot be interrupted: it ran to the end, late).
    """

    handler: str
    event_seq: int
    event_type: str
    timeout: float
    elapsed: float
    outcome: Literal["cancelled", "abandoned", "overrun"]
    calls: int = 1
    advice: str = ""


class HandlerStateChanged(Event, frozen=True, kw_only=True):
    """A handler was disabled, re-enabled, or started/stopped coalescing."""

    handler: str
    state: Literal["normal", "coalescing", "disabled"]
    reason: str


class HandlerUsage(msgspec.Struct, frozen=True, kw_only=True):
    """One handler's cost in one health-check period."""

    handler: str
    calls: int
    total: float
    max: float
    timeouts: int = 0
    faults: int = 0
    skipped: int = 0
    budget: float = 0.0
    over_budget: bool = False


class BudgetReport(Event, frozen=True, kw_only=True):
    """Callback overhead of one health-check period against its budget.

    ``partial``: the last, unfinished period of a bus that closed (so a run
    shorter than a period still reports what its callbacks cost).
    """

    period: int
    start: float
    end: float
    budget: float
    total: float
    fraction: float
    handlers: tuple[HandlerUsage, ...] = ()
    over_budget: tuple[str, ...] = ()
    partial: bool = False


class StateSnapshotted(Event, frozen=True, kw_only=True):
    """Callback states were written for a checkpoint (``errors``: key -> why not).

    ``error`` says why nothing was written (a location outside the state
    root, an I/O error); ``path`` is then empty.
    """

    run_id: str
    checkpoint: str
    path: str
    keys: tuple[str, ...] = ()
    errors: dict[str, str] = msgspec.field(default_factory=dict)
    error: str = ""


class EventPlaceholder(Event, frozen=True, kw_only=True):
    """Stands in, in a log, for an event that could not be kept as itself.

    The recorder writes one when it cannot encode an event (a value msgspec
    cannot encode, nesting too deep, a record too large), so one bad value
    never costs the rest of the log; the reader yields one for an intact
    record that does not decode as its type (an unknown type, a mistyped
    field). ``seq`` and ``time`` are the original event's, ``event_type`` its
    type name, ``reason`` why it is a placeholder, ``text`` a bounded,
    readable rendering of what was there. Replays skip placeholders.
    """

    event_type: str
    reason: str
    text: str = ""


class StateRestored(Event, frozen=True, kw_only=True):
    """Callback states were restored.

    ``missing``: saved but no longer live; ``unsaved``: live but never saved.
    """

    run_id: str
    checkpoint: str
    restored: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unsaved: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    #: Classes whose saved and live instance counts differ: ``"Class: N saved, M live"``.
    mismatched: tuple[str, ...] = ()
