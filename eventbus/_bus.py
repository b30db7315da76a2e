"""The event bus: ordered, bounded, deadline-guarded delivery to handlers.

How it stays cheap. ``publish`` only appends to a bounded inbox; one
dispatcher task takes the inbox as a batch, stamps sequence numbers and the
time, and hands the batch to each handler in turn (*handler-major*): handler
A gets every event of the batch, then handler B. Both ordering guarantees
hold (each handler sees publish order; for one event, handlers run by
``order`` then registration), and the loop that calls a handler is as tight
as a plain ``for`` loop, with one clock read per call, or one per batch for
handlers that have proved to cost less than a clock read.

Deadlines without a scope per call. Plain sync handlers cannot be
interrupted, so they are timed and an overrun is reported. Async handlers
run under one cancel scope per batch, and a single watchdog task cancels it
when the call in progress has not finished within its deadline. Blocking sync
handlers run in a worker thread and are abandoned at their deadline.
"""

from __future__ import annotations

import inspect
import math
import threading
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from itertools import groupby
from types import CoroutineType, TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.lowlevel
import msgspec
from msgspec.structs import force_setattr

from ._budget import close_period, newest_per_type
from ._clock import Clock, MonotonicClock
from ._events import (
    BudgetReport,
    Event,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HealthCheckTick,
)
from ._faults import FATAL, forgive_foreign_cancel, is_requested_cancel
from ._lanes import MAX_BATCH, Guard, Lane
from ._logging import get_logger
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    HandlerState,
    OverBudgetPolicy,
    Subscription,
    SubscriptionStats,
    handler_name,
)
from ._text import describe, format_traceback, safe_str

__all__ = ["BusClosed", "BusFull", "BusStats", "CloseReport", "EventBus"]

_log = get_logger("eventbus")

#: A handler whose mean call time is below this is timed per batch, not per call:
#: below it, reading the clock would cost as much as the call itself.
FAST_CALL = 2e-6
#: Calls timed one by one before a handler may switch to per-batch timing.
CALIBRATION_CALLS = 256
#: How far ``emit`` may fill the inbox past ``buffer``. Derived events are a
#: few per event handled, so only a handler that emits more than it gets (a
#: feedback loop) reaches this; past it, its ``emit`` raises ``BusFull``.
EMIT_HEADROOM = 4 * MAX_BATCH

_DIAGNOSTICS = (HandlerFailed, HandlerTimedOut)
_OVERRUN_ADVICE = (
    "a plain sync handler cannot be interrupted; declare it blocking=True to run it "
    "in a worker thread that is abandoned at the deadline, or make it async"
)


class BusClosed(RuntimeError):
    """The bus is closed (or not started): it accepts no more events."""


class BusFull(anyio.WouldBlock):
    """``publish_nowait`` found the inbox full; nothing was dropped."""


class BusStats(msgspec.Struct, frozen=True, kw_only=True):
    published: int
    delivered: int
    failed: int
    timed_out: int
    skipped: int
    queued: int
    abandoned: int
    subscriptions: tuple[SubscriptionStats, ...]


class CloseReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``aclose`` did: ``abandoned`` deliveries were never made."""

    drained: bool
    abandoned: int
    published: int
    delivered: int


class EventBus:
    """Carries events from publishers to handlers, in order, under deadlines.

    Use it as ``async with EventBus() as bus:``; leaving the block drains what
    was published (within ``drain_timeout``) and stops the bus. A handler with
    ``on_error="raise"`` that fails makes the exception propagate out of the
    ``async with``.

    ``buffer`` bounds the inbox (and each lane, unless given its own):
    ``publish`` waits when it is full and ``publish_nowait`` raises ``BusFull``.
    ``timeout`` is the default deadline of one handler call, in real seconds.
    ``clock`` drives timestamps and health-check periods (``period`` seconds);
    ``budget`` is the share of a period handlers may use together.

    ``on_failure``: what happens when a handler with ``on_error="raise"``
    fails, or any handler raises ``KeyboardInterrupt`` or ``SystemExit``.
    By default the bus stops at once and ``async with`` re-raises that
    exception. An owner that must still deliver events before it stops (a
    run's ``RunFinished`` and ``after_run``) passes a function instead: it is
    called once with the exception, the bus goes on, and the owner ends
    things in order and raises the exception itself.
    """

    def __init__(
        self,
        *,
        buffer: int = 1024,
        timeout: float = 30.0,
        clock: Clock | None = None,
        period: float = 2.0,
        budget: float = 0.05,
        drain_timeout: float = 10.0,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        if buffer < 1:
            raise ValueError(f"buffer must be at least 1, got {buffer}")
        if timeout <= 0 or period <= 0 or drain_timeout < 0:
            raise ValueError("timeout and period must be positive, drain_timeout not negative")
        if not 0 < budget <= 1:
            raise ValueError(f"budget is a share of the period, in (0, 1], got {budget}")
        self.buffer = buffer
        self.timeout = timeout
        self.clock: Clock = clock if clock is not None else MonotonicClock()
        self._now: Callable[[], float] = self.clock.now
        self.period = period
        self.budget = budget
        self.drain_timeout = drain_timeout
        self._on_failure = on_failure
        self._emit_limit = buffer + EMIT_HEADROOM

        self._subs: list[Subscription] = []
        self._routes: dict[type[Event], tuple[Subscription, ...]] = {}
        self._barriers: set[type[Event]] = set()  # types delivered one event at a time
        self._taps: list[Callable[[list[Event]], None]] = []
        self._next_index = 0

        self._inbox: deque[Event] = deque()
        self._room: anyio.Event | None = None
        self._wake = anyio.Event()
        self._sleeping = False
        self._dispatching = False
        self._in_hand = 0  # deliveries of the dispatcher's batch not yet handed to a runner
        self._running_tasks = 0
        self._task_ids: set[int] = set()
        self._tasks_stopped: anyio.Event | None = None
        self._idle: anyio.Event | None = None

        self._seq = 0
        self._period_index = 0
        self._period_start = 0.0
        self._period_end = math.inf

        # Watchdog over async calls: one guard per runner (the dispatcher, each lane).
        self._guards: list[Guard] = []
        self._dispatch_guard = Guard()
        self._guards.append(self._dispatch_guard)
        self._watchdog_wake: anyio.Event | None = None

        self._tg: anyio.abc.TaskGroup | None = None
        self._task_scopes: list[anyio.CancelScope] = []
        self._open = False
        self._closing = False
        self._close_report: CloseReport | None = None
        self._failure: BaseException | None = None
        self._failure_reported = False
        self._abandoned = 0
        self._stop_listening: Callable[[], None] | None = None

    # --- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("an EventBus can be started only once")
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        now = self._now()
        self._period_start = now
        self._period_end = now + self.period
        self._open = True
        self._start(self._dispatch_loop)
        self._start(self._watchdog)
        add_listener = getattr(self.clock, "add_listener", None)
        if add_listener is not None:
            self._stop_listening = add_listener(self._on_clock_moved)
        else:
            self._start(self._period_ticker)
        for sub in self._subs:
            if sub.lane is not None:
                self._start(sub.lane.run)
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
            self._abandoned += self._undelivered()
            raise self._failure
        return bool(swallowed) and cancelled

    def _start(self, loop: Callable[[], Any]) -> None:
        assert self._tg is not None

        async def guarded() -> None:
            self._running_tasks += 1
            self._task_ids.add(anyio.get_current_task().id)
            try:
                with anyio.CancelScope() as scope:
                    self._task_scopes.append(scope)
                    while True:
                        try:
                            await loop()
                            return
                        except BaseException as exc:
                            if not self._survive(loop, exc):
                                raise
            finally:
                self._running_tasks -= 1
                if not self._running_tasks and self._tasks_stopped is not None:
                    self._tasks_stopped.set()

        self._tg.start_soon(guarded)

    def _survive(self, loop: Callable[[], Any], exc: BaseException) -> bool:
        """Something escaped one of the bus's own loops: True to start it again.

        Handlers' exceptions are caught where handlers are called; what gets
        here came from elsewhere in that task: a ``KeyboardInterrupt`` that
        trio raised wherever the task was (it ends the run, in order), or a
        cancellation no scope of ours asked for (a handler that cancelled the
        task it runs in). Either way the loop is needed to finish the run.
        A cancellation we asked for, or any other exception (a bug of ours),
        propagates.
        """
        if isinstance(exc, FATAL):
            self._failed_by(exc)
        elif isinstance(exc, anyio.get_cancelled_exc_class()) and not is_requested_cancel(exc):
            forgive_foreign_cancel()
            _log.error("a bus task was cancelled by something else; it goes on", task=repr(loop))
        else:
            return False
        return True

    async def _stop_tasks(self) -> None:
        """Cancel the bus's tasks and wait until they are gone (their ``finally``
        blocks account for the calls they made, so what is left is exact)."""
        self._tasks_stopped = anyio.Event()
        for scope in self._task_scopes:
            scope.cancel()
        if self._running_tasks:
            with anyio.CancelScope(shield=True):
                await self._tasks_stopped.wait()

    async def aclose(
        self, *, drain: bool = True, drain_timeout: float | None = None
    ) -> CloseReport:
        """Stop accepting events, deliver what was accepted (unless ``drain=False``,
        or until ``drain_timeout``), stop the bus's tasks, and say what was not delivered."""
        if self._close_report is not None:
            return self._close_report
        if anyio.get_current_task().id in self._task_ids:
            raise RuntimeError(
                "aclose() called from a handler: it would wait for itself; "
                "leave the `async with EventBus()` block (or cancel it) instead"
            )
        self._open = False
        self._closing = True
        drained = True
        if drain:
            limit = self.drain_timeout if drain_timeout is None else drain_timeout
            with anyio.move_on_after(limit):
                await self.wait_idle()
                # The unfinished period is reported too, and delivered like the others.
                now = self._now()
                if now > self._period_start:
                    self._emit(self._budget_report(self._period_start, now, partial=True))
                    await self.wait_idle()
            drained = self._is_idle()
        await self._stop_tasks()
        abandoned = self._undelivered()
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
        types = (event_types,) if isinstance(event_types, type) else tuple(event_types)
        if not types or not all(isinstance(t, type) and issubclass(t, Event) for t in types):
            raise TypeError(f"event_types must be Event subclasses, got {event_types!r}")
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        if mode not in ("inline", "lane"):
            raise ValueError(f"mode must be 'inline' or 'lane', got {mode!r}")
        if on_error not in ("log", "raise", "disable"):
            raise ValueError(f"on_error must be 'log', 'raise' or 'disable', got {on_error!r}")
        if over_budget not in ("warn", "coalesce", "disable"):
            raise ValueError(
                f"over_budget must be 'warn', 'coalesce' or 'disable', got {over_budget!r}"
            )
        if timeout is not None and timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if budget is not None and not 0 < budget <= 1:
            raise ValueError(f"budget is a share of the period, in (0, 1], got {budget}")
        if max_faults < 1:
            raise ValueError(f"max_faults must be at least 1, got {max_faults}")
        if self._closing or self._failure is not None:
            raise BusClosed("the bus is closed")
        sub = Subscription(
            self,
            types,
            handler,
            name=name or handler_name(handler),
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
        if blocking and sub.is_async:
            raise ValueError(f"{sub.name}: blocking=True is for sync handlers; this one is async")
        self._next_index += 1
        if mode == "lane":
            sub.lane = Lane(self, sub, buffer or self.buffer)
            if self._open:
                self._start(sub.lane.run)
        self._subs.append(sub)
        self._subs.sort(key=lambda s: (s.order, s.index))
        self._routes.clear()
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        if sub in self._subs:
            self._subs.remove(sub)
            self._routes.clear()
        if sub.lane is not None:
            sub.lane._wake()

    def add_tap(self, tap: Callable[[list[Event]], None]) -> Callable[[], None]:
        """Call ``tap(batch)`` with every batch the dispatcher takes, stamped, in
        sequence order, before any handler sees it; returns a remover.

        For observers of everything (the event-log recorder): one call per
        batch instead of one per event, and no timing or deadline. A tap that
        raises is logged and removed; it must not block.
        """
        self._taps.append(tap)
        return lambda: self._taps.remove(tap) if tap in self._taps else None

    @property
    def period_end(self) -> float:
        """When the current health-check period ends, on the bus clock.

        A replay waits for the bus to go idle before moving a virtual clock
        past it, so every event is accounted to the period it belongs to.
        """
        return self._period_end

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(self._subs)

    def _route(self, event_type: type[Event]) -> tuple[Subscription, ...]:
        subs = tuple(s for s in self._subs if issubclass(event_type, s.types))
        self._routes[event_type] = subs
        if any(s.barrier for s in subs):
            self._barriers.add(event_type)
        else:
            self._barriers.discard(event_type)
        return subs

    # --- publishing ------------------------------------------------------------

    async def publish(self, event: Event) -> None:
        """Accept ``event``; waits while the inbox is full. Delivery happens in
        the dispatcher: ``await wait_idle()`` to know it is done."""
        if len(self._inbox) >= self.buffer:
            await self._wait_room()
        self._accept(event)

    def publish_nowait(self, event: Event) -> None:
        """Accept ``event`` or raise ``BusFull``; never drops it silently."""
        if len(self._inbox) >= self.buffer:
            raise BusFull(f"the bus inbox is full ({self.buffer} events waiting)")
        self._accept(event)

    def _accept(self, event: Event) -> None:
        try:
            if event.seq >= 0:
                raise ValueError(f"{type(event).__name__} seq={event.seq} was already published")
        except AttributeError:
            raise TypeError(f"only Event instances can be published, got {event!r}") from None
        if not self._open:
            raise BusClosed(
                "the bus is closed"
                if self._tg is not None
                else "the bus is not running: use `async with EventBus() as bus`"
            )
        self._inbox.append(event)
        if self._sleeping:
            self._sleeping = False
            self._wake.set()

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
        if not derived and len(self._inbox) >= self._emit_limit:
            raise BusFull(
                f"emit: the bus inbox holds {len(self._inbox)} events, its limit for "
                f"emitted events; does a handler emit more events than it receives?"
            )
        self._emit(event)

    def _emit(self, event: Event) -> None:
        """The bus's own diagnostics: a bounded number per event handled, never refused."""
        if self._open or self._closing:
            self._inbox.append(event)
            if self._sleeping:
                self._sleeping = False
                self._wake.set()

    def _refuse_wait_in_handler(self, what: str) -> None:
        """A handler waiting for the bus would wait for itself until its deadline."""
        if anyio.get_current_task().id in self._task_ids:
            raise RuntimeError(
                f"{what} called from a handler would wait for the handler itself to "
                "finish; from a handler, publish with bus.emit(event), which never waits"
            )

    async def _wait_room(self) -> None:
        if self._open:
            self._refuse_wait_in_handler("a publish() that must wait for room")
        while len(self._inbox) >= self.buffer:
            if not self._open:
                return  # _accept raises the right error
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()

    async def wait_idle(self) -> None:
        """Return once every accepted event has been fully handled.

        Not from a handler (``RuntimeError``): the bus is not idle while the
        handler that waits runs.
        """
        if not self._is_idle():
            self._refuse_wait_in_handler("wait_idle()")
        while not self._is_idle():
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    def _is_idle(self) -> bool:
        if self._inbox or self._dispatching:
            return False
        return all(s.lane is None or not s.lane.queued for s in self._subs)

    def _maybe_idle(self) -> None:
        if self._idle is not None and self._is_idle():
            self._idle.set()
            self._idle = None

    def _undelivered(self) -> int:
        """Deliveries not made: in the inbox, in the dispatcher's batch, queued in
        lanes, and left in a runner's batch when it was stopped."""
        count = self._in_hand + sum(len(self._route(type(e))) for e in self._inbox)
        count += sum(guard.pending for guard in self._guards)
        return count + sum(len(s.lane.queue) for s in self._subs if s.lane is not None)

    # --- dispatching -------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        inbox = self._inbox
        routes = self._routes
        while True:
            if not inbox:
                self._dispatching = False
                self._sleeping = True
                self._wake = anyio.Event()
                self._maybe_idle()
                await self._wake.wait()
                continue
            self._dispatching = True
            if len(inbox) <= MAX_BATCH:
                batch = list(inbox)
                inbox.clear()
            else:
                batch = [inbox.popleft() for _ in range(MAX_BATCH)]
            if self._room is not None:
                self._room.set()
                self._room = None
            now = self._now()
            if now >= self._period_end:
                self._roll_period(now)
            seq = self._seq
            for event in batch:
                force_setattr(event, "seq", seq)
                if not event.time:  # a publisher (a replay) may bring its own time
                    force_setattr(event, "time", now)
                seq += 1
            self._seq = seq
            if self._taps:
                self._run_taps(batch)
            segments: list[tuple[tuple[Subscription, ...], list[Event]]] = []
            for event_type, group in groupby(batch, type):
                subs = routes.get(event_type)
                if subs is None:
                    subs = self._route(event_type)
                if subs:
                    events = list(group)
                    if event_type in self._barriers:
                        segments.extend((subs, [event]) for event in events)
                    else:
                        segments.append((subs, events))
                    self._in_hand += len(subs) * len(events)
            for subs, events in segments:
                for sub in subs:
                    if sub.lane is not None:
                        await sub.lane.put(events)
                    else:
                        self._in_hand -= len(events)
                        await self._run(sub, events, self._dispatch_guard)
            if inbox:
                # More came in while this batch was handled (handlers emit): let the
                # other tasks run before the next batch, so that no chain of events
                # can starve them.
                await anyio.lowlevel.checkpoint()

    def _run_taps(self, batch: list[Event]) -> None:
        for tap in tuple(self._taps):
            try:
                tap(batch)
            except BaseException as exc:
                if isinstance(exc, FATAL):
                    self._failed_by(exc)
                    continue
                _log.error("event tap failed and was removed", tap=repr(tap), error=describe(exc))
                if tap in self._taps:
                    self._taps.remove(tap)

    async def _run(self, sub: Subscription, events: list[Event], guard: Guard) -> None:
        """Deliver ``events`` to one handler, in order, timed and guarded."""
        if sub.state != "normal" or not sub.active:
            if sub.state == "coalescing" and sub.active:
                events = newest_per_type(events, sub)
            else:
                sub.skipped += len(events)
                sub.p_skipped += len(events)
                return
        if sub.blocking:
            await self._run_blocking(sub, events, guard)
        elif sub.is_async:
            await self._run_async(sub, events, guard)
        else:
            returned = (
                self._run_sync_timed(sub, events)
                if sub.per_call
                else self._run_sync_batch(sub, events)
            )
            if returned is not None:
                await self._adopt_coroutine(sub, events, *returned, guard)

    async def _adopt_coroutine(
        self,
        sub: Subscription,
        events: list[Event],
        index: int,
        coroutine: Coroutine[Any, Any, Any],
        guard: Guard,
    ) -> None:
        """A plain sync handler returned a coroutine (``lambda e: upload(e)``).

        Dropped, it would never run while the call counted as delivered. It is
        awaited instead, under the async handlers' deadline, and so is every
        later call of that handler (one warning says to declare it ``async``).
        """
        _log.warning(
            "sync handler returned a coroutine: it is awaited from now on; "
            "declare the handler `async def` to say so",
            handler=sub.name,
        )
        call = sub.handler
        first: list[Coroutine[Any, Any, Any]] = [coroutine]

        async def awaiting(event: Event) -> None:
            result = first.pop() if first else call(event)
            if inspect.iscoroutine(result):
                await result

        sub.handler = awaiting
        sub.is_async = True
        await self._run_async(sub, events[index:], guard)

    def _run_sync_timed(self, sub: Subscription, events: list[Event]) -> _Returned | None:
        """Returns where a call returned a coroutine (the rest is not run here)."""
        fn = sub.handler
        clock = self._now
        timeout = sub.timeout
        calls = len(events)
        longest = total = 0.0
        returned = None
        t0 = clock()
        for event in events:
            try:
                result = fn(event)
                if result is not None and type(result) is CoroutineType:
                    calls = _index_of(events, event)
                    returned = (calls, result)
                    total += clock() - t0
                    break
            except BaseException as exc:
                if self._handler_raised(sub, event, exc, events, _index_of(events, event)):
                    calls = _index_of(events, event) + 1
                    total += clock() - t0
                    break
            t1 = clock()
            elapsed = t1 - t0
            t0 = t1
            total += elapsed
            if elapsed > longest:
                longest = elapsed
            if elapsed > timeout and self._timed_out(sub, event, elapsed, "overrun"):
                calls = _index_of(events, event) + 1
                self._skip_rest(sub, len(events) - calls)
                break
        self._account(sub, calls, total, longest, timed_per_call=True)
        return returned

    def _run_sync_batch(self, sub: Subscription, events: list[Event]) -> _Returned | None:
        """Returns where a call returned a coroutine (the rest is not run here)."""
        fn = sub.handler
        calls = len(events)
        returned = None
        t0 = self._now()
        for event in events:
            try:
                result = fn(event)
                if result is not None and type(result) is CoroutineType:
                    calls = _index_of(events, event)
                    returned = (calls, result)
                    break
            except BaseException as exc:
                if self._handler_raised(sub, event, exc, events, _index_of(events, event)):
                    calls = _index_of(events, event) + 1
                    break
        total = self._now() - t0
        if calls and total > sub.timeout:
            self._timed_out(sub, events[calls - 1], total, "overrun", calls)
        # Per-batch timing knows only the mean: it stands in for the longest call.
        self._account(sub, calls, total, total / calls if calls else 0.0, timed_per_call=False)
        return returned

    def _account(
        self, sub: Subscription, calls: int, total: float, longest: float, *, timed_per_call: bool
    ) -> None:
        """Add one batch's figures; decide how the handler's next calls are timed."""
        sub.calls += calls
        sub.p_calls += calls
        sub.p_total += total
        if longest > sub.p_max:
            sub.p_max = longest
        if timed_per_call:
            sub.fine_calls += calls
            sub.fine_total += total
            if sub.fine_calls >= CALIBRATION_CALLS:
                sub.per_call = sub.fine_total / sub.fine_calls >= FAST_CALL
                sub.fine_calls = 0
                sub.fine_total = 0.0
        elif calls and total / calls >= FAST_CALL:
            sub.per_call = True

    async def _run_async(self, sub: Subscription, events: list[Event], guard: Guard) -> None:
        fn = sub.handler
        clock = self._now
        n = len(events)
        calls = i = 0
        longest = total = 0.0
        guard.pending = n
        try:
            while i < n:
                with anyio.CancelScope() as scope:
                    guard.sub = sub
                    guard.scope = scope
                    if self._watchdog_wake is not None:
                        self._watchdog_wake.set()
                        self._watchdog_wake = None
                    t0 = clock()
                    while i < n:
                        event = events[i]
                        i += 1
                        calls += 1
                        guard.progress += 1
                        try:
                            await fn(event)
                        except BaseException as exc:
                            if self._handler_raised(sub, event, exc, events, i - 1):
                                i = n
                        t1 = clock()
                        elapsed = t1 - t0
                        t0 = t1
                        total += elapsed
                        if elapsed > longest:
                            longest = elapsed
                guard.sub = guard.scope = None
                if scope.cancelled_caught:
                    elapsed = clock() - t0
                    total += elapsed
                    if elapsed > longest:
                        longest = elapsed
                    if self._timed_out(sub, events[i - 1], elapsed, "cancelled"):
                        self._skip_rest(sub, n - i)
                        break
            guard.pending = 0
        finally:
            # Also when the bus is stopped mid-batch: the calls made are counted,
            # and the events not reached stay pending (abandoned, in the close report).
            guard.sub = guard.scope = None
            if guard.pending:
                guard.pending = n - calls
            self._account(sub, calls, total, longest, timed_per_call=True)

    async def _watchdog(self) -> None:
        """Cancels async calls that overran their deadline (real time).

        A call counts as stuck when its runner's progress counter has not moved
        for its timeout; the tolerance is one tick (at most 50 ms).
        """
        current_time = anyio.current_time
        while True:
            active = [g for g in self._guards if g.scope is not None]
            if not active:
                self._watchdog_wake = anyio.Event()
                await self._watchdog_wake.wait()
                continue
            now = current_time()
            tick = 0.05
            for guard in active:
                sub, scope = guard.sub, guard.scope
                assert sub is not None and scope is not None
                if guard.progress != guard.seen_progress or guard.seen_scope is not scope:
                    guard.seen_progress = guard.progress
                    guard.seen_scope = scope
                    guard.seen_at = now
                elif now - guard.seen_at >= sub.timeout:
                    scope.cancel()
                    guard.seen_at = math.inf
                tick = min(tick, sub.timeout / 10)
            await anyio.sleep(tick)

    async def _run_blocking(self, sub: Subscription, events: list[Event], guard: Guard) -> None:
        clock = self._now
        n = len(events)
        calls = 0
        longest = total = 0.0
        guard.pending = n
        try:
            for i, event in enumerate(events):
                calls += 1
                t0 = clock()
                call = _ThreadCall(sub.handler, event)
                with anyio.move_on_after(sub.timeout) as scope:
                    try:
                        await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True)
                    except BaseException as exc:
                        if self._handler_raised(sub, event, exc, events, i):
                            break
                if scope.cancelled_caught:
                    call.abandon()
                elapsed = clock() - t0
                total += elapsed
                if elapsed > longest:
                    longest = elapsed
                if scope.cancelled_caught and self._timed_out(sub, event, elapsed, "abandoned"):
                    self._skip_rest(sub, n - i - 1)
                    break
            guard.pending = 0
        finally:
            if guard.pending:
                guard.pending = n - calls
            self._account(sub, calls, total, longest, timed_per_call=True)

    # --- faults ------------------------------------------------------------------

    def _handler_raised(
        self, sub: Subscription, event: Event, exc: BaseException, events: list[Event], index: int
    ) -> bool:
        """A handler call raised ``exc``: whose is it?

        A cancellation the bus asked for (a deadline, the bus stopping) is
        re-raised, for the scope that asked. ``KeyboardInterrupt`` and
        ``SystemExit`` end the run: the call is recorded as failed, the handler
        is disabled and the bus's owner is told. Anything else, a stray
        cancellation included, is the handler's fault. True when the handler
        must get no more of ``events``.
        """
        if is_requested_cancel(exc):
            raise exc
        if isinstance(exc, FATAL):
            self._fault(sub, event, exc, events, index, policy=False)
            self._skip_rest(sub, len(events) - index - 1)
            self._set_state(sub, "disabled", f"raised {type(exc).__name__}: the run ends")
            self._failed_by(exc)
            return True
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            forgive_foreign_cancel()
        return self._fault(sub, event, exc, events, index)

    def _fault(
        self,
        sub: Subscription,
        event: Event,
        exc: BaseException,
        events: list[Event],
        index: int,
        *,
        policy: bool = True,
    ) -> bool:
        """Record a handler failure; True when the handler must get no more of ``events``."""
        sub.failed += 1
        sub.p_faults += 1
        if sub.p_faults == 1:  # once per period: the budget report has the count
            _log.warning(
                "handler failed",
                handler=sub.name,
                event_type=type(event).__name__,
                event_seq=event.seq,
                error=describe(exc),
            )
        if not isinstance(event, _DIAGNOSTICS):  # a failing diagnostic handler must not loop
            self._emit(
                HandlerFailed(
                    handler=sub.name,
                    event_seq=event.seq,
                    event_type=type(event).__name__,
                    error_type=type(exc).__qualname__,
                    message=safe_str(exc),
                    traceback=format_traceback(exc),
                )
            )
        if not policy:
            return True
        stop = self._apply_error_policy(sub, exc)
        if stop:
            self._skip_rest(sub, len(events) - index - 1)
        return stop

    def _apply_error_policy(self, sub: Subscription, exc: BaseException) -> bool:
        sub.faults += 1
        if sub.on_error == "raise":
            if self._on_failure is not None:  # the run fails; the others still get their events
                self._set_state(sub, "disabled", "on_error='raise': it failed the run")
            self._failed_by(exc)
            return True
        if sub.on_error == "disable" and sub.faults >= sub.max_faults:
            self._set_state(sub, "disabled", f"{sub.faults} faults (max_faults={sub.max_faults})")
            return True
        return False

    def _timed_out(
        self,
        sub: Subscription,
        event: Event,
        elapsed: float,
        outcome: Literal["cancelled", "abandoned", "overrun"],
        calls: int = 1,
    ) -> bool:
        """Record a call past its deadline; True when the handler must get no more events."""
        sub.timed_out += 1
        sub.p_timeouts += 1
        if sub.p_timeouts == 1:  # once per period: the budget report has the count
            _log.warning(
                "handler timed out",
                handler=sub.name,
                event_seq=event.seq,
                timeout=sub.timeout,
                elapsed=round(elapsed, 6),
                outcome=outcome,
                calls=calls,
            )
        if not isinstance(event, _DIAGNOSTICS):
            self._emit(
                HandlerTimedOut(
                    handler=sub.name,
                    event_seq=event.seq,
                    event_type=type(event).__name__,
                    timeout=sub.timeout,
                    elapsed=elapsed,
                    outcome=outcome,
                    calls=calls,
                    advice=_OVERRUN_ADVICE if outcome == "overrun" else "",
                )
            )
        return self._apply_error_policy(
            sub, TimeoutError(f"{sub.name} took {elapsed:.3f}s, deadline {sub.timeout}s")
        )

    def _skip_rest(self, sub: Subscription, count: int) -> None:
        if count > 0:
            sub.skipped += count
            sub.p_skipped += count

    def _set_state(self, sub: Subscription, state: HandlerState, reason: str) -> None:
        if sub.state == state:
            return
        sub.state = state
        sub.state_reason = reason
        if state == "normal":
            sub.faults = 0
        _log.warning("handler state changed", handler=sub.name, state=state, reason=reason)
        self._emit(HandlerStateChanged(handler=sub.name, state=state, reason=reason))

    # --- health-check periods and budgets ----------------------------------------------

    def _on_clock_moved(self, now: float) -> None:
        if now >= self._period_end and (self._open or self._closing):
            self._roll_period(now)

    async def _period_ticker(self) -> None:
        """Ends periods while nothing is published (the dispatcher ends them otherwise)."""
        while True:
            end = self._period_end
            await self.clock.sleep_until(end)
            if self._period_end == end:
                self._roll_period(self._now())

    def _roll_period(self, now: float) -> None:
        """Close every period that ended by ``now``: one tick and one budget report each."""
        while now >= self._period_end:
            start, end = self._period_start, self._period_end
            self._emit(HealthCheckTick(period=self._period_index, start=start, end=end))
            self._emit(self._budget_report(start, end))
            self._period_index += 1
            self._period_start = end
            self._period_end = end + self.period

    def _budget_report(self, start: float, end: float, *, partial: bool = False) -> BudgetReport:
        report, over = close_period(
            self._subs,
            self._period_index,
            start,
            end,
            self.budget,
            period=self.period,
            partial=partial,
        )
        if not partial:  # at close, a policy would change nothing
            for sub in self._subs:
                self._apply_budget_policy(sub, sub in over)
        if report.over_budget or report.total > report.budget:
            worst = sorted(report.handlers, key=lambda u: u.total, reverse=True)[:3]
            _log.warning(
                "callbacks over budget",
                period=report.period,
                total=round(report.total, 6),
                budget=round(report.budget, 6),
                worst={u.handler: round(u.total, 6) for u in worst},
            )
        return report

    def _apply_budget_policy(self, sub: Subscription, is_over: bool) -> None:
        if is_over and sub.over_budget != "warn" and sub.state == "normal":
            state: HandlerState = "coalescing" if sub.over_budget == "coalesce" else "disabled"
            self._set_state(sub, state, "over budget")
        elif not is_over and sub.state != "normal" and sub.state_reason == "over budget":
            self._set_state(sub, "normal", "back under budget")

    # --- figures -------------------------------------------------------------------

    def stats(self) -> BusStats:
        subs = tuple(s.stats() for s in self._subs)
        return BusStats(
            published=self._seq + len(self._inbox),
            delivered=sum(s.calls for s in subs),
            failed=sum(s.failed for s in subs),
            timed_out=sum(s.timed_out for s in subs),
            skipped=sum(s.skipped for s in subs),
            queued=len(self._inbox) + self._in_hand + sum(s.queued for s in subs),
            abandoned=self._abandoned,
            subscriptions=subs,
        )


class _ThreadCall:
    """A blocking handler's call in a worker thread, which its deadline may abandon.

    Abandoned before its thread started, it never runs: run late, it would
    overtake nothing but could be overtaken, breaking the handler's order.
    Abandoned while running, it runs on in its thread (it cannot be stopped).
    """

    __slots__ = ("event", "handler", "lock", "state")

    def __init__(self, handler: Callable[[Any], Any], event: Event) -> None:
        self.handler = handler
        self.event = event
        self.lock = threading.Lock()
        self.state = "waiting"

    def run(self) -> None:
        with self.lock:
            if self.state == "abandoned":
                return
            self.state = "running"
        result = self.handler(self.event)
        if type(result) is CoroutineType:
            result.close()
            raise TypeError(
                "a blocking=True handler returned a coroutine, which cannot run in its "
                "worker thread; make the handler `async def` (without blocking=True)"
            )

    def abandon(self) -> None:
        with self.lock:
            self.state = "abandoned"


#: Where a sync handler returned a coroutine: the index of that call, and the coroutine.
_Returned = tuple[int, Coroutine[Any, Any, Any]]


def _index_of(events: list[Event], event: Event) -> int:
    """Position of ``event`` itself (not an equal one); only on the rare fault path."""
    return next(i for i, e in enumerate(events) if e is event)
