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

_log = get_logger("handlers.metrics")

#: The line's own fields (and the logger's positional names): a metric named so is renamed.
_OWN_FIELDS = frozenset({"event", "self", "run_id", "round", "ranks", "checkpoint"})


class MetricsLogger(UserCallback):
    """Logs every ``every``-th round at info level: the mean of each numeric metric over ranks."""

    def __init__(self, every: int = 1, logger: Any = None) -> None:
        self.every: int = checked("every", every, Count)
        self.log = logger if logger is not None else _log
        self.rounds = 0
        #: What the line calls a metric named as one of its own fields.
        self._line_names: dict[str, str] = {}

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        if (self.rounds - 1) % self.every == 0:
            means = mean_metrics(metrics)
            if not _OWN_FIELDS.isdisjoint(means):
                means = self._renamed(means)
            self.log.info(
                "round",
                run_id=run_context.run_id,
                round=self.rounds - 1,
                ranks=len(metrics),
                checkpoint=checkpoint,
                **means,
            )

    def _renamed(self, means: dict[str, Any]) -> dict[str, Any]:
        """``means`` with each metric named as one of the line's own fields prefixed with
        ``metric.``, said once per name: one odd name must not cost the round its line."""
        out: dict[str, Any] = {}
        for name, value in means.items():
            line_name = name
            if name in _OWN_FIELDS:
                line_name = self._line_names.get(name, "")
                if not line_name or line_name in means:  # a metric of this round has it
                    line_name = f"metric.{name}"
                    while line_name in means:
                        line_name = f"metric.{line_name}"
                if self._line_names.get(name) != line_name:
                    self._line_names[name] = line_name
                    _log.warning(
                        "a metric is named as a field of MetricsLogger's line: logged renamed",
                        metric=name,
                        logged_as=line_name,
                    )
            out[line_name] = value
        return out

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
