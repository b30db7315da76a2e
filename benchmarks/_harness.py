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

__all__ = ["CountRounds", "time_publishing"]


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
