"""Summaries of a round's metrics, shared by the built-in callbacks and the run.

A round holds one dict per rank; callbacks that rank or log a round want one
number per metric. The mean is taken over the ranks that reported a finite
number, so one rank's missing or diverged value does not hide the others'.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import isfinite
from typing import Any

__all__ = ["mean_metrics", "mean_of"]


def mean_of(metrics: Sequence[dict[str, Any]], name: str) -> float | None:
    """Mean of ``name`` over the ranks that reported it as a finite number."""
    total = 0.0
    count = 0
    for m in metrics:
        v = m.get(name)
        # A plain float first (the usual case), then ints and subclasses of either.
        if (
            type(v) is float or (isinstance(v, (int, float)) and not isinstance(v, bool))
        ) and isfinite(v):
            total += v
            count += 1
    return total / count if count else None


def note_missing_metric(
    log: Any, callback: object, metric: str, misses: int, metrics: Sequence[dict[str, Any]]
) -> None:
    """One debug line, at a callback's first round without its metric (``misses == 1``).

    Why quiet: trainers report rounds that lack a metric by design (Hugging
    Face's evaluation logs have ``eval_loss``, not ``loss``), as Keras's and
    Lightning's early stopping know; the callback counts them instead.
    """
    if misses == 1:
        log.debug(
            "round without the metric skipped (counted in rounds_without_metric)",
            callback=repr(callback),
            metric=metric,
            reported=sorted({name for m in metrics for name in m})[:20],
        )


def mean_metrics(metrics: Sequence[dict[str, Any]]) -> dict[str, float | int]:
    """Per-name mean over ranks of every numeric metric (one summary line per round).

    A metric every rank reported as an int stays an int when its mean is
    whole (``step=1``, not ``step=1.0``); otherwise the mean is a float.
    """
    if len(metrics) == 1:  # one rank (a single-process trainer): its numbers as they are
        alone = _one_rank(metrics[0])
        if alone is not None:
            return alone
    elif metrics:
        plain = _plain_ranks(metrics)
        if plain is not None:
            return plain
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
    """``mean_metrics`` of one rank's plain ints and floats, in one pass (every report of a
    single-process trainer comes here); None for anything else a number may be."""
    out: dict[str, float | int] = {}
    for name, value in metrics.items():
        kind = type(value)
        if kind is float:
            if isfinite(value):
                out[name] = value
        elif kind is int:
            out[name] = value
        elif kind is not bool and isinstance(value, (int, float)):  # a subclass: the long way
            return None
    return out


def _plain_ranks(metrics: Sequence[dict[str, Any]]) -> dict[str, float | int] | None:
    """``mean_metrics`` of ranks reporting the same names, all plain floats or ints, in one
    pass (every round of a data-parallel run comes here); None for anything else."""
    first = metrics[0]
    names = first.keys()
    for m in metrics:
        if m.keys() != names:
            return None
    ranks = len(metrics)
    out: dict[str, float | int] = {}
    for name in first:
        ints = floats = count = 0
        total = 0.0
        for m in metrics:
            v = m[name]
            kind = type(v)
            if kind is float:
                floats += 1
                if isfinite(v):
                    total += v
                    count += 1
            elif kind is int:
                ints += v
            else:
                return None
        if floats == ranks:
            if count:
                out[name] = total / count
        elif not floats and not ints % ranks:
            out[name] = ints // ranks
        else:  # ints whose mean is not whole, or ints and floats: the long way's sums
            value = mean_of(metrics, name)
            if value is not None:
                out[name] = value
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
