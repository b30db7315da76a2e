"""Logs each gathered round through structlog (per round, never per report)."""

from __future__ import annotations

from typing import Any

from eventbus import RunResult, TrainRunContext
from eventbus._logging import get_logger
from eventbus._options import Count
from eventbus.options import checked

from .._callback import UserCallback
from .._metrics import mean_metrics

__all__ = ["MetricsLogger"]


class MetricsLogger(UserCallback):
    """Logs every ``every``-th round at info level: the mean of each numeric metric over ranks."""

    def __init__(self, every: int = 1, logger: Any = None) -> None:
        self.every: int = checked("every", every, Count)
        self.log = logger if logger is not None else get_logger("handlers.metrics")
        self.rounds = 0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        if (self.rounds - 1) % self.every == 0:
            self.log.info(
                "round",
                run_id=run_context.run_id,
                round=self.rounds - 1,
                ranks=len(metrics),
                checkpoint=checkpoint,
                **mean_metrics(metrics),
            )

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.log.warning(
            "worker failures",
            run_id=run_context.run_id,
            failures={rank: str(exc) for rank, exc in sorted(worker_exceptions.items())},
        )

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.log.info(
            "run ended", run_id=run_context.run_id, status=result.status, rounds=result.rounds
        )
