"""``eventbus stats LOG``: its cost section, summed from the log's budget reports.

The budget reports are in every log a run recorded, old ones included, so the
section is the same for a log of format 2 (``tests/data``) as for today's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _builders import eventbus as cli

from eventbus import BudgetReport, VirtualClock
from eventbus.log import read_log
from eventbus.testing import report_rounds, write_log
from handlers import UserCallback, open_run

DATA = Path(__file__).parent / "data"
HOOKS = {"Noop.after_report", "EarlyStopping.after_report"}


def summed(log: Path) -> dict[str, dict[str, Any]]:
    """Each handler's figures over the budget reports of ``log``, as the test sums them."""
    figures: dict[str, dict[str, Any]] = {}
    for event in read_log(log).events:
        if isinstance(event, BudgetReport):
            for usage in event.handlers:
                row = figures.setdefault(usage.handler, {"calls": 0, "total": 0.0, "over": 0})
                row["calls"] += usage.calls
                row["total"] += usage.total
                row["over"] += usage.over_budget
    return figures


@pytest.mark.parametrize("name", ["format2-run.evlog", "format2-run.jsonl"])
def test_a_format_2_log_gets_its_costs_from_its_budget_reports(name: str) -> None:
    log = DATA / name
    shown = cli("stats", log)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert "rounds:" in text and "by type:" in text  # what it printed before
    assert "callback costs: 3 health-check period(s) over" in text
    lines = text.splitlines()
    callbacks = lines.index(next(line for line in lines if line.startswith("  callbacks ")))
    others = lines.index(next(line for line in lines if line.startswith("  library and plain")))
    assert "calls" in lines[callbacks] and "total ms" in lines[callbacks]
    assert "mean µs" in lines[callbacks] and "share" in lines[callbacks]
    # The callbacks' hooks first, the library's handlers apart after them.
    assert {line.split()[0] for line in lines[callbacks + 1 : others]} == HOOKS
    library = {line.split()[0] for line in lines[others + 1 :]}
    assert {"state-store", "handlers.ReportCallbackHandler"} <= library
    for line in lines[callbacks + 1 : others] + lines[others + 1 :]:
        assert line.rstrip().endswith("of 3 period(s)") and "%" in line

    figures = json.loads(cli("stats", log, "--json").stdout)
    assert figures["periods"] == 3 and figures["by_type"]["BudgetReport"] == 3
    expected = summed(log)
    for cost in figures["callbacks"] + figures["other_handlers"]:
        want = expected.pop(cost["handler"])
        assert (cost["calls"], cost["periods_over_budget"]) == (want["calls"], want["over"])
        assert cost["total"] == pytest.approx(want["total"])
        assert cost["mean"] == pytest.approx(want["total"] / want["calls"])
        assert cost["total"] >= cost["max"] >= 0.0
    assert expected == {}  # every handler of the reports, once
    assert {c["handler"] for c in figures["callbacks"]} == HOOKS
    assert [c["calls"] for c in figures["callbacks"]] == [20, 20]


def test_a_log_without_budget_reports_says_so_in_one_line(tmp_path: Path) -> None:
    log = write_log(tmp_path / "bare.evlog", report_rounds(2, world_size=1))
    shown = cli("stats", log)
    assert shown.returncode == 0, shown.stderr
    assert "callback costs: none recorded (the log holds no budget reports)" in shown.stdout
    figures = json.loads(cli("stats", log, "--json").stdout)
    assert (figures["periods"], figures["callbacks"], figures["other_handlers"]) == (0, [], [])


class Slow(UserCallback):
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.clock.advance(0.25)


@pytest.mark.anyio
async def test_a_run_s_log_shows_what_its_result_says_its_callbacks_cost(tmp_path: Path) -> None:
    clock = VirtualClock()
    log = tmp_path / "run.evlog"
    async with open_run(
        world_size=1, callbacks=[Slow(clock)], clock=clock, log=log, period=10.0
    ) as run:
        for _ in range(3):
            await run.reporter(0).report({"loss": 1.0})
    assert run.result is not None
    [slow] = run.result.callbacks
    figures = json.loads(cli("stats", log, "--json").stdout)
    [shown] = figures["callbacks"]
    assert shown == {
        "handler": "Slow.after_report",
        "calls": 3,
        "total": slow.total,
        "mean": slow.mean,
        "max": slow.max,
        "periods_over_budget": 1,  # 0.75 s against 5% of 10 s, judged as the bus closed
        "faults": 0,
        "timeouts": 0,
        "skipped": 0,
    }
    assert slow.periods_over_budget == 1 and slow.total == pytest.approx(0.75)
    text = cli("stats", log).stdout
    [row] = [line for line in text.splitlines() if line.startswith("  Slow.after_report")]
    assert row.split()[1:9] == ["3", "0", "0", "0", "750.000", "250000.00", "250.000", "100.00%"]
    assert row.rstrip().endswith("1 of 1 period(s)")
