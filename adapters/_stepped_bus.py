"""A bus stepped in the trainer's own thread, at its hooks: no second thread.

A bus in a thread of its own takes the GIL from the trainer at each look: on a
real Hugging Face Trainer (``benchmarks/bench_trainer_overhead.py``) a tiny
model lost 15-20% of its steps per second that way, the training thread
blocking four times a step, while our callbacks' own work was about 30 us a
step. Stepped, the bus's asyncio loop runs only inside the trainer's hooks: a
hook appends to the deque, and ``poll`` (at most once per ``poll_interval``)
or a checkpoint runs the loop for as long as it has something ready to run
(at most ``STEP_LIMIT``): the bus takes what was handed off and its handlers
run, in the trainer's thread, as the framework's own callbacks do. What the
bus waits for (an async callback's I/O, a ``blocking`` handler's worker
thread, a sleep) is not waited for: it goes on at the next steps, and a deadline that
passed is enforced at the next step. ``wait_idle`` and the run's end do wait,
for everything.

A sync callback that hangs hangs the trainer, as a framework callback would:
run such callbacks with ``blocking = True`` or ``bus_runs="in_thread"``.
asyncio only: trio's loop cannot be run a step at a time from outside it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from eventbus import CloseReport, Event, EventBus, get_logger

from ._bus_host import STOP, BusHost

__all__ = ["STEP_LIMIT", "SteppedBus", "loop_running_here"]

_log = get_logger("adapters.stepped_bus")

#: The longest a hook runs the bus's ready work (seconds of its loop's clock), so a
#: handler that never stops yielding cannot hold the trainer; the rest goes on at the
#: next step. A sync callback is not cut short: it runs to its end.
STEP_LIMIT = 0.1
#: How long a bus abandoned at close gets to cancel its tasks (seconds).
_CANCEL_GRACE = 1.0


def loop_running_here() -> bool:
    """Whether an event loop already runs in this thread (a notebook's, an async app's)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class _SteppedLoop(asyncio.SelectorEventLoop):
    """asyncio's own loop, which can also say whether it has work ready to run now."""

    def runnable(self) -> bool:
        # CPython's BaseEventLoop keeps the callbacks of its next iteration in _ready.
        return bool(self._ready)  # type: ignore[attr-defined]


def _settle(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


class SteppedBus(BusHost):
    """An ``EventBus`` whose loop runs in the caller's thread, a step at a time (see the
    module docstring; ``BusHost`` for the arguments). ``setup`` runs at ``start``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.backend != "asyncio":
            raise ValueError(
                f"{self.name}: a bus stepped at the trainer's hooks runs on asyncio, not "
                f"{self.backend}; use bus_runs='in_thread' for trio"
            )
        self._loop: _SteppedLoop | None = None
        self._main_task: asyncio.Task[None] | None = None
        self._wake: asyncio.Future[bool] | None = None
        self._step_done: asyncio.Future[bool] | None = None
        self._stepping = False
        self._lanes_too = False  # whether this step waits for the lanes as well
        self._idle = False  # the pump waits for the next step, everything before handled
        self._steps = 0  # steps so far: a stale check of quiet() knows it is stale
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
        loop = self._loop = _SteppedLoop()
        task = self._main_task = loop.create_task(self._main())
        task.add_done_callback(self._main_done)
        self._wait(timeout)
        if self._error is not None:
            self._shut_loop()
            raise RuntimeError(f"{self.name}: the bus failed to start") from self._error
        if not self.running:
            raise TimeoutError(f"{self.name}: the bus did not start within {timeout}s")

    def close(self, final: Iterable[Event] = (), *, timeout: float = 30.0) -> CloseReport | None:
        """Hand off ``final`` events, drain the bus, close the loop; None if the bus had
        to be abandoned (still busy after ``timeout``) or never ran."""
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
        """A hook's chance to step the bus: at most once per poll interval for the hooks
        that hand off reports (``handed_off``), and for the others only for what those
        left behind a whole interval ago, or, with nothing handed off, for its timers.

        So a step another hook takes never holds a report back: when a step's end took
        what came before it and reset the one clock, each report waited for the next
        step's end, step after step, once one had (a stop a step late, for the run)."""
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
        """Like ``BusHost``'s, and stepped now: a checkpoint's states are taken in the
        hook that saved it (unless the bus still waits for what came before)."""
        accepted = super().handoff_after_idle(event)
        self._step()
        return accepted

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Run the bus until everything handed off was handled, lanes included (True),
        or ``timeout`` passed (False)."""
        task = self._main_task
        if task is None or task.done():
            return True
        return self._wait(timeout, lanes_too=True)

    def _make_room(self) -> bool:
        """A full deque: step the bus, so it takes what it holds."""
        self._step(self.handoff_timeout)
        return len(self._queue) < self.capacity

    def _step(self, limit: float = STEP_LIMIT, *, takes: bool = False) -> bool:
        """Run the loop while it has work ready (at most ``limit`` seconds), so the pump
        takes the deque and the handlers run; never wait. True if the bus is idle.
        ``takes``: a hook's hand-off asked for it (its clock, see ``poll``)."""
        loop, task = self._loop, self._main_task
        if self._stepping or loop is None or task is None or task.done():
            return task is not None and task.done()
        self.wakeups += 1
        self._steps += 1
        step = self._steps

        def quiet() -> None:
            if self._steps != step:  # left over from a step that ended by its limit
                return
            if loop.runnable():
                loop.call_soon(quiet)
            else:
                loop.stop()

        self._wake_pump()
        loop.call_soon(quiet)
        timer = loop.call_later(limit, loop.stop)
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
        return self._idle and not self._queue

    def _wait(self, limit: float, *, lanes_too: bool = False) -> bool:
        """Run the loop until the bus handled everything (True), the bus ended (True), or
        ``limit`` seconds passed (False): waits for what the bus waits for."""
        loop, task = self._loop, self._main_task
        if self._stepping or loop is None or task is None or task.done():
            return task is not None and task.done()
        self.wakeups += 1
        done = self._step_done = loop.create_future()
        self._lanes_too = lanes_too
        self._wake_pump()
        timer = loop.call_later(limit, _settle, done, False)
        self._stepping = True
        try:
            loop.run_until_complete(done)
        finally:
            self._stepping = False
            self._step_done = None
            self._lanes_too = False
            timer.cancel()
            self._next_look = self._next_take = time.monotonic() + self.poll_interval
            if not self._queue:
                self._waiting_since = None
        return bool(done.result())

    def _wake_pump(self) -> None:
        wake = self._wake
        if wake is not None:
            _settle(wake, True)

    # --- the bus's loop ------------------------------------------------------------------

    def _main_done(self, task: asyncio.Task[None]) -> None:
        self._ended(None if task.cancelled() else task.exception())
        if self._step_done is not None:
            _settle(self._step_done, True)

    async def _pump(self, bus: EventBus) -> None:
        """At each step: publish what the deque holds, wait for the bus, say so, sleep."""
        queue = self._queue
        loop = asyncio.get_running_loop()
        while True:
            while queue:
                item = self._in_hand = queue.popleft()
                if not await self._deliver(bus, item):
                    return
            self._in_hand = None
            lanes_too = self._lanes_too
            await bus.wait_idle(lanes=None if lanes_too else ())
            if queue or (self._lanes_too and not lanes_too):  # more came, or more is asked
                continue
            if self._step_done is not None:
                _settle(self._step_done, True)
            self._wake = loop.create_future()
            self._idle = True
            await self._wake
            self._idle = False
