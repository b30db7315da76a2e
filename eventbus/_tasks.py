"""The bus's own tasks (dispatcher, watchdog, ticker, lanes), each in a cancel scope of its
own, restarted after an interrupt or a stray cancellation, so the run ends in order."""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import anyio
import anyio.abc

from ._faults import FATAL, forgive_foreign_cancel, is_requested_cancel
from ._logging import get_logger

__all__ = ["Tasks", "event_maker"]

_log = get_logger("eventbus")

#: The ``Tasks`` whose task runs the caller, or started the task that does (it inherits it).
_running_in: ContextVar[Tasks | None] = ContextVar("eventbus_task", default=None)


def event_maker() -> Callable[[], anyio.Event]:
    """What makes the running loop's ``anyio.Event``s without asking which backend runs at
    every call, as ``anyio.Event()`` does (a tenth of a trainer hook's wait for the bus)."""
    return type(anyio.Event())


class Tasks:
    """Starts, restarts and stops the bus's tasks in the bus's task group."""

    __slots__ = ("_end_run", "_ids", "_running", "_scopes", "_stopped", "_tg")

    def __init__(self, end_run: Callable[[BaseException], None]) -> None:
        self._end_run = end_run
        self._tg: anyio.abc.TaskGroup | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._ids: set[int] = set()
        self._running = 0
        self._stopped: anyio.Event | None = None

    def open(self, tg: anyio.abc.TaskGroup) -> None:
        """Start tasks in ``tg`` from now on (the bus's task group)."""
        self._tg = tg

    def in_bus_task(self) -> bool:
        """Whether the caller runs in one of these tasks (it is a handler, then). The context
        variable rules most callers out without ``anyio.get_current_task()``'s backend
        lookup (a tenth of a trainer hook's wait for the bus)."""
        return _running_in.get() is self and anyio.get_current_task().id in self._ids

    def refuse_wait(self, what: str) -> None:
        """A handler waiting for the bus would wait for itself until its deadline."""
        if self.in_bus_task():
            raise RuntimeError(
                f"{what} called from a handler would wait for the handler itself to "
                "finish; from a handler, publish with bus.emit(event), which never waits"
            )

    def start(self, loop: Callable[[], Any]) -> None:
        """Run ``loop`` as a bus task, in a cancel scope of its own, starting it again after
        an interrupt (the run ends in order) or a cancellation no scope of ours asked for."""
        assert self._tg is not None
        cancelled = anyio.get_cancelled_exc_class()

        async def guarded() -> None:
            self._running += 1
            _running_in.set(self)
            self._ids.add(anyio.get_current_task().id)
            try:
                with anyio.CancelScope() as scope:
                    self._scopes.append(scope)
                    while True:
                        try:
                            await loop()
                            return
                        except BaseException as exc:
                            if isinstance(exc, FATAL):
                                self._end_run(exc)
                            elif isinstance(exc, cancelled) and not is_requested_cancel(exc):
                                forgive_foreign_cancel()
                                _log.error(
                                    "a bus task was cancelled by something else; it goes on",
                                    task=repr(loop),
                                )
                            else:
                                raise
            finally:
                self._running -= 1
                if not self._running and self._stopped is not None:
                    self._stopped.set()

        self._tg.start_soon(guarded)

    async def stop(self) -> None:
        """Cancel the tasks and wait until they are gone (their ``finally`` blocks
        account for the calls they made, so what is left is exact)."""
        self._stopped = anyio.Event()
        for scope in self._scopes:
            scope.cancel()
        if self._running:
            with anyio.CancelScope(shield=True):
                await self._stopped.wait()
