"""The metrics a run's ranks reported, one chart each, with where things happened: by round
(``RoundGathered``), else by report index; one level of nested dicts (``"eval/loss"``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ._limits import (
    MAX_LABEL,
    MAX_MARKERS,
    MAX_METRICS,
    MAX_NAMES,
    MAX_RANK_LINES,
    MAX_RANKS_TRACKED,
    clip,
)
from ._series import SeriesGroup

ALL_RANKS = "all ranks"


class Marker(msgspec.Struct, frozen=True):
    """Something that happened at round ``x``: a checkpoint, a restart, a failure, a resume."""

    x: float
    kind: str
    label: str


class MetricSeries:
    """One metric: its chart's series (a line per rank, and all ranks together)."""

    __slots__ = ("all_ranks", "first_nonfinite", "group", "name", "nonfinite", "ranks")

    def __init__(self, name: str) -> None:
        self.name = name  # as shown (a hostile name is clipped)
        self.group = SeriesGroup()
        self.all_ranks = self.group.series(ALL_RANKS)
        self.ranks: dict[int, int] = {}
        self.nonfinite = 0
        self.first_nonfinite: float | None = None


class MetricCharts:
    """Every charted metric of a run, by round (or by report index: ``x_label``)."""

    def __init__(self, x_label: str) -> None:
        self.x_label = x_label
        self.metrics: dict[str, MetricSeries] = {}
        self.uncharted: dict[str, None] = {}  # names past MAX_METRICS, in order seen
        self.uncharted_more = False  # and more names than MAX_NAMES of them
        self.ranks: set[int] = set()
        self.markers: dict[str, list[Marker]] = {}
        self.markers_dropped: dict[str, int] = {}
        self.last_x = -1.0

    @property
    def per_rank(self) -> bool:
        """Whether the run is narrow enough for a line per rank."""
        return len(self.ranks) <= MAX_RANK_LINES

    def add(self, x: float, ranks: Sequence[int], metrics: Sequence[Mapping[str, Any]]) -> None:
        """One round at ``x``: ``metrics[i]`` from rank ``ranks[i]``; the ranks' values
        are pooled first, so the band of all ranks costs one addition per metric."""
        if x > self.last_x:
            self.last_x = x
        seen = self.ranks
        for rank in ranks:
            if rank not in seen and len(seen) < MAX_RANKS_TRACKED:
                seen.add(rank)
        per_rank = len(seen) <= MAX_RANK_LINES
        pooled: dict[str, list[float]] = {}  # name -> [lowest, highest, sum, count]
        put = self._put
        for rank, values in zip(ranks, metrics, strict=False):
            nested: list[tuple[str, Any]] = []
            for name, value in values.items():
                if type(value) is dict:
                    nested += [(f"{name}/{sub}", inner) for sub, inner in value.items()]
                else:
                    put(name, value, x, rank if per_rank else None, pooled)
            for name, value in nested:
                put(name, value, x, rank if per_rank else None, pooled)
        get = self.metrics.__getitem__
        for name, pool in pooled.items():
            series = get(name)
            series.group.add_pooled(series.all_ranks, x, pool)

    def _put(
        self, name: str, value: Any, x: float, rank: int | None, pooled: dict[str, list[float]]
    ) -> None:
        """One number of one rank: to its line, and to the round's pool."""
        kind = type(value)
        if kind is not float:
            if kind is not int:
                return  # not a number: a string, a list, a bool...
            try:
                value = float(value)
            except OverflowError:  # an int past a float's range is no point on a chart
                value = math.inf
        series = self.metrics.get(name)
        if series is None:
            if not isinstance(name, str):
                return
            if len(self.metrics) >= MAX_METRICS:  # its name listed, up to MAX_NAMES
                if len(self.uncharted) < MAX_NAMES:
                    self.uncharted[clip(name)] = None
                elif clip(name) not in self.uncharted:
                    self.uncharted_more = True
                return
            series = self.metrics[name] = MetricSeries(clip(name))
        if value - value != 0.0:  # NaN or infinite
            series.nonfinite += 1
            if series.first_nonfinite is None:
                series.first_nonfinite = x
            return
        if rank is not None:
            line = series.ranks.get(rank)
            if line is None:
                line = series.ranks[rank] = series.group.series(f"rank {rank}")
            series.group.add(line, x, value)
        pool = pooled.get(name)
        if pool is None:
            pooled[name] = [value, value, value, 1.0]
            return
        if value < pool[0]:
            pool[0] = value
        elif value > pool[1]:
            pool[1] = value
        pool[2] += value
        pool[3] += 1.0

    def mark(self, x: float, kind: str, label: str) -> None:
        """A marker on every chart at ``x`` (bounded per kind)."""
        kept = self.markers.setdefault(kind, [])
        if len(kept) >= MAX_MARKERS:
            self.markers_dropped[kind] = self.markers_dropped.get(kind, 0) + 1
            return
        kept.append(Marker(x, kind, clip(label, MAX_LABEL)))
