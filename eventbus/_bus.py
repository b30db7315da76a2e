"""The event bus: ordered, bounded, deadline-guarded delivery to handlers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Self, Unpack

import anyio
import anyio.abc
import anyio.to_thread

from ._bus_results import BusClosed, BusFull, BusStats, CloseReport, refusal
from ._clock import Clock, MonotonicClock
from ._dispatch import Dispatcher, Inbox
from ._events import Event
from ._holds import LoopHolds
from ._lanes import MAX_BATCH, Lane
from ._logging import get_logger
from ._observers import CallObserver, CallObservers
from ._options import DEFAULT_PROBATION, Buffer, BusKeywords, BusOptions, WaitSeconds
from ._periods import Periods
from ._policy import Policy
from ._registry import Registry
from ._runners import Runner
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    OverBudgetPolicy,
    Subscription,
)
from ._tasks import Tasks
from ._text import describe
from ._watchdog import Watchdog
from .options import checked

__all__ = [
    "EMIT_HEADROOM",
    "BusClosed",
    "BusFull",
    "BusStats",
    "CloseReport",
    "EventBus",
    "blocking_io",
]

_log = get_logger("eventbus")

#: How far ``emit`` may fill the inbox past ``buffer``: only a handler that emits
#: more than it gets (a feedback loop) reaches it.
EMIT_HEADROOM = 4 * MAX_BATCH

#: The ``Event`` classes published so far: ``publish`` looks an event's class up here
#: before it asks ``isinstance``, which ``Event``'s metaclass makes slow.
_EVENT_CLASSES: set[type] = set()


async def blocking_io(bus: EventBus, work: Callable[[], object]) -> None:
    """Run file work that blocks (a checkpoint's fsyncs) for a handler of ``bus``: in a
    worker thread where ``bus.io_in_threads`` (later events wait), else here."""
    if bus.io_in_threads:
        await anyio.to_thread.run_sync(work)
    else:
        work()


def _is_event(thing: object) -> bool:
    """Whether ``thing`` is an ``Event`` (its class remembered if it is)."""
    if isinstance(thing, Event):
        _EVENT_CLASSES.add(type(thing))
        return True
    return False


class EventBus(anyio.AsyncContextManagerMixin):
    """Carries events from publishers to handlers, in order, each call under a deadline.

    Use it as ``async with EventBus() as bus:``. Handlers get a copy of each event stamped
    with its ``seq`` and ``time``. Leaving the block delivers what was published (for up
    to ``drain_timeout``) and re-raises the failure of an ``on_error="raise"`` handler.

    Args:
        options: The bus's settings, a ``BusOptions``; keywords given as well change it.
        clock: What timestamps and health-check periods follow (default: the
            monotonic clock; a ``VirtualClock`` makes tests and replays instant).
            Deadlines stay in real seconds.
        on_failure: Called once with the exception when an ``on_error="raise"``
            handler fails or any handler raises ``KeyboardInterrupt`` or
            ``SystemExit``; the bus goes on delivering. Without it the bus stops
            at once and ``async with`` re-raises.
        buffer: How many events the inbox (and a lane without its own) holds.
        timeout: The default deadline of one handler call, in real seconds.
        period: The length of a health-check period, in seconds of ``clock``.
        budget: The share of a period that all handlers may use together.
        drain_timeout: How long closing waits for accepted events to be
            delivered, in seconds.
    """

    def __init__(
        self,
        options: BusOptions | None = None,
        *,
        clock: Clock | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
        **keywords: Unpack[BusKeywords],
    ) -> None:
        #: The bus's options (``BusOptions``: ``options`` with ``keywords`` changed), checked.
        self.options = options = BusOptions.build(options, **keywords)
        self._buffer = options.buffer  # read by every publish
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._now: Callable[[], float] = self.clock.now
        self._on_failure = on_failure
        self._emit_limit = options.buffer + EMIT_HEADROOM
        self._next_index = 0
        #: Whether the library's own handlers hand blocking file work to a worker thread
        #: (``blocking_io``); off for a host that steps the loop inside a trainer's hooks.
        self.io_in_threads = True

        self._inbox = Inbox()
        #: The time workers' code held this loop (counted by their runner): not charged to
        #: the async handler calls in flight meanwhile (their deadlines stay real time).
        self.loop_holds = LoopHolds()
        self._watchdog = Watchdog()
        self._policy = Policy(self._emit, self._end_run, owner_ends_run=on_failure is not None)
        self._observers = CallObservers(self._end_run)
        self._gathering: Subscription | None = None
        self._registry = registry = Registry(self._policy)
        self._periods = Periods(
            self.clock,
            options.period,
            options.budget,
            subs=lambda: registry.subs,
            emit=self._emit,
            policy=self._policy,
        )
        runner = Runner(
            self._now, self._policy, self._watchdog.guard(), self._observers, self.loop_holds
        )
        self._dispatcher = Dispatcher(
            self._inbox, registry, self._periods, runner, self._now, end_run=self._end_run
        )

        self._tg: anyio.abc.TaskGroup | None = None
        self._tasks = Tasks(self._end_run)
        self._open = False
        self._closing = False
        self._close_report: CloseReport | None = None
        self._failure: BaseException | None = None
        self._failure_reported = False
        self._abandoned = 0
        self._stop_listening: Callable[[], None] | None = None

    @property
    def buffer(self) -> int:
        """How many events the inbox holds (``options.buffer``)."""
        return self.options.buffer

    @property
    def timeout(self) -> float:
        """The default deadline of one handler call, in seconds (``options.timeout``)."""
        return self.options.timeout

    @property
    def period(self) -> float:
        """The length of a health-check period, in seconds (``options.period``)."""
        return self.options.period

    @property
    def budget(self) -> float:
        """The share of a period all handlers may use together (``options.budget``)."""
        return self.options.budget

    @property
    def drain_timeout(self) -> float:
        """How long closing waits for delivery, in seconds (``options.drain_timeout``)."""
        return self.options.drain_timeout

    # --- lifecycle -----------------------------------------------------------

    @asynccontextmanager
    async def __asynccontextmanager__(self) -> AsyncIterator[Self]:
        """Run the bus's tasks; on the way out drain (unless cancelled) and re-raise a
        handler's failure. The body's own exception leaves unwrapped."""
        if self._tg is not None:
            raise RuntimeError("an EventBus can be started only once: make a new one")
        body: BaseException | None = None
        async with anyio.create_task_group() as tg:
            self._tg = tg
            self._tasks.open(tg)
            self._periods.begin(self._now())
            self._open = True
            self._tasks.start(self._dispatcher.run)
            self._tasks.start(self._watchdog.run)
            add_listener = getattr(self.clock, "add_listener", None)
            if add_listener is not None:
                self._stop_listening = add_listener(self._on_clock_moved)
            else:
                self._tasks.start(self._periods.ticker)
            for lane in self._registry.lanes.values():
                self._tasks.start(lane.run)
            try:
                yield self
            except BaseException as exc:
                body = exc
            cancelled = isinstance(body, anyio.get_cancelled_exc_class())
            if self._failure is None and not self._closing:
                await self.aclose(drain=not cancelled)
            tg.cancel_scope.cancel()
            if cancelled and body is not None:
                raise body  # a cancellation is the task group's: it swallows its own
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        if self._failure is not None:
            # Counted now that every task has stopped and accounted for its calls.
            self._abandoned += self._dispatcher.undelivered()
            raise self._failure
        if body is not None and not cancelled:
            raise body

    async def aclose(
        self, *, drain: bool = True, drain_timeout: float | None = None
    ) -> CloseReport:
        """Stop accepting events, deliver what was accepted, and report what was not.

        Leaving ``async with`` calls it; calling it again returns the same report.

        Args:
            drain: Deliver what was accepted first; ``False`` abandons it.
            drain_timeout: How long delivering may take, in seconds (default:
                the bus's ``drain_timeout``); what is left then is abandoned.
        """
        if self._close_report is not None:
            return self._close_report
        limit = (
            self.drain_timeout
            if drain_timeout is None
            else checked("drain_timeout", drain_timeout, WaitSeconds)
        )
        if self._tasks.in_bus_task():
            raise RuntimeError(
                "aclose() called from a handler: it would wait for itself; "
                "leave the `async with EventBus()` block (or cancel it) instead"
            )
        self._open = False
        self._closing = True
        drained = True
        if drain:
            with anyio.move_on_after(limit):
                await self.wait_idle()
                # The unfinished period is reported too, and delivered like the others.
                report = self._periods.cut(self._now())
                if report is not None:
                    self._emit(report)
                    await self.wait_idle()
            drained = self._dispatcher.is_idle()
        await self._tasks.stop()
        self._inbox.wake_publishers()  # those waiting for room: refused now, not left waiting
        abandoned = self._dispatcher.undelivered()
        self._abandoned += abandoned
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        stats = self.stats()
        self._close_report = CloseReport(
            drained=drained and abandoned == 0,
            abandoned=abandoned,
            published=stats.published,
            delivered=stats.delivered,
        )
        if abandoned:
            _log.warning("bus closed with undelivered events", abandoned=abandoned)
        return self._close_report

    def _end_run(self, exc: BaseException) -> None:
        """Tell the owner once, or, with no owner, stop everything now and re-raise ``exc``
        on leaving ``async with``."""
        if self._on_failure is None:
            if self._failure is None:
                self._failure = exc
                self._open = False
                self._inbox.wake_publishers()
                if self._tg is not None:
                    self._tg.cancel_scope.cancel()
            return
        if self._failure_reported:
            return
        self._failure_reported = True
        try:
            self._on_failure(exc)
        except Exception as error:
            _log.error("on_failure raised", error=describe(error))

    # --- subscribing -----------------------------------------------------------

    def subscribe(
        self,
        event_types: type[Event] | Iterable[type[Event]],
        handler: Callable[[Any], Any],
        *,
        name: str | None = None,
        order: int = 0,
        delivery: DeliveryMode = "inline",
        timeout: float | None = None,
        on_error: ErrorPolicy = "log",
        max_faults: int = 3,
        blocking: bool = False,
        buffer: int | None = None,
        budget: float | None = None,
        over_budget: OverBudgetPolicy = "warn",
        probation: int = DEFAULT_PROBATION,
        barrier: bool = False,
    ) -> Subscription:
        """Call ``handler(event)`` for every event of ``event_types`` (subclasses included).

        Returns the subscription (``stats()``, ``cancel()``, ``enable()``).

        Args:
            event_types: An ``Event`` subclass, or several.
            handler: A function or coroutine function of one event.
            name: The handler's name in reports (default: module and qualified name).
            order: For one event, lower runs first; then registration order.
            delivery: ``"inline"`` runs in the dispatcher (cheapest; a slow one
                delays the others); ``"lane"`` gives it a task and buffer of its own.
            timeout: The deadline of one call, in real seconds (default: the bus's).
            on_error: ``"log"`` a failure and go on, ``"raise"`` it out of the
                bus, or ``"disable"`` the handler after ``max_faults``.
            max_faults: Failures and timeouts before ``"disable"`` acts.
            blocking: Run a sync handler in a worker thread, so its deadline can abandon it.
            buffer: The size of a lane's buffer (default: the bus's ``buffer``).
            budget: This handler's share of a period (default: the bus's, shared).
            over_budget: ``"warn"``, ``"coalesce"`` (deliver only the newest pending
                event of each type until a period under budget) or ``"disable"``
                (for ``probation`` whole periods).
            probation: Whole periods an ``over_budget="disable"`` handler stays off.
            barrier: Deliver each such event to every handler before the next one
                reaches any, so the handler sees the others' state as of that event.
        """
        registry = self._registry
        capacity = self._buffer if buffer is None else checked("buffer", buffer, Buffer)
        sub = Subscription(
            registry,
            event_types,
            handler,
            name=name,
            index=self._next_index,
            order=order,
            delivery=delivery,
            timeout=self.timeout if timeout is None else timeout,
            on_error=on_error,
            max_faults=max_faults,
            blocking=blocking,
            budget=budget,
            over_budget=over_budget,
            barrier=barrier,
            probation=probation,
        )
        if self._closing or self._failure is not None:
            raise BusClosed("the bus is closed")
        self._next_index += 1
        lane = None
        if delivery == "lane":
            runner = Runner(
                self._now, self._policy, self._watchdog.guard(), self._observers, self.loop_holds
            )
            lane = Lane(
                sub,
                runner,
                capacity,
                took=self._dispatcher.lane_took,
                idle=self._dispatcher.maybe_idle,
                ended=registry.lane_ended,
            )
        registry.add(sub, lane)
        if lane is not None and self._open:
            self._tasks.start(lane.run)
        return sub

    def add_tap(self, tap: Callable[[list[Event]], None]) -> Callable[[], None]:
        """Call ``tap(batch)`` with every stamped batch before any handler sees it;
        returns a function that removes it. Untimed, so it must not block; one that
        raises is logged and removed."""
        return self._dispatcher.add_tap(tap)

    def observe_calls(
        self, observer: CallObserver, *, min_seconds: float = 0.0
    ) -> Callable[[], None]:
        """Show ``observer`` the handler calls that took at least ``min_seconds`` (bus
        clock), failed or ran past their deadline, as ``HandlerCall`` records; returns a
        function that removes it. It must not block; one that raises is removed."""
        threshold = checked("min_seconds", min_seconds, WaitSeconds)
        return self._observers.add(observer, threshold)

    @property
    def gathering(self) -> Subscription | None:
        """The active subscription that makes this bus's derived events (rounds, the
        run's start and end), or ``None``; a replay then leaves recorded ones out."""
        sub = self._gathering
        return sub if sub is not None and sub.active else None

    @gathering.setter
    def gathering(self, subscription: Subscription) -> None:
        self._gathering = subscription

    def continue_from(self, *, seq: int, period: int) -> None:
        """Number events from ``seq`` and periods from ``period`` on (a resumed run).
        Only before the bus starts (``RuntimeError`` after)."""
        if self._tg is not None:
            raise RuntimeError("continue_from() must be called before the bus starts")
        self._dispatcher.next_seq, self._periods.index = max(0, seq), max(0, period)

    @property
    def period_end(self) -> float:
        """When the current health-check period ends, on the bus clock."""
        return self._periods.end

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """The active subscriptions, in delivery order."""
        return tuple(self._registry.subs)

    def _on_clock_moved(self, now: float) -> None:
        if now >= self._periods.end and (self._open or self._closing):
            self._periods.roll(now)

    # --- publishing ------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Accept ``event``, waiting while the inbox is full.

        Raises ``TypeError`` for a non-``Event``, ``BusClosed`` once the bus is closed.
        """
        inbox = self._inbox
        if len(inbox) >= self._buffer:
            await self._wait_room()
        if not (self._open and (type(event) in _EVENT_CLASSES or _is_event(event))):
            raise refusal(event, started=self._tg is not None)
        # ``Inbox.put`` inlined: the hot path.
        inbox.append(event)
        if inbox.sleeping:
            inbox.wake_up()

    async def publish_many(self, events: Iterable[Event]) -> None:
        """Publish ``events`` in order, as ``publish`` would each, for less per event.

        A thing ``publish`` would refuse raises its error; the events before it are accepted.
        """
        pending = events if type(events) is list else list(events)
        inbox = self._inbox
        done = 0
        while done < len(pending):
            if len(inbox) >= self._buffer or not self._open:
                await self._wait_room()
                if not self._open:
                    raise refusal(pending[done], started=self._tg is not None)
            chunk = pending[done : done + self._buffer - len(inbox)]
            for index, thing in enumerate(chunk):
                if type(thing) not in _EVENT_CLASSES and not _is_event(thing):
                    inbox.put_many(chunk[:index])
                    raise refusal(thing, started=True)
            inbox.put_many(chunk)
            done += len(chunk)

    def publish_nowait(self, event: Event) -> None:
        """Accept ``event`` at once, or raise ``BusFull`` if the inbox is full: an
        event is never dropped silently. Refuses what ``publish`` refuses."""
        if len(self._inbox) >= self._buffer:
            raise BusFull(f"the bus inbox is full ({self._buffer} events waiting)")
        if not (self._open and (type(event) in _EVENT_CLASSES or _is_event(event))):
            raise refusal(event, started=self._tg is not None)
        self._inbox.put(event)

    def emit(self, event: Event, *, derived: bool = False) -> None:
        """Publish from inside a handler: never waits (that would deadlock the dispatcher).

        Raises ``BusFull`` past ``buffer`` plus ``EMIT_HEADROOM``; ``derived=True`` events
        (rounds, reports) are never refused.
        """
        if not isinstance(event, Event):
            raise refusal(event, started=True)
        if not derived and len(self._inbox) >= self._emit_limit:
            raise BusFull(
                f"emit: the bus inbox holds {len(self._inbox)} events, its limit for "
                f"emitted events; does a handler emit more events than it receives?"
            )
        self._emit(event)

    def _emit(self, event: Event) -> None:
        """The bus's own diagnostics: a bounded number per event handled, never refused."""
        if self._open or self._closing:
            self._inbox.put(event)

    async def _wait_room(self) -> None:
        if self._open:
            self._tasks.refuse_wait("a publish() that must wait for room")
        while len(self._inbox) >= self._buffer:
            if not self._open:
                return  # the publisher raises the right error
            await self._inbox.room()

    async def wait_idle(self, *, lanes: Iterable[Subscription] | None = None) -> None:
        """Return once every accepted event has been fully handled.

        With ``lanes``, only those lanes' backlogs are waited for (other lanes' are not).
        Raises ``RuntimeError`` from a handler: the bus is never idle while it runs.
        """
        if lanes is not None:
            lanes = tuple(lanes)
        if not self._dispatcher.is_idle(lanes):
            self._tasks.refuse_wait("wait_idle()")
        await self._dispatcher.wait_idle(lanes)

    # --- stats ---------------------------------------------------------------------

    def stats(self) -> BusStats:
        """The bus's counts since it started, and each subscription's (a snapshot)."""
        return self._dispatcher.stats(abandoned=self._abandoned)
