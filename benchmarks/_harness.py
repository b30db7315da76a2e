"""What several benchmarks share: a callback that only counts, and timing a bus's work.

Imported as a sibling module (``python benchmarks/bench_x.py`` puts this
directory first on ``sys.path``).
"""

from __future__ import annotations

import logging
import resource
import selectors
import statistics
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, TextIO

import structlog

from eventbus import Event, EventBus, TrainRunContext
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, UserCallback

__all__ = [
    "CountRounds",
    "CountingSelector",
    "figure",
    "peak_rss_mb",
    "print_targets",
    "spread",
    "target",
    "time_publishing",
]


class CountingSelector(selectors.DefaultSelector):
    """asyncio's selector, counting per thread the returns from a ``select`` that could
    block: each is one wake-up of that thread's event loop, whatever woke it."""

    wakeups: dict[str, int] = {}  # noqa: RUF012  # one count per thread name, shared

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(timeout)
        if timeout is None or timeout > 0:
            name = threading.current_thread().name
            CountingSelector.wakeups[name] = CountingSelector.wakeups.get(name, 0) + 1
        return ready


class CountRounds(UserCallback):
    """The cheapest useful callback: counts its rounds (so a test can check them all came)."""

    def __init__(self) -> None:
        self.rounds = 0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1


async def time_publishing(bus: EventBus, events: Sequence[Event]) -> float:
    """Seconds to publish ``events`` on a running ``bus`` until every one was handled."""
    publish = bus.publish
    start = time.perf_counter()
    for event in events:
        await publish(event)
    await bus.wait_idle()
    return time.perf_counter() - start


def target(
    name: str,
    measured: float,
    limit: float,
    unit: str,
    *,
    better: str = "lower",
    peer: str | None = None,
) -> dict[str, Any]:
    """One row of ``make bench``'s table: a figure measured in this run against its target.

    Every benchmark's ``--json`` output carries a ``"targets"`` list of these;
    ``benchmarks/check.py`` runs them all and prints one table. ``peer`` is
    the best peer's figure from the same run, in the same unit, when there is one.
    """
    met = measured <= limit if better == "lower" else measured >= limit
    return {
        "name": name,
        "measured": round(measured, 3),
        "target": limit,
        "unit": unit,
        "better": better,
        "peer": peer,
        "met": met,
    }


def print_targets(rows: Iterable[dict[str, Any]]) -> None:
    """The ``target`` rows, one line each, for a benchmark's own table."""
    for row in rows:
        bound = "<=" if row["better"] == "lower" else ">="
        verdict = "met" if row["met"] else "MISSED"
        print(f"target: {row['name']}: {row['measured']} {bound} {row['target']}  {verdict}")


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> dict[str, float]:
    """A figure taken several times: its median and range, scaled and rounded."""
    return {
        "median": round(statistics.median(values) * scale, digits),
        "min": round(min(values) * scale, digits),
        "max": round(max(values) * scale, digits),
    }


def figure(values: dict[str, float], unit: str = "") -> str:
    """A ``spread`` as text: ``median (min-max)``."""
    return f"{values['median']}{unit} ({values['min']}-{values['max']})"


def peak_rss_mb() -> float:
    """This process's peak RSS (``VmHWM``: unlike ``ru_maxrss``, not inherited across exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def engine_callbacks(metrics: TextIO) -> list[Any]:
    """The callbacks an engine's benchmark runs: ``EarlyStopping`` that never stops, the 3
    best checkpoints, and ``MetricsLogger`` writing each round as a JSON line to
    ``metrics`` (what the plain loops beside them write by hand)."""
    wrapper: Any = structlog.make_filtering_bound_logger(logging.INFO)
    lines = wrapper(structlog.WriteLogger(metrics), [structlog.processors.JSONRenderer()], {})
    return [
        EarlyStopping("loss", patience=10**9),
        BestCheckpoints("loss", k=3),
        MetricsLogger(logger=lines),
    ]
