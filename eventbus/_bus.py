"""The event bus: ordered, bounded, deadline-guarded delivery to handlers.

How it stays cheap. ``publish`` only appends to a bounded inbox; one
dispatcher task (``_dispatch``) takes the inbox as a batch and hands it to
each handler in turn, with one clock read per call, or one per batch for
handlers that have proved to cost less than a clock read (``_runners``).

Deadlines without a scope per call. Plain sync handlers cannot be
interrupted, so they are timed and an overrun is reported. Async handlers
run under one cancel scope per batch, and a single watchdog task
(``_watchdog``) cancels it when the call in progress has not finished
within its deadline. Blocking sync handlers run in a worker thread and are
abandoned at their deadline.

The parts, each owning its state and using only the ones after it:
``EventBus`` (lifecycle, subscribing, publishing, figures); its ``Tasks``;
the ``Dispatcher`` and its ``Inbox``; the ``Registry`` of subscriptions and
lanes; the ``Periods`` and their budgets; the lanes and the ``Runner`` of
each task that calls handlers; the ``Policy`` for faults and handler states;
the ``Watchdog``; the subscriptions and their ``Figures``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, Self, Unpack

import anyio
import anyio.abc

from ._bus_results import BusClosed, BusFull, BusStats, CloseReport, is_fresh, refusal
from ._clock import Clock, MonotonicClock
from ._dispatch import Dispatcher, Inbox
from ._events import Event
from ._lanes import MAX_BATCH
from ._logging import get_logger
from ._periods import Periods
from ._policy import Policy
from ._registry import Registry
from ._runners import Runner
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    OverBudgetPolicy,
    Subscription,
    as_event_types,
)
from ._tasks import Tasks
from ._text import describe
from ._watchdog import Watchdog
from .options import Buffer, BusKeywords, BusOptions, WaitSeconds, checked

__all__ = ["EMIT_HEADROOM", "BusClosed", "BusFull", "BusStats", "CloseReport", "EventBus"]

_log = get_logger("eventbus")

#: How far ``emit`` may fill the inbox past ``buffer``. Derived events are a
#: few per event handled, so only a handler that emits more than it gets (a
#: feedback loop) reaches this; past it, its ``emit`` raises ``BusFull``.
EMIT_HEADROOM = 4 * MAX_BATCH


class EventBus:
    """Carries events from publishers to handlers, in order, under deadlines.

    Use it as ``async with EventBus() as bus:``; leaving the block drains what
    was published (within ``drain_timeout``) and stops the bus. A handler with
    ``on_error="raise"`` that fails makes the exception propagate out of the
    ``async with``.

    ``options`` (a ``BusOptions``), or the same as keywords (``EventBus(period=5)``),
    say how it runs, each checked against its range when the bus is made:
    ``buffer`` bounds the inbox (and each lane, unless given its own), so
    ``publish`` waits when it is full and ``publish_nowait`` raises ``BusFull``;
    ``timeout`` is the default deadline of one handler call, in real seconds;
    ``period`` the health-check period and ``budget`` the share of it handlers
    may use together; ``drain_timeout`` bounds the drain on close. ``clock``
    drives timestamps and health-check periods.

    Publishing hands an event over: the bus stamps ``seq`` and ``time`` onto
    that very object when it dispatches it (a stamped copy per event would
    cost a third of the cheapest delivery). Publish a fresh event each time:
    one handed over again is refused once dispatched, and delivered once,
    with an error logged, if both hand-overs came before that.

    ``on_failure``: when a handler with ``on_error="raise"`` fails, or any
    raises ``KeyboardInterrupt`` or ``SystemExit``, the bus stops at once and
    ``async with`` re-raises it; an owner that must still deliver events (a
    run's ``RunFinished``) passes a function, called once with the exception
    while the bus goes on, and ends things in order itself.
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
        period, budget = options.period, options.budget
        self._on_failure = on_failure
        self._emit_limit = options.buffer + EMIT_HEADROOM
        self._next_index = 0

        self._inbox = Inbox()
        self._watchdog = Watchdog()
        self._policy = Policy(self._emit, self._failed_by, owner_ends_run=on_failure is not None)
        self._derived: set[type[Event]] = set()
        self._registry = registry = Registry(self._policy)
        self._periods = Periods(
            self.clock,
            period,
            budget,
            subs=lambda: registry.subs,
            emit=self._emit,
            policy=self._policy,
        )
        runner = Runner(self._now, self._policy, self._watchdog.guard())
        self._dispatcher = Dispatcher(
            self._inbox, registry, self._periods, runner, self._now, fail=self._failed_by
        )

        self._tg: anyio.abc.TaskGroup | None = None
        self._tasks = Tasks(self._failed_by)
        self._open = False
        self._closing = False
        self._close_report: CloseReport | None = None
        self._failure: BaseException | None = None
        self._failure_reported = False
        self._abandoned = 0
        self._stop_listening: Callable[[], None] | None = None

    @property
    def buffer(self) -> int:
        return self.options.buffer

    @property
    def timeout(self) -> float:
        return self.options.timeout

    @property
    def period(self) -> float:
        return self.options.period

    @property
    def budget(self) -> float:
        return self.options.budget

    @property
    def drain_timeout(self) -> float:
        return self.options.drain_timeout

    # --- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("an EventBus can be started only once")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tasks.open(self._tg)
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
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        assert self._tg is not None
        cancelled = exc is not None and isinstance(exc, anyio.get_cancelled_exc_class())
        if self._failure is None and not self._closing:
            await self.aclose(drain=not cancelled)
        self._tg.cancel_scope.cancel()
        # A cancellation goes to the task group, which swallows its own; any other
        # exception of the body is not the task group's business: keep it unwrapped.
        if cancelled:
            swallowed = await self._tg.__aexit__(exc_type, exc, tb)
        else:
            swallowed = await self._tg.__aexit__(None, None, None)
        if self._stop_listening is not None:
            self._stop_listening()
            self._stop_listening = None
        if self._failure is not None:
            # Counted now that every task has stopped and accounted for its calls.
            self._abandoned += self._dispatcher.undelivered()
            raise self._failure
        return bool(swallowed) and cancelled

    async def aclose(
        self, *, drain: bool = True, drain_timeout: float | None = None
    ) -> CloseReport:
        """Stop accepting events, deliver what was accepted (unless ``drain=False``,
        or until ``drain_timeout``), stop the bus's tasks, and say what was not delivered."""
        if self._close_report is not None:
            return self._close_report
        limit = (
            self.drain_timeout
            if drain_timeout is None
            else checked("drain_timeout", drain_timeout, WaitSeconds)
        )
        if self._tasks.in_one():
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

    def _failed_by(self, exc: BaseException) -> None:
        """A handler failed the run (``on_error="raise"``, or an interrupt): tell the
        owner once, or, with no owner, stop everything and re-raise on exit."""
        if self._on_failure is None:
            self._fail(exc)
            return
        if self._failure_reported:
            return
        self._failure_reported = True
        try:
            self._on_failure(exc)
        except Exception as error:
            _log.error("on_failure raised", error=describe(error))

    def _fail(self, exc: BaseException) -> None:
        """Stop everything, re-raise ``exc`` on exit."""
        if self._failure is None:
            self._failure = exc
            self._open = False
            self._inbox.wake_publishers()
            if self._tg is not None:
                self._tg.cancel_scope.cancel()

    # --- subscribing -----------------------------------------------------------

    def subscribe(
        self,
        event_types: type[Event] | Iterable[type[Event]],
        handler: Callable[[Any], Any],
        *,
        name: str | None = None,
        order: int = 0,
        mode: DeliveryMode = "inline",
        timeout: float | None = None,
        on_error: ErrorPolicy = "log",
        max_faults: int = 3,
        blocking: bool = False,
        buffer: int | None = None,
        budget: float | None = None,
        over_budget: OverBudgetPolicy = "warn",
        barrier: bool = False,
    ) -> Subscription:
        """Call ``handler(event)`` for every event of ``event_types`` (subclasses included).

        ``order``: lower runs first for one event, then registration order.
        ``mode``: ``inline`` runs in the dispatcher (cheapest; a slow handler
        delays the others) and ``lane`` gives the handler its own task and
        bounded buffer. ``on_error``: ``log`` and go on, ``raise`` to fail
        the bus, or ``disable`` after ``max_faults`` faults (timeouts count).
        ``blocking=True`` runs a sync handler in a worker thread so its
        deadline can abandon it. ``budget``: this handler's share of a
        period; ``over_budget``: ``warn``, ``coalesce`` (only the newest
        pending event of each type) or ``disable`` (until a period under budget).
        ``barrier=True``: each event of ``event_types`` reaches every handler
        before the next event reaches any (handlers otherwise get a batch each,
        in turn): for a handler that must see the others' state as of that
        event, such as the state store snapshotting at each checkpoint.
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
            mode=mode,
            timeout=self.timeout if timeout is None else timeout,
            on_error=on_error,
            max_faults=max_faults,
            blocking=blocking,
            budget=budget,
            over_budget=over_budget,
            barrier=barrier,
        )
        if self._closing or self._failure is not None:
            raise BusClosed("the bus is closed")
        self._next_index += 1
        lane = None
        if mode == "lane":
            runner = Runner(self._now, self._policy, self._watchdog.guard())
            lane = self._dispatcher.new_lane(sub, runner, capacity)
        registry.add(sub, lane)
        if lane is not None and self._open:
            self._tasks.start(lane.run)
        return sub

    def add_tap(self, tap: Callable[[list[Event]], None]) -> Callable[[], None]:
        """Call ``tap(batch)`` with every batch the dispatcher takes, stamped, in
        sequence order, before any handler sees it; returns a remover.

        For observers of everything (the event-log recorder): one call per
        batch instead of one per event, and no timing or deadline. A tap that
        raises is logged and removed; it must not block.
        """
        return self._dispatcher.add_tap(tap)

    def derives(self, *event_types: type[Event]) -> None:
        """Declare that a handler of this bus makes events of ``event_types`` from
        other events (the gathering makes rounds of reports).

        A replay into this bus then leaves the recorded ones out, as it leaves
        out the bus's own diagnostics: they are made again, and delivered once.
        """
        self._derived.update(as_event_types(event_types))

    @property
    def derived_types(self) -> tuple[type[Event], ...]:
        """The event types handlers of this bus make themselves (``derives``)."""
        return tuple(self._derived)

    def continue_from(self, *, seq: int, period: int) -> None:
        """Number events from ``seq`` and periods from ``period`` on (before starting):
        a resumed run's bus continues the history its log holds."""
        if self._tg is not None:
            raise RuntimeError("continue_from() must be called before the bus starts")
        self._dispatcher.seq, self._periods.index = max(0, seq), max(0, period)

    @property
    def period_end(self) -> float:
        """When the current health-check period ends, on the bus clock.

        A replay waits for the bus to go idle before moving a virtual clock
        past it, so every event is accounted to the period it belongs to.
        """
        return self._periods.end

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(self._registry.subs)

    def _on_clock_moved(self, now: float) -> None:
        if now >= self._periods.end and (self._open or self._closing):
            self._periods.roll(now)

    # --- publishing ------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Accept ``event``; waits while the inbox is full. Delivery happens in
        the dispatcher: ``await wait_idle()`` to know it is done.

        The event is handed over (see the class): publish a fresh one each
        time; one already published is refused with ``ValueError``."""
        inbox = self._inbox
        if len(inbox) >= self._buffer:
            await self._wait_room()
        # The checks and ``Inbox.put`` written out: a call costs a fifth of the fixed cost.
        try:
            fresh = event.seq < 0
        except (AttributeError, TypeError):  # no event; a ``seq`` that is no number
            fresh = False
        if not (fresh and self._open):
            raise refusal(event, started=self._tg is not None)
        inbox.append(event)
        if inbox.sleeping:
            inbox.wake_up()

    async def publish_many(self, events: Iterable[Event]) -> None:
        """Publish ``events`` in order, as ``publish`` would each, for less per event:
        one call, and one check and hand-over per inbox-full (for a replay, or a
        trainer's deque drained at once). Waits while the inbox is full. An event
        that ``publish`` would refuse raises the same error; those before it are in."""
        pending = events if type(events) is list else list(events)
        inbox = self._inbox
        done = 0
        while done < len(pending):
            if len(inbox) >= self._buffer or not self._open:
                await self._wait_room()
                if not self._open:
                    raise refusal(pending[done], started=self._tg is not None)
            done += inbox.put_many(pending, done, self._buffer - len(inbox))

    def publish_nowait(self, event: Event) -> None:
        """Accept ``event`` or raise ``BusFull``; never drops it silently."""
        if len(self._inbox) >= self._buffer:
            raise BusFull(f"the bus inbox is full ({self._buffer} events waiting)")
        if not (self._open and is_fresh(event)):
            raise refusal(event, started=self._tg is not None)
        self._inbox.put(event)

    def emit(self, event: Event, *, derived: bool = False) -> None:
        """Publish from inside a handler: never waits, even past ``buffer``.

        A handler runs in the dispatcher (or its lane); waiting there for
        room in the inbox that only the dispatcher empties would deadlock.
        A handler that emits more than it gets (a feedback loop) would fill
        memory: past ``buffer`` plus a headroom of ``EMIT_HEADROOM`` events,
        ``emit`` raises ``BusFull``, so the emitting handler fails visibly.
        ``derived=True`` is for an event derived from the one being handled,
        a bounded number per event (a gathered round, a checkpoint's snapshot
        report, ``after_run``'s turn): never refused, so no flood by another
        handler can cost a run its rounds or its end. Events emitted while
        the bus drains on close are still delivered.
        """
        if not is_fresh(event):
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

    async def wait_idle(self) -> None:
        """Return once every accepted event has been fully handled. Not from a
        handler (``RuntimeError``): the bus is not idle while that handler runs."""
        if not self._dispatcher.is_idle():
            self._tasks.refuse_wait("wait_idle()")
        await self._dispatcher.wait_idle()

    # --- figures -------------------------------------------------------------------

    def stats(self) -> BusStats:
        return self._dispatcher.stats(abandoned=self._abandoned)
