"""Summaries of a round's metrics (one number per metric), shared by the built-in callbacks
and the run: the mean over the ranks that reported a finite number, so one rank's missing
or diverged value does not hide the others'."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["mean_metrics", "mean_of"]


def mean_of(metrics: Sequence[dict[str, Any]], name: str) -> float | None:
    """Mean of ``name`` over the ranks that reported it as a finite number."""
    total = 0.0
    count = 0
    for m in metrics:
        v = m.get(name)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            total += v
            count += 1
    return total / count if count else None


def note_missing_metric(
    log: Any, callback: object, metric: str, misses: int, metrics: Sequence[dict[str, Any]]
) -> None:
    """One debug line, at a callback's first round without its metric: quiet, because
    trainers report such rounds by design (Hugging Face's evaluation logs)."""
    if misses == 1:
        log.debug(
            "round without the metric skipped (counted in rounds_without_metric)",
            callback=repr(callback),
            metric=metric,
            reported=sorted({name for m in metrics for name in m})[:20],
        )


def mean_metrics(metrics: Sequence[dict[str, Any]]) -> dict[str, float | int]:
    """Per-name mean over ranks of every numeric metric; a metric every rank reported as an
    int stays an int when its mean is whole (``step=1``, not ``step=1.0``)."""
    if len(metrics) == 1:  # one rank (a single-process trainer): its numbers as they are
        alone = _one_rank(metrics[0])
        if alone is not None:
            return alone
    names: dict[str, None] = {}
    for m in metrics:
        for k, v in m.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                names[k] = None
    out: dict[str, float | int] = {}
    for name in names:
        whole = _whole_mean(metrics, name)
        if whole is not None:
            out[name] = whole
            continue
        value = mean_of(metrics, name)
        if value is not None:
            out[name] = value
    return out


def _one_rank(metrics: dict[str, Any]) -> dict[str, float | int] | None:
    """``mean_metrics`` of one rank's plain ints and floats, in one pass (a single-process
    trainer's every report); None for anything else a number may be."""
    out: dict[str, float | int] = {}
    for name, value in metrics.items():
        kind = type(value)
        if kind is float:
            if math.isfinite(value):
                out[name] = value
        elif kind is int:
            out[name] = value
        elif kind is not bool and isinstance(value, (int, float)):  # a subclass: the long way
            return None
    return out


def _whole_mean(metrics: Sequence[dict[str, Any]], name: str) -> int | None:
    """The exact mean of ``name`` if every rank reporting it gave an int and it is whole."""
    total = count = 0
    for m in metrics:
        v = m.get(name)
        if v is None:
            continue
        if type(v) is not int:
            return None
        total += v
        count += 1
    if count == 0 or total % count:
        return None
    return total // count
