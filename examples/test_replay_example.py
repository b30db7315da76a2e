"""Testing a callback against a recorded run, as a user of train-eventbus would.

The ``eventbus`` pytest plugin (installed with the package) provides the
``event_log_factory``, ``replay_log`` and ``recorded_bus`` fixtures. In a
real project the log comes from a real run (``LogRecorder`` or the demo
trainer's ``--log``); here it is built in code so the example is complete.

Run it with ``pytest examples/test_replay_example.py`` (anyio's pytest
plugin runs the async tests).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eventbus import Event, EventFilter, Report, RoundGathered, StatefulCallback, TrainRunContext
from eventbus.testing import BusRecording, assert_rounds, report_rounds
from handlers import EarlyStopping, UserCallback


class BestLossTracker:
    """The callback under test: remembers the best loss reported by rank 0."""

    def __init__(self) -> None:
        self.best: float | None = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, Report) and event.rank == 0:
            loss = event.metrics["loss"]
            self.best = loss if self.best is None else min(self.best, loss)


class LossTrend(UserCallback, StatefulCallback):
    """A training callback under test: the mean loss of each round."""

    state_attributes = ("losses",)

    def __init__(self) -> None:
        self.losses: list[float] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.losses.append(sum(m["loss"] for m in metrics) / len(metrics))


@pytest.fixture
def anyio_backend() -> str:
    """Run these tests on asyncio only (anyio's default is every installed backend)."""
    return "asyncio"


@pytest.mark.anyio
async def test_tracker_sees_every_round_of_the_recorded_run(
    event_log_factory: Callable[..., Path], replay_log: Callable[..., Any]
) -> None:
    log = event_log_factory(report_rounds(5, world_size=2), name="run.evlog")
    tracker = BestLossTracker()

    result = await replay_log(log, tracker)

    assert tracker.best == pytest.approx(1 / 5)
    assert_rounds(result.events_of(tracker), range(5), ranks=[0, 1])
    assert result.summary.failed == 0


@pytest.mark.anyio
async def test_replay_only_rank_one(
    event_log_factory: Callable[..., Path], replay_log: Callable[..., Any]
) -> None:
    log = event_log_factory(report_rounds(3, world_size=2))
    tracker = BestLossTracker()

    result = await replay_log(log, tracker, filter=EventFilter.of(ranks=[1]))

    assert tracker.best is None  # rank 0 was filtered out
    assert_rounds(result.events_of(tracker), range(3), ranks=[1])


@pytest.mark.anyio
async def test_record_what_the_bus_carried(recorded_bus: BusRecording) -> None:
    async with recorded_bus(period=1.0) as bus:
        for event in report_rounds(2, world_size=1):
            await bus.publish(event)

    assert [e.index for e in recorded_bus.of_type(Report)] == [0, 1]


@pytest.mark.anyio
async def test_training_callbacks_get_each_round_once(
    event_log_factory: Callable[..., Path], replay_log: Callable[..., Any]
) -> None:
    losses = lambda rank, index: {"loss": 1.0 if index > 0 else 0.5}  # noqa: E731
    log = event_log_factory(report_rounds(4, world_size=2, metrics=losses))
    trend, stopping = LossTrend(), EarlyStopping("loss", patience=2)

    result = await replay_log(log, trend, stopping)  # attached as a live run attaches them

    assert trend.losses == [0.5, 1.0, 1.0, 1.0]
    assert [type(e) for e in result.events_of(trend)] == [RoundGathered] * 4
    assert stopping.should_stop and stopping.stop_reason is not None
