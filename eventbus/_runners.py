"""Calling one handler with a batch of events: timed, deadline-guarded, in order.

Each task that calls handlers (the dispatcher, each lane) has its own
``Runner``. Handlers are timed with one clock read per call, or one per
batch once they have proved to cost less than a clock read. Plain sync
handlers cannot be interrupted, so an overrun is reported. Async handlers
run under one cancel scope per batch that the watchdog cancels when the call
in progress overruns (it reads the progress off the batch's iterator).
Blocking sync handlers run in a worker thread, abandoned at their deadline.
A sync handler that returns a coroutine is awaited, from then on as an async
handler.

The loops are as tight as a plain ``for`` loop: locals only, figures added
once per batch, the fault policy consulted only when something went wrong.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Coroutine
from operator import length_hint
from types import CoroutineType
from typing import Any

import anyio
import anyio.to_thread

from ._events import Event
from ._logging import get_logger
from ._policy import Policy
from ._subscription import Figures, Subscription
from ._watchdog import Guard

__all__ = ["Runner", "ThreadCall", "newest_per_type"]

_log = get_logger("eventbus")

#: Where a sync handler returned a coroutine: the index of that call, and the coroutine.
_Returned = tuple[int, Coroutine[Any, Any, Any]]


class Runner:
    """Delivers batches to handlers for one task (the dispatcher, or one lane).

    ``pending`` counts the events of the batch being run that are neither
    handled nor skipped yet: when the bus is stopped mid-batch, they are the
    ones reported as not delivered.
    """

    __slots__ = ("_guard", "_now", "_policy", "pending")

    def __init__(self, now: Callable[[], float], policy: Policy, guard: Guard) -> None:
        self._now = now
        self._policy = policy
        self._guard = guard
        self.pending = 0

    def close(self) -> None:
        """This runner's task is over: the watchdog can forget it."""
        self._guard.release()

    async def run(self, sub: Subscription, events: list[Event]) -> None:
        """Deliver ``events`` to one handler, in order, timed and guarded."""
        if sub.state != "normal" or not sub.active:
            if sub.state == "coalescing" and sub.active:
                events = newest_per_type(events, sub.figures)
            else:
                sub.figures.skip(len(events))
                return
        if sub.blocking:
            await self._run_blocking(sub, events)
        elif sub.is_async:
            await self._run_async(sub, events, timed_per_call=sub.figures.per_call)
        else:
            returned = (
                self._run_sync_timed(sub, events)
                if sub.figures.per_call
                else self._run_sync_batch(sub, events)
            )
            if returned is not None:
                await self._adopt_coroutine(sub, events, *returned)

    async def _adopt_coroutine(
        self,
        sub: Subscription,
        events: list[Event],
        index: int,
        coroutine: Coroutine[Any, Any, Any],
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

        sub.make_async(awaiting)
        await self._run_async(sub, events[index:], timed_per_call=True)

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
                if self._policy.raised(sub, event, exc, events, _index_of(events, event)):
                    calls = _index_of(events, event) + 1
                    total += clock() - t0
                    break
            t1 = clock()
            elapsed = t1 - t0
            t0 = t1
            total += elapsed
            if elapsed > longest:
                longest = elapsed
            if elapsed > timeout and self._policy.timed_out(sub, event, elapsed, "overrun"):
                calls = _index_of(events, event) + 1
                self._policy.skip_rest(sub, len(events) - calls)
                break
        sub.figures.add_batch(calls, total, longest, timed_per_call=True)
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
                if self._policy.raised(sub, event, exc, events, _index_of(events, event)):
                    calls = _index_of(events, event) + 1
                    break
        total = self._now() - t0
        if calls and total > sub.timeout:
            self._policy.timed_out(sub, events[calls - 1], total, "overrun", calls)
        # Per-batch timing knows only the mean: it stands in for the longest call.
        longest = total / calls if calls else 0.0
        sub.figures.add_batch(calls, total, longest, timed_per_call=False)
        return returned

    async def _run_async(
        self, sub: Subscription, events: list[Event], *, timed_per_call: bool
    ) -> None:
        """Await the handler for each event, under one cancel scope for the batch.

        Timed per call until the handler proves cheap, then once per batch.
        The watchdog reads the progress off the iterator the loop takes the
        events from, and cancels the scope when a call overruns; the calls
        then go on with the next event in a new scope, unless the policy says
        stop. Timed per batch, an overrun's time is the batch's so far.
        """
        fn = sub.handler
        clock = self._now
        guard = self._guard
        policy = self._policy
        n = len(events)
        remaining = iter(events)
        longest = total = 0.0
        t0 = 0.0
        counting = False  # time since t0 is not added to total yet
        self.pending = n
        try:
            while True:
                with anyio.CancelScope() as scope:
                    guard.watch(scope, sub.timeout, remaining)
                    t0 = clock()
                    counting = True
                    # Two loops, not a test per call: the second is the floor's own loop.
                    if timed_per_call:
                        for event in remaining:
                            try:
                                await fn(event)
                            except BaseException as exc:
                                index = n - length_hint(remaining) - 1
                                if policy.raised(sub, event, exc, events, index):
                                    break
                            t1 = clock()
                            elapsed = t1 - t0
                            t0 = t1
                            total += elapsed
                            if elapsed > longest:
                                longest = elapsed
                    else:
                        for event in remaining:
                            try:
                                await fn(event)
                            except BaseException as exc:
                                index = n - length_hint(remaining) - 1
                                if policy.raised(sub, event, exc, events, index):
                                    break
                # The guard still names this scope: harmless, as it is no longer
                # awaited; the next scope replaces it, and ``finally`` clears it.
                elapsed = clock() - t0
                counting = False
                total += elapsed
                if not scope.cancelled_caught:
                    break
                if elapsed > longest:
                    longest = elapsed
                index = n - length_hint(remaining) - 1
                if policy.timed_out(sub, events[index], elapsed, "cancelled"):
                    policy.skip_rest(sub, length_hint(remaining))
                    break
            self.pending = 0
        finally:
            # Also when the bus is stopped mid-batch: the calls made are counted,
            # and the events not reached stay pending (abandoned, in the close report).
            guard.done()
            if counting:
                total += clock() - t0
            calls = n - length_hint(remaining)
            if self.pending:
                self.pending = n - calls
            if not timed_per_call and calls:
                # Per-batch timing knows only the mean: it stands in for the longest call.
                longest = max(longest, total / calls)
            sub.figures.add_batch(calls, total, longest, timed_per_call=timed_per_call)

    async def _run_blocking(self, sub: Subscription, events: list[Event]) -> None:
        clock = self._now
        policy = self._policy
        n = len(events)
        calls = 0
        longest = total = 0.0
        self.pending = n
        try:
            for i, event in enumerate(events):
                calls += 1
                t0 = clock()
                call = ThreadCall(sub.handler, event)
                with anyio.move_on_after(sub.timeout) as scope:
                    try:
                        await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True)
                    except BaseException as exc:
                        if policy.raised(sub, event, exc, events, i):
                            break
                if scope.cancelled_caught:
                    call.abandon()
                elapsed = clock() - t0
                total += elapsed
                if elapsed > longest:
                    longest = elapsed
                if scope.cancelled_caught and policy.timed_out(sub, event, elapsed, "abandoned"):
                    policy.skip_rest(sub, n - i - 1)
                    break
            self.pending = 0
        finally:
            if self.pending:
                self.pending = n - calls
            sub.figures.add_batch(calls, total, longest, timed_per_call=True)


class ThreadCall:
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


def newest_per_type(events: list[Event], figures: Figures) -> list[Event]:
    """Coalescing: keep only the newest event of each type, counting the rest as skipped."""
    newest: dict[type[Event], Event] = {}
    for event in events:
        newest[type(event)] = event
    kept = sorted(newest.values(), key=lambda e: e.seq)
    figures.skip(len(events) - len(kept))
    return kept


def _index_of(events: list[Event], event: Event) -> int:
    """Position of ``event`` itself (not an equal one); only on the rare fault path."""
    return next(i for i, e in enumerate(events) if e is event)
