"""Time that jumps: a gap of any length costs two period reports, never one per period,
live and in replays; a time that is no finite number is a damaged record, never a loop;
and every event with a recorded time is placed somewhere (issue 23, items 4 and 5)."""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    EventPlaceholder,
    HealthCheckTick,
    Report,
    RunFinished,
    RunStarted,
    TrainRunContext,
    VirtualClock,
    WorkerFailure,
)
from eventbus._clock import FastForwardClock
from eventbus.log import LogRecorder, read_log, replay_file
from eventbus.testing import replay_log
from handlers import UserCallback
from handlers._attach import attach_user_callbacks

pytestmark = pytest.mark.anyio


def report(index: int, time: float) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={"loss": 1.0}, time=time)


async def test_a_live_jump_of_years_costs_two_reports_and_no_memory() -> None:
    clock = VirtualClock()
    ticks: list[HealthCheckTick] = []
    tracemalloc.start()
    try:
        async with EventBus(clock=clock, period=0.001) as bus:
            bus.subscribe(HealthCheckTick, ticks.append)
            clock.set(3e8)  # ten years of 1 ms periods: 3e11 of them
            await bus.wait_idle()
            await bus.publish(report(0, 0.0))
            await bus.wait_idle()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [(t.period, t.start) for t in ticks] == [(0, 0.0), (1, 0.001)]
    idle = ticks[1]
    assert idle.end <= 3e8 < idle.end + 0.001 + 1e-6  # the stretch ends where 3e8 falls
    assert peak < 5_000_000


async def test_a_real_clock_that_jumps_rolls_once_when_the_dispatcher_wakes() -> None:
    """A suspended machine: the fast-forward clock jumps a day ahead between events."""
    clock = FastForwardClock()
    reports: list[BudgetReport] = []
    async with EventBus(clock=clock, period=0.01) as bus:
        bus.subscribe(BudgetReport, reports.append)
        clock.set(clock.now() + 86_400.0)
        await bus.publish(report(0, 0.0))
        await bus.wait_idle()
    assert 2 <= len(reports) <= 4  # the period, the idle day, and the one cut at close


async def test_time_going_backwards_in_a_publisher_is_placed_not_lost() -> None:
    clock = VirtualClock(100.0)
    seen: list[float] = []
    async with EventBus(clock=clock, period=1.0) as bus:
        bus.subscribe(Report, lambda e: seen.append(e.time))
        for i, t in enumerate([100.5, 3.0, -5.0, 100.7]):
            await bus.publish(report(i, t))
        await bus.wait_idle()
    assert seen == [100.5, 3.0, -5.0, 100.7]


class Failures(UserCallback):
    def __init__(self) -> None:
        self.seen: list[dict[int, Exception]] = []

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.seen.append(worker_exceptions)


@pytest.mark.parametrize("when", [math.nan, math.inf, -math.inf, 1e300, -1e300])
async def test_a_failure_at_any_recorded_time_reaches_after_exception(when: float) -> None:
    """``RunResult.failures`` and ``after_exception`` agree: NaN compares false with
    everything, and was counted but never delivered."""
    clock = VirtualClock()
    failures = Failures()
    async with EventBus(clock=clock, period=1.0) as bus:
        attachment = attach_user_callbacks(bus, [failures], world_size=2)
        await bus.publish(RunStarted(run_id="r", name="r", world_size=2))
        await bus.publish(WorkerFailure(run_id="r", rank=1, error_type="E", message="m", time=when))
        await bus.wait_idle()
        clock.advance(1.0)
        await bus.wait_idle()
        await bus.publish(RunFinished(run_id="r", status="failed"))
        await bus.wait_idle()
    assert attachment.result("failed").failures == 1
    assert [list(seen) for seen in failures.seen] == [[1]]


def _log_with(tmp_path: Path, times: list[float], name: str = "gap.evlog") -> Path:
    path = tmp_path / name
    events: list[Event] = [RunStarted(run_id="r", name="r", world_size=1, seq=0, time=1.0)]
    events += [
        Report(
            run_id="r",
            rank=0,
            world_size=1,
            index=i,
            metrics={"loss": 1.0 / (i + 1)},
            seq=i + 1,
            time=t,
        )
        for i, t in enumerate(times)
    ]
    with LogRecorder(path) as recorder:
        recorder.write_many(events)
    return path


class Rounds(UserCallback):
    def __init__(self) -> None:
        self.rounds = 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.rounds += 1


@pytest.mark.parametrize("gap", [1e5, 1e8, 1e11])
async def test_a_replayed_gap_is_instant_and_bounded(tmp_path: Path, gap: float) -> None:
    """A run resumed on a host whose clock is far ahead: the log jumps by ``gap``."""
    path = _log_with(tmp_path, [1.5, 2.5, gap, gap + 0.5])
    rounds = Rounds()
    ticks: list[HealthCheckTick] = []
    with anyio.fail_after(10):
        result = await replay_log(
            path, rounds, subscribe=lambda b: b.subscribe(HealthCheckTick, ticks.append), period=1.0
        )
    assert rounds.rounds == 4 and result.summary.replayed == 5
    assert len(ticks) <= 8
    assert result.summary.bus.published < 40


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan, 1e13])
async def test_a_record_at_a_time_no_bus_has_is_damaged_and_the_replay_ends(
    tmp_path: Path, bad: float
) -> None:
    path = _log_with(tmp_path, [1.5, bad, 2.5])
    back = read_log(path)
    assert back.placeholders == 1 and isinstance(back.events[2], EventPlaceholder)
    rounds = Rounds()
    with anyio.fail_after(10):
        result = await replay_log(path, rounds, period=1.0)
    assert result.summary.placeholders == 1 and rounds.rounds == 2


async def test_replaying_given_events_at_times_no_clock_can_take_is_refused_cleanly() -> None:
    """Events handed to a replay (not read from a log) are the caller's: one at an
    infinite time is refused by the clock, with the time in the message."""
    events: list[Event] = [report(0, 1.0), report(1, math.inf)]

    def setup(bus: EventBus) -> None:
        pass

    from eventbus.log import replay

    clock = VirtualClock()
    async with EventBus(clock=clock, period=1.0) as bus:
        setup(bus)
        with pytest.raises(ValueError, match="inf"):
            await replay(bus, events)


async def test_a_replay_file_with_a_huge_recorded_period_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "odd.evlog"
    with LogRecorder(path) as recorder:
        recorder.write_many(
            [
                RunStarted(run_id="r", name="r", world_size=1, seq=0, time=1.0),
                HealthCheckTick(period=0, start=1.0, end=1e9, seq=1, time=1e9),
            ]
        )
    with pytest.raises(ValueError, match="period"):
        await replay_file(path, lambda bus: None)


async def test_a_period_given_to_a_replay_is_checked_never_swapped_for_the_logs(
    tmp_path: Path,
) -> None:
    """``period=0`` is a mistake to say, not a request for the recorded period."""
    path = _log_with(tmp_path, [1.5, 2.5])
    with pytest.raises(ValueError, match=r"^period must be a number of seconds"):
        await replay_file(path, lambda bus: None, period=0.0)
