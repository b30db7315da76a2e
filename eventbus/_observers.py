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


class CallObservers:
    """A bus's call observers, shared by its runners. ``min_seconds``: the shortest call
    any wants (infinite: none); ``every_call``: one wants them all."""

    __slots__ = ("_added", "_end_run", "_entries", "every_call", "min_seconds")

    def __init__(self, end_run: Callable[[BaseException], None]) -> None:
        self._end_run = end_run
        #: Each observer and the shortest call it wants shown, by the order it came in.
        self._entries: dict[int, tuple[CallObserver, float]] = {}
        self._added = 0
        self.min_seconds = math.inf
        self.every_call = False

    def add(self, observer: CallObserver, min_seconds: float) -> Callable[[], None]:
        """Show ``observer`` the calls of at least ``min_seconds``; returns its remover."""
        key = self._added = self._added + 1
        self._entries[key] = (observer, min_seconds)
        self._update()
        return lambda: self._remove(key)

    def _remove(self, key: int) -> None:
        if self._entries.pop(key, None) is not None:
            self._update()

    def _update(self) -> None:
        self.min_seconds = min((wanted for _, wanted in self._entries.values()), default=math.inf)
        self.every_call = self.min_seconds <= 0

    def notify(self, calls: list[HandlerCall]) -> None:
        """Show each observer the calls of ``calls`` it asked for."""
        least = self.min_seconds
        for key, (observer, wanted) in tuple(self._entries.items()):
            shown = (
                calls
                if wanted <= least
                else [c for c in calls if c.outcome != "ok" or c.elapsed >= wanted]
            )
            if not shown:
                continue
            try:
                observer(shown)
            except BaseException as exc:
                if isinstance(exc, FATAL):
                    self._end_run(exc)
                    continue
                _log.error(
                    "call observer failed and was removed",
                    observer=repr(observer),
                    error=describe(exc),
                )
                self._remove(key)
