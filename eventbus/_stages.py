"""Where each kind of handler runs among those of one event (``order``), named in one place
instead of as numbers across modules. A user's handler defaults to ``CALLBACKS`` (0)."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["Stage"]

_STEP = 1_000_000


class Stage(IntEnum):
    """``EventBus.subscribe(..., order=Stage.X)``; lower stages see an event first."""

    #: The event log's own handlers (fsync at a checkpoint, flush at a period's
    #: end), and other recorders of the run (``adapters.otel``'s round spans): what
    #: the callbacks of an event do next cannot cost it its record.
    RECORD = -4 * _STEP
    #: Failures of a period are gathered before the run's end is (``after_exception``
    #: comes before ``after_run``).
    GATHER_FAILURES = -3 * _STEP
    #: The run's start and end, and its context, which every gathered event carries.
    LIFECYCLE = -2 * _STEP
    #: Reports gathered into rounds; a round's checkpoint tracked.
    GATHER_REPORTS = -1 * _STEP
    #: Callbacks and plain handlers: the default.
    CALLBACKS = 0
    #: The state store snapshots callbacks once all of them have seen the checkpoint.
    SNAPSHOT = _STEP
    #: An adapter hands the snapshot to its framework (Hugging Face's ``trainer_state.json``).
    HANDOFF = 2 * _STEP
    #: Observers of everything above (a bench's or a replay's accounting).
    OBSERVE = 3 * _STEP
