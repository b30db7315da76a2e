"""Whose fault is an exception? A cancellation the bus asked for propagates;
``KeyboardInterrupt`` and ``SystemExit`` end the run in order; anything else, a stray
cancellation included, is the handler's fault (``HandlerFailed``), and the bus goes on."""

from __future__ import annotations

import asyncio
import math

import anyio

__all__ = ["FATAL", "forgive_foreign_cancel", "is_requested_cancel"]

#: Exceptions that end the run instead of failing one handler call.
FATAL: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)


def is_requested_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation that a scope around the current task asked for
    (else it came from elsewhere: a cancelled future a handler awaited, say)."""
    return isinstance(exc, anyio.get_cancelled_exc_class()) and (
        anyio.current_effective_deadline() == -math.inf
    )


def forgive_foreign_cancel() -> None:
    """On asyncio, ``uncancel()`` the stray cancel requests taken as a handler's fault: left
    counted, they would make the next deadline escape its scope."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return
    if task is not None:
        while task.cancelling():
            task.uncancel()
