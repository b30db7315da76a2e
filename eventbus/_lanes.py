"""Runners besides the dispatcher: lanes, and the guards the watchdog reads.

A lane gives one handler its own task and bounded FIFO, so a slow handler
delays only itself; a guard tells the bus's single watchdog what a runner is
awaiting, so no cancel scope is needed per call.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._events import Event
    from ._subscription import Subscription

__all__ = ["MAX_BATCH", "Guard", "Lane"]

#: At most this many events are handed to a handler as one batch.
MAX_BATCH = 1024


class Guard:
    """What one runner (the dispatcher or a lane) is awaiting, for the watchdog."""

    __slots__ = ("pending", "progress", "scope", "seen_at", "seen_progress", "seen_scope", "sub")

    def __init__(self) -> None:
        self.sub: Subscription | None = None
        self.scope: anyio.CancelScope | None = None
        self.progress = 0
        #: Events of the batch being run that are neither handled nor skipped yet.
        self.pending = 0
        self.seen_scope: anyio.CancelScope | None = None
        self.seen_progress = -1
        self.seen_at = 0.0


class Lane:
    """A handler's own task and bounded FIFO: a slow handler delays only itself."""

    __slots__ = ("bus", "capacity", "guard", "queue", "room", "sleeping", "sub", "wake")

    def __init__(self, bus: EventBus, sub: Subscription, capacity: int) -> None:
        self.bus = bus
        self.sub = sub
        self.capacity = capacity
        self.queue: deque[Event] = deque()
        self.wake = anyio.Event()
        self.room: anyio.Event | None = None
        self.sleeping = False
        self.guard = Guard()
        bus._guards.append(self.guard)

    @property
    def queued(self) -> int:
        return len(self.queue) + self.guard.pending

    async def put(self, events: list[Event]) -> None:
        """Queue ``events``, waiting for room; each one leaves the dispatcher's
        hands as it enters the queue, so a close counts it exactly once."""
        queue = self.queue
        while len(queue) + len(events) > self.capacity:
            room = self.capacity - len(queue)
            if room > 0:
                queue.extend(events[:room])
                self.bus._in_hand -= room
                events = events[room:]
                self._wake()
            self.room = anyio.Event()
            await self.room.wait()
        queue.extend(events)
        self.bus._in_hand -= len(events)
        self._wake()

    def _wake(self) -> None:
        if self.sleeping:
            self.sleeping = False
            self.wake.set()

    async def run(self) -> None:
        queue = self.queue
        bus = self.bus
        while True:
            if not queue:
                if not self.sub.active:
                    bus._guards.remove(self.guard)
                    return
                self.sleeping = True
                self.wake = anyio.Event()
                bus._maybe_idle()
                await self.wake.wait()
                continue
            n = min(len(queue), MAX_BATCH)
            batch = [queue.popleft() for _ in range(n)]
            if self.room is not None:
                self.room.set()
                self.room = None
            await bus._run(self.sub, batch, self.guard)
