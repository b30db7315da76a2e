"""Whose fault is an exception? Telling the bus's own cancellations from a handler's.

A handler may raise anything, ``BaseException`` subclasses included. Three
kinds matter to the bus:

- a cancellation the bus asked for (a deadline's scope, or the bus stopping):
  it must propagate, so the scope that asked catches it;
- ``KeyboardInterrupt`` and ``SystemExit``: the user (or the program) wants
  the run to end; the bus's owner ends it in order and re-raises them;
- anything else, a cancellation nobody on the bus asked for included (an
  awaited future that was cancelled, a foreign scope's exception): the
  handler's fault, reported as ``HandlerFailed``, and the bus goes on.
"""

from __future__ import annotations

import asyncio
import math

import anyio

__all__ = ["FATAL", "forgive_foreign_cancel", "is_requested_cancel"]

#: Exceptions that end the run instead of failing one handler call.
FATAL: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)


def is_requested_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` is a cancellation that a scope around the current task asked for.

    Such a cancellation must propagate to the scope that asked. A cancellation
    exception raised while no enclosing scope is cancelled came from
    somewhere else (a cancelled future a handler awaited, say).
    """
    return isinstance(exc, anyio.get_cancelled_exc_class()) and (
        anyio.current_effective_deadline() == -math.inf
    )


def forgive_foreign_cancel() -> None:
    """On asyncio, withdraw the ``Task.cancel()`` requests of the current task that
    no bus scope made, once the bus has taken their cancellation as a handler's fault.

    asyncio asks code that suppresses a cancellation to call ``Task.uncancel()``
    for it. Left counted, the requests make anyio's scopes take the bus's next
    deadline for someone else's cancellation: it escapes its scope, and the rest
    of the batch is lost (``test_a_stray_task_cancel_leaves_later_deadlines_working``).
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return
    if task is not None:
        while task.cancelling():
            task.uncancel()
