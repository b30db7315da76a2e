"""The report names why deliveries were skipped, from what the log recorded: coalesced,
disabled, or stopped by the fault policy, and only "skipped" when the log cannot tell."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from adapters.report import run_report
from adapters.report._cost import COALESCED, DISABLED, FAULT_POLICY, UNKNOWN_CAUSE, skip_cause
from adapters.report._digest import RunDigest, digest_log
from adapters.report._run_page import cost_chart, skipped_text
from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    HandlerStateChanged,
    HealthCheckTick,
    Report,
    RunStarted,
    VirtualClock,
)
from eventbus._events import HandlerUsage
from eventbus.log import LogRecorder

pytestmark = pytest.mark.anyio


def usage(handler: str, *, calls: int = 1, total: float = 0.001, skipped: int = 0) -> HandlerUsage:
    return HandlerUsage(handler=handler, calls=calls, total=total, max=total, skipped=skipped)


def budget_report(period: int, *usages: HandlerUsage) -> BudgetReport:
    total = sum(u.total for u in usages)
    return BudgetReport(
        period=period,
        start=float(period),
        end=period + 1.0,
        budget=0.05,
        total=total,
        fraction=total,
        handlers=usages,
    )


def tick(period: int) -> HealthCheckTick:
    return HealthCheckTick(period=period, start=float(period), end=period + 1.0)


def changed(handler: str, state: str, reason: str) -> HandlerStateChanged:
    return HandlerStateChanged(handler=handler, state=state, reason=reason)  # type: ignore[arg-type]


def digest(events: list[Event]) -> RunDigest:
    run = RunDigest(Path("run.evlog"), "r")
    for event in events:
        run.add(event)
    return run


@pytest.mark.parametrize(
    ("state", "reason", "cause"),
    [
        ("coalescing", "over budget", COALESCED),
        ("disabled", "over budget", DISABLED),
        ("disabled", "over budget: 205 ms of 5 s (4.1%), budget 25 ms", DISABLED),
        ("disabled", "3 faults (max_faults=3)", FAULT_POLICY),
        ("disabled", "on_error='raise': it failed the run", FAULT_POLICY),
        ("disabled", "raised ValueError: the run ends", FAULT_POLICY),
        ("disabled", "a reason of a later release", DISABLED),
        ("normal", "back under budget", None),
    ],
)
def test_a_state_and_its_reason_give_the_cause_of_skips(
    state: str, reason: str, cause: str | None
) -> None:
    assert skip_cause(state, reason) == cause


def test_skips_take_the_cause_the_handler_was_under_in_their_period() -> None:
    run = digest(
        [
            budget_report(0, usage("slow", total=0.2)),
            # Period 1's verdict, logged as the bus writes it (the period's tick, its
            # verdicts, its report), holds from period 2.
            tick(1),
            changed("slow", "coalescing", "over budget"),
            budget_report(1, usage("slow", total=0.2)),
            budget_report(2, usage("slow", skipped=5)),
            tick(3),
            changed("slow", "normal", "back under budget"),
            budget_report(3, usage("slow", skipped=2)),  # still coalescing in period 3
            budget_report(4, usage("slow")),
            tick(5),
            changed("slow", "disabled", "over budget"),
            budget_report(5, usage("slow")),
            budget_report(6, usage("slow", calls=0, total=0.0, skipped=3)),
            tick(7),
            changed("slow", "normal", "back under budget"),
            budget_report(7, usage("slow", calls=0, total=0.0, skipped=3)),
            budget_report(8, usage("slow")),
            changed("slow", "disabled", "2 faults (max_faults=2)"),  # in period 9 itself
            budget_report(9, usage("slow", skipped=4)),
            budget_report(10, usage("slow", calls=0, total=0.0, skipped=6)),
        ]
    )
    slow = run.cost.handlers["slow"]
    assert slow.skipped == 23
    assert slow.skipped_by == {COALESCED: 7, DISABLED: 6, FAULT_POLICY: 10}
    assert skipped_text(slow) == "23 (10 stopped by the fault policy, 7 coalesced, 6 disabled)"
    spans = [(s.state, s.start, s.end) for s in run.cost.spans]
    assert spans == [("coalescing", 2, 4), ("disabled", 6, 8), ("disabled", 9, None)]


def test_a_state_changed_between_two_periods_holds_from_the_next() -> None:
    """Without a tick before it (a log written by hand), a change after period p's
    report holds from period p + 1, as before."""
    run = digest(
        [
            budget_report(0, usage("slow", total=0.2)),
            changed("slow", "coalescing", "over budget"),
            budget_report(1, usage("slow", skipped=3)),
        ]
    )
    assert run.cost.handlers["slow"].skipped_by == {COALESCED: 3}
    assert [(s.start, s.end) for s in run.cost.spans] == [(1, None)]


def test_a_resumed_process_starts_with_every_handler_normal() -> None:
    run = digest(
        [
            RunStarted(run_id="r", name="n", world_size=1),
            changed("slow", "coalescing", "over budget"),
            budget_report(0, usage("slow", skipped=3)),
            RunStarted(run_id="r", name="n", world_size=1),  # a new process, a new bus
            budget_report(0, usage("slow", skipped=1)),
        ]
    )
    assert run.cost.handlers["slow"].skipped_by == {COALESCED: 3, UNKNOWN_CAUSE: 1}


def test_skips_under_two_causes_or_none_are_only_counted() -> None:
    run = digest(
        [
            budget_report(0, usage("a", skipped=1)),  # never changed state: unsubscribed?
            changed("b", "coalescing", "over budget"),
            changed("b", "disabled", "3 faults (max_faults=3)"),  # both in period 1
            budget_report(1, usage("a"), usage("b", skipped=9)),
            budget_report(2, usage("b", calls=0, total=0.0, skipped=2)),  # only disabled
        ]
    )
    a, b = run.cost.handlers["a"], run.cost.handlers["b"]
    assert a.skipped_by == {UNKNOWN_CAUSE: 1}
    assert skipped_text(a) == "1"
    assert b.skipped_by == {UNKNOWN_CAUSE: 9, FAULT_POLICY: 2}
    assert skipped_text(b) == "11 (2 stopped by the fault policy, 9 cause not in the log)"


def test_the_chart_marks_each_cause_apart_and_never_calls_a_disabling_a_coalescing() -> None:
    run = digest(
        [
            budget_report(0, usage("a"), usage("b")),
            tick(1),
            changed("a", "coalescing", "over budget"),
            changed("b", "disabled", "over budget"),
            budget_report(1, usage("a"), usage("b")),
            budget_report(2, usage("a", skipped=4), usage("b", calls=0, total=0.0, skipped=3)),
            budget_report(3, usage("c", skipped=1)),
        ]
    )
    chart = cost_chart("chart-cost", run.cost)
    marks = {(m["x"], m["kind"], m["label"]) for m in chart.markers}
    assert marks == {
        (2, "skipped-coalesced", "4 skipped (coalesced)"),
        (2, "skipped-disabled", "3 skipped (disabled)"),
        (3, "skipped", "1 skipped"),
    }
    key = chart.html().split('<div class="key">', 1)[1].split("</div>", 1)[0]
    names = re.findall(r">([^<]+)</span>", key)
    assert "skipped (coalesced)" in names and "skipped (disabled)" in names
    assert "skipped" in names
    page = run_report(run)
    assert "3 disabled" in page and "4 coalesced" in page


async def test_a_recorded_bus_gives_each_skip_its_cause(tmp_path: Path) -> None:
    """Live: a coalescing handler, one disabled over budget, one stopped by its fault
    policy; the log they leave names each one's skips."""
    clock = VirtualClock()
    path = tmp_path / "run.evlog"

    def heavy(event: Report) -> None:
        clock.advance(0.1)

    def broken(event: Report) -> None:
        raise ValueError("no")

    def report(index: int) -> Report:
        return Report(run_id="r", rank=0, world_size=1, index=index, metrics={})

    with LogRecorder(path, fsync="never") as recorder:
        bus = EventBus(clock=clock, period=1.0, budget=0.05)
        recorder.attach(bus)
        async with bus:
            bus.subscribe(Report, heavy, name="coalescer", over_budget="coalesce")
            bus.subscribe(Report, heavy, name="disabled", over_budget="disable")
            bus.subscribe(Report, broken, name="broken", on_error="disable", max_faults=1)
            await bus.publish(report(0))  # period 0: both heavy ones over budget
            await bus.wait_idle()
            clock.set(1.0)
            await bus.wait_idle()
            for i in range(1, 6):  # period 1: coalesced, disabled, disabled by a fault
                await bus.publish(report(i))
            await bus.wait_idle()
            clock.set(1.5)
    cost = digest_log(path).cost
    by_cause = {name: cost.handlers[name].skipped_by for name in ("coalescer", "disabled")}
    assert by_cause["coalescer"] == {COALESCED: cost.handlers["coalescer"].skipped}
    assert by_cause["disabled"] == {DISABLED: 5}
    assert cost.handlers["coalescer"].skipped > 0
    broken_cost = cost.handlers["broken"]
    assert broken_cost.skipped > 0
    assert broken_cost.skipped_by == {FAULT_POLICY: broken_cost.skipped}
