"""A bus stepped in the trainer's own thread, at its hooks: no second thread to take the GIL
(docs/performance.md). A call never spans two hooks, so a callback is charged only the time
it ran. asyncio only: trio's loop cannot be run a step at a time from outside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from eventbus import Event, EventBus
from eventbus._bus import CloseReport
from eventbus._logging import get_logger
from eventbus._subscription import Subscription

from ._bus_host import STOP, BusHost

__all__ = ["SteppedBus", "loop_running_here"]

_log = get_logger("adapters.stepped_bus")

#: How long a bus abandoned at close gets to cancel its tasks (seconds).
_CANCEL_GRACE = 1.0


def loop_running_here() -> bool:
    """Whether an event loop already runs in this thread (a notebook's, an async app's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class SteppedBus(BusHost):
    """An ``EventBus`` whose loop runs in the caller's thread, a step at a time (arguments:
    ``BusHost``'s)."""

    io_in_threads = False  # a hook that steps the bus wakes no thread

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.backend != "asyncio":
            raise ValueError(
                f"{self.name}: a bus stepped at the trainer's hooks runs on asyncio, not "
                f"{self.backend}; use bus_runs='in_thread' for trio"
            )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[bool] | None = None
        #: How the step under way ended: None while it runs, True idle, False its limit.
        self._step_idle: bool | None = None
        self._stepping = False
        self._next_look = 0.0  # when a hook's poll next steps the bus
        self._next_take = 0.0  # when a hook's poll next steps it for its own hand-off
        #: Since when what is in the deque waits for a step (None: nothing waits).
        self._waiting_since: float | None = None

    # --- lifecycle (the trainer's thread) -------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Make the loop and run it until the bus accepts events."""
        if self._loop is not None:
            raise RuntimeError(f"{self.name}: already started")
        if loop_running_here():
            raise RuntimeError(
                f"{self.name}: an event loop already runs in this thread (a notebook's?), "
                "so the bus cannot be stepped in it; use bus_runs='in_thread'"
            )
        # asyncio's own selector loop, named: not whatever a policy would make (uvloop).
        loop = self._loop = asyncio.SelectorEventLoop()
        task = self._main_task = loop.create_task(self._main())
        task.add_done_callback(self._main_done)
        self._wait(timeout)
        if self._error is not None:
            self._shut_loop()
            raise RuntimeError(f"{self.name}: the bus failed to start") from self._error
        if not self.running:
            raise TimeoutError(f"{self.name}: the bus did not start within {timeout}s")

    def close(self, final: Iterable[Event] = (), *, timeout: float = 30.0) -> CloseReport | None:
        """Hand off ``final`` events, drain the bus, close the loop; None if abandoned."""
        task = self._main_task
        if task is None or self._loop is None or self._loop.is_closed():
            return self.close_report
        if self._stepping:  # a callback ends the run from inside a step: not from here
            _log.warning("bus closed from inside its own step: left open", thread=self.name)
            return None
        if not task.done():
            self._open = self.running = False
            self._queue.extend(final)  # past the capacity on purpose: these must not drop
            self._queue.append(STOP)
            self._wait(timeout)
        abandoned = not task.done()
        if abandoned:
            _log.warning(
                "bus still busy at close; abandoned",
                thread=self.name,
                timeout=timeout,
                queued=len(self._queue),
            )
        self._shut_loop()
        if self.dropped:
            _log.warning("events dropped at the hand-off", thread=self.name, dropped=self.dropped)
        return None if abandoned else self.close_report

    def _shut_loop(self) -> None:
        """Cancel what is left (an abandoned bus's tasks) and close the loop."""
        loop = self._loop
        assert loop is not None
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left, timeout=_CANCEL_GRACE))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    # --- steps (the trainer's thread) ------------------------------------------------

    def poll(self, handed_off: bool = False) -> None:
        """A hook's chance to step the bus: at most once per poll interval for hooks that
        hand off reports; others only for what waited a whole interval, or for timers."""
        now = time.monotonic()
        waiting = self._waiting_since
        if waiting is None and self._queue:
            waiting = self._waiting_since = now
        if handed_off:
            due = self._next_take
        elif waiting is not None:
            due = waiting + self.poll_interval
        else:
            due = self._next_look
        if now >= due:
            self._step(takes=handed_off)

    def handoff_after_idle(self, event: Event) -> bool:
        """Like ``BusHost``'s, stepped now: a checkpoint's states are taken in its hook."""
        accepted = super().handoff_after_idle(event)
        self._step()
        return accepted

    def wait_idle(
        self, timeout: float = 30.0, *, lanes: tuple[Subscription, ...] | None = None
    ) -> bool:
        """Run the bus until everything handed off was handled, lanes included (True), or
        ``timeout`` passed (False)."""
        task = self._main_task
        if task is None or task.done():
            return True
        return self._wait(timeout)

    def _make_room(self) -> bool:
        """A full deque: step the bus, so it takes what it holds."""
        self._step()
        return len(self._queue) < self.capacity

    def _step(self, limit: float | None = None, *, takes: bool = False) -> bool:
        """Run the loop until the bus handled what the deque holds (True) or ``limit``
        seconds passed (default ``handoff_timeout``; False)."""
        return self._wait(self.handoff_timeout if limit is None else limit, takes=takes)

    def _wait(self, limit: float, *, takes: bool = True) -> bool:
        """Run the loop until the bus handled everything or ended (True), or ``limit``
        seconds passed (False); never stopped mid-call, so the watchdog holds deadlines."""
        loop, task = self._loop, self._main_task
        if self._stepping or loop is None or task is None or task.done():
            return task is not None and task.done()
        self.wakeups += 1
        self._step_idle = None
        self._wake_pump()
        timer = loop.call_later(limit, self._end_step, False)
        self._stepping = True
        try:
            loop.run_forever()
        finally:
            self._stepping = False
            timer.cancel()
            self._next_look = time.monotonic() + self.poll_interval
            if takes:
                self._next_take = self._next_look
            if not self._queue:
                self._waiting_since = None
        return bool(self._step_idle)

    def _end_step(self, idle: bool) -> None:
        """End the step under way (never outside one: it would end the next at once)."""
        loop = self._loop
        if self._stepping and self._step_idle is None and loop is not None:
            self._step_idle = idle
            loop.stop()

    def _wake_pump(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(True)

    # --- the bus's loop ------------------------------------------------------------------

    def _main_done(self, task: asyncio.Task[None]) -> None:
        self._ended(None if task.cancelled() else task.exception())
        self._end_step(True)

    async def _pump(self, bus: EventBus) -> None:
        """At each step: publish what the deque holds, wait until handled, sleep."""
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            while queue:
                item = self._in_hand = queue.popleft()
                if not await self._deliver(bus, item):
                    return
            self._in_hand = None
            await bus.wait_idle()  # lanes included: no call is left under way
            if queue:  # more came meanwhile
                continue
            self._end_step(True)
            self._wake = loop.create_future()
            await self._wake
