"""The callback-cost chart in headless Chromium over every decade a share can take.

A log-scale axis whose lowest value sat just under a power of ten (0.0099%) left the
chart blank with ``RangeError: Invalid array length``: uPlot counted its ticks up from
that value and never stopped. One page holds a cost chart for each case (the shares of
every decade from 1e-6% to 100%, each decade's power of ten and the values just under
it, shares of 0, a single period, a budget under every share, no budget) and a log
chart without a budget line (as a metric's); every chart must draw, the page log no
error and fetch nothing, each scale span whole decades, and each tick read as a round
percentage. Needs Chromium, as tests/test_report_browser.py does.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from _browser import nonblank_canvases_js, render_page, require_chromium

from adapters.report._cost import CostDigest
from adapters.report._page import Chart, Document
from adapters.report._run_page import cost_chart
from eventbus import BudgetReport
from eventbus._events import HandlerUsage

DECADES = range(-6, 3)  # 1e-6% ... 100%
#: Each decade's power of ten and the values just under it (0.0099%, 0.095%...).
UNDER = (1.0, 0.99, 0.999, 0.95)
TICK = re.compile(r"(?P<value>[0-9.]+(e-?[0-9]+)?)%")


class Case:
    def __init__(self, ident: str, chart: Chart) -> None:
        self.ident = ident
        self.chart = chart
        #: What the chart draws (a log scale leaves out 0).
        self.shares = [v for s in chart.series for v in s["values"] if v is not None]
        self.threshold = chart.threshold["y"] if chart.threshold else None


def costs(ident: str, periods: list[dict[str, float]], budget_pct: float = 5.0) -> Case:
    """A run's cost chart: per period, each handler's share of it (%), periods of 1 s."""
    cost = CostDigest()
    for period, shares in enumerate(periods):
        usages = tuple(
            HandlerUsage(handler=name, calls=1, total=share / 100.0, max=share / 100.0)
            for name, share in shares.items()
        )
        total = sum(u.total for u in usages)
        cost.add_report(
            BudgetReport(
                period=period,
                start=float(period),
                end=period + 1.0,
                budget=budget_pct / 100.0,
                total=total,
                fraction=total,
                handlers=usages,
            )
        )
    return Case(ident, cost_chart(ident, cost))


def cases() -> list[Case]:
    every = [10.0**e for e in DECADES]
    made = [
        costs("decades", [{"Sweep.after_report": share} for share in every]),
        # 8 handlers a decade apart (the chart draws the 8 costliest), 1e-6% to 10%.
        costs("decades-apart", [{f"H{e}.after_report": 10.0**e for e in range(-6, 2)}] * 3),
    ]
    assert min(made[0].shares) == 1e-6 and max(made[0].shares) == 100.0
    assert min(made[1].shares) == 1e-6
    for e in DECADES:
        for under in UNDER:
            low = float(f"{under * 10.0**e:.6g}")
            ident = f"low-{low:g}".replace(".", "_")
            made.append(
                costs(
                    ident,
                    [{"Low.after_report": low, "High.after_report": 100.0}] * 2
                    + [{"Low.after_report": low * 3, "High.after_report": 40.0}],
                )
            )
    made += [
        costs("zero", [{"Idle.after_report": 0.0}] * 4),
        costs("zero-no-budget", [{"Idle.after_report": 0.0}] * 4, budget_pct=0.0),
        costs("single", [{"Once.after_report": 0.0099}]),
        costs("single-100", [{"Once.after_report": 100.0}]),
        costs("budget-under-all", [{"A.after_report": 0.5}, {"A.after_report": 2.0}], 1e-6),
        costs("no-budget", [{"A.after_report": 0.0099}, {"A.after_report": 0.2}], 0.0),
    ]
    metric = Chart("metric-log", "loss", x_label="round", y_label="loss", log_y=True)
    metric.x = [0.0, 1.0, 2.0]
    metric.line("rank 0", [50.0, 1.0, 0.0099])
    made.append(Case("metric-log", metric))
    return made


#: The page's formatter (``eventbusReport.format(value, unit, digits)``): what it writes.
FORMATS = [
    ("0.001078, '%', 4", "0.001078%"),
    ("1e-6, '%', 6", "1e-6%"),
    ("2.5e-5, '%', 6", "2.5e-5%"),
    ("0.01, '%', 6", "0.01%"),
    ("100, '%', 6", "100%"),
    ("12.5, 'ms', 4", "12.5 ms"),
    ("3, 's', 6", "3 s"),
    ("1234567, '', 4", "1.235e6"),
    ("1025, '', 6", "1025"),
    ("0.1 + 0.2, '', 6", "0.3"),
    ("null, '%', 4", ""),
]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Case], Any, list[str]]:
    require_chromium()
    made = cases()
    document = Document("cost chart sweep", "every decade of a share")
    document.section("cost", "Cost", "".join(document.add_chart(c.chart) for c in made))
    where = tmp_path_factory.mktemp("sweep")
    page = where / "sweep.html"
    page.write_text(document.render(), encoding="utf-8")
    formats = ", ".join(f"eventbusReport.format({args})" for args, _ in FORMATS)
    script = (
        f"({{canvases: {nonblank_canvases_js}, axes: eventbusReport.axes, "
        f"drawn: document.body.dataset.charts, formats: [{formats}]}})"
    )
    rendered = render_page(page, where / "sweep.png", height=1200, script=script)
    assert rendered.ready, "the page never said its charts drew (body data-ready)"
    return made, rendered.value, rendered.console_errors + rendered.network_requests


def test_every_chart_draws_with_no_error_and_no_request(
    sweep: tuple[list[Case], Any, list[str]],
) -> None:
    made, value, problems = sweep
    assert problems == []
    assert value["drawn"] == str(len(made))
    assert value["canvases"]["drawn"] == len(made), value["canvases"]
    assert set(value["axes"]) == {c.ident for c in made}


def power_of_ten(value: float) -> bool:
    exponent = math.log10(value)
    return abs(exponent - round(exponent)) < 1e-9


def test_every_log_scale_spans_whole_decades_around_its_values_and_budget(
    sweep: tuple[list[Case], Any, list[str]],
) -> None:
    made, value, _ = sweep
    for case in made:
        axis = value["axes"][case.ident]
        low, high = axis["min"], axis["max"]
        assert power_of_ten(low) and power_of_ten(high), (case.ident, axis)
        shown = case.shares + ([case.threshold] if case.threshold else [])
        if shown:
            assert low <= min(shown) * (1 + 1e-9) and max(shown) <= high, (case.ident, axis)


def test_every_tick_reads_as_a_round_percentage(
    sweep: tuple[list[Case], Any, list[str]],
) -> None:
    made, value, _ = sweep
    for case in made:
        labels = [t for t in value["axes"][case.ident]["ticks"] if t]
        assert labels, case.ident
        unit = "%" if case.ident != "metric-log" else ""
        for label in labels:
            if unit:
                match = TICK.fullmatch(label)
                assert match is not None, (case.ident, label)
                number = float(match["value"])
            else:
                number = float(label)
            mantissa = number / 10.0 ** math.floor(math.log10(number) + 1e-9)
            assert abs(mantissa - round(mantissa)) < 1e-6, (case.ident, label)  # not 1.078


def test_figures_are_written_with_their_units(
    sweep: tuple[list[Case], Any, list[str]],
) -> None:
    _, value, _ = sweep
    assert dict(zip([args for args, _ in FORMATS], value["formats"], strict=True)) == dict(FORMATS)
