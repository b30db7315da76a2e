"""Two runs side by side: "did my change make callbacks cheaper?"

Both runs are put on one grid first (``align``: the finer run's buckets
are merged to the coarser's width), so round r of A is drawn above round r
of B, and period p above period p. Metrics are drawn as each run's mean
over ranks, with a band from the lowest to the highest rank; the callback
table puts each callback's figures in both runs next to the change.
"""

from __future__ import annotations

from typing import NamedTuple

from ._cost import ALL_CALLBACKS, BUDGET, CallbackCost
from ._digest import RunDigest
from ._limits import MAX_METRICS
from ._metrics import MetricSeries
from ._page import Chart, Document, escape, table
from ._run_page import damage_banner, seconds
from ._series import align

__all__ = ["comparison_report"]


class RunStyle(NamedTuple):
    colour: str
    dash: tuple[int, ...]
    fill: str


RUN_STYLE = (
    RunStyle("#0072B2", (), "rgba(0,114,178,0.15)"),
    RunStyle("#D55E00", (6, 3), "rgba(213,94,0,0.15)"),
)
#: A change within this share is shown as unchanged (timings are noisy).
NOISE = 0.05


def _labels(a: RunDigest, b: RunDigest) -> tuple[str, str]:
    first, second = a.run_id or a.path.stem, b.run_id or b.path.stem
    if first == second:
        first, second = str(a.path), str(b.path)
    return f"A: {first}", f"B: {second}"


def _change(before: float, after: float) -> tuple[str, str]:
    """The change from A to B as text, and its class (lower cost is better)."""
    if before <= 0:
        return "-", ""
    ratio = after / before - 1.0
    tone = "" if abs(ratio) < NOISE else ("better" if ratio < 0 else "worse")
    return f"{ratio * 100:+.1f}%", tone


def _summary(a: RunDigest, b: RunDigest, labels: tuple[str, str]) -> str:
    def share(d: RunDigest) -> str:
        total = sum(c.total for c in d.cost.handlers.values())
        return f"{total / d.cost.timeline * 100:.3f}%" if d.cost.timeline else "-"

    rows = [
        ["status", a.status, b.status],
        ["world size", str(a.world_size), str(b.world_size)],
        ["duration", seconds(a.duration), seconds(b.duration)],
        ["rounds", f"{a.rounds:,}", f"{b.rounds:,}"],
        ["reports", f"{a.reports:,}", f"{b.reports:,}"],
        ["restarts", str(a.restarts), str(b.restarts)],
        ["worker failures", str(a.failure_count), str(b.failure_count)],
        ["checkpoints", str(a.checkpoints), str(b.checkpoints)],
        ["resumes", str(a.resume_count), str(b.resume_count)],
        ["callbacks' share of the run", share(a), share(b)],
        [
            "periods over budget",
            f"{a.cost.periods_over} of {a.cost.periods}",
            f"{b.cost.periods_over} of {b.cost.periods}",
        ],
        [
            "callback faults",
            f"{a.fault_count} failed, {a.timeout_count} timed out",
            f"{b.fault_count} failed, {b.timeout_count} timed out",
        ],
        ["events read", f"{a.events:,}", f"{b.events:,}"],
    ]
    return table(["", labels[0], labels[1]], rows)


def _cost(document: Document, a: RunDigest, b: RunDigest, labels: tuple[str, str]) -> str:
    if not a.cost.periods and not b.cost.periods:
        return '<p class="empty">Neither log has budget reports: no callback cost.</p>'
    return document.add_chart(_cost_chart(a, b, labels)) + _cost_table(a, b)


def _cost_chart(a: RunDigest, b: RunDigest, labels: tuple[str, str]) -> Chart:
    """All handlers' share of each period in both runs, on one grid, and the budget."""
    align(a.cost.shares, b.cost.shares)
    chart = Chart(
        "chart-cost",
        "All handlers' share of each period",
        x_label="health-check period",
        y_label="share of the period",
        y_unit="%",
        log_y=True,
        note="log scale; the dashed line is the budget",
    )
    groups = (a.cost.shares, b.cost.shares)
    lines = [group.lines([group.series(ALL_CALLBACKS)]) for group in groups]
    chart.x = sorted(set(lines[0].x) | set(lines[1].x))
    for label, line, style in zip(labels, lines, RUN_STYLE, strict=True):
        chart.line(
            label,
            _on(chart.x, line.x, line.columns[0]),
            colour=style.colour,
            dash=style.dash,
            width=2,
        )
    budgets = [g.band(g.series(BUDGET)).high for g in groups]
    highest = max((max(values) for values in budgets if values), default=None)
    if highest is not None and highest > 0:  # a log scale has no 0
        chart.threshold = {
            "y": highest,
            "colour": "#000000",
            "label": f"budget {highest:.3g}% of a period",
        }
    return chart


def _cost_table(a: RunDigest, b: RunDigest) -> str:
    """Each callback in A and in B, and the change, the costliest (in both) first."""
    names = {**dict.fromkeys(a.cost.handlers), **dict.fromkeys(b.cost.handlers)}
    empty = CallbackCost("")
    rows = []
    classes: dict[tuple[int, int], str] = {}
    order = sorted(
        names,
        key=lambda n: -(a.cost.handlers.get(n, empty).total + b.cost.handlers.get(n, empty).total),
    )
    for r, name in enumerate(order):
        first, second = a.cost.handlers.get(name, empty), b.cost.handlers.get(name, empty)
        shares = [
            c.total / d.cost.timeline * 100 if d.cost.timeline else 0.0
            for c, d in ((first, a), (second, b))
        ]
        if not first.calls or not second.calls:
            only = "only in A" if first.calls else "only in B" if second.calls else "-"
            (mean_change, mean_tone), (share_change, share_tone) = (only, ""), (only, "")
        else:
            mean_change, mean_tone = _change(first.mean, second.mean)
            share_change, share_tone = _change(*shares)
        classes[(r, 5)] = mean_tone
        classes[(r, 8)] = share_tone
        rows.append(
            [
                name,
                f"{first.calls:,}",
                f"{second.calls:,}",
                f"{first.mean * 1e6:.2f}",
                f"{second.mean * 1e6:.2f}",
                mean_change,
                f"{shares[0]:.3f}%",
                f"{shares[1]:.3f}%",
                share_change,
                str(first.periods_over),
                str(second.periods_over),
            ]
        )
    headers = [
        "callback",
        "calls A",
        "calls B",
        "mean µs A",
        "mean µs B",
        "mean change",
        "share A",
        "share B",
        "share change",
        "over budget A",
        "over budget B",
    ]
    return table(headers, rows, numeric=range(1, len(headers)), classes=classes)


def _on(grid: list[float], xs: list[float], values: list[float | None]) -> list[float | None]:
    """``values`` (along ``xs``) placed on ``grid`` (a superset of ``xs``)."""
    at = dict(zip(xs, values, strict=True))
    return [at.get(x) for x in grid]


def _metrics(document: Document, a: RunDigest, b: RunDigest, labels: tuple[str, str]) -> str:
    charts = (a.metrics, b.metrics)
    names = list({**dict.fromkeys(charts[0].metrics), **dict.fromkeys(charts[1].metrics)})
    if not names:
        return '<p class="empty">Neither run reported numeric metrics.</p>'
    body = (
        '<p class="note">Each run\'s mean over its ranks, with a band from the lowest to the '
        f"highest rank; A solid, B dashed. x: {escape(charts[0].x_label)}.</p>"
    )
    for n, name in enumerate(names[:MAX_METRICS]):
        present: list[tuple[str, MetricSeries, RunStyle]] = [
            (label, c.metrics[name], style)
            for label, c, style in zip(labels, charts, RUN_STYLE, strict=True)
            if name in c.metrics
        ]
        align(*(series.group for _, series, _ in present))
        bands = [series.group.band(series.all_ranks) for _, series, _ in present]
        title = present[0][1].name
        chart = Chart(f"chart-m{n}", title, x_label=charts[0].x_label, y_label=title)
        if len(present) == 1:
            chart.note = f"only in {present[0][0]}"
        chart.x = sorted({x for band in bands for x in band.x})
        for (label, _, style), band in zip(present, bands, strict=True):
            colour, dash = style.colour, style.dash
            high = chart.line(
                f"{label} highest",
                _on(chart.x, band.x, list(band.high)),
                colour=colour,
                width=0.5,
                dash=dash,
            )
            chart.line(
                f"{label} mean",
                _on(chart.x, band.x, list(band.mean)),
                colour=colour,
                width=2,
                dash=dash,
            )
            low = chart.line(
                f"{label} lowest",
                _on(chart.x, band.x, list(band.low)),
                colour=colour,
                width=0.5,
                dash=dash,
            )
            chart.band(high, low, style.fill)
        body += document.add_chart(chart)
    if len(names) > MAX_METRICS:
        body += f'<p class="note">{len(names) - MAX_METRICS} more metric(s) not charted.</p>'
    return body


def comparison_report(a: RunDigest, b: RunDigest) -> str:
    """The page of two runs, A and B, side by side."""
    labels = _labels(a, b)
    document = Document(f"{labels[0]} vs {labels[1]}", f"A: {a.path} · B: {b.path}")
    for digest in (a, b):
        if digest.damage.any:
            document.banners.append(damage_banner(str(digest.path), digest.damage))
    document.section("summary", "Summary", _summary(a, b, labels))
    document.section("cost", "Callback cost", _cost(document, a, b, labels))
    document.section("metrics", "Metrics over rounds", _metrics(document, a, b, labels))
    return document.render()
