"""Preemption: the signal a cluster sends before it kills a job ends the run in order.

Slurm (``--signal=TERM@60``, and before ``scancel`` or a requeue), Kubernetes
(then ``terminationGracePeriodSeconds``, 30 s by default) and spot VMs send
SIGTERM, then kill. Left to Python's default, SIGTERM kills the process at
once: ``after_run`` never runs and the log loses its end. So a run takes
SIGTERM while it runs, where the user's code has not installed a handler of
its own: the first ends the run in order (status ``preempted``), a second
skips what is left of the callbacks' work but still closes the log whole.
SIGINT stays Python's: a ``KeyboardInterrupt``, status ``cancelled``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

import anyio

__all__ = ["PREEMPTION_SIGNALS", "Preempted", "takes_signals", "watch_signals"]

#: The signals that preempt a run.
PREEMPTION_SIGNALS = (signal.SIGTERM,)


class Preempted(SystemExit):
    """The run was told to stop by a signal, and ended in order, status ``preempted``.

    Raised out of the run (``async with open_run(...)``, a trainer's
    ``train()``/``fit()``). Uncaught, the process exits quietly with code
    ``128 + signal`` (143 for SIGTERM), the code a process the signal killed
    would have: schedulers that requeue on it (Slurm's ``--requeue``,
    Kubernetes' restart policy) see what they expect.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"preempted by {signal.Signals(self.signum).name}"

    def __reduce__(self) -> tuple[object, ...]:
        return type(self), (self.signum,)


def takes_signals() -> bool:
    """Whether a run may take the preemption signals here: in the main thread (the
    only one signals reach), and only where nobody installed a handler of their own
    (to opt out, install yours before the run starts)."""
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
