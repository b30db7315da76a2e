"""What every host of an adapter's bus (a thread of its own, or stepped in the trainer's
hooks) shares: the hand-off deque the hooks append to, and the bus's life."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Unpack

from eventbus import BusClosed, Event, EventBus
from eventbus._bus import CloseReport
from eventbus._logging import get_logger
from eventbus._subscription import Subscription
from eventbus._text import describe as describe_exception
from eventbus.log import LogRecorder

from ._options import AdapterKeywords, AdapterOptions, Backend

__all__ = [
    "BusHost",
    "DeferredEvent",
    "kind_of",
]

_log = get_logger("adapters.bus_host")

#: ``(make, a, b)``, published as ``make(a, b)`` in the bus's loop: a tuple is cheaper
#: for the trainer's hook to build than the event.
DeferredEvent = tuple[Callable[[Any, Any], Event | list[Event]], Any, Any]


def kind_of(item: Event | DeferredEvent) -> str:
    """What a handed-off item is, for a warning."""
    if isinstance(item, tuple):
        maker = item[0]
        made = getattr(maker, "event_type", None)
        return made.__name__ if isinstance(made, type) else getattr(maker, "__name__", "deferred")
    return type(item).__name__


class AfterIdle:
    """Publish ``event`` only once everything handed off before it was handled."""

    __slots__ = ("event",)

    def __init__(self, event: Event) -> None:
        self.event = event


#: The last item: the pump returns, and the bus closes.
STOP = object()
#: What ``handed_off`` counts in the deque (not the markers).
_HANDED_OFF = (Event, tuple, AfterIdle)


class BusHost(ABC):
    """An ``EventBus`` fed through a deque by one producer (the trainer's thread).

    ``setup(bus)`` runs before the bus starts; its return value is ``setup_result``.
    ``log``: record the bus's events to this file. ``options``: the bus's and the
    hand-off's (``poll_interval``: how long a handed-off event may wait).
    """

    #: ``EventBus.io_in_threads`` of the bus it hosts.
    io_in_threads = True

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
        #: Events dropped because the bus stayed full.
        self.dropped = 0
        #: Times the host woke to look at the deque.
        self.wakeups = 0
        #: Whether the bus accepts events. An attribute, not a property: every hook reads it.
        self.running = False
        #: What failed the run in the bus's loop, else why the bus ended early (an
        #: attribute: every hand-off reads it).
        self.failure: BaseException | None = None
        self._error: BaseException | None = None
        self._queue: deque[object] = deque()
        # ``offer``'s one test: running, and no failure for the trainer to see first.
        self._open = False
        self._taken = 0  # events the pump took from the deque
        self._in_hand: object = None  # the pump's current item

    @abstractmethod
    def start(self, timeout: float = 30.0) -> None:
        """Start the bus and wait until it accepts events."""

    @abstractmethod
    def close(self, final: Iterable[Event] = (), *, timeout: float = 30.0) -> CloseReport | None:
        """Hand off ``final`` events, drain the bus and end it; None if abandoned or never ran."""

    @abstractmethod
    def wait_idle(
        self, timeout: float = 30.0, *, lanes: tuple[Subscription, ...] | None = None
    ) -> bool:
        """Block until everything handed off so far was handled; False on timeout."""

    @property
    def error(self) -> BaseException | None:
        """Why the bus ended early (it failed to start, or broke)."""
        return self._error

    @property
    def handed_off(self) -> int:
        """Events accepted so far (counted on the bus's side: exact once it is idle)."""
        waiting = sum(1 for item in list(self._queue) if isinstance(item, _HANDED_OFF))
        return self._taken + waiting

    # --- hand-off (the trainer's thread) --------------------------------------------

    def offer(self, item: Event | DeferredEvent) -> bool:
        """The trainer's fast path: append ``item`` if that needs no wait, else False
        (full, not running, or a failure waiting). Never wakes the bus."""
        queue = self._queue
        if self._open and len(queue) < self.capacity:
            queue.append(item)
            return True
        return False

    def handoff(self, item: Event | DeferredEvent) -> bool:
        """Give ``item`` to the bus without waiting for it to be handled; False when it
        was dropped (full past ``handoff_timeout``). ``BusClosed`` when not running."""
        return self.offer(item) or self._handoff(item)

    def handoff_after_idle(self, event: Event) -> bool:
        """Like ``handoff``, but publish ``event`` only once everything before it was handled."""
        return self._handoff(AfterIdle(event))

    def _handoff(self, item: Event | DeferredEvent | AfterIdle) -> bool:
        if not self.running:
            raise BusClosed(f"{self.name}: the bus is not running")
        if len(self._queue) >= self.capacity and not self._make_room():
            self._drop(item.event if isinstance(item, AfterIdle) else item)
            return False
        self._queue.append(item)
        return True

    def poll(self, handed_off: bool = False) -> None:  # noqa: B027  # a no-op unless stepped
        """A hook's chance to let the bus look at the deque (the stepped host takes it)."""

    @abstractmethod
    def _make_room(self) -> bool:
        """The deque is full: make room for one more, or say there is none (False)."""

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

    # --- the bus's loop --------------------------------------------------------------

    def _failed_by(self, exc: BaseException) -> None:
        """Keep ``exc`` for the trainer's thread; the bus goes on to deliver the run's end."""
        self.failure = exc
        self._open = False  # the trainer's next hand-off takes the slow path and sees it
        _log.error("a callback failed the run", thread=self.name, error=describe_exception(exc))

    def _ended(self, exc: BaseException | None) -> None:
        """The bus's loop is over, broken by ``exc`` or not: nothing is accepted any more."""
        if exc is not None:
            self._error = exc
            if self.failure is None:
                self.failure = exc
            _log.error("the bus failed", thread=self.name, error=describe_exception(exc))
        self._open = self.running = False

    def _started(self) -> None:  # noqa: B027  # a no-op unless the host waits for it
        """The bus accepts events (called in its loop): a host's chance to say so."""

    async def _main(self) -> None:
        bus = EventBus(self.options, on_failure=self._failed_by)
        bus.io_in_threads = self.io_in_threads
        self.bus = bus
        recorder: LogRecorder | None = None
        try:
            if self._log is not None:
                recorder = LogRecorder(self._log, run_id=self._run_id).attach(bus)
            self.setup_result = self._setup(bus)
            async with bus:
                self.running = True
                self._open = self.failure is None
                self._started()
                await self._pump(bus)
                self.close_report = await bus.aclose()
        finally:
            if recorder is not None:
                recorder.close()

    @abstractmethod
    async def _pump(self, bus: EventBus) -> None:
        """Take the deque's items and ``_deliver`` them until the stop."""

    async def _deliver(self, bus: EventBus, item: object) -> bool:
        """Publish what ``item`` stands for, with the events right after it; False at the stop."""
        queue = self._queue
        try:
            if isinstance(item, Event | tuple):
                # A run of events (and recipes) goes to the bus as one batch.
                taken, events = _taken_events(item, queue)
                self._taken += taken
                self._room_made()
                await bus.publish_many(events)
                return True
            self._room_made()
            if type(item) is AfterIdle:
                self._taken += 1
                await bus.wait_idle()
                await bus.publish(item.event)
                return True
            return await self._control(bus, item)
        except BusClosed:  # the bus stopped on its own (it broke): nothing more to deliver
            self._open = self.running = False
            return False

    def _room_made(self) -> None:  # noqa: B027  # a no-op unless its producer waits
        """The pump took items off the deque (a host whose producer waits says so)."""

    async def _control(self, bus: EventBus, item: object) -> bool:
        """A host's own marker taken off the deque (the stop by default): go on?"""
        return False


#: The most events the pump takes from the deque for one ``publish_many``.
_RUN = 256


def _taken_events(first: Event | DeferredEvent, queue: deque[object]) -> tuple[int, list[Event]]:
    """Take ``first`` and up to ``_RUN`` events right after it off ``queue``; returns how
    many were taken, and the events made."""
    items: list[Any] = [first]
    while queue and len(items) < _RUN and isinstance(queue[0], Event | tuple):
        items.append(queue.popleft())
    events: list[Event] = []
    for item in items:
        if type(item) is not tuple:
            events.append(item)
            continue
        try:  # a maker that fails is logged and skipped
            made = item[0](item[1], item[2])
        except Exception as exc:
            _log.error(
                "a handed-off event could not be made",
                maker=kind_of(item),
                error=describe_exception(exc),
            )
            continue
        if isinstance(made, list):
            events.extend(made)
        elif made is not None:  # a maker may have nothing to say
            events.append(made)
    return len(items), events
