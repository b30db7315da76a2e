"""How a run's end is reported, wherever it ran: its status and error text, who stopped it,
its console line, and the exception that ended it from inside, found inside exception
groups (the cancellations the ending caused are its fallout, replaced by it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from eventbus import RunResult, RunStatus
from eventbus._logging import get_logger
from eventbus._text import describe as describe_exception
from eventbus.state._model import callback_name

from ._signals import Preempted

__all__ = ["interrupt_in", "log_run_end", "only_cancellations", "status_of", "stop_of"]

_log = get_logger("handlers.run")

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
    fallout = (cancelled_class, KeyboardInterrupt, SystemExit)
    if exc is None or isinstance(exc, fallout):
        return True
    return isinstance(exc, BaseExceptionGroup) and exc.split(fallout)[1] is None


def status_of(ended_by: BaseException) -> tuple[RunStatus, str]:
    """How a run that ``ended_by`` ended is reported: a preemption signal preempts it, an
    interrupt cancels it, ``SystemExit`` or a callback's raise fails it."""
    if isinstance(ended_by, Preempted):
        return "preempted", str(ended_by)
    status: RunStatus = "cancelled" if isinstance(ended_by, KeyboardInterrupt) else "failed"
    return status, describe_exception(ended_by)


def stop_of(callbacks: Iterable[Any]) -> tuple[str, str | None] | None:
    """Which callback asked the run to stop early (the first whose ``should_stop`` is true,
    named as the state store names it), and its ``stop_reason``."""
    for callback in callbacks:
        try:  # asked at every run's end: a property that raises must not break it
            if getattr(callback, "should_stop", False) is not True:
                continue
            reason = getattr(callback, "stop_reason", None)
        except Exception:
            continue
        reason = reason[:MAX_STOP_REASON] if isinstance(reason, str) else None
        return callback_name(callback), reason
    return None


def _count(number: int, what: str, plural: str | None = None) -> str:
    return f"{number:,} {what if number == 1 else plural or what + 's'}"


def log_run_end(result: RunResult, seconds: float | None = None) -> None:
    """One line on the console for a run's end: how it ended, what it did, and what went
    wrong (a warning when something did)."""
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    parts = [_count(result.rounds, "round"), _count(result.reports, "report")]
    troubles = []
    if result.rejected:
        troubles.append(_count(result.rejected, "report") + " rejected")
    if result.failures:
        troubles.append(_count(result.failures, "worker failure"))
    if result.restarts:
        troubles.append(_count(result.restarts, "restart"))
    if result.checkpoint_mismatches:
        troubles.append(
            _count(result.checkpoint_mismatches, "checkpoint mismatch", "checkpoint mismatches")
        )
    line = f"run {result.run_id} {result.status}{took}: {', '.join(parts + troubles)}"
    if result.stopped_by is not None:
        line += f"; stopped by {result.stopped_by}"
        if result.stop_reason:
            line += f": {result.stop_reason}"
    if result.error:
        line += f"; error: {result.error}"
    if troubles or result.status != "finished":
        _log.warning(line)
    else:
        _log.info(line)
