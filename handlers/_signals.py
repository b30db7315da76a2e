"""Preemption: the SIGTERM a cluster sends before it kills a job ends the run in order
(docs/operations/preemption.md); a second one skips what is left of the callbacks' work
but still closes the log whole. SIGINT stays Python's."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import anyio

__all__ = ["PREEMPTION_SIGNALS", "Preempted", "takes_signals", "watch_signals"]

#: The signals that preempt a run.
PREEMPTION_SIGNALS = (signal.SIGTERM,)


class Preempted(SystemExit):
    """The run was told to stop by a signal, and ended in order, status ``preempted``. Raised
    out of the run; uncaught, the process exits quietly with code ``128 + signal`` (143 for
    SIGTERM), as schedulers that requeue on it expect."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"preempted by {signal.Signals(self.signum).name}"

    def __reduce__(self) -> tuple[object, ...]:
        return type(self), (self.signum,)


def takes_signals() -> bool:
    """Whether a run may take the preemption signals: in the main thread, unless someone
    installed a handler of their own (install yours first to opt out)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    return all(signal.getsignal(s) is signal.SIG_DFL for s in PREEMPTION_SIGNALS)


async def watch_signals(first: Callable[[int], None], again: Callable[[int], None]) -> None:
    """Until cancelled, call ``first(signum)`` for the first preemption signal and
    ``again(signum)`` for each one after it; the previous handlers come back after."""
    with anyio.open_signal_receiver(*PREEMPTION_SIGNALS) as signals:
        seen = False
        async for signum in signals:
            (again if seen else first)(int(signum))
            seen = True
