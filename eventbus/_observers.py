"""Observers of handler calls (``EventBus.observe_calls``): how long each call took, which a
tap of batches cannot see. Free while nobody observes (``min_seconds`` is then infinite)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import msgspec

from ._events import Event
from ._faults import FATAL
from ._logging import get_logger
from ._subscription import Subscription
from ._text import describe

__all__ = ["CallObserver", "CallObservers", "CallOutcome", "HandlerCall", "noted"]

_log = get_logger("eventbus")

#: What became of a call; past its deadline as ``HandlerTimedOut.outcome`` says.
CallOutcome = Literal["ok", "error", "cancelled", "abandoned", "overrun"]


class HandlerCall(msgspec.Struct, frozen=True, kw_only=True):
    """One handler call shown to a call observer (``EventBus.observe_calls``).

    Attributes:
        handler: The handler's name (``subscribe(name=...)``).
        event: The event it was called with (for a batch, its last).
        elapsed: Seconds the call took, on the bus's clock.
        end: When it ended, on the bus's clock (``EventBus.clock``).
        outcome: ``"ok"``, ``"error"`` (it raised ``error``), or past its deadline:
            ``"cancelled"``, ``"abandoned"`` or ``"overrun"`` (as ``HandlerTimedOut``).
        error: What it raised, for ``"error"``.
        calls: 1, or for a handler timed by the batch, the calls ``elapsed`` covers.
    """

    handler: str
    event: Event
    elapsed: float
    end: float
    outcome: CallOutcome = "ok"
    error: BaseException | None = None
    calls: int = 1


#: Shown the calls of one batch it asked for, in order.
CallObserver = Callable[[list[HandlerCall]], None]


def noted(
    notes: list[HandlerCall] | None,
    sub: Subscription,
    event: Event,
    elapsed: float,
    end: float,
    *,
    outcome: CallOutcome = "ok",
    error: BaseException | None = None,
    calls: int = 1,
) -> list[HandlerCall]:
    """``notes`` (a new list if ``None``) with the call added, for one observed batch."""
    call = HandlerCall(
        handler=sub.name,
        event=event,
        elapsed=elapsed,
        end=end,
        outcome=outcome,
        error=error,
        calls=calls,
    )
    if notes is None:
        return [call]
    notes.append(call)
    return notes


class _Entry:
    """One observer and the shortest call it wants shown (compared by identity)."""

    __slots__ = ("min_seconds", "observer")

    def __init__(self, observer: CallObserver, min_seconds: float) -> None:
        self.observer = observer
        self.min_seconds = min_seconds


class CallObservers:
    """A bus's call observers, shared by its runners. ``min_seconds``: the shortest call
    any wants (infinite: none); ``every_call``: one wants them all."""

    __slots__ = ("_end_run", "_entries", "every_call", "min_seconds")

    def __init__(self, end_run: Callable[[BaseException], None]) -> None:
        self._end_run = end_run
        self._entries: list[_Entry] = []
        self.min_seconds = math.inf
        self.every_call = False

    def add(self, observer: CallObserver, min_seconds: float) -> Callable[[], None]:
        """Show ``observer`` the calls of at least ``min_seconds``; returns its remover."""
        entry = _Entry(observer, min_seconds)
        self._entries.append(entry)
        self._update()
        return lambda: self._remove(entry)

    def _remove(self, entry: _Entry) -> None:
        if entry in self._entries:
            self._entries.remove(entry)
            self._update()

    def _update(self) -> None:
        self.min_seconds = min((e.min_seconds for e in self._entries), default=math.inf)
        self.every_call = self.min_seconds <= 0

    def notify(self, calls: list[HandlerCall]) -> None:
        """Show each observer the calls of ``calls`` it asked for."""
        least = self.min_seconds
        for entry in tuple(self._entries):
            wanted = entry.min_seconds
            shown = (
                calls
                if wanted <= least
                else [c for c in calls if c.outcome != "ok" or c.elapsed >= wanted]
            )
            if not shown:
                continue
            try:
                entry.observer(shown)
            except BaseException as exc:
                if isinstance(exc, FATAL):
                    self._end_run(exc)
                    continue
                _log.error(
                    "call observer failed and was removed",
                    observer=repr(entry.observer),
                    error=describe(exc),
                )
                self._remove(entry)
