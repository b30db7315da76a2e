"""Calling one handler with a batch of events: timed, deadline-guarded, in order. A handler
proved cheaper than a clock read has its batches timed as a whole."""

from __future__ import annotations

import inspect
import math
import threading
from collections.abc import Callable, Coroutine
from types import CoroutineType
from typing import Any

import anyio
import anyio.to_thread

from ._events import Event
from ._holds import LoopHolds
from ._logging import get_logger
from ._observers import CallObservers, CallOutcome, HandlerCall, noted
from ._policy import Policy
from ._subscription import Counters, Subscription
from ._watchdog import Guard

__all__ = ["Runner", "ThreadCall", "newest_per_type"]

_log = get_logger("eventbus")

#: A sync handler returned a coroutine: the index of that call, and the coroutine.
_CoroutineReturned = tuple[int, Coroutine[Any, Any, Any]]
#: No observer's threshold: no call is long enough.
_NONE = math.inf


class Runner:
    """Delivers batches to handlers for one task (the dispatcher, or one lane); ``pending``:
    events of the batch neither handled nor skipped yet."""

    __slots__ = ("_guard", "_holds", "_now", "_observers", "_policy", "pending")

    def __init__(
        self,
        now: Callable[[], float],
        policy: Policy,
        guard: Guard,
        observers: CallObservers,
        holds: LoopHolds,
    ) -> None:
        self._now = now
        self._policy = policy
        self._guard = guard
        self._observers = observers
        #: An awaited call is charged its time less the workers' time in the loop meanwhile.
        self._holds = holds
        self.pending = 0

    def close(self) -> None:
        """Tell the watchdog to forget this runner: its task is over."""
        self._guard.release()

    def run(self, sub: Subscription, events: list[Event]) -> Coroutine[Any, Any, None] | None:
        """Deliver ``events`` to one handler, in order, timed and guarded: a plain sync
        handler at once (``None``), else the coroutine to await (no coroutine per batch
        of a sync handler)."""
        if sub.state != "normal" or not sub.active:
            if sub.state == "coalescing" and sub.active:
                events = newest_per_type(events, sub.counters)
            else:
                sub.counters.skip(len(events))
                return None
        if sub.blocking:
            return self._run_blocking(sub, events)
        if sub.is_async:
            return self._run_async(sub, events)
        if sub.counters.timed_per_call or self._observers.every_call:
            returned = self._run_sync(sub, events)
        else:
            returned = self._run_sync_cheap(sub, events)
        return None if returned is None else self._adopt_coroutine(sub, events, *returned)

    async def _adopt_coroutine(
        self,
        sub: Subscription,
        events: list[Event],
        index: int,
        coroutine: Coroutine[Any, Any, Any],
    ) -> None:
        """A plain sync handler returned a coroutine (``lambda e: upload(e)``): await it, and
        every later call's, under the async deadline (one warning says to declare it async)."""
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
        await self._run_async(sub, events[index:])

    def _run_sync(self, sub: Subscription, events: list[Event]) -> _CoroutineReturned | None:
        """Call a plain sync handler for each event, timing each call; returns where a call
        returned a coroutine (for ``_adopt_coroutine``)."""
        fn = sub.handler
        clock = self._now
        policy = self._policy
        timeout = sub.timeout
        watch = self._observers.min_seconds
        # One comparison per call: with the lower of the two.
        limit = watch if watch < timeout else timeout
        calls = len(events)
        longest = 0.0
        returned = None
        notes: list[HandlerCall] | None = None
        start = t0 = clock()
        for event in events:
            try:
                result = fn(event)
            except BaseException as exc:
                index = _index_of(events, event)
                stop = policy.handler_raised(sub, event, exc, events, index)
                t1 = clock()
                elapsed = t1 - t0
                t0 = t1
                if elapsed > longest:
                    longest = elapsed
                if watch != _NONE:
                    notes = noted(notes, sub, event, elapsed, t1, outcome="error", error=exc)
                if stop:
                    calls = index + 1
                    break
                if elapsed > timeout and policy.timed_out(sub, event, elapsed, "overrun"):
                    calls = index + 1
                    policy.skip_rest(sub, len(events) - calls)
                    break
                continue
            if result is not None and type(result) is CoroutineType:
                calls = _index_of(events, event)
                returned = (calls, result)
                t0 = clock()
                break
            t1 = clock()
            elapsed = t1 - t0
            t0 = t1
            if elapsed > longest:
                longest = elapsed
            if elapsed >= limit:  # past its deadline, or long enough for an observer
                overran = elapsed > timeout
                if watch != _NONE and (overran or elapsed >= watch):
                    notes = noted(
                        notes, sub, event, elapsed, t1, outcome="overrun" if overran else "ok"
                    )
                if overran and policy.timed_out(sub, event, elapsed, "overrun"):
                    calls = _index_of(events, event) + 1
                    policy.skip_rest(sub, len(events) - calls)
                    break
        sub.counters.add_batch(calls, t0 - start, longest)
        if notes is not None:
            self._observers.notify(notes)
        return returned

    def _run_sync_cheap(self, sub: Subscription, events: list[Event]) -> _CoroutineReturned | None:
        """``_run_sync`` with one clock read per batch, for a handler proved cheap."""
        fn = sub.handler
        calls = len(events)
        returned = None
        watch = self._observers.min_seconds
        failed: BaseException | None = None  # kept for an observer only (it holds a frame)
        start = self._now()
        for event in events:
            try:
                result = fn(event)
            except BaseException as exc:
                index = _index_of(events, event)
                stop = self._policy.handler_raised(sub, event, exc, events, index)
                if failed is None and watch != _NONE:
                    failed = exc
                if stop:
                    calls = index + 1
                    break
            else:
                if result is not None and type(result) is CoroutineType:
                    calls = _index_of(events, event)
                    returned = (calls, result)
                    break
        end = self._now()
        total = end - start
        overran = calls > 0 and total > sub.timeout
        if overran:
            self._policy.timed_out(sub, events[calls - 1], total, "overrun", calls)
        sub.counters.add_batch(calls, total, total / calls if calls else 0.0)
        if watch != _NONE and calls and (total >= watch or overran or failed is not None):
            outcome: CallOutcome = "error" if failed is not None else "overrun" if overran else "ok"
            self._observers.notify(
                noted(
                    None,
                    sub,
                    events[calls - 1],
                    total,
                    end,
                    outcome=outcome,
                    error=failed,
                    calls=calls,
                )
            )
        return returned

    async def _run_async(self, sub: Subscription, events: list[Event]) -> None:
        """Await the handler for each event under one cancel scope for the batch, which the
        watchdog cancels when a call overruns; the next event gets a new scope."""
        fn = sub.handler
        clock = self._now
        holds = self._holds
        guard = self._guard
        policy = self._policy
        observers = self._observers
        timed = sub.counters.timed_per_call or observers.every_call
        watch = observers.min_seconds
        notes: list[HandlerCall] | None = None
        failed: BaseException | None = None  # timed per batch, the first, for an observer
        remaining = enumerate(events)  # shared by the scopes of this batch
        index = -1  # the call in progress, then the last one made
        longest = 0.0
        self.pending = len(events)
        start = t0 = clock()
        held_at_start = h0 = holds.seconds
        try:
            while True:
                with anyio.CancelScope() as scope:
                    guard.watch(scope, sub.timeout)
                    if timed:
                        for index, event in remaining:
                            guard.call = index
                            try:
                                await fn(event)
                            except BaseException as exc:
                                stop = policy.handler_raised(sub, event, exc, events, index)
                                t1, h1 = clock(), holds.seconds
                                elapsed = t1 - t0 - (h1 - h0)
                                t0, h0 = t1, h1
                                if elapsed > longest:
                                    longest = elapsed
                                if watch != _NONE:
                                    notes = noted(
                                        notes, sub, event, elapsed, t1, outcome="error", error=exc
                                    )
                                if stop:
                                    break
                                continue
                            t1, h1 = clock(), holds.seconds
                            elapsed = t1 - t0 - (h1 - h0)
                            t0, h0 = t1, h1
                            if elapsed > longest:
                                longest = elapsed
                            if elapsed >= watch:
                                notes = noted(notes, sub, event, elapsed, t1)
                    else:  # the same loop without the clock
                        for index, event in remaining:
                            guard.call = index
                            try:
                                await fn(event)
                            except BaseException as exc:
                                stop = policy.handler_raised(sub, event, exc, events, index)
                                if failed is None and watch != _NONE:
                                    failed = exc
                                if stop:
                                    break

                if not scope.cancelled_caught:
                    break
                t1, h1 = clock(), holds.seconds
                elapsed = t1 - t0  # the call the watchdog cancelled: its deadline's time
                held, t0, h0 = h1 - h0, t1, h1
                if elapsed > longest:
                    longest = elapsed
                if watch != _NONE:
                    notes = noted(notes, sub, events[index], elapsed, t1, outcome="cancelled")
                if policy.timed_out(sub, events[index], elapsed, "cancelled", held=held):
                    policy.skip_rest(sub, len(events) - index - 1)
                    break
            self.pending = 0
        finally:
            # Also when stopped mid-batch: events not reached stay pending.
            guard.done()
            made = index + 1
            if self.pending:
                self.pending = len(events) - made
            end = clock()
            total = end - start - (holds.seconds - held_at_start)
            if not timed and made:
                longest = max(longest, total / made)
                if notes is None and watch != _NONE and (total >= watch or failed is not None):
                    outcome: CallOutcome = "ok" if failed is None else "error"
                    notes = noted(
                        None,
                        sub,
                        events[index],
                        total,
                        end,
                        outcome=outcome,
                        error=failed,
                        calls=made,
                    )
            sub.counters.add_batch(made, total, longest)
            if notes is not None:
                observers.notify(notes)

    async def _run_blocking(self, sub: Subscription, events: list[Event]) -> None:
        """Run a ``blocking=True`` handler in a worker thread per event, abandoning
        each call at its deadline (its thread runs on: it cannot be stopped)."""
        clock = self._now
        holds = self._holds
        policy = self._policy
        watch = self._observers.min_seconds
        notes: list[HandlerCall] | None = None
        n = len(events)
        calls = 0
        longest = total = 0.0
        self.pending = n
        try:
            for i, event in enumerate(events):
                calls += 1
                t0, h0 = clock(), holds.seconds
                call = ThreadCall(sub.handler, event)
                failed: BaseException | None = None
                with anyio.move_on_after(sub.timeout) as scope:
                    try:
                        await anyio.to_thread.run_sync(call.run, abandon_on_cancel=True)
                    except BaseException as exc:
                        stop = policy.handler_raised(sub, event, exc, events, i)
                        if watch != _NONE:
                            failed = exc
                        if stop:
                            if watch != _NONE:
                                t1 = clock()
                                elapsed = t1 - t0 - (holds.seconds - h0)
                                notes = noted(
                                    notes, sub, event, elapsed, t1, outcome="error", error=exc
                                )
                            break
                if scope.cancelled_caught:
                    call.abandon()
                t1 = clock()
                elapsed = t1 - t0 - (holds.seconds - h0)
                total += elapsed
                if elapsed > longest:
                    longest = elapsed
                if watch != _NONE and (
                    failed is not None or scope.cancelled_caught or elapsed >= watch
                ):
                    done: CallOutcome = "ok"
                    if failed is not None:
                        done = "error"
                    elif scope.cancelled_caught:
                        done = "abandoned"
                    notes = noted(notes, sub, event, elapsed, t1, outcome=done, error=failed)
                if scope.cancelled_caught and policy.timed_out(sub, event, elapsed, "abandoned"):
                    policy.skip_rest(sub, n - i - 1)
                    break
            self.pending = 0
        finally:
            if self.pending:
                self.pending = n - calls
            sub.counters.add_batch(calls, total, longest)
            if notes is not None:
                self._observers.notify(notes)


class ThreadCall:
    """A blocking handler's call in a worker thread, which its deadline may abandon (never
    started then, so it cannot overtake; or left running: it cannot be stopped)."""

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


def newest_per_type(events: list[Event], counters: Counters) -> list[Event]:
    """Coalescing: keep only the newest event of each type, counting the rest as skipped."""
    newest: dict[type[Event], Event] = {}
    for event in events:
        newest[type(event)] = event
    kept = sorted(newest.values(), key=lambda e: e.seq)
    counters.skip(len(events) - len(kept))
    return kept


def _index_of(events: list[Event], event: Event) -> int:
    """Where ``event`` itself (not an equal one) is in ``events``; for the rare paths."""
    return next(i for i, e in enumerate(events) if e is event)
