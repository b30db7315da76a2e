"""What a report's metrics may hold (what a log replays exactly as reported), checked where
reports enter, and frozen once into read-only containers every callback shares
(docs/concepts/rounds.md#metrics)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

__all__ = [
    "MAX_DEPTH",
    "FrozenDict",
    "FrozenList",
    "MetricsError",
    "freeze_metrics",
]

#: Deepest nesting of lists and dicts inside one report's metrics.
MAX_DEPTH = 32
#: Most values (scalars and containers) in one report's metrics.
MAX_VALUES = 100_000
#: Most characters of all strings (keys included): far below a log record's limit.
MAX_TEXT = 4 * 1024 * 1024
#: msgpack holds integers from -2**63 to 2**64 - 1 (the fast path spells them out).
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1


class MetricsError(ValueError):
    """Metrics that cannot be accepted: ``field`` is the path of the offending
    value (``metrics['hist'][3]``), ``reason`` what is wrong with it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


_READ_ONLY = (
    "metrics are read-only, so that every callback sees what was reported; "
    "copy them to change them: dict(metrics[i])"
)


def _read_only(*args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(_READ_ONLY)


class FrozenDict(dict[str, Any]):
    """The read-only ``dict`` each rank's metrics reach callbacks as (every callback gets the
    same objects); ``dict(d)``, ``d.copy()``, ``copy.deepcopy(d)`` and pickling thaw it."""

    __slots__ = ()

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return _thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A ``list`` whose mutators raise ``TypeError`` (see ``FrozenDict``)."""

    __slots__ = ()

    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = remove = pop = clear = sort = reverse = _read_only

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return _thaw(self)  # type: ignore[no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _thaw(item) for key, item in dict.items(value)}
    if isinstance(value, list):
        return [_thaw(item) for item in list.__iter__(value)]
    return value


def _scalar_problem(value: Any) -> str | None:
    """Why a non-container value cannot be accepted (``None`` if it can)."""
    if value is None or isinstance(value, (bool, float)):
        return None
    if isinstance(value, int):
        number = int.__int__(value)
        if _INT_MIN <= number <= _INT_MAX:
            return None
        return f"integer {number.bit_length()} bits long; the log holds at most 64 bits"
    if isinstance(value, str):
        return None
    kind = type(value)
    name = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    # The commonest case: a loss reported as a tensor (or a numpy number), not its value.
    item = "; report its number, value.item()" if hasattr(kind, "item") else ""
    return f"{name} is not a JSON value (str, number, bool, None, list or dict){item}"


def _walk(metrics: Any) -> tuple[str, str] | None:
    if not isinstance(metrics, dict):
        return "metrics", f"expected a dict of metric values, got {type(metrics).__qualname__}"
    values = 0
    text = 0
    # (value, path, depth); iterative, so no nesting can exhaust the stack.
    stack: list[tuple[Any, str, int]] = [(metrics, "metrics", 0)]
    while stack:
        value, path, depth = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return "metrics", f"more than {MAX_VALUES} values"
        if isinstance(value, (dict, list, tuple)) and depth >= MAX_DEPTH:
            return path, f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            items = list(dict.items(value))
            for key, item in reversed(items):
                if not isinstance(key, str):
                    return path, f"key {_short_repr(key)} is a {type(key).__qualname__}, not a str"
                text += str.__len__(key)
                stack.append((item, f"{path}[{_short_repr(key)}]", depth + 1))
        elif isinstance(value, (list, tuple)):
            items = list(list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value))
            for index in range(len(items) - 1, -1, -1):
                stack.append((items[index], f"{path}[{index}]", depth + 1))
        else:
            problem = _scalar_problem(value)
            if problem is not None:
                return path, problem
            if isinstance(value, str):
                text += str.__len__(value)
        if text > MAX_TEXT:
            return "metrics", f"more than {MAX_TEXT} characters of text"
    return None


def _short_repr(value: Any) -> str:
    try:
        text = (
            repr(value) if isinstance(value, (str, int, float)) else f"<{type(value).__qualname__}>"
        )
    except Exception:
        text = f"<{type(value).__qualname__}>"
    return text if len(text) <= 80 else f"{text[:77]}..."


def freeze_metrics(metrics: Any) -> FrozenDict:
    """A read-only deep copy of ``metrics``, or ``MetricsError`` naming what is wrong.

    Subclasses of the JSON types become the plain types (an ``IntEnum`` an ``int``), as a
    trip through the log would make them, so a live run and its replay agree.
    """
    kind = type(metrics)
    if kind is FrozenDict:
        return metrics  # type: ignore[no-any-return]
    # The fast path, every report's: a flat dict of exact scalar types, nothing called.
    if kind is dict and len(metrics) <= 1024:
        for key, value in metrics.items():
            if type(key) is not str:
                break
            kind = type(value)
            if kind is float:
                continue
            if kind is int:
                if -9223372036854775808 <= value <= 18446744073709551615:
                    continue
                break
            if kind is bool or value is None or (kind is str and len(value) <= 4096):
                continue
            break
        else:
            return FrozenDict(metrics)
    try:  # the thorough walk, value by value
        problem = _walk(metrics)
    except RecursionError:
        problem = "metrics", "nested too deeply to inspect"
    except Exception as exc:  # a hostile subclass whose methods raise
        problem = "metrics", f"could not be inspected: {type(exc).__qualname__}"
    if problem is not None:
        raise MetricsError(*problem)
    frozen: FrozenDict = _freeze(metrics)
    return frozen


def _freeze(value: Any) -> Any:
    """Recursive: only called on checked metrics, whose depth is bounded."""
    if isinstance(value, dict):
        return FrozenDict((str.__str__(k), _freeze(v)) for k, v in dict.items(value))
    if isinstance(value, (list, tuple)):
        items: Iterable[Any] = (
            list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)
        )
        return FrozenList(_freeze(item) for item in items)
    if value is None or type(value) in (bool, float, int, str):
        return value
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, int):
        return int.__int__(value)
    return str.__str__(value)
