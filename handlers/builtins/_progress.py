"""A terminal progress display: reports per rank and rounds completed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar, TextIO

from eventbus import Event, Report, RunResult, TrainRunContext

from .._callback import UserCallback

__all__ = ["ProgressDisplay"]


class ProgressDisplay(UserCallback):
    """One status line: rounds completed and reports per rank, rewritten in place on a
    terminal at most every ``interval`` seconds, else a new line every ``interval`` seconds;
    the last state always at the end."""

    event_types: ClassVar[tuple[type[Event], ...]] = (Report,)

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        interval: float | None = None,
        tty: bool | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval if interval is not None else (0.1 if self.tty else 5.0)
        self.now = now
        self.reports: dict[int, int] = {}
        self.rounds = 0
        self.failures = 0
        self._shown_at = -float("inf")

    def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        if isinstance(event, Report):
            self.reports[event.rank] = self.reports.get(event.rank, 0) + 1

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        self._maybe_show(run_context)

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.failures += len(worker_exceptions)
        self._maybe_show(run_context)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self._show(run_context, final=True)

    def line(self, run_context: TrainRunContext) -> str:
        per_rank = " ".join(f"{rank}:{n}" for rank, n in sorted(self.reports.items()))
        failed = f" | failures {self.failures}" if self.failures else ""
        return f"{run_context.name}: round {self.rounds} | reports {per_rank}{failed}"

    def _maybe_show(self, run_context: TrainRunContext) -> None:
        now = self.now()
        if now - self._shown_at >= self.interval:
            self._shown_at = now
            self._show(run_context, final=False)

    def _show(self, run_context: TrainRunContext, *, final: bool) -> None:
        text = self.line(run_context)
        if self.tty:
            self.stream.write(f"\r\x1b[2K{text}" + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
