"""The watchdog: one task that cancels async handler calls past their deadline.

Entering a cancel scope costs more than most handler calls (DESIGN.md §10),
so a runner enters one scope per batch and tells its ``Guard`` about it; the
watchdog looks at the guards a few times per deadline and cancels a scope
whose runner has made no progress for the handler's timeout.

A runner's side is two steps: ``watch(scope, timeout, calls)`` before it
awaits calls under ``scope``, taking each event from the iterator ``calls``,
and ``done()`` when it leaves the scope. Progress is read from the iterator
itself (how many events it has left), so the hot loop pays nothing for it.
What the watchdog remembers between looks is the guard's own business.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from operator import length_hint

import anyio

__all__ = ["Guard", "Watchdog"]

#: The watchdog looks at least this often while a call is watched (seconds).
_LONGEST_TICK = 0.05


class Guard:
    """What one runner (the dispatcher, or one lane) is awaiting, for the watchdog."""

    __slots__ = (
        "_calls",
        "_notify",
        "_release",
        "_scope",
        "_seen_at",
        "_seen_progress",
        "_seen_scope",
        "_timeout",
    )

    def __init__(self, notify: Callable[[], None], release: Callable[[Guard], None]) -> None:
        self._notify = notify
        self._release = release
        self._scope: anyio.CancelScope | None = None
        self._timeout = math.inf
        self._calls: Iterator[object] = iter(())
        self._seen_scope: anyio.CancelScope | None = None
        self._seen_progress = -1
        self._seen_at = 0.0

    def watch(self, scope: anyio.CancelScope, timeout: float, calls: Iterator[object]) -> None:
        """The runner awaits calls under ``scope``, one per item it takes from ``calls``;
        each may take ``timeout`` seconds."""
        self._scope = scope
        self._timeout = timeout
        self._calls = calls
        self._notify()

    def done(self) -> None:
        """The runner left the scope: nothing to watch."""
        self._scope = None

    @property
    def watching(self) -> bool:
        return self._scope is not None

    def check(self, now: float) -> float:
        """Cancel the scope if the runner is stuck in one call; how soon to look again."""
        scope = self._scope
        if scope is None:
            return _LONGEST_TICK
        progress = length_hint(self._calls)  # what is left: it shrinks as calls start
        if progress != self._seen_progress or self._seen_scope is not scope:
            self._seen_progress = progress
            self._seen_scope = scope
            self._seen_at = now
        elif now - self._seen_at >= self._timeout:
            scope.cancel()
            self._seen_at = math.inf
        return self._timeout / 10

    def release(self) -> None:
        """The runner is gone (its lane ended): stop looking at this guard."""
        self._release(self)


class Watchdog:
    """Cancels async calls that overran their deadline (real time).

    A call counts as stuck when its runner has taken no new event for its
    timeout; the tolerance is one tick (at most 50 ms). With nothing
    watched, the watchdog sleeps until a guard starts watching.
    """

    __slots__ = ("_guards", "_wake")

    def __init__(self) -> None:
        self._guards: list[Guard] = []
        self._wake: anyio.Event | None = None

    def guard(self) -> Guard:
        """A new runner's guard."""
        guard = Guard(self._notify, self._guards.remove)
        self._guards.append(guard)
        return guard

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def run(self) -> None:
        current_time = anyio.current_time
        while True:
            active = [guard for guard in self._guards if guard.watching]
            if not active:
                self._wake = anyio.Event()
                await self._wake.wait()
                continue
            now = current_time()
            tick = _LONGEST_TICK
            for guard in active:
                tick = min(tick, guard.check(now))
            await anyio.sleep(tick)
