"""Two runs side by side, on one grid (``align``): did a change make callbacks cheaper?"""

from __future__ import annotations

from html import escape

from ._cost import ALL_CALLBACKS, BUDGET, CallbackCost
from ._digest import RunDigest
from ._limits import MAX_METRICS
from ._page import Chart, Document, table
from ._run_page import damage_banner, run_facts
from ._series import align

#: Each run's colour, dash and band fill: A solid blue, B dashed vermillion.
RUN_STYLE = (
    ("#0072B2", (), "rgba(0,114,178,0.15)"),
    ("#D55E00", (6, 3), "rgba(213,94,0,0.15)"),
)
#: A change within this share is shown as unchanged (timings are noisy).
NOISE = 0.05


def _share(d: RunDigest, total: float) -> float:
    """``total`` seconds as a share (%) of the run's periods."""
    return total / d.cost.timeline * 100 if d.cost.timeline else 0.0


def _summary(d: RunDigest) -> list[tuple[str, str]]:
    """The run's rows of the summary table: its figures, the callbacks' share, events."""
    share = _share(d, sum(c.total for c in d.cost.handlers.values()))
    return [
        *((label, value) for label, value, _ in run_facts(d)),
        ("callbacks' share of the run", f"{share:.3f}%" if d.cost.timeline else "-"),
        ("events read", f"{d.events:,}"),
    ]


def _change(before: float, after: float) -> tuple[str, str]:
    """The change from A to B as text, and its class (lower cost is better)."""
    if before <= 0:
        return "-", ""
    ratio = after / before - 1.0
    tone = "" if abs(ratio) < NOISE else ("better" if ratio < 0 else "worse")
    return f"{ratio * 100:+.1f}%", tone


def _cost_chart(a: RunDigest, b: RunDigest, labels: tuple[str, str]) -> Chart:
    """All handlers' share of each period in both runs, on one grid, and the budget."""
    align(a.cost.shares, b.cost.shares)
    chart = Chart.of_shares(
        "chart-cost",
        "All handlers' share of each period",
        "log scale; the dashed line is the budget",
    )
    groups = (a.cost.shares, b.cost.shares)
    lines = [group.lines([group.series(ALL_CALLBACKS)]) for group in groups]
    chart.x = sorted(set(lines[0].x) | set(lines[1].x))
    for label, line, (colour, dash, _) in zip(labels, lines, RUN_STYLE, strict=True):
        chart.line(label, _on(chart.x, line.x, line.columns[0]), colour=colour, dash=dash, width=2)
    chart.budget(max(max(g.band(g.series(BUDGET)).high, default=0.0) for g in groups), "#000000")
    return chart


def _cost_table(a: RunDigest, b: RunDigest) -> str:
    """Each callback in A and in B, and the change, the costliest (in both) first."""
    empty = CallbackCost("")
    names = {**dict.fromkeys(a.cost.handlers), **dict.fromkeys(b.cost.handlers)}
    pairs = [
        (name, a.cost.handlers.get(name, empty), b.cost.handlers.get(name, empty)) for name in names
    ]
    pairs.sort(key=lambda pair: -(pair[1].total + pair[2].total))
    rows = []
    classes: dict[tuple[int, int], str] = {}
    for r, (name, first, second) in enumerate(pairs):
        shares = (_share(a, first.total), _share(b, second.total))
        if first.calls and second.calls:
            mean_change, classes[(r, 5)] = _change(first.mean, second.mean)
            share_change, classes[(r, 8)] = _change(*shares)
        else:
            only = "only in A" if first.calls else "only in B" if second.calls else "-"
            mean_change = share_change = only
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
    headers = ["callback", "calls A", "calls B", "mean µs A", "mean µs B", "mean change"]
    headers += ["share A", "share B", "share change", "over budget A", "over budget B"]
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
        present = [
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
        for (label, _, (colour, dash, fill)), band in zip(present, bands, strict=True):
            chart.band(
                [f"{label} {which}" for which in ("highest", "mean", "lowest")],
                [_on(chart.x, band.x, list(v)) for v in (band.high, band.mean, band.low)],
                (colour,) * 3,
                fill,
                edge=0.5,
                dash=dash,
            )
        body += document.add_chart(chart)
    if len(names) > MAX_METRICS:
        body += f'<p class="note">{len(names) - MAX_METRICS} more metric(s) not charted.</p>'
    return body


def comparison_report(a: RunDigest, b: RunDigest) -> str:
    """The page of two runs, A and B, side by side."""
    first, second = a.run_id or a.path.stem, b.run_id or b.path.stem
    if first == second:  # two runs of one id: told apart by their logs
        first, second = str(a.path), str(b.path)
    labels = f"A: {first}", f"B: {second}"
    document = Document(f"{labels[0]} vs {labels[1]}", f"A: {a.path} · B: {b.path}")
    for digest in (a, b):
        if digest.damage.any:
            document.banners.append(damage_banner(str(digest.path), digest.damage))
    rows = zip(_summary(a), _summary(b), strict=True)
    summary = [[label, value_a, value_b] for (label, value_a), (_, value_b) in rows]
    document.section("summary", "Summary", table(["", *labels], summary))
    if a.cost.periods or b.cost.periods:
        cost = document.add_chart(_cost_chart(a, b, labels)) + _cost_table(a, b)
    else:
        cost = '<p class="empty">Neither log has budget reports: no callback cost.</p>'
    document.section("cost", "Callback cost", cost)
    document.section("metrics", "Metrics over rounds", _metrics(document, a, b, labels))
    return document.render()
