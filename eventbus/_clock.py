"""Clocks that drive the bus's timestamps and health-check periods, so tests and replays run
on virtual time. Handler deadlines stay in real seconds: a stuck handler is still cancelled."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import anyio

__all__ = ["Clock", "FastForwardClock", "MonotonicClock", "VirtualClock"]


@runtime_checkable
class Clock(Protocol):
    """What the bus needs of a clock: ``now()`` in seconds, read once per batch,
    and ``sleep_until(deadline)``, awaited only by the bus's period ticker."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class MonotonicClock:
    """Real time: ``time.monotonic`` (the cheapest precise clock in CPython)."""

    now = staticmethod(time.monotonic)

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.monotonic()))


class VirtualClock:
    """Time that moves only when told to (``advance``/``set``); sleepers wake in deadline
    order as it passes their deadlines, so periodic work on it is deterministic."""

    def __init__(self, start: float = 0.0) -> None:
        if not math.isfinite(start):
            raise ValueError(f"a clock cannot start at {start}: not a finite time")
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._counter = 0
        self._listeners: list[Callable[[float], None]] = []

    def add_listener(self, listener: Callable[[float], None]) -> Callable[[], None]:
        """Call ``listener(now)`` synchronously whenever the clock moves (no task switch to
        race against); returns a function that removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def now(self) -> float:
        """The clock's time, in seconds."""
        return self._now

    def set(self, when: float, *, blocked: bool = False) -> None:
        """Move the clock to ``when`` (never backwards) and wake due sleepers. ``blocked=True``:
        time a blocking call let pass, told to listeners only with the next move."""
        if not math.isfinite(when):
            raise ValueError(f"virtual clock cannot be set to {when}: not a finite time")
        if when < self._now:
            raise ValueError(f"virtual clock cannot go back from {self._now} to {when}")
        self._now = when
        if not blocked:
            for listener in self._listeners:
                listener(when)
        sleepers = self._sleepers
        while sleepers and sleepers[0][0] <= when:
            heapq.heappop(sleepers)[2].set()

    def advance(self, seconds: float, *, blocked: bool = False) -> None:
        """Move the clock ``seconds`` ahead (see ``set``)."""
        self.set(self._now + seconds, blocked=blocked)

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the clock is moved to ``deadline`` or past it."""
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        self._counter += 1
        event = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, self._counter, event))
        await event.wait()


class FastForwardClock(VirtualClock):
    """Real time that can jump ahead over idle gaps (``set``/``advance``), never back:
    between jumps a handler's measured cost is its real cost."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._offset = start - time.monotonic()

    def now(self) -> float:
        return time.monotonic() + self._offset

    def set(self, when: float, *, blocked: bool = False) -> None:
        if not math.isfinite(when):
            raise ValueError(f"clock cannot be set to {when}: not a finite time")
        now = self.now()
        if when > now:
            self._offset += when - now
        else:
            when = now
        self._now = when
        super().set(when, blocked=blocked)
