"""What several benchmarks share: a callback that only counts, and timing a bus's work.

Imported as a sibling module (``python benchmarks/bench_x.py`` puts this
directory first on ``sys.path``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from eventbus import Event, EventBus
from handlers import TrainRunContext, UserCallback

__all__ = ["CountRounds", "target", "time_publishing"]


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
