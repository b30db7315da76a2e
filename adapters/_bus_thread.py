"""A bus in its own thread, fed from the trainer's thread through a bounded hand-off.

Trainers call their callbacks synchronously and must not wait for ours, so the
bus runs in a daemon thread with its own loop. A hand-off only appends to a
deque: waking the bus's thread would cost the trainer a syscall and the GIL in
the middle of its hook, so that thread polls instead (``poll_interval``,
backing off while idle). A full deque makes the caller wait up to
``handoff_timeout``, then drops the event loudly. Our own daemon thread, not
anyio's blocking portal, lets ``close`` abandon a callback stuck in a sync call
rather than hang the trainer; a callback's failure of the run is kept
(``failure``) for ``adapters._threaded_run`` to raise in the trainer's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Unpack

import anyio

from eventbus import BusClosed, CloseReport, Event, EventBus, describe_exception, get_logger
from eventbus.log import LogRecorder

from ._options import AdapterKeywords, AdapterOptions, Backend

__all__ = [
    "IDLE_POLL_INTERVAL",
    "BusThread",
    "DeferredEvent",
    "kind_of",
]

_log = get_logger("adapters.bus_thread")

#: How seldom an idle bus thread looks: each look that finds nothing doubles the
#: pause, up to this; the first look that finds events brings it back to the interval.
IDLE_POLL_INTERVAL = 0.1

#: An event to make in the bus's thread: ``(make, a, b)`` is published as ``make(a, b)``,
#: so the trainer's hook only builds a tuple.
#: A trainer's hook hands off a tuple, cheaper to build than the event itself.
DeferredEvent = tuple[Callable[[Any, Any], Event], Any, Any]


def kind_of(item: Event | DeferredEvent) -> str:
    """What a handed-off item is, for a warning: its event's class; for a deferred, the
    class its maker names (an ``event_type`` attribute), else the maker's name."""
    if isinstance(item, tuple):
        maker = item[0]
        made = getattr(maker, "event_type", None)
        return made.__name__ if isinstance(made, type) else getattr(maker, "__name__", "deferred")
    return type(item).__name__


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
_CONTROL = (_Barrier, _Stop)


class BusThread:
    """An ``EventBus`` running in a daemon thread; ``handoff`` feeds it from another thread.

    One producer thread at a time (a trainer's hooks come from one thread):
    the deque is thread-safe, the figures are not meant for several.

    ``setup(bus)`` runs in the bus's thread before the bus starts (subscribe
    handlers there); its return value is ``setup_result``. ``log``: record the
    bus's events to this file (closed, so flushed, when the bus closes).
    ``options``: the bus's, and the hand-off's (``poll_interval``: how often
    the bus thread looks at the deque, so how long a handed-off event may
    wait; see the module docstring).
    """

    def __init__(
        self,
        setup: Callable[[EventBus], Any],
        options: AdapterOptions | None = None,
        *,
        log: Path | None = None,
        run_id: str = "",
        name: str = "eventbus",
        **keywords: Unpack[AdapterKeywords],
    ) -> None:
        self.options = options = AdapterOptions.build(options, **keywords)
        #: How many events the deque holds: the bus's ``buffer``.
        self.capacity = options.buffer
        self.handoff_timeout = options.handoff_timeout
        self.poll_interval = options.poll_interval
        self.name = name
        self.backend: Backend = options.backend
        self._setup = setup
        self._log = log
        self._run_id = run_id
        self.bus: EventBus | None = None
        self.setup_result: Any = None
        self.close_report: CloseReport | None = None
        #: Events dropped because the bus stayed full (``handed_off`` counts the accepted).
        self.dropped = 0
        #: Times the bus thread woke from its sleep (by its poll timer or by a waiter).
        self.wakeups = 0
        #: Whether the bus accepts events. An attribute, not a property: every hook reads it.
        self.running = False
        #: What failed the run in the bus's thread: a callback's ``on_error="raise"``
        #: failure or interrupt (the bus went on), else why the thread ended early.
        #: An attribute, not a property: the trainer's every hand-off reads it.
        self.failure: BaseException | None = None

        self._queue: deque[object] = deque()
        # ``offer``'s one test: running, and no failure for the trainer to see first.
        self._open = False
        self._taken = 0  # events the pump took from the deque
        self._sleeping = False
        self._wake: anyio.Event | None = None
        self._call_soon: Callable[[Callable[[], object]], object] | None = None
        self._room = threading.Event()
        self._want_room = False
        self._stalled = False
        self._ready = threading.Event()
        self._done = threading.Event()
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._in_hand: object = None  # the pump's current item

    # --- lifecycle (any thread) ---------------------------------------------------

    @property
    def error(self) -> BaseException | None:
        """Why the bus thread ended early (it failed to start, or broke)."""
        return self._error

    @property
    def handed_off(self) -> int:
        """Events accepted so far: taken by the bus, or waiting in the deque.

        Counted on the bus's side, not per hand-off: the trainer's path stays
        one append. Exact once the thread is idle or ended.
        """
        waiting = sum(1 for item in list(self._queue) if type(item) not in _CONTROL)
        return self._taken + waiting

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
            self._open = self.running = False
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

    def offer(self, item: Event | DeferredEvent) -> bool:
        """The trainer's fast path: append ``item`` if that needs no wait, else False.

        False (and nothing done) when the deque is full, the bus is not
        running, or a failure is waiting for the caller: then ``handoff``
        (or the caller's failure handling) decides. Never wakes the bus.
        """
        queue = self._queue
        if self._open and len(queue) < self.capacity:
            queue.append(item)
            return True
        return False

    def handoff(self, item: Event | DeferredEvent) -> bool:
        """Give ``item`` to the bus without waiting for it to be handled.

        False when it was dropped (the bus stayed full past ``handoff_timeout``;
        counted and warned about). ``BusClosed`` when the bus is not running.
        """
        return self.offer(item) or self._handoff(item)

    def handoff_after_idle(self, event: Event) -> bool:
        """Like ``handoff``, but ``event`` is published only once everything handed off
        before it was handled (a checkpoint's state snapshot must see every report).
        Not a wake-up either: published at the bus's next look, in order."""
        return self._handoff(_AfterIdle(event))

    def _handoff(self, item: Event | DeferredEvent | _AfterIdle) -> bool:
        if not self.running:
            raise BusClosed(f"{self.name}: the bus is not running")
        if len(self._queue) >= self.capacity and not self._wait_for_room():
            self._drop(item.event if isinstance(item, _AfterIdle) else item)
            return False
        self._queue.append(item)
        return True

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until nothing handed off so far is pending (handled, or the bus ended;
        once closing: until the thread ended); False on timeout. Wakes the bus at
        once: its caller is waiting, so there is no hook to interrupt."""
        if self._thread is None:
            return True
        if not self.running:
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
        """Wait for the bus's next look to make room (it is not woken: a burst that
        fills the deque must not wake it more than once per poll interval)."""
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

    def _drop(self, item: Event | DeferredEvent) -> None:
        self.dropped += 1
        dropped = self.dropped
        if dropped & (dropped - 1) == 0:  # 1, 2, 4, 8, ...: a warning, not a flood
            _log.warning(
                "bus hand-off full: event dropped",
                thread=self.name,
                event_type=kind_of(item),
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
            self._open = self.running = False
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
        self._open = False  # the trainer's next hand-off takes the slow path and sees it
        _log.error("a callback failed the run", thread=self.name, error=describe_exception(exc))

    async def _main(self) -> None:
        bus = EventBus(self.options, on_failure=self._failed_by)
        self.bus = bus
        recorder: LogRecorder | None = None
        try:
            if self._log is not None:
                recorder = LogRecorder(self._log, run_id=self._run_id).attach(bus)
            self.setup_result = self._setup(bus)
            self._call_soon = _thread_safe_scheduler()
            async with bus:
                self.running = True
                self._open = self.failure is None
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
            try:
                if isinstance(item, Event | tuple):
                    # A run of events (and recipes) goes to the bus as one batch.
                    taken, events = _taken_events(item, queue)
                    self._taken += taken
                    if self._want_room:
                        self._want_room = False
                        self._room.set()
                    await bus.publish_many(events)
                    continue
                if self._want_room:
                    self._want_room = False
                    self._room.set()
                if type(item) is _AfterIdle:
                    self._taken += 1
                    await bus.wait_idle()
                    await bus.publish(item.event)
                elif type(item) is _Barrier:
                    await bus.wait_idle()
                    item.done.set()
                else:
                    return
            except BusClosed:  # the bus stopped on its own (it broke): nothing more to deliver
                self._open = self.running = False
                return


#: The most events the pump takes from the deque for one ``publish_many``.
_RUN = 256


def _taken_events(first: Event | DeferredEvent, queue: deque[object]) -> tuple[int, list[Event]]:
    """``first`` and the events (or recipes) right after it in ``queue``, taken off it,
    made into events: up to ``_RUN``, stopping at anything else (a barrier, a stop).
    Returns how many were taken, and the events (a deferred that fails makes none)."""
    items: list[Any] = [first]
    while queue and len(items) < _RUN and isinstance(queue[0], Event | tuple):
        items.append(queue.popleft())
    events: list[Event] = []
    for item in items:
        if type(item) is tuple:
            made = _made(item)
            if made is not None:
                events.append(made)
        else:
            events.append(item)
    return len(items), events


def _made(deferred: DeferredEvent) -> Event | None:
    """The event a deferred stands for; a maker that fails is our bug: logged, skipped."""
    try:
        return deferred[0](deferred[1], deferred[2])
    except Exception as exc:
        _log.error(
            "a handed-off event could not be made",
            maker=kind_of(deferred),
            error=describe_exception(exc),
        )
        return None


def _thread_safe_scheduler() -> Callable[[Callable[[], object]], object]:
    """The running loop's non-waiting, thread-safe "call this soon"."""
    try:
        return asyncio.get_running_loop().call_soon_threadsafe
    except RuntimeError:  # not asyncio: the only other anyio backend is trio
        import trio  # a test extra: needed only on trio

        return trio.lowlevel.current_trio_token().run_sync_soon
