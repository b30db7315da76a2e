"""Early stopping on a metric: the trainer reads ``should_stop``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from eventbus import StatefulCallback, TrainRunContext
from eventbus._logging import get_logger
from eventbus._options import Count
from eventbus.options import checked

from .._callback import UserCallback
from .._metrics import mean_of, note_missing_metric

__all__ = ["EarlyStopping"]

_log = get_logger("handlers.early_stopping")

#: How much a value must beat the best by to improve: finite, not negative.
Threshold = Annotated[float, Meta(ge=0, le=1e300)]


class EarlyStopping(UserCallback, StatefulCallback, state_name="handlers.EarlyStopping"):
    """Sets ``should_stop`` after ``patience`` rounds without improvement of ``metric``.

    The round's value is the mean over ranks; it improves when it beats the best so far by
    more than ``threshold`` (lower for ``mode="min"``). Rounds without the metric do not
    count (they are counted in ``rounds_without_metric``).
    """

    state_args = ("metric", "patience", "threshold", "mode")
    state_attributes = ("best", "wait", "rounds", "should_stop")

    def __init__(
        self,
        metric: str,
        patience: int = 3,
        threshold: float = 0.0,
        mode: Literal["min", "max"] = "min",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.metric = metric
        self.patience: int = checked("patience", patience, Count)
        self.threshold: float = checked("threshold", threshold, Threshold)
        self.mode = mode
        self.best: float | None = None
        self.wait = 0
        self.rounds = 0
        self.should_stop = False
        self.stop_reason: str | None = None
        #: Rounds that had no finite ``metric`` at any rank, skipped (this process only).
        self.rounds_without_metric = 0

    @property
    def stops_on(self) -> tuple[str, ...]:
        """The metrics whose rounds may change ``should_stop``: the Hugging Face adapter's
        hooks need not wait for logs without them (docs/trainers/hugging-face.md)."""
        return (self.metric,)

    @property
    def state_key(self) -> str:
        return f"EarlyStopping(metric={self.metric!r}, mode={self.mode!r})"

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        value = mean_of(metrics, self.metric)
        if value is None:
            self.rounds_without_metric += 1
            note_missing_metric(_log, self, self.metric, self.rounds_without_metric, metrics)
            return
        self.rounds += 1
        if self.best is None or self._improves(value):
            self.best = value
            self.wait = 0
        else:
            self.wait += 1
            if self.wait >= self.patience and not self.should_stop:
                self.should_stop = True
                by = f" by more than {self.threshold:g}" if self.threshold else ""
                self.stop_reason = (
                    f"{self.metric} did not improve{by} for {self.wait} rounds"
                    f" (best {self.best:.6g}, last {value:.6g})"
                )
                _log.info("early stopping", callback=repr(self), reason=self.stop_reason)

    def _improves(self, value: float) -> bool:
        assert self.best is not None
        if self.mode == "min":
            return value < self.best - self.threshold
        return value > self.best + self.threshold
