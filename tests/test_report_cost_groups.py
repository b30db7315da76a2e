"""The report's callback cost section: the library's own handlers kept apart from the
user's callbacks, every line of a chart its own colour, axes and figures with units."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from adapters.report import run_report
from adapters.report._cost import is_library
from adapters.report._digest import RunDigest
from adapters.report._limits import COST_LINES, MAX_HANDLERS, MAX_RANK_LINES
from adapters.report._page import Chart, series_style, with_unit
from adapters.report._run_page import cost_chart
from eventbus import BudgetReport
from eventbus._events import HandlerUsage

LIBRARY = [
    "eventbus.recorder.fsync",
    "eventbus.recorder.flush",
    "state-store",
    "handlers.ReportCallbackHandler",
    "handlers.ExceptionCallbackHandler",
    "handlers.RunCallbackHandler",
    "Reporter.sync",
    "adapters.transformers.trainer_state",
]
USERS = [f"Callback{i}.after_report" for i in range(10)] + ["mymodule.on_event"]


def budget_report(period: int, *usages: HandlerUsage) -> BudgetReport:
    total = sum(u.total for u in usages)
    return BudgetReport(
        period=period,
        start=5.0 * period,
        end=5.0 * (period + 1),
        budget=0.25,
        total=total,
        fraction=total / 5.0,
        handlers=usages,
    )


def a_run() -> RunDigest:
    """Three periods of every handler above, the user's dearer than the library's."""
    run = RunDigest(Path("run.evlog"), "r")
    for period in range(3):
        usages = [
            HandlerUsage(handler=name, calls=10, total=0.001 * (i + 1), max=0.001)
            for i, name in enumerate(LIBRARY)
        ]
        usages += [
            HandlerUsage(handler=name, calls=10, total=0.01 * (i + 1), max=0.01)
            for i, name in enumerate(USERS)
        ]
        run.add(budget_report(period, *usages))
    return run


def report_data(page: str) -> Any:
    block = re.search(r'id="report-data">(.*?)</script>', page, re.S)
    assert block is not None
    return json.loads(block.group(1))


def test_the_librarys_own_handlers_are_told_by_name() -> None:
    assert all(is_library(name) for name in LIBRARY)
    assert not any(is_library(name) for name in USERS)
    assert not is_library("EarlyStopping.after_report")  # a built-in the user chose
    assert not is_library("(other handlers)")


def test_the_library_has_its_own_chart_and_table() -> None:
    page = run_report(a_run())
    charts = {c["id"]: c for c in report_data(page)["charts"]}
    users = {s["label"] for s in charts["chart-cost"]["series"]}
    library = {s["label"] for s in charts["chart-cost-library"]["series"]}
    assert "all handlers" in users and not users & set(LIBRARY)
    assert len(users) == 1 + COST_LINES  # the costliest of the user's
    assert "the library's handlers together" in library
    assert library - {"the library's handlers together"} == set(LIBRARY)
    section = page[page.index('<section id="cost"') : page.index('<section id="failures"')]
    tables = section.rsplit("</figure>", 1)[1]
    yours, ours = tables.split("<h3>The library's own handlers</h3>")
    assert "<h3>Your callbacks</h3>" in yours
    assert set(re.findall(r"<tr><td>([^<]+)</td>", yours)) == set(USERS)
    assert set(re.findall(r"<tr><td>([^<]+)</td>", ours)) == set(LIBRARY)


def test_a_run_without_library_handlers_has_one_cost_chart() -> None:
    run = RunDigest(Path("run.evlog"), "r")
    run.add(budget_report(0, HandlerUsage(handler="A.after_report", calls=1, total=0.1, max=0.1)))
    page = run_report(run)
    ids = [c["id"] for c in report_data(page)["charts"]]
    assert ids == ["chart-cost"]
    assert "The library's own handlers" not in page


def test_every_line_of_a_chart_has_its_own_colour() -> None:
    run = a_run()
    for library in (False, True):
        chart = cost_chart("c", run.cost, library=library)
        colours = [s["colour"] for s in chart.series]
        assert len(set(colours)) == len(colours), colours
    styles = [series_style(position)[0] for position in range(MAX_HANDLERS)]
    assert len(set(styles)) == MAX_HANDLERS
    assert all(re.fullmatch(r"#[0-9A-F]{6}", colour) for colour in styles)
    assert "#000000" not in styles  # black is all handlers together
    plain = Chart("m", "loss", x_label="round", y_label="loss")
    for rank in range(MAX_RANK_LINES):
        plain.line(f"rank {rank}", [1.0])
    assert len({s["colour"] for s in plain.series}) == MAX_RANK_LINES
    assert all(s["dash"] == [] for s in plain.series)  # within the ten colours: solid


def test_axes_and_figures_carry_their_units() -> None:
    run = a_run()
    spec = cost_chart("c", run.cost).spec()
    assert spec["yUnit"] == "%"
    assert spec["xLabel"] == "health-check period (5 s each)"
    text = cost_chart("c", run.cost).text_alternative()
    assert re.search(r"<td>[0-9.e+-]+% at [0-9]", text) is not None  # 0.2% at 0, not 0.2
    assert with_unit(0.001078, "%") == "0.001078%"
    assert with_unit(12.5, "ms") == "12.5 ms"
    assert with_unit(3.0, "s") == "3 s"
    assert with_unit(1234.0, "", 6) == "1234"
    assert with_unit(1e-6, "%") == "1e-6%"
    assert with_unit(12_345_678.0, "") == "1.235e7"
    with pytest.raises(ValueError, match="chart c: unit 'kg'"):
        Chart("c", "t", x_label="x", y_label="y", y_unit="kg")
