"""The watchdog: one task that cancels async handler calls past their deadline, a scope
per batch (docs/performance.md), each runner's ``Guard`` saying which call it is in."""

from __future__ import annotations

import math
from collections.abc import Callable

import anyio

__all__ = ["Guard", "Watchdog"]

#: The watchdog looks at least this often while a call is watched (seconds).
_LONGEST_TICK = 0.05


class Guard:
    """What one runner is awaiting: ``call``, the index of its current call in the batch."""

    __slots__ = (
        "_notify",
        "_release",
        "_scope",
        "_seen_at",
        "_seen_call",
        "_seen_scope",
        "_timeout",
        "call",
    )

    def __init__(self, notify: Callable[[], None], release: Callable[[Guard], None]) -> None:
        self._notify = notify
        self._release = release
        self._scope: anyio.CancelScope | None = None
        self._timeout = math.inf
        self.call = 0
        # What the watchdog saw at its last look, and since when (its real time).
        self._seen_scope: anyio.CancelScope | None = None
        self._seen_call = -1
        self._seen_at = 0.0

    def watch(self, scope: anyio.CancelScope, timeout: float) -> None:
        """The runner awaits calls under ``scope``; each may take ``timeout`` seconds."""
        self._scope = scope
        self._timeout = timeout
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
        if self.call != self._seen_call or self._seen_scope is not scope:
            self._seen_call = self.call
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
    """Cancels async calls that overran their deadline (real time, within one tick)."""

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
