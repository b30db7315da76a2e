"""Checks and summaries of metric dicts shared by the gatherer and the built-in callbacks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["SCALAR_TYPES", "json_problem", "mean_metrics", "mean_of"]

#: Exact types of JSON scalars (checked by ``type(v) in``: subclasses take the slow path).
SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})
_SCALARS = SCALAR_TYPES


def json_problem(metrics: Any) -> tuple[str, str] | None:
    """``(field, reason)`` when ``metrics`` is not a dict of JSON values, else None.

    The common case (flat scalars) costs one set lookup per value.
    """
    if type(metrics) is not dict:
        return "metrics", f"expected a dict, got {type(metrics).__name__}"
    for key, value in metrics.items():
        if type(key) is not str:
            return "metrics", f"key {key!r} is a {type(key).__name__}, not a str"
        if type(value) not in _SCALARS:
            reason = _value_problem(value)
            if reason is not None:
                return f"metrics[{key!r}]", reason
    return None


def _value_problem(value: Any) -> str | None:
    if type(value) in _SCALARS or isinstance(value, (str, int, float)):
        return None
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            reason = _value_problem(item)
            if reason is not None:
                return f"item {i}: {reason}"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"key {key!r} is not a str"
            reason = _value_problem(item)
            if reason is not None:
                return f"key {key!r}: {reason}"
        return None
    return f"{type(value).__name__} is not a JSON value"


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


def mean_metrics(metrics: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per-name mean over ranks of every numeric metric (one summary line per round)."""
    names: dict[str, None] = {}
    for m in metrics:
        for k, v in m.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                names[k] = None
    out: dict[str, float] = {}
    for name in names:
        value = mean_of(metrics, name)
        if value is not None:
            out[name] = value
    return out
