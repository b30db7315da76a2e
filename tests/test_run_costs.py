"""``RunResult.callbacks``: what each training callback's hooks cost over the run.

The costs are made known by construction: a callback that advances the run's
``VirtualClock`` by a set time per call costs exactly that on the bus's
accounting, so every figure is checked exactly, never timed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from eventbus import AfterRun, RunResult, TrainRunContext, VirtualClock
from eventbus._events import CallbackCost
from eventbus.log import read_log
from handlers import UserCallback, open_run

pytestmark = pytest.mark.anyio

DATA = Path(__file__).parent / "data"


class Slow(UserCallback):
    """Takes ``seconds`` of the run's virtual time per round."""

    def __init__(self, clock: VirtualClock, seconds: float) -> None:
        self.clock, self.seconds = clock, seconds

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.clock.advance(self.seconds)


class Ends(UserCallback):
    """Costs nothing; keeps the result ``after_run`` was given."""

    def __init__(self) -> None:
        self.result: RunResult | None = None

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        pass

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.result = result


def by_name(result: RunResult | None) -> dict[str, CallbackCost]:
    assert result is not None
    return {cost.handler: cost for cost in result.callbacks}


async def test_each_hook_s_calls_total_mean_and_max_are_the_bus_s_accounting() -> None:
    clock = VirtualClock()
    ends = Ends()
    async with open_run(  # 0.75 s within 10% of a 10 s period: never over budget
        world_size=1, callbacks=[Slow(clock, 0.25), ends], clock=clock, period=10.0, budget=0.1
    ) as run:
        for index in range(3):
            await run.reporter(0).report({"loss": 1.0 / (index + 1)})
        await run.bus.wait_idle()
    given = by_name(ends.result)
    # The training callbacks' hooks only, in the order they were subscribed.
    assert list(given) == ["Slow.after_report", "Ends.after_report", "Ends.after_run"]
    slow = given["Slow.after_report"]
    assert (slow.calls, slow.faults, slow.timeouts, slow.skipped) == (3, 0, 0, 0)
    assert slow.total == pytest.approx(0.75)
    assert slow.mean == pytest.approx(0.25) and slow.max == pytest.approx(0.25)
    # after_run is given its result before it runs: its own call is not in it yet.
    assert given["Ends.after_run"].calls == 0
    for cost in given.values():
        assert cost.total >= cost.max >= 0.0
        assert cost.mean == (cost.total / cost.calls if cost.calls else 0.0)
    # The run's result, read after the run, has them up to the bus's close.
    final = by_name(run.result)
    assert final["Ends.after_run"].calls == 1
    assert final["Slow.after_report"] == slow
    stats = {s.name: s for s in run.bus.stats().subscriptions}
    for name, cost in final.items():
        assert (cost.calls, cost.total, cost.max) == (
            stats[name].calls,
            stats[name].total,
            stats[name].max,
        )
    # The library's own handlers are not the user's callbacks.
    assert not any(name.startswith("handlers.") for name in final)


async def test_a_callback_over_budget_has_its_periods_over_budget_counted() -> None:
    """0.3 s a round against 5% of a 1 s period: over budget in each of two periods."""
    clock = VirtualClock()
    ends = Ends()
    async with open_run(
        world_size=1, callbacks=[Slow(clock, 0.3), ends], clock=clock, period=1.0, budget=0.05
    ) as run:
        for index in range(2):
            await run.reporter(0).report({"loss": 1.0})
            await run.bus.wait_idle()
            clock.set(index + 1.0)  # the period ends: its budget report judges it
            await run.bus.wait_idle()
    given = by_name(ends.result)
    assert given["Slow.after_report"].periods_over_budget == 2
    assert given["Ends.after_report"].periods_over_budget == 0
    assert by_name(run.result)["Slow.after_report"].periods_over_budget == 2


async def test_the_period_cut_by_the_run_s_end_is_judged_in_the_run_s_result() -> None:
    """A run shorter than a period: its one period is judged when the bus closes,
    after ``after_run``; ``Run.result`` has the verdict."""
    clock = VirtualClock()
    ends = Ends()
    async with open_run(
        world_size=1, callbacks=[Slow(clock, 0.25), ends], clock=clock, period=10.0
    ) as run:
        for _ in range(3):  # 0.75 s against 5% of 10 s
            await run.reporter(0).report({"loss": 1.0})
    assert by_name(ends.result)["Slow.after_report"].periods_over_budget == 0
    final = by_name(run.result)
    assert final["Slow.after_report"].periods_over_budget == 1
    assert final["Ends.after_report"].periods_over_budget == 0


async def test_the_log_records_the_costs_after_run_was_given(tmp_path: Path) -> None:
    clock = VirtualClock()
    ends = Ends()
    log = tmp_path / "run.evlog"
    async with open_run(
        world_size=1, callbacks=[Slow(clock, 0.125), ends], clock=clock, log=log
    ) as run:
        await run.reporter(0).report({"loss": 1.0})
    [ended] = [e for e in read_log(log).events if isinstance(e, AfterRun)]
    assert ends.result is not None and ended.result == ends.result
    assert by_name(ended.result)["Slow.after_report"].total == pytest.approx(0.125)


@pytest.mark.parametrize("name", ["format2-run.evlog", "format2-run.jsonl"])
def test_a_log_recorded_before_the_costs_reads_with_none(name: str) -> None:
    ended = [e for e in read_log(DATA / name).events if isinstance(e, AfterRun)]
    assert len(ended) == 2
    assert all(e.result.callbacks == () and e.result.rounds > 0 for e in ended)
