"""How a run that something ended from inside reports it: the status, the error text,
and the exception to raise, found inside exception groups.

A run ended by an interrupt (``KeyboardInterrupt``, from a callback, a worker
or a signal) is ``cancelled``; by ``SystemExit`` or a callback's
``on_error="raise"``, ``failed``. The cancellations the ending caused in the
body and the workers are its fallout: the exception that ended the run
replaces them, unwrapped, on asyncio and trio alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eventbus import describe_exception
from eventbus.events import RunStatus

__all__ = ["interrupt_in", "only_cancellations", "status_of", "stop_of"]

_object_repr: Any = object.__repr__
#: Longest stop reason kept (it goes into the run's result and its log).
MAX_STOP_REASON = 1000


def interrupt_in(exc: BaseException | None) -> BaseException | None:
    """The ``KeyboardInterrupt``/``SystemExit`` in ``exc``, found inside exception groups too."""
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = interrupt_in(inner)
            if found is not None:
                return found
    return None


def only_cancellations(exc: BaseException | None, cancelled_class: type[BaseException]) -> bool:
    """Whether ``exc`` holds nothing but cancellations and interrupts: the fallout of
    ending the run from inside, which the exception that ended it replaces."""
    if exc is None or isinstance(exc, (cancelled_class, KeyboardInterrupt, SystemExit)):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(only_cancellations(inner, cancelled_class) for inner in exc.exceptions)
    return False


def status_of(ended_by: BaseException) -> tuple[RunStatus, str]:
    """How a run that ``ended_by`` ended is reported, wherever it ran (``open_run``,
    an adapter): an interrupt cancels it; ``SystemExit`` or a callback's raise fails
    it; the error text is ``Type: message`` either way."""
    status: RunStatus = "cancelled" if isinstance(ended_by, KeyboardInterrupt) else "failed"
    return status, describe_exception(ended_by)


def stop_of(callbacks: Iterable[Any]) -> tuple[str, str | None] | None:
    """Which callback asked the run to stop early, and why: the first whose
    ``should_stop`` is true, named as the state store tells it apart
    (``EarlyStopping(metric='loss', mode='min')``), with its ``stop_reason``."""
    for callback in callbacks:
        try:  # asked at every run's end: a property that raises must not break it
            if getattr(callback, "should_stop", False) is not True:
                continue
            reason = getattr(callback, "stop_reason", None)
        except Exception:
            continue
        reason = reason[:MAX_STOP_REASON] if isinstance(reason, str) else None
        return _name_of(callback), reason
    return None


def _name_of(callback: Any) -> str:
    """Its ``state_key`` if it has one, else its own ``repr`` if its class has one,
    else its class's name (whatever the first two raise or return)."""
    cls = type(callback)
    try:
        key = getattr(callback, "state_key", None)
        if isinstance(key, str) and key:
            return key[:200] if key.startswith(cls.__name__) else f"{cls.__qualname__}[{key[:200]}]"
        if cls.__repr__ is not _object_repr:
            return str(repr(callback))[:200]
    except Exception:
        pass
    return cls.__qualname__
