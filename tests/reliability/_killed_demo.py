"""The demo trainer, SIGKILLed at a chosen point: the subject of the resume property test.

    python _killed_demo.py KILL_AT MODE demo-arguments...
    python _killed_demo.py --serve

``MODE`` says where the kill lands: ``batch`` when the dispatcher takes the
batch holding the ``KILL_AT``-th event, before the log or any handler saw it;
``handled`` once every handler has handled that event (a snapshot written,
say, or a log flushed); ``never`` runs to the end. The process kills itself
with SIGKILL, so nothing of Python's shutdown runs: no ``finally``, no flush,
no atexit, exactly as when the machine's operator or the OOM killer kills it.
``term`` sends itself SIGTERM instead once that event is handled, as Slurm or
Kubernetes does: the run is preempted, checkpoints where it stands, and exits 143.

``--serve`` imports the demo once, then forks one such process per request, a JSON
line on stdin (``cwd``, ``argv``: KILL_AT MODE demo-arguments, ``stderr``: a file,
``timer``, ``signum``), and answers each with its exit code (as ``Popen.returncode``
says it; None when it ran past ``HUNG`` seconds and was killed). The property test
runs hundreds of demos: most of each one's half second was Python importing the demo,
nothing a kill point can land in (no file is touched before the run opens). A child
returns up the stack and exits as the script would: Python's shutdown, atexit and all.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
from typing import Any

import adapters.cli._demo_trainer as trainer
from adapters.cli import main
from eventbus import Event
from eventbus._stages import Stage

#: Seconds a served demo may run before it is killed as hung.
HUNG = 120.0


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


def demo(argv: list[str]) -> int:
    """The demo with ``argv`` (KILL_AT MODE demo-arguments...), killed as MODE says."""
    kill_at, mode, *arguments = argv
    if mode != "never":
        trainer.open_run = _killing_open_run(int(kill_at), mode)  # type: ignore[attr-defined]
    return main(["demo", *arguments])


def _ended(pid: int, seconds: float) -> int | None:
    """The exit code of child ``pid`` once it ends, or None if it runs ``seconds`` more."""
    fd = os.pidfd_open(pid)
    try:
        if not select.select([fd], [], [], max(seconds, 0.0))[0]:
            return None
    finally:
        os.close(fd)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        pid = os.fork()
        if pid == 0:  # the demo: stdin and stdout to /dev/null, stderr to its file
            os.chdir(request["cwd"])
            null = os.open(os.devnull, os.O_RDWR)
            for fd, to in ((0, null), (1, null), (2, err)):
                os.dup2(to, fd)
            sys.exit(demo(request["argv"]))  # up through this loop: the script's exit
        os.close(err)
        code = None
        if request["timer"] is not None:
            code = _ended(pid, request["timer"])
            if code is None:
                os.kill(pid, request["signum"])
        if code is None:
            code = _ended(pid, HUNG)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        print(json.dumps(code), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        sys.exit(demo(sys.argv[1:]))
