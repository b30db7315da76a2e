"""A bus in its own thread, fed from another thread through a bounded hand-off.

Trainers call their callbacks synchronously: Hugging Face's Trainer on its
training thread, Ray Train on its controller's event loop. Neither may wait
for our callbacks. So the bus and our handlers run in a daemon thread with
their own event loop, and the caller only appends the event to a deque.

No wake-up per event. The pump on the bus's side looks at the deque every
``poll_interval`` seconds (10 ms by default) and is woken at once only when
the deque is half full, or for control items (close, wait-idle, a
checkpoint). Waking a sleeping loop from another thread costs a syscall, and
the woken thread then takes the GIL from the trainer's thread in the middle
of its hook: measured here (``benchmarks/bench_hf_handoff.py``), a wake per
event made one ``on_log`` cost 20-50 us, an append alone about 1 us. The
price is a delivery delay of up to ``poll_interval``, small beside a
training step, and about a hundred idle wake-ups a second in the bus thread.
``BlockingPortal.call`` would cost hundreds of microseconds: it waits for the
loop to run the call and reply.

Bounded and never silent: the deque holds ``capacity`` events. When it is
full the caller waits up to ``handoff_timeout`` for room; then the event is
dropped, counted in ``dropped`` and a warning says how many so far. While the
bus stays stuck, further events are dropped (and counted) at once instead of
each waiting again, so a stuck callback costs the trainer one wait, not one
per event.

A daemon thread of our own rather than ``start_blocking_portal``: leaving the
portal joins its thread, so a callback stuck forever in a plain sync call
would hang the trainer's process. Here ``close`` waits up to its deadline,
then abandons the thread and says so.

A callback that fails the run (``on_error="raise"``, or ``KeyboardInterrupt``
or ``SystemExit`` raised in it) does so in the bus's thread, where nothing
can stop the trainer. The bus is told to go on (its ``on_failure``), so that
the run's end can still be delivered, and the failure is kept (``failure``)
for the trainer's thread: ``adapters._threaded_run`` raises it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

import anyio

from eventbus import BusClosed, CloseReport, Event, EventBus, describe_exception, get_logger
from eventbus.log import LogRecorder

__all__ = ["Backend", "BusThread"]

_log = get_logger("adapters.bus_thread")

Backend = Literal["asyncio", "trio"]


class _AfterIdle:
    """Publish ``event`` only once everything handed off before it was handled."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


class _Barrier:
    """Set ``done`` once everything handed off before it was handled."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class _Stop:
    __slots__ = ()


_STOP = _Stop()


class BusThread:
    """An ``EventBus`` running in a daemon thread; ``handoff`` feeds it from another thread.

    One producer thread at a time (a trainer's hooks come from one thread):
    the deque is thread-safe, the figures are not meant for several.

    ``setup(bus)`` runs in the bus's thread before the bus starts (subscribe
    handlers there); its return value is ``setup_result``. ``log``: record the
    bus's events to this file (closed, so flushed, when the bus closes).
    ``poll_interval``: how long a handed-off event may wait before the bus
    thread looks (see the module docstring). ``bus_options`` go to ``EventBus``.
    """

    def __init__(
        self,
        setup: Callable[[EventBus], Any],
        *,
        log: Path | None = None,
        run_id: str = "",
        name: str = "eventbus",
        capacity: int = 1024,
        handoff_timeout: float = 5.0,
        backend: Backend = "asyncio",
        poll_interval: float = 0.01,
        **bus_options: Any,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        if poll_interval <= 0:
            raise ValueError(f"poll_interval must be positive, got {poll_interval}")
        if handoff_timeout < 0:
            raise ValueError(f"handoff_timeout must not be negative, got {handoff_timeout}")
        self.capacity = capacity
        self.handoff_timeout = handoff_timeout
        self.poll_interval = poll_interval
        self._high_water = max(1, capacity // 2)
        self.name = name
        self.backend: Backend = backend
        self._setup = setup
        self._log = log
        self._run_id = run_id
        self._bus_options = bus_options
        self.bus: EventBus | None = None
        self.setup_result: Any = None
        self.close_report: CloseReport | None = None
        #: Events accepted by ``handoff``, and events dropped because the bus stayed full.
        self.handed_off = 0
        self.dropped = 0

        self._queue: deque[object] = deque()
        self._accepting = False
        self._sleeping = False
        self._wake: anyio.Event | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        self._room = threading.Event()
        self._want_room = False
        self._stalled = False
        self._ready = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        #: What failed the run in the bus's thread: a callback's ``on_error="raise"``
        #: failure or interrupt (the bus went on), else why the thread ended early.
        #: An attribute, not a property: the trainer's every hand-off reads it.
        self.failure: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._in_hand: object = None  # the pump's current item

    # --- lifecycle (any thread) ---------------------------------------------------

    @property
    def running(self) -> bool:
        return self._accepting

    @property
    def error(self) -> BaseException | None:
        """Why the bus thread ended early (it failed to start, or broke)."""
        return self._error

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
        """Hand off ``final`` events, drain the bus, stop the thread; None if it had to be
        abandoned (still busy after ``timeout``) or never ran."""
        if self._thread is None:
            return None
        if not self._done.is_set():
            self._accepting = False
            # Past the capacity on purpose: these few must not be dropped.
            self._queue.extend(final)
            self._queue.append(_STOP)
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

    def handoff(self, event: Event) -> bool:
        """Give ``event`` to the bus without waiting for it to be handled.

        False when it was dropped (the bus stayed full past ``handoff_timeout``;
        counted and warned about). ``BusClosed`` when the bus is not running.
        """
        if not self._accepting:
            raise BusClosed(f"{self.name}: the bus is not running")
        queue = self._queue
        if len(queue) >= self.capacity and not self._wait_for_room():
            self._drop(event)
            return False
        queue.append(event)
        self.handed_off += 1
        if len(queue) >= self._high_water and self._sleeping:
            self._wake_pump()
        return True

    def handoff_after_idle(self, event: Event) -> bool:
        """Like ``handoff``, but ``event`` is published only once everything handed off
        before it was handled (a checkpoint's state snapshot must see every report)."""
        if not self._accepting:
            raise BusClosed(f"{self.name}: the bus is not running")
        if len(self._queue) >= self.capacity and not self._wait_for_room():
            self._drop(event)
            return False
        self._queue.append(_AfterIdle(event))
        self.handed_off += 1
        self._wake_pump()
        return True

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until nothing handed off so far is pending (handled, or the bus ended;
        once closing: until the thread ended); False on timeout."""
        if self._thread is None:
            return True
        if not self._accepting:
            return self._done.wait(timeout)
        barrier = _Barrier()
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

    def _wait_for_room(self) -> bool:
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
            self._wake_pump()
            self._room.wait(remaining)
        return True

    def _drop(self, event: Event) -> None:
        self.dropped += 1
        dropped = self.dropped
        if dropped & (dropped - 1) == 0:  # 1, 2, 4, 8, ...: a warning, not a flood
            _log.warning(
                "bus hand-off full: event dropped",
                thread=self.name,
                event_type=type(event).__name__,
                dropped=dropped,
                handoff_timeout=self.handoff_timeout,
            )

    # --- the bus's thread ------------------------------------------------------------

    def _thread_main(self) -> None:
        try:
            anyio.run(self._main, backend=self.backend)
        except BaseException as exc:
            self._error = exc
            if self.failure is None:
                self.failure = exc
            _log.error("bus thread failed", thread=self.name, error=describe_exception(exc))
        finally:
            self._accepting = False
            self._done.set()
            self._ready.set()
            self._room.set()
            for item in [self._in_hand, *self._queue]:  # nothing left to wait for
                if type(item) is _Barrier:
                    item.done.set()

    def _failed_by(self, exc: BaseException) -> None:
        """The bus's ``on_failure`` (called once, in its thread): keep ``exc`` for the
        trainer's thread; the bus goes on, so the run's end is still delivered."""
        self.failure = exc
        _log.error("a callback failed the run", thread=self.name, error=describe_exception(exc))

    async def _main(self) -> None:
        bus = EventBus(**self._bus_options, on_failure=self._failed_by)
        self.bus = bus
        recorder: LogRecorder | None = None
        try:
            if self._log is not None:
                recorder = LogRecorder(self._log, run_id=self._run_id).attach(bus)
            self.setup_result = self._setup(bus)
            self._call_soon = _thread_safe_scheduler()
            async with bus:
                self._accepting = True
                self._ready.set()
                await self._pump(bus)
                self.close_report = await bus.aclose()
        finally:
            if recorder is not None:
                recorder.close()

    def _wake_in_loop(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _pump(self, bus: EventBus) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wake = anyio.Event()
                self._sleeping = True
                if not queue:  # checked after announcing sleep: a wake-up now is not lost
                    with anyio.move_on_after(self.poll_interval):
                        await self._wake.wait()
                self._sleeping = False
                continue
            item = self._in_hand = queue.popleft()
            if self._want_room:
                self._want_room = False
                self._room.set()
            try:
                if isinstance(item, Event):
                    await bus.publish(item)
                elif type(item) is _AfterIdle:
                    await bus.wait_idle()
                    await bus.publish(item.event)
                elif type(item) is _Barrier:
                    await bus.wait_idle()
                    item.done.set()
                else:
                    return
            except BusClosed:  # the bus stopped on its own (it broke): nothing more to deliver
                self._accepting = False
                return


def _thread_safe_scheduler() -> Callable[[Callable[[], object]], object]:
    """The running loop's non-waiting, thread-safe "call this soon"."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: the only other anyio backend is trio
        import trio  # a test extra: needed only on trio

        return trio.lowlevel.current_trio_token().run_sync_soon
