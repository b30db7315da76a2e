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

Exceptions are turned into text here too, defensively: ``str()`` of a hostile
exception may raise, and a message or traceback may be huge.
"""

from __future__ import annotations

import asyncio
import math
import traceback

import anyio

__all__ = [
    "FATAL",
    "describe",
    "forgive_foreign_cancel",
    "format_traceback",
    "is_requested_cancel",
    "safe_str",
]

#: Exceptions that end the run instead of failing one handler call.
FATAL: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit)
#: Longest message kept from an exception (the rest is cut, with a note).
MAX_MESSAGE = 4096
#: Longest traceback text kept.
MAX_TRACEBACK = 32768


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
    """On asyncio, undo a native ``Task.cancel()`` of the current task that no
    bus scope asked for, so that it does not linger and make a later, real
    cancellation of ours look foreign (anyio compares the task's cancel count)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # not on asyncio
        return
    if task is not None:
        while task.cancelling():
            task.uncancel()


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def safe_str(exc: BaseException) -> str:
    """``str(exc)``, bounded; never raises, whatever the exception's ``__str__`` does."""
    try:
        text = str(exc)
    except FATAL:
        raise
    except BaseException as inner:  # a hostile __str__ may raise anything
        text = f"<str() of {type(exc).__qualname__} raised {type(inner).__qualname__}>"
    return _cut(text, MAX_MESSAGE)


def format_traceback(exc: BaseException) -> str:
    """The traceback text of ``exc``, bounded; never raises."""
    try:
        text = "".join(traceback.format_exception(exc))
    except FATAL:
        raise
    except BaseException:  # formatting calls the exception's own methods
        text = f"{type(exc).__qualname__}: {safe_str(exc)} (traceback could not be formatted)"
    return _cut(text, MAX_TRACEBACK)


def describe(exc: BaseException) -> str:
    """``Type: message``, for one-line logs."""
    return f"{type(exc).__qualname__}: {safe_str(exc)}"
