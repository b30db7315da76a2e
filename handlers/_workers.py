"""The worker tasks of a run: counted from when they are scheduled, cancelled together.

A run must not finish while a worker it started has yet to run, and ending a
run must reach every worker, also one that starts after the ending began.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio

__all__ = ["WorkerTasks"]


class WorkerTasks:
    """Counts a run's workers and cancels them all at once.

    A worker counts from when it is scheduled, not from when it runs: the run
    must not finish in between. Once ``cancel_all`` was called, a worker that
    starts afterwards is cancelled at once.
    """

    def __init__(self) -> None:
        self._scopes: set[anyio.CancelScope] = set()
        self._cancelled = False
        self._active = 0
        self._done: anyio.Event | None = None

    def scheduled(self) -> None:
        self._active += 1
        if self._done is None or self._done.is_set():
            self._done = anyio.Event()

    @contextmanager
    def running(self) -> Iterator[None]:
        """Run one scheduled worker under a scope ``cancel_all`` reaches; it ends on exit."""
        try:
            with anyio.CancelScope() as scope:
                self._scopes.add(scope)
                if self._cancelled:
                    scope.cancel()
                try:
                    yield
                finally:
                    self._scopes.discard(scope)
        finally:
            self._active -= 1
            if self._active == 0 and self._done is not None:
                self._done.set()

    def cancel_all(self) -> None:
        self._cancelled = True
        for scope in list(self._scopes):
            scope.cancel()

    async def wait_all(self) -> None:
        """Return once every scheduled worker has ended."""
        if self._done is not None:
            await self._done.wait()
