"""A bus in its own thread, fed from the trainer's thread through a bounded hand-off.

For a trainer that must never wait for our callbacks (Ray's controller loop, a trio bus).
The thread polls the deque rather than be woken, which would cost the trainer a syscall
mid-hook; each look takes the GIL (``adapters._stepped_bus`` avoids that).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio

from eventbus import Event, EventBus
from eventbus._bus import CloseReport
from eventbus._logging import get_logger
from eventbus._subscription import Subscription

from ._bus_host import STOP, BusHost, DeferredEvent, kind_of

__all__ = [
    "IDLE_POLL_INTERVAL",
    "BusThread",
    "DeferredEvent",
    "kind_of",
]

_log = get_logger("adapters.bus_thread")

#: How seldom an idle bus thread looks (each empty look doubles the pause, up to this).
IDLE_POLL_INTERVAL = 0.1


class _Barrier:
    """Set ``done`` once everything handed off before it was handled (of the lane
    handlers, only by ``lanes``, when given)."""

    __slots__ = ("done", "lanes")

    def __init__(self, lanes: tuple[Subscription, ...] | None) -> None:
        self.done = threading.Event()
        self.lanes = lanes


class BusThread(BusHost):
    """An ``EventBus`` running in a daemon thread; ``handoff`` feeds it from another thread
    (see ``BusHost`` for the arguments). ``setup`` runs in the bus's thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sleeping = False
        self._wake: anyio.Event | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        self._room = threading.Event()
        self._want_room = False
        self._stalled = False
        self._ready = threading.Event()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle (any thread) ---------------------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start the thread and wait until the bus accepts events."""
        if self._thread is not None:
            raise RuntimeError(f"{self.name}: already started")
        self._thread = threading.Thread(target=self._thread_main, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"{self.name}: the bus thread did not start within {timeout}s")
        if self._error is not None:
            raise RuntimeError(f"{self.name}: the bus failed to start") from self._error

    def close(self, final: Iterable[Event] = (), *, timeout: float = 30.0) -> CloseReport | None:
        """Hand off ``final`` events, drain the bus, stop the thread; None if abandoned."""
        if self._thread is None:
            return None
        if not self._done.is_set():
            self._open = self.running = False
            # Past the capacity on purpose: these few must not be dropped.
            self._queue.extend(final)
            self._queue.append(STOP)
            self._wake_pump()
            if not self._done.wait(timeout):
                _log.warning(
                    "bus thread still busy at close; abandoned",
                    thread=self.name,
                    timeout=timeout,
                    queued=len(self._queue),
                )
                return None
        if self.dropped:
            _log.warning("events dropped at the hand-off", thread=self.name, dropped=self.dropped)
        return self.close_report

    # --- hand-off (the caller's thread) -------------------------------------------

    def wait_idle(
        self, timeout: float = 30.0, *, lanes: tuple[Subscription, ...] | None = None
    ) -> bool:
        """Block until nothing handed off so far is pending; False on timeout. Wakes the bus
        at once: its caller is waiting."""
        if self._thread is None:
            return True
        if not self.running:
            return self._done.wait(timeout)
        barrier = _Barrier(lanes)
        self._queue.append(barrier)
        if self._done.is_set():  # ended meanwhile; its last look at the queue may have missed us
            return True
        self._wake_pump()
        return barrier.done.wait(timeout)

    def _wake_pump(self) -> None:
        if self._sleeping and not self._done.is_set():
            self._sleeping = False
            call_soon = self._call_soon
            assert call_soon is not None
            # The loop may have closed meanwhile (RuntimeError): nothing left to wake.
            with contextlib.suppress(RuntimeError):
                call_soon(self._wake_in_loop)

    def _make_room(self) -> bool:
        """Wait for the bus's next look to make room (it is not woken)."""
        queue = self._queue
        if self._stalled:
            if len(queue) < self.capacity:
                self._stalled = False
                return True
            return False
        deadline = time.monotonic() + self.handoff_timeout
        while len(queue) >= self.capacity:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._done.is_set():
                self._stalled = True
                return False
            self._room.clear()
            self._want_room = True
            if len(queue) < self.capacity:  # made room before it saw the request
                break
            self._room.wait(remaining)
        return True

    # --- the bus's thread ------------------------------------------------------------

    def _thread_main(self) -> None:
        failed: BaseException | None = None
        try:
            anyio.run(self._main, backend=self.backend)
        except BaseException as exc:
            failed = exc
        finally:
            self._ended(failed)
            self._done.set()
            self._ready.set()
            self._room.set()
            for item in [self._in_hand, *self._queue]:  # nothing left to wait for
                if type(item) is _Barrier:
                    item.done.set()

    def _started(self) -> None:
        try:  # the running loop's non-waiting, thread-safe "call this soon"
            self._call_soon = asyncio.get_running_loop().call_soon_threadsafe
        except RuntimeError:  # not asyncio: the only other anyio backend is trio
            import trio  # a test extra: needed only on trio

            self._call_soon = trio.lowlevel.current_trio_token().run_sync_soon
        self._ready.set()

    def _wake_in_loop(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _room_made(self) -> None:
        if self._want_room:
            self._want_room = False
            self._room.set()

    async def _control(self, bus: EventBus, item: object) -> bool:
        if type(item) is _Barrier:
            await bus.wait_idle(lanes=item.lanes)
            item.done.set()
            return True
        return False

    async def _pump(self, bus: EventBus) -> None:
        """Drain the deque, then sleep until one poll interval after the last wake-up."""
        queue = self._queue
        interval = self.poll_interval
        clock = time.monotonic
        woke = clock()
        wake = self._wake = anyio.Event()
        pause = interval  # doubles while wake-ups find nothing, up to IDLE_POLL_INTERVAL
        while True:
            if not queue:
                delay = woke + pause - clock()
                if delay <= 0:  # the drain outlasted the interval: a full one from now
                    delay = pause
                if wake.is_set():  # an Event cannot be cleared; one not set is reused
                    wake = self._wake = anyio.Event()
                self._sleeping = True
                if not queue:  # checked after announcing sleep: a wake-up now is not lost
                    with anyio.move_on_after(delay):
                        await wake.wait()
                    woke = clock()
                    self.wakeups += 1
                    pause = interval if queue else min(2 * pause, IDLE_POLL_INTERVAL)
                self._sleeping = False
                continue
            item = self._in_hand = queue.popleft()
            if not await self._deliver(bus, item):
                return
