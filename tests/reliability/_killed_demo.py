"""The demo trainer, SIGKILLed at a chosen point: the subject of the resume property test.

    python _killed_demo.py KILL_AT MODE demo-arguments...

``MODE`` says where the kill lands: ``batch`` when the dispatcher takes the
batch holding the ``KILL_AT``-th event, before the log or any handler saw it;
``handled`` once every handler has handled that event (a snapshot written,
say, or a log flushed); ``never`` runs to the end. The process kills itself
with SIGKILL, so nothing of Python's shutdown runs: no ``finally``, no flush,
no atexit, exactly as when the machine's operator or the OOM killer kills it.
``term`` sends itself SIGTERM instead once that event is handled, as Slurm or
Kubernetes does: the run is preempted, checkpoints where it stands, and exits 143.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import adapters.cli._demo_trainer as trainer
from adapters.cli import main
from eventbus import Event
from eventbus._stages import Stage


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _terminate() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def _killing_open_run(kill_at: int, mode: str) -> Any:
    real_open_run = trainer.open_run  # type: ignore[attr-defined]
    seen = 0

    def open_run(**options: Any) -> Any:
        run = real_open_run(**options)

        def on_batch(batch: list[Event]) -> None:
            nonlocal seen
            seen += len(batch)
            if seen >= kill_at:
                _die()

        def on_event(event: Event) -> None:
            nonlocal seen
            seen += 1
            if seen == kill_at and mode == "term":
                _terminate()  # once: a second SIGTERM would cut the orderly end short
            elif seen >= kill_at and mode == "handled":
                _die()

        if mode == "batch":
            run.bus.add_tap(on_batch)
        elif mode in ("handled", "term"):
            run.bus.subscribe(Event, on_event, name="killer", order=Stage.OBSERVE + 1)
        return run

    return open_run


if __name__ == "__main__":
    kill_at, mode, *arguments = sys.argv[1:]
    if mode != "never":
        trainer.open_run = _killing_open_run(int(kill_at), mode)  # type: ignore[attr-defined]
    sys.exit(main(["demo", *arguments]))
