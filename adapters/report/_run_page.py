"""One run's page: summary, metrics over rounds, callback cost, failures."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from html import escape
from itertools import groupby

from eventbus import (
    CheckpointMismatch,
    CheckpointSaved,
    EventPlaceholder,
    HandlerFailed,
    HandlerTimedOut,
    Report,
    ReportRejected,
    RoundGathered,
    RunResumed,
    StateSnapshotted,
    WorkerFailure,
    WorkerGroupRestarted,
)

from ._cost import (
    ALL_CALLBACKS,
    BUDGET,
    LIBRARY_TOTAL,
    SKIP_CAUSES,
    UNKNOWN_CAUSE,
    CallbackCost,
    CostDigest,
    is_library,
)
from ._digest import Damage, RunDigest
from ._limits import COST_LINES, MAX_LABEL, clip
from ._metrics import MetricCharts, MetricSeries
from ._page import (
    PALETTE,
    Chart,
    Document,
    bullets,
    facts,
    kind_name,
    series_style,
    table,
)

BAND_FILL = "rgba(0,114,178,0.18)"
#: The chart's line of all handlers together, and of the library's handlers together.
TOTAL_COLOUR = "#000000"
LIBRARY_COLOUR = "#555555"


def _worst(c: CallbackCost, cost: CostDigest) -> float:
    extremes = cost.shares.extremes(cost.shares.series(c.name))
    return extremes[1][1] if extremes else 0.0


#: The cost table: each column's header and its cell for handler ``c`` of a run's ``cost``.
COST_COLUMNS: list[tuple[str, Callable[[CallbackCost, CostDigest], str]]] = [
    ("callback", lambda c, cost: c.name),
    ("calls", lambda c, cost: f"{c.calls:,}"),
    ("mean µs", lambda c, cost: f"{c.mean * 1e6:.2f}"),
    ("p50 µs", lambda c, cost: f"{min(c.quantile(0.5), c.longest) * 1e6:.2f}"),
    ("p99 µs", lambda c, cost: f"{min(c.quantile(0.99), c.longest) * 1e6:.2f}"),
    ("max µs", lambda c, cost: f"{c.longest * 1e6:.2f}"),
    ("total ms", lambda c, cost: f"{c.total * 1e3:.3f}"),
    ("share of run", lambda c, d: f"{c.total / d.timeline * 100:.3f}%" if d.timeline else "-"),
    ("worst period", lambda c, cost: f"{_worst(c, cost):.3f}%"),
    ("over budget", lambda c, cost: f"{c.periods_over}"),
    ("timeouts", lambda c, cost: f"{c.timeouts}"),
    ("faults", lambda c, cost: f"{c.faults}"),
    ("skipped", lambda c, cost: skipped_text(c)),
]


def seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.1f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    return f"{value:.3g} s"


def wall(value: float | None) -> str:
    if value is None:
        return "unknown"
    try:
        moment = datetime.datetime.fromtimestamp(value, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return "unknown"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def damage_banner(path: str, damage: Damage) -> str:
    """The banner of a damaged log: what was lost, and that the rest is shown."""
    return (
        f"<strong>This log is damaged.</strong> {escape(path)}: {escape(damage.lost())}. "
        "The report shows everything that could be read."
    )


def metric_chart(ident: str, series: MetricSeries, charts: MetricCharts) -> Chart:
    """One metric: a line per rank, or for a wide run a band of all ranks around the mean."""
    group = series.group
    notes = []
    if group.width > 1:
        notes.append(
            f"downsampled: each point stands for {group.width:g} {charts.x_label}s, "
            "keeping their lowest and highest values"
        )
    if series.nonfinite:
        notes.append(
            f"{series.nonfinite} NaN or infinite value(s) not drawn (first at "
            f"{charts.x_label} {series.first_nonfinite:g})"
        )
    # A positive metric that falls by over two decades (a loss) reads best on a log scale;
    # a counter that grows (steps) does not.
    extremes = group.extremes(series.all_ranks)
    wide = (
        extremes is not None
        and extremes[0][1] > 0
        and extremes[1][1] / extremes[0][1] > 100
        and extremes[1][0] < extremes[0][0]
    )
    if wide:
        notes.insert(0, "log scale")
    name = series.name
    chart = Chart(
        ident, name, x_label=charts.x_label, y_label=name, note="; ".join(notes), log_y=wide
    )
    if charts.per_rank and series.ranks:
        lines = group.lines([series.ranks[rank] for rank in sorted(series.ranks)])
        chart.x = lines.x
        for label, column in zip(lines.names, lines.columns, strict=True):
            chart.line(label, column)
    else:
        band = group.band(series.all_ranks)
        chart.x = band.x
        names = ("highest rank", "mean of ranks", "lowest rank")
        colours = (PALETTE[4], PALETTE[0], PALETTE[4])
        chart.band(names, (band.high, band.mean, band.low), colours, BAND_FILL, edge=0.8)
        chart.extra_text.append(f"{len(charts.ranks)} ranks: drawn as a band, not a line each.")
    chart.shares_markers = True  # the run's markers: one copy in the page, not one a chart
    for kind, markers in charts.markers.items():
        for marker in markers:
            chart.mark(marker.x, kind, marker.label)
        dropped = charts.markers_dropped.get(kind, 0)
        if dropped:
            chart.extra_text.append(f"{dropped} more {kind} marker(s) not drawn.")
    return chart


def cost_chart(
    ident: str,
    cost: CostDigest,
    title: str = "Callback cost per period",
    *,
    library: bool = False,
) -> Chart:
    """The costliest handlers' share of every period, against the budget line, and
    where timeouts, faults, skips (by cause) and disabled handlers were: the user's
    callbacks with all handlers together, or (``library``) the library's own handlers
    with their sum."""
    group = cost.shares
    names = [c.name for c in cost.ranked(library=library)[:COST_LINES]]
    total = LIBRARY_TOTAL if library else ALL_CALLBACKS
    indices = [group.series(total)] + [group.series(name) for name in names]
    length = f" ({seconds(cost.period_length)} each)" if cost.period_length else ""
    note = "log scale; the dashed line is the budget of each handler and of all together"
    chart = Chart.of_shares(ident, title, note, f"health-check period{length}")
    lines = group.lines(indices)
    chart.x = lines.x
    for position, (label, column) in enumerate(zip(lines.names, lines.columns, strict=True)):
        if position == 0:
            colour = LIBRARY_COLOUR if library else TOTAL_COLOUR
            chart.line(label, column, colour=colour, width=2.5)
        else:
            colour, dash = series_style(position - 1)
            chart.line(label, column, colour=colour, dash=dash)
    chart.budget(max(group.band(group.series(BUDGET)).high, default=0.0))
    incidents = cost.incidents
    if not library:  # the run's incidents, once, on the main chart
        for index, kind in enumerate(incidents.names):
            for x, count in incidents.totals(index):
                chart.mark(x, kind, f"{count:g} {kind_name(kind)}")
    end = cost.last_period + 1
    for span in cost.spans:
        if is_library(span.handler) != library:
            continue
        chart.span(
            span.start,
            span.end if span.end is not None else end,
            span.state,
            clip(f"{span.handler} {span.state}: {span.reason}", MAX_LABEL),
        )
    return chart


def skipped_text(cost: CallbackCost) -> str:
    """A handler's skipped deliveries with their causes: ``40 (30 coalesced, 10
    disabled)``; a count the log gives no cause for is only counted."""
    if not cost.skipped:
        return "0"
    known = [
        (count, SKIP_CAUSES[cause][1])
        for cause, count in sorted(cost.skipped_by.items(), key=lambda item: -item[1])
        if cause != UNKNOWN_CAUSE
    ]
    if not known:
        return f"{cost.skipped:,}"
    unknown = cost.skipped - sum(count for count, _ in known)
    if unknown == 0 and len(known) == 1:
        return f"{cost.skipped:,} {known[0][1]}"
    parts = [f"{count:,} {label}" for count, label in known]
    if unknown:
        parts.append(f"{unknown:,} cause not in the log")
    return f"{cost.skipped:,} ({', '.join(parts)})"


def _cost_table(ranked: Sequence[CallbackCost], cost: CostDigest) -> str:
    """The handlers' figures, a count of periods over budget, timeouts or faults flagged."""
    rows = [[cell(c, cost) for _, cell in COST_COLUMNS] for c in ranked]
    marked = {(r, i): "over" for r, row in enumerate(rows) for i in (9, 10, 11) if row[i] != "0"}
    headers = [header for header, _ in COST_COLUMNS]
    return table(headers, rows, numeric=range(1, len(headers)), classes=marked)


def _cost_section(document: Document, cost: CostDigest) -> str:
    """The callback cost section: the user's callbacks, then the library's own handlers
    (the event log's, the gathering's, the state store's), each a chart and a table."""
    body = (
        f'<p class="note">{cost.periods} health-check periods of {seconds(cost.period_length)}'
        f" ({cost.partial_periods} partial). p50 and p99 are of each period's mean call, "
        "weighted by its calls: a log keeps each period's calls, total and longest call, "
        "not every call (<code>eventbus bench</code> times every call).</p>"
    )
    yours, ours = cost.ranked(library=False), cost.ranked(library=True)
    body += document.add_chart(cost_chart("chart-cost", cost))
    if ours:
        body += document.add_chart(
            cost_chart(
                "chart-cost-library",
                cost,
                "The library's own handlers per period (event log, gathering, state store)",
                library=True,
            )
        )
    body += "<h3>Your callbacks</h3>" + (
        _cost_table(yours, cost) if yours else '<p class="empty">None reported a cost.</p>'
    )
    if ours:
        body += (
            "<h3>The library's own handlers</h3>"
            '<p class="note">What the library runs beside your callbacks on the same bus, '
            "charged to the same budget: the event log's, the gathering of reports and "
            "failures, the state store's.</p>" + _cost_table(ours, cost)
        )
    if cost.spans_dropped:
        body += f'<p class="note">{cost.spans_dropped} more state changes not drawn.</p>'
    return body


def _bad(count: int) -> str:
    return "bad" if count else ""


def run_facts(d: RunDigest) -> list[tuple[str, str, str]]:
    """A run's figures as both pages show them: (label, value, tone)."""
    count = d.counts
    ranks = ", ".join(f"rank {r}: {n}" for r, n in sorted(d.failures_by_rank.items())[:8])
    failures = f"{count[WorkerFailure]}" + (f" ({ranks})" if ranks else "")
    failed, late = count[HandlerFailed], count[HandlerTimedOut]
    return [
        ("status", d.status, "bad" if d.status != "finished" else "good"),
        ("world size", str(d.world_size or "unknown"), ""),
        ("duration", seconds(d.duration), ""),
        ("rounds", f"{count[RoundGathered]:,}", ""),
        ("reports", f"{count[Report]:,}", ""),
        ("restarts", str(count[WorkerGroupRestarted]), _bad(count[WorkerGroupRestarted])),
        ("worker failures", failures, _bad(count[WorkerFailure])),
        ("checkpoints", str(count[CheckpointSaved]), ""),
        ("resumes", str(count[RunResumed]), ""),
        (
            "periods over budget",
            f"{d.cost.periods_over} of {d.cost.periods}",
            _bad(d.cost.periods_over),
        ),
        ("callback faults", f"{failed} failed, {late} timed out", _bad(failed + late)),
    ]


def _summary(d: RunDigest, text: Callable[[str], str]) -> str:
    count = d.counts
    items = [*run_facts(d), ("started", wall(d.wall_start), "")]
    if count[ReportRejected]:
        items.append(("reports rejected", str(count[ReportRejected]), "bad"))
    if count[CheckpointMismatch]:
        items.append(("checkpoint mismatches", str(count[CheckpointMismatch]), "bad"))
    if d.rolled_back:
        items.append(("events rolled back by resumes", f"{d.rolled_back:,}", ""))
    if count[EventPlaceholder]:  # values the recorder could not encode (an object in metrics)
        items.append(("events kept as placeholders", f"{count[EventPlaceholder]:,}", "bad"))
    body = facts(items)
    details = []
    if d.last_checkpoint:
        details.append(f"Last checkpoint: <code>{text(d.last_checkpoint)}</code>.")
    if d.stopped_by:
        details.append(
            f"Stopped early by <code>{text(d.stopped_by)}</code>: {text(d.stop_reason or '')}."
        )
    if d.error:
        details.append(f"Error: <code>{text(d.error)}</code>.")
    details += [f"Resumed from <code>{text(checkpoint)}</code>." for checkpoint in d.resumes]
    body += "".join(f"<p>{detail}</p>" for detail in details)
    if d.config not in ("", "{}"):
        config = text(d.config)
        body += f"<details><summary>the run's configuration</summary><pre>{config}</pre></details>"
    if d.rejections:
        body += "<h3>Rejected reports</h3>" + bullets(text(r) for r in d.rejections)
    return body + _state_store(d, text)


def _state_store(d: RunDigest, text: Callable[[str], str]) -> str:
    body = "<h3>State store</h3>"
    snapshots = d.counts[StateSnapshotted]
    if not snapshots and not d.restores:
        return body + '<p class="empty">No callback state was saved or restored.</p>'
    body += (
        f"<p>Saved {snapshots} time(s), at checkpoints; the last save held "
        f"{d.snapshot_key_count} callback state(s):</p>"
    ) + bullets(f"<code>{text(k)}</code>" for k in d.snapshot_keys)
    if d.snapshot_errors:
        errors = d.snapshot_errors.items()
        body += '<p class="note">Not saved:</p>'
        body += bullets(f"<code>{text(k)}</code>: {text(v)}" for k, v in errors)
    for restored in d.restores:
        parts = [
            f"Restored from <code>{text(restored.checkpoint)}</code>: "
            f"{text(', '.join(restored.restored) or 'nothing')}."
        ]
        for label, values in (
            ("saved but not live", restored.missing),
            ("live but never saved", restored.unsaved),
            ("instance counts differ", restored.mismatched),
        ):
            if values:
                parts.append(f"{label}: {text(', '.join(values))}.")
        body += "<p>" + " ".join(parts) + "</p>"
        if restored.warnings:
            body += bullets((f"warning: {text(w)}" for w in restored.warnings), "warnings")
    return body


def _message(text: Callable[[str], str], message: str, traceback: str) -> str:
    """A message, its traceback one click away."""
    escaped = text(message)
    if not traceback:
        return escaped
    return f"{escaped}<details><summary>traceback</summary><pre>{text(traceback)}</pre></details>"


def _failures(d: RunDigest, text: Callable[[str], str]) -> str:
    failure_count = d.counts[WorkerFailure]
    if not failure_count and not d.faults:
        return '<p class="empty">No worker failed and no callback raised or timed out.</p>'
    body = ""
    headers = ["when (into the run)", d.metrics.x_label, "type", "message"]
    for rank, failures in groupby(sorted(d.failures, key=lambda f: f.rank), lambda f: f.rank):
        rows = [
            [
                seconds(f.elapsed),
                f"{f.round:g}",
                f.error_type + (" (retryable)" if f.retryable else ""),
                _message(text, f.message, f.traceback),
            ]
            for f in failures
        ]
        body += f"<h3>Rank {rank}</h3>" + table(headers, rows, numeric=(0, 1), raw=(3,))
    if failure_count > len(d.failures):
        unlisted = failure_count - len(d.failures)
        body += f'<p class="note">{unlisted} more worker failure(s) not listed.</p>'
    if d.faults:
        rows = [
            [
                seconds(f.elapsed),
                f.handler,
                f.event_type,
                f.kind,
                _message(text, f.detail, f.traceback),
            ]
            for f in d.faults
        ]
        body += "<h3>Callbacks that raised or ran late</h3>" + table(
            ["when", "callback", "event", "what", "detail"], rows, numeric=(0,), raw=(4,)
        )
        unlisted = d.counts[HandlerFailed] + d.counts[HandlerTimedOut] - len(d.faults)
        if unlisted > 0:
            body += f'<p class="note">{unlisted} more not listed.</p>'
    return body


def _metrics(document: Document, digest: RunDigest) -> str:
    charts = digest.metrics
    if not charts.metrics:
        return '<p class="empty">No numeric metrics were reported.</p>'
    body = (
        f'<p class="note">One chart per metric, one line per rank ({charts.x_label} '
        "on the x axis); markers show checkpoints, restarts, failures and resumes.</p>"
    )
    for n, series in enumerate(charts.metrics.values()):
        body += document.add_chart(metric_chart(f"chart-m{n}", series, charts))
    if charts.uncharted:
        names = ", ".join(charts.uncharted) + (" and more" if charts.uncharted_more else "")
        body += (
            f'<p class="note">More metrics were reported than are charted (the first '
            f"{len(charts.metrics)}): {escape(names)}.</p>"
        )
    return body


def run_report(digest: RunDigest) -> str:
    """The page of one run."""
    title = f"Run {digest.run_id or digest.path.stem}"
    subtitle = f"{digest.name or 'run'} · {digest.path} · {digest.events:,} events read"
    document = Document(title, subtitle)
    if digest.damage.any:
        document.banners.append(damage_banner(str(digest.path), digest.damage))
    if digest.events == 0:
        document.banners.append("<strong>This log holds no events.</strong> Nothing to chart.")
    elif digest.status == "unfinished":
        document.banners.append(
            "<strong>The run's end is not in this log.</strong> It was still running, was "
            "killed, or its last records were lost."
        )
    document.section("summary", "Summary", _summary(digest, document.text))
    document.section("metrics", "Metrics over rounds", _metrics(document, digest))
    cost = digest.cost
    if cost.periods:
        body = _cost_section(document, cost)
    else:
        body = '<p class="empty">No budget reports: the log has no callback cost.</p>'
    document.section("cost", "Callback cost", body)
    document.section("failures", "Failures", _failures(digest, document.text))
    return document.render()
