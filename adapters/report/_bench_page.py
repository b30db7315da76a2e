"""A bench run's page: the same callback-cost chart and table as a run's report.

``eventbus bench`` times every call, so its table has exact percentiles
(a log keeps only each period's figures); the figures come in ready-made,
and this module only lays them out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._page import Chart, Document, escape, facts, table
from ._series import SeriesGroup

__all__ = ["BENCH_HEADERS", "bench_report"]

BENCH_HEADERS = [
    "callback",
    "calls",
    "mean µs",
    "p50 µs",
    "p99 µs",
    "max µs",
    "bus calls",
    "bus total ms",
    "share of run",
    "worst period",
    "periods over budget",
    "bus skipped",
    "over budget policy",
    "disabled or coalescing",
]
#: The columns of figures (right-aligned).
_NUMERIC = range(1, BENCH_HEADERS.index("over budget policy"))


def bench_report(
    *,
    title: str,
    subtitle: str,
    summary: Sequence[tuple[str, str, str]],
    per_period_pct: Mapping[str, Sequence[float]],
    budget_pct: float,
    rows: Sequence[Sequence[str]],
    notes: Sequence[str] = (),
    spans: Sequence[tuple[float, float, str, str]] = (),
) -> str:
    """The page: ``summary`` as facts, each callback's share of every period against
    ``budget_pct``, and ``rows`` (``BENCH_HEADERS``), the costliest first. ``spans``:
    ``(first period, end, state, label)`` where the bus disabled or coalesced a
    callback, shaded on the chart as the run report shades them."""
    group = SeriesGroup()
    for name, shares in per_period_pct.items():
        index = group.series(name)
        for period, share in enumerate(shares):
            group.add(index, period, share)
    chart = Chart.of_shares(
        "chart-cost",
        "Each callback's share of every period",
        "log scale; the dashed line is the budget",
    )
    lines = group.lines()
    chart.x = lines.x
    for label, column in zip(lines.names, lines.columns, strict=True):
        chart.line(label, column)  # each its own colour, in turn
    chart.budget(budget_pct)
    for start, end, state, label in spans:
        chart.span(start, end, state, label)
    document = Document(title, subtitle)
    document.section(
        "summary",
        "Summary",
        facts(summary) + "".join(f'<p class="note">{escape(note)}</p>' for note in notes),
    )
    body = document.add_chart(chart) + table(BENCH_HEADERS, rows, numeric=_NUMERIC)
    document.section("cost", "Callback cost", body)
    return document.render()
