"""Our callbacks as the adapter tests use them: each keeps what it saw, or misbehaves."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import anyio

from eventbus import RunResult, StatefulCallback, TrainRunContext
from eventbus._subscription import ErrorPolicy
from handlers import UserCallback


class Inputs(UserCallback):
    """Keeps what each hook received."""

    def __init__(self) -> None:
        self.rounds: list[list[dict[str, Any]]] = []
        self.checkpoints: list[str | None] = []
        self.exceptions: list[dict[int, Exception]] = []
        self.results: list[RunResult] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append(metrics)
        self.checkpoints.append(checkpoint)

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.exceptions.append(worker_exceptions)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


class RoundCounter(UserCallback, StatefulCallback):
    """A stateful callback: how many rounds it saw, and the step of the last one."""

    state_attributes = ("rounds", "last_step")

    def __init__(self) -> None:
        self.rounds = 0
        self.last_step = -1

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        self.last_step = metrics[0]["step"]


class StopAfter(UserCallback):
    def __init__(self, rounds: int) -> None:
        self.limit = rounds
        self.rounds = 0
        self.should_stop = False

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        self.should_stop = self.rounds >= self.limit


class Raises(UserCallback):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        raise RuntimeError("a callback that always fails")


class HangsAsync(UserCallback):
    timeout: ClassVar[float | None] = 0.2

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        await anyio.sleep(3600)


class HangsInThread(UserCallback):
    timeout: ClassVar[float | None] = 0.2
    blocking: ClassVar[bool] = True

    def __init__(self) -> None:
        self.release = threading.Event()

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.release.wait(30)


class FailsTheRun(UserCallback):
    """Raises ``exc`` at its first round; ``on_error="raise"``: that fails the run."""

    on_error: ClassVar[ErrorPolicy] = "raise"

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        raise self.exc
