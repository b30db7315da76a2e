"""Clocks that drive timestamps, deadlines and health-check periods.

The bus never calls ``time`` directly: it is given a clock, so tests and
replays run on virtual time, instantly and deterministically, as
``trio.testing.MockClock`` does for trio.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["Clock", "MonotonicClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """``now`` is read on the hot path; ``sleep_until`` only by background tasks."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    """Real time: ``time.monotonic`` (the cheapest precise clock in CPython)."""

    now = staticmethod(time.monotonic)

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


class VirtualClock:
    """Time that moves only when told to: ``advance``/``set``.

    Sleepers wake, in deadline order, as soon as the clock passes their
    deadline, so periodic work driven by this clock is deterministic.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._counter = 0
        self._listeners: list[Callable[[float], None]] = []

    def add_listener(self, listener: Callable[[float], None]) -> Callable[[], None]:
        """Call ``listener(now)`` synchronously whenever the clock moves.

        A bus listens to end its health-check periods at the exact moment
        virtual time passes them, with no task switch to race against.
        Returns a function that removes the listener.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def now(self) -> float:
        return self._now

    def set(self, when: float) -> None:
        """Move the clock to ``when`` (never backwards) and wake due sleepers."""
        if when < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {when}")
        self._now = when
        for listener in list(self._listeners):
            listener(when)
        due = [s for s in self._sleepers if s[0] <= when]
        if due:
            self._sleepers = [s for s in self._sleepers if s[0] > when]
            for _, _, event in sorted(due, key=lambda s: (s[0], s[1])):
                event.set()

    def advance(self, seconds: float) -> None:
        self.set(self._now + seconds)

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        self._counter += 1
        event = anyio.Event()
        self._sleepers.append((deadline, self._counter, event))
        await event.wait()
