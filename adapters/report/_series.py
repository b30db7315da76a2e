"""Long series kept in bounded memory without losing their spikes: each bucket keeps its
lowest and highest value with where they were, and when a point lands past the last bucket
the width doubles and neighbours merge, so a one-round spike survives any number of merges."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ._limits import BUCKETS

# A bucket: [lowest, x of lowest, highest, x of highest, sum, count].
_LO, _LO_X, _HI, _HI_X, _SUM, _COUNT = range(6)


class Lines(NamedTuple):
    """Series on one x grid, ready to draw: ``columns[i][j]`` is series ``i`` at
    ``x[j]``, or ``None`` where it has no point there."""

    x: list[float]
    columns: list[list[float | None]]
    names: list[str]


class Band(NamedTuple):
    """One series as a band: per bucket, its lowest, mean and highest value."""

    x: list[float]
    low: list[float]
    mean: list[float]
    high: list[float]


class SeriesGroup:
    """The series of one chart, downsampled together on one x grid; a point off the axis
    or not finite is counted in ``dropped``. ``width`` is a power of two."""

    __slots__ = ("_buckets", "_data", "buckets", "dropped", "names", "width")

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.buckets = buckets
        self.width = 1.0
        self.names: list[str] = []
        self._data: list[dict[int, list[float]]] = []
        self._buckets: dict[str, int] = {}
        self.dropped = 0

    def series(self, name: str) -> int:
        """The index of the series ``name``, added if new."""
        index = self._buckets.get(name)
        if index is None:
            index = self._buckets[name] = len(self.names)
            self.names.append(name)
            self._data.append({})
        return index

    def add(self, index: int, x: float, y: float) -> None:
        """Add point (``x``, ``y``) to series ``index``."""
        if y - y != 0.0:  # NaN for NaN and the infinities
            self.dropped += 1
            return
        self.add_pooled(index, x, (y, y, y, 1.0))

    def add_pooled(self, index: int, x: float, pool: Sequence[float]) -> None:
        """Add several values at ``x`` at once, as their (lowest, highest, sum, count)."""
        low, high, total, count = pool
        if not 0.0 <= x < math.inf:
            self.dropped += int(count)
            return
        if x // self.width >= self.buckets:
            width = self.width
            while x // width >= self.buckets:
                width *= 2.0
            self.widen_to(width)
        data = self._data[index]
        key = int(x // self.width)
        bucket = data.get(key)
        if bucket is None:
            data[key] = [low, x, high, x, total, count]
            return
        if low < bucket[_LO]:
            bucket[_LO], bucket[_LO_X] = low, x
        if high > bucket[_HI]:
            bucket[_HI], bucket[_HI_X] = high, x
        bucket[_SUM] += total
        bucket[_COUNT] += count

    def widen_to(self, width: float) -> None:
        """Merge buckets until they are ``width`` wide (a power of two, not narrower)."""
        factor = width / self.width
        if factor == 1.0:
            return
        self.width = width
        self._data = [_merged(data, factor) for data in self._data]

    def lines(self, indices: Sequence[int] | None = None) -> Lines:
        """The series (all, or ``indices``) as lines that keep each bucket's spikes: at
        most two points per bucket (its low and high, in order), on one x grid."""
        chosen = list(range(len(self.names))) if indices is None else list(indices)
        width = self.width
        half = width / 2.0
        slots: dict[float, dict[int, float]] = {}
        for column, index in enumerate(chosen):
            for key, bucket in self._data[index].items():
                start = key * width
                lo, lo_x, hi, hi_x = bucket[_LO], bucket[_LO_X], bucket[_HI], bucket[_HI_X]
                if lo == hi:
                    x = lo_x if width == 1.0 else start + (half if lo_x >= start + half else 0.0)
                    slots.setdefault(x, {})[column] = lo
                    continue
                first, second = (lo, hi) if lo_x <= hi_x else (hi, lo)
                slots.setdefault(start, {})[column] = first
                slots.setdefault(start + half, {})[column] = second
        xs = sorted(slots)
        columns: list[list[float | None]] = [[None] * len(xs) for _ in chosen]
        for position, x in enumerate(xs):
            for column, y in slots[x].items():
                columns[column][position] = y
        return Lines(xs, columns, [self.names[i] for i in chosen])

    def band(self, index: int) -> Band:
        """Series ``index`` as a band, one point per bucket: lowest, mean, highest."""
        width = self.width
        data = self._data[index]
        keys = sorted(data)
        offset = 0.0 if width == 1.0 else width / 2.0
        return Band(
            x=[key * width + offset for key in keys],
            low=[data[key][_LO] for key in keys],
            mean=[data[key][_SUM] / data[key][_COUNT] for key in keys],
            high=[data[key][_HI] for key in keys],
        )

    def totals(self, index: int) -> list[tuple[float, float]]:
        """Series ``index`` added up per bucket: (the bucket's first x, the sum)."""
        width = self.width
        data = self._data[index]
        return [
            (data[key][_LO_X] if width == 1.0 else key * width, data[key][_SUM])
            for key in sorted(data)
        ]

    def points(self, index: int) -> int:
        """How many values series ``index`` received."""
        return int(sum(bucket[_COUNT] for bucket in self._data[index].values()))

    def extremes(self, index: int) -> tuple[tuple[float, float], tuple[float, float]] | None:
        """Series ``index``'s lowest and highest value, each with its x (``None`` if empty)."""
        buckets = self._data[index].values()
        if not buckets:
            return None
        low = min(buckets, key=lambda b: (b[_LO], b[_LO_X]))
        high = max(buckets, key=lambda b: (b[_HI], -b[_HI_X]))
        return (low[_LO_X], low[_LO]), (high[_HI_X], high[_HI])


def _merged(data: dict[int, list[float]], factor: float) -> dict[int, list[float]]:
    """Buckets merged ``factor`` to one (a power of two): lows and highs kept."""
    shift = int(factor).bit_length() - 1
    merged: dict[int, list[float]] = {}
    for key in sorted(data):
        bucket = data[key]
        into = merged.get(key >> shift)
        if into is None:
            merged[key >> shift] = list(bucket)
            continue
        if bucket[_LO] < into[_LO]:
            into[_LO], into[_LO_X] = bucket[_LO], bucket[_LO_X]
        if bucket[_HI] > into[_HI]:
            into[_HI], into[_HI_X] = bucket[_HI], bucket[_HI_X]
        into[_SUM] += bucket[_SUM]
        into[_COUNT] += bucket[_COUNT]
    return merged


def align(*groups: SeriesGroup) -> float:
    """Put groups (one chart's series from two runs) on one x grid; returns its width."""
    width = max(group.width for group in groups)
    for group in groups:
        group.widen_to(width)
    return width
