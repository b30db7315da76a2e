"""Lanes: a handler's own task and bounded FIFO, so a slow handler delays only itself. A
lane knows nothing of the bus: what it must tell others comes in as callables."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import anyio

from ._events import Event
from ._runners import Runner
from ._subscription import Subscription
from ._tasks import event_maker

__all__ = ["MAX_BATCH", "Lane"]

#: At most this many events are handed to a handler as one batch.
MAX_BATCH = 1024


class Lane:
    """One lane-mode subscription's queue and the task that empties it."""

    __slots__ = (
        "_closed",
        "_ended",
        "_idle",
        "_room",
        "_runner",
        "_sleeping",
        "_sub",
        "_took",
        "_wake",
        "capacity",
        "queue",
    )

    def __init__(
        self,
        sub: Subscription,
        runner: Runner,
        capacity: int,
        *,
        took: Callable[[int], None],
        idle: Callable[[], None],
        ended: Callable[[Subscription], None],
    ) -> None:
        self._sub = sub
        self._runner = runner
        self.capacity = capacity
        self.queue: deque[Event] = deque()
        self._took = took
        self._idle = idle
        self._ended = ended
        self._wake = anyio.Event()
        self._room: anyio.Event | None = None
        self._sleeping = False
        self._closed = False

    @property
    def queued(self) -> int:
        """Deliveries not made yet: waiting in the queue, or in the batch being run."""
        return len(self.queue) + self._runner.pending

    async def put(self, events: list[Event]) -> None:
        """Queue ``events``, waiting for room; the dispatcher is told of each one as
        it enters the queue, so a close counts it exactly once."""
        queue = self.queue
        while len(queue) + len(events) > self.capacity:
            room = self.capacity - len(queue)
            if room > 0:
                queue.extend(events[:room])
                self._took(room)
                events = events[room:]
                self._wake_up()
            self._room = anyio.Event()
            await self._room.wait()
        queue.extend(events)
        self._took(len(events))
        self._wake_up()

    def close(self) -> None:
        """The subscription was cancelled: end the task once the queue is empty
        (what is left in it is skipped, as the runner sees the subscription inactive)."""
        self._closed = True
        self._wake_up()

    def _wake_up(self) -> None:
        if self._sleeping:
            self._sleeping = False
            self._wake.set()

    async def run(self) -> None:
        """The lane's task: run the queued events in batches, in order; end once the
        subscription is cancelled and the queue is empty."""
        queue = self.queue
        run = self._runner.run
        sub = self._sub
        new_event = event_maker()
        while True:
            if not queue:
                if self._closed:
                    self._runner.close()
                    self._ended(sub)
                    return
                self._sleeping = True
                self._wake = new_event()
                self._idle()
                await self._wake.wait()
                continue
            n = min(len(queue), MAX_BATCH)
            if sub.over_budget != "warn" and sub.state == "normal" and sub.counters.timed_per_call:
                # A policy can act on what is queued: a handler that is not cheap takes
                # one event at a time, so its time is charged as it goes and a period
                # that made it over budget coalesces or skips the rest of the backlog
                # (one long batch was charged at its end, and delivered in full).
                n = 1
            batch = [queue.popleft() for _ in range(n)]
            if self._room is not None:
                self._room.set()
                self._room = None
            pending = run(sub, batch)
            if pending is not None:
                await pending
