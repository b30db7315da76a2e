"""Health-check periods and overhead budgets, on virtual time: exact figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    EventBus,
    HandlerStateChanged,
    HealthCheckTick,
    Report,
    VirtualClock,
)

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={})


def costs(clock: VirtualClock, seconds: float) -> Callable[[Any], None]:
    """A handler that takes ``seconds`` of virtual time per call."""

    def handler(event: object) -> None:
        clock.advance(seconds)

    return handler


async def test_budget_report_has_exact_figures_per_handler() -> None:
    clock = VirtualClock()
    reports: list[BudgetReport] = []
    ticks: list[HealthCheckTick] = []
    async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
        bus.subscribe(BudgetReport, reports.append)
        bus.subscribe(HealthCheckTick, ticks.append)
        bus.subscribe(Report, costs(clock, 0.03), name="slow")
        bus.subscribe(Report, costs(clock, 0.001), name="cheap", budget=0.01)
        for i in range(2):
            await bus.publish(report(i))
        await bus.wait_idle()
        clock.set(1.0)
        await bus.wait_idle()
    assert [(t.period, t.start, t.end) for t in ticks][:1] == [(0, 0.0, 1.0)]
    first = reports[0]
    assert (first.period, first.start, first.end, first.budget) == (0, 0.0, 1.0, 0.05)
    usage = {u.handler: u for u in first.handlers}
    assert usage["slow"].calls == 2
    assert usage["slow"].total == pytest.approx(0.06)
    assert usage["slow"].max == pytest.approx(0.03)
    assert usage["slow"].budget == pytest.approx(0.05)
    assert usage["slow"].over_budget
    assert usage["cheap"].total == pytest.approx(0.002)
    assert usage["cheap"].budget == pytest.approx(0.01)
    assert not usage["cheap"].over_budget
    assert first.total == pytest.approx(0.062)
    assert first.fraction == pytest.approx(0.062)
    assert first.over_budget == ("slow",)


async def test_over_budget_warning_names_the_worst_handlers_once_per_period() -> None:
    clock = VirtualClock()
    with capture_logs() as logs:
        async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
            bus.subscribe(Report, costs(clock, 0.2), name="hog")
            await bus.publish(report(0))
            await bus.wait_idle()
            clock.set(1.0)
            await bus.wait_idle()
    warnings = [entry for entry in logs if entry["event"].startswith("callbacks over budget")]
    assert len(warnings) == 1
    assert warnings[0]["worst"] == {"hog": pytest.approx(0.2)}


async def test_a_jump_in_time_closes_the_period_then_the_idle_stretch_as_one() -> None:
    clock = VirtualClock()
    ticks: list[HealthCheckTick] = []
    async with EventBus(clock=clock, period=2.0) as bus:
        bus.subscribe(HealthCheckTick, ticks.append)
        clock.set(7.0)
        await bus.wait_idle()
        clock.set(7.5)  # within the period that began at 6
        await bus.wait_idle()
        clock.set(8.0)
        await bus.wait_idle()
    periods = [(t.period, t.start, t.end) for t in ticks]
    assert periods == [(0, 0.0, 2.0), (1, 2.0, 6.0), (2, 6.0, 8.0)]


async def test_coalescing_delivers_only_the_newest_of_each_type_and_counts_the_rest() -> None:
    clock = VirtualClock()
    seen: list[tuple[str, int]] = []
    reports: list[BudgetReport] = []
    changes: list[HandlerStateChanged] = []

    def heavy(event: Report | CheckpointSaved) -> None:
        seen.append((type(event).__name__, event.index))
        clock.advance(0.1)

    async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
        bus.subscribe((Report, CheckpointSaved), heavy, name="heavy", over_budget="coalesce")
        bus.subscribe(BudgetReport, reports.append)
        bus.subscribe(HandlerStateChanged, changes.append)
        await bus.publish(report(0))
        await bus.wait_idle()
        clock.set(1.0)  # period 0: 0.1 s used of 0.05 -> coalescing
        await bus.wait_idle()
        for i in range(1, 6):
            await bus.publish(report(i))
        await bus.publish(CheckpointSaved(run_id="r", checkpoint="c", index=4))
        await bus.publish(CheckpointSaved(run_id="r", checkpoint="c", index=5))
        await bus.wait_idle()
        clock.set(2.0)  # period 1: over budget again, still coalescing
        await bus.wait_idle()
        clock.set(3.0)  # period 2: nothing used -> back to normal
        await bus.wait_idle()
        await bus.publish(report(6))
        await bus.publish(report(7))
    assert seen == [
        ("Report", 0),
        ("Report", 5),
        ("CheckpointSaved", 5),
        ("Report", 6),
        ("Report", 7),
    ]
    usage = {r.period: {u.handler: u for u in r.handlers} for r in reports}
    assert usage[1]["heavy"].skipped == 5
    assert usage[1]["heavy"].calls == 2
    assert [(c.state, c.reason.split(":")[0]) for c in changes] == [
        ("coalescing", "over budget"),
        ("normal", "back under budget"),
    ]
    assert bus.stats().skipped == 5


async def test_disable_policy_skips_its_probation_then_returns_to_normal() -> None:
    clock = VirtualClock()
    seen: list[int] = []

    def heavy(event: Report) -> None:
        seen.append(event.index)
        clock.advance(0.1)

    async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
        sub = bus.subscribe(Report, heavy, name="heavy", over_budget="disable", probation=1)
        await bus.publish(report(0))
        await bus.wait_idle()
        clock.set(1.0)
        await bus.wait_idle()
        assert sub.stats().state == "disabled"
        await bus.publish(report(1))
        await bus.publish(report(2))
        await bus.wait_idle()
        clock.set(2.0)
        await bus.wait_idle()
        assert sub.stats().state == "normal"
        await bus.publish(report(3))
    assert seen == [0, 3]
    assert sub.stats().skipped == 2


async def test_warn_policy_keeps_delivering() -> None:
    clock = VirtualClock()
    seen: list[int] = []

    def heavy(event: Report) -> None:
        seen.append(event.index)
        clock.advance(0.1)

    async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
        sub = bus.subscribe(Report, heavy)
        for i in range(3):
            await bus.publish(report(i))
            await bus.wait_idle()
            clock.advance(1.0)
            await bus.wait_idle()
    assert seen == [0, 1, 2]
    assert sub.state == "normal"


async def test_closing_reports_the_unfinished_period() -> None:
    clock = VirtualClock()
    reports: list[BudgetReport] = []
    async with EventBus(clock=clock, period=10.0) as bus:
        bus.subscribe(BudgetReport, reports.append)
        bus.subscribe(Report, costs(clock, 0.25), name="short-run")
        await bus.publish(report(0))
        await bus.wait_idle()
        clock.set(3.0)
    assert len(reports) == 1
    final = reports[0]
    assert (final.partial, final.start, final.end) == (True, 0.0, 3.0)
    assert [(u.handler, u.calls, u.total) for u in final.handlers] == [("short-run", 1, 0.25)]
