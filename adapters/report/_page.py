"""The page's building blocks: the document, its charts, tables and facts, in one offline
HTML file (docs/report.md). Every text from the log is escaped."""

from __future__ import annotations

import colorsys
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import KW_ONLY, dataclass, field
from functools import cache
from html import escape
from importlib import resources
from string import Template
from typing import Any

import eventbus

from ._limits import MAX_DRAWN, SHORT_TEXT, TEXT_BUDGET, clip

#: Okabe-Ito, without its yellow (too faint on white).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000")
#: A chart's lines, one colour each: Okabe-Ito without its yellow and its black (the
#: black line is "all handlers"), then Paul Tol's wine, olive, indigo and brown.
SERIES_COLOURS = (*PALETTE[:-1], "#882255", "#999933", "#332288", "#661100")
UNITS = ("", "%", "s", "ms", "µs")
#: How each kind of marker or span is drawn: colour and dash (none: a solid line; 2, 3:
#: dotted; other: dashed), and its name in the chart's key when not its kind.
MARKER_STYLES: dict[str, tuple[str, list[int], str]] = {
    "checkpoint": ("#009E73", [2, 3], ""),
    "restart": ("#E69F00", [6, 3], ""),
    "failure": ("#D55E00", [], ""),
    "resume": ("#CC79A7", [8, 3], ""),
    "timeouts": ("#D55E00", [], ""),
    "faults": ("#CC79A7", [4, 2], ""),
    # Skipped deliveries, by what the log says caused them (``_cost.SKIP_CAUSES``).
    "skipped-coalesced": ("#E69F00", [2, 3], "skipped (coalesced)"),
    "skipped-disabled": ("#777777", [2, 3], "skipped (disabled)"),
    "skipped-fault-policy": ("#882255", [2, 3], "skipped (stopped by the fault policy)"),
    "skipped": ("#999933", [2, 3], ""),
    "disabled": ("#777777", [], ""),
    "coalescing": ("#E69F00", [], ""),
}


def kind_name(kind: str) -> str:
    """How a kind of marker or span is named: in the chart's key, in its labels."""
    return MARKER_STYLES[kind][2] or kind


def series_style(position: int) -> tuple[str, list[int]]:
    """The colour and dash of a chart's ``position``-th line (from 0): the ten
    ``SERIES_COLOURS``, solid, then hues 137.5 degrees apart (the golden angle: the
    first hundred are all far apart), dashed."""
    if position < len(SERIES_COLOURS):
        return SERIES_COLOURS[position], []
    hue = (position - len(SERIES_COLOURS)) * 137.508 % 360.0
    red, green, blue = colorsys.hls_to_rgb(hue / 360.0, 0.42, 0.7)
    return f"#{round(red * 255):02X}{round(green * 255):02X}{round(blue * 255):02X}", [6, 3]


def with_unit(value: float, unit: str, digits: int = 4) -> str:
    """A chart's figure as ``report.js`` writes it: ``digits`` significant digits and its
    unit (``0.001078%``, ``12.5 ms``, ``1e-6%``; a percentage without a space)."""
    text = f"{value:.{digits}g}"
    if "e" in text:  # 1e-06 -> 1e-6, 1.2e+07 -> 1.2e7
        mantissa, exponent = text.split("e")
        text = f"{mantissa}e{int(exponent)}"
    if not unit:
        return text
    return f"{text}{unit}" if unit == "%" else f"{text} {unit}"


def short(value: float) -> float:
    """A figure rounded to 6 significant digits: what a chart can show, half the bytes."""
    return float(f"{value:.6g}")


@dataclass
class Chart:
    """One chart: series on a shared x, markers, spans, an optional threshold line."""

    ident: str
    title: str
    _: KW_ONLY
    x_label: str
    y_label: str
    note: str = ""
    log_y: bool = False
    y_unit: str = ""  # one of UNITS: the ticks and the legend show it
    x: list[float] = field(default_factory=list)
    series: list[dict[str, Any]] = field(default_factory=list)
    bands: list[tuple[int, int, str]] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    threshold: dict[str, Any] | None = None
    extra_text: list[str] = field(default_factory=list)
    #: Draw the page's run markers (``Document.run_markers``), not markers of its own.
    shares_markers: bool = False

    def __post_init__(self) -> None:
        if self.y_unit not in UNITS:
            raise ValueError(f"chart {self.ident}: unit {self.y_unit!r} is not one of {UNITS}")

    @classmethod
    def of_shares(cls, ident: str, title: str, note: str, x_label: str = "") -> Chart:
        """A cost chart: shares of each health-check period, on a log scale."""
        x_label = x_label or "health-check period"
        y_label = "share of the period"
        return cls(
            ident, title, x_label=x_label, y_label=y_label, y_unit="%", log_y=True, note=note
        )

    def budget(self, share: float, colour: str = "#D55E00") -> None:
        """The budget line at ``share`` % of a period (none at 0: a log scale has no 0)."""
        if share > 0:
            label = f"budget {share:.3g}% of a period"
            self.threshold = {"y": share, "colour": colour, "label": label}

    def line(
        self,
        label: str,
        values: Sequence[float | None],
        *,
        colour: str | None = None,
        dash: Sequence[int] = (),
        width: float = 1.5,
    ) -> int:
        """Add a series (``values`` along ``self.x``); returns its uPlot index."""
        if colour is None:
            colour, default_dash = series_style(len(self.series))
            dash = dash or default_dash
        kept = [None if v is None or not math.isfinite(v) else short(v) for v in values]
        if self.log_y:
            kept = [v if v is not None and v > 0 else None for v in kept]
        self.series.append(
            {"label": label, "values": kept, "colour": colour, "dash": list(dash), "width": width}
        )
        return len(self.series)

    def band(
        self,
        names: Sequence[str],
        columns: Sequence[Sequence[float | None]],
        colours: Sequence[str],
        fill: str,
        *,
        edge: float,
        dash: Sequence[int] = (),
    ) -> None:
        """Three lines, highest, mean and lowest (``columns``), shaded between the outer two."""
        high, _, low = (
            self.line(name, column, colour=colour, dash=dash, width=width)
            for name, column, colour, width in zip(
                names, columns, colours, (edge, 2, edge), strict=True
            )
        )
        self.bands.append((high, low, fill))

    def mark(self, x: float, kind: str, label: str) -> None:
        self.markers.append({"x": short(x), "kind": kind, "label": label})

    def span(self, start: float, end: float, kind: str, label: str) -> None:
        self.spans.append({"from": short(start), "to": short(end), "kind": kind, "label": label})

    @property
    def empty(self) -> bool:
        return not self.x or not self.series

    def spec(self) -> dict[str, Any]:
        """What ``report.js`` draws."""
        markers = [] if self.shares_markers else thin(self.markers)
        return {
            "id": self.ident,
            "x": [short(x) for x in self.x],
            "xLabel": self.x_label,
            "yLabel": self.y_label,
            "yUnit": self.y_unit,
            "logY": self.log_y,
            "series": self.series,
            "bands": self.bands,
            "markers": markers,
            "runMarkers": self.shares_markers,
            "spans": self.spans,
            "threshold": self.threshold,
        }

    def html(self) -> str:
        kinds = sorted({m["kind"] for m in self.markers} | {s["kind"] for s in self.spans})
        key = "".join(
            f'<span class="{"dotted" if dash == [2, 3] else "dashed" if dash else "solid"}" '
            f'style="--c:{colour}">{escape(kind_name(kind))}</span>'
            for kind in kinds
            if kind in MARKER_STYLES
            for colour, dash, _ in [MARKER_STYLES[kind]]
        )
        if self.threshold is not None:
            key += (
                f'<span class="dashed" style="--c:{self.threshold["colour"]}">'
                f"{escape(self.threshold['label'])}</span>"
            )
        note = f' <span class="sub">{escape(self.note)}</span>' if self.note else ""
        return (
            f'<figure id="{self.ident}-figure">'
            f"<figcaption>{escape(self.title)}{note}</figcaption>"
            f'<div class="chart" id="{self.ident}" role="img" '
            f'aria-label="{escape(self.summary())}"></div>'
            f'<div class="hover" id="{self.ident}-hover" aria-hidden="true"></div>'
            + (f'<div class="key">{key}</div>' if key else "")
            + "<details><summary>This chart as text</summary>"
            + self.text_alternative()
            + "</details></figure>"
        )

    def summary(self) -> str:
        """One sentence for a screen reader: what is drawn, over what."""
        if self.empty:
            return f"{self.title}: no data."
        names = ", ".join(s["label"] for s in self.series[:8])
        more = f" and {len(self.series) - 8} more" if len(self.series) > 8 else ""
        return (
            f"{self.title}: {self.y_label} against {self.x_label} from {self.x[0]:g} "
            f"to {self.x[-1]:g}, for {names}{more}; figures in the table below."
        )

    def text_alternative(self) -> str:
        rows = []
        for s in self.series:
            points = [(x, v) for x, v in zip(self.x, s["values"], strict=True) if v is not None]
            if not points:
                rows.append([s["label"], "0", "", "", "", ""])
                continue
            low = min(points, key=lambda p: p[1])
            high = max(points, key=lambda p: p[1])
            rows.append(
                [s["label"], str(len(points))]
                + [
                    f"{with_unit(y, self.y_unit)} at {with_unit(x, '', 6)}"
                    for x, y in (points[0], points[-1], low, high)
                ]
            )
        text = table(
            ["series", "points drawn", "first", "last", "lowest", "highest"],
            rows,
            numeric=(1,),
        )
        events = [f"{m['label']} (at {m['x']:g})" for m in self.markers]
        events += [f"{s['label']} (from {s['from']:g} to {s['to']:g})" for s in self.spans]
        if events:
            more = [f"and {len(events) - 20} more"] if len(events) > 20 else []
            text += bullets([escape(event) for event in events[:20]] + more)
        return text + "".join(f'<p class="note">{escape(t)}</p>' for t in self.extra_text)


def thin(markers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """At most ``MAX_DRAWN`` markers of each kind, evenly spread, the first and last
    kept: a thousand checkpoints thin out, the one failure stays."""
    kinds: dict[str, list[dict[str, Any]]] = {}
    for marker in markers:
        kinds.setdefault(marker["kind"], []).append(marker)
    kept: list[dict[str, Any]] = []
    for group in kinds.values():
        if len(group) <= MAX_DRAWN:
            kept += group
            continue
        step = (len(group) - 1) / (MAX_DRAWN - 1)
        kept += [group[round(i * step)] for i in range(MAX_DRAWN)]
    return kept


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    numeric: Iterable[int] = (),
    classes: dict[tuple[int, int], str] | None = None,
    raw: Iterable[int] = (),
) -> str:
    """An HTML table; cells are escaped, except columns in ``raw`` (already HTML)."""
    right = set(numeric)
    keep = set(raw)
    marked = classes or {}
    num = ' class="num"'
    head = "".join(
        f'<th{num if i in right else ""} scope="col">{escape(h)}</th>'
        for i, h in enumerate(headers)
    )
    body = []
    for r, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            names = " ".join(n for n in ("num" if i in right else "", marked.get((r, i), "")) if n)
            attr = f' class="{names}"' if names else ""
            cells.append(f"<td{attr}>{cell if i in keep else escape(cell)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def bullets(items: Iterable[str], css: str = "") -> str:
    """A list of ``items`` (already HTML)."""
    attr = f' class="{css}"' if css else ""
    return f"<ul{attr}>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def facts(items: Iterable[tuple[str, str, str]]) -> str:
    """Summary figures as cards: (label, value, tone) with tone '', 'good' or 'bad'."""
    cards = "".join(
        f'<div class="fact"><span class="label">{escape(label)}</span>'
        f'<span class="value {tone}">{escape(value)}</span></div>'
        for label, value, tone in items
    )
    return f'<div class="facts">{cards}</div>'


@cache
def asset(name: str) -> str:
    return (resources.files(__package__) / "_assets" / name).read_text(encoding="utf-8")


class Document:
    """The page: header, banners, sections; ``render`` makes the one file."""

    def __init__(self, title: str, subtitle: str) -> None:
        self.title = title
        self.subtitle = subtitle
        #: Bytes the log's long texts may still take of the page (``text``).
        self.text_left = TEXT_BUDGET
        self.banners: list[str] = []
        self.sections: list[tuple[str, str, str]] = []  # (anchor, heading, html)
        self.charts: list[Chart] = []

    def add_chart(self, chart: Chart) -> str:
        """The chart's HTML (its data goes in the page's), or a line saying there was
        nothing to draw."""
        if chart.empty:
            return f'<p class="empty">{escape(chart.title)}: nothing recorded to draw.</p>'
        self.charts.append(chart)
        return chart.html()

    def text(self, text: str) -> str:
        """``text`` escaped, within ``TEXT_BUDGET`` bytes for all, then ``SHORT_TEXT``
        characters each, so the page stays small whatever the log holds."""
        allowed = max(SHORT_TEXT, self.text_left // 6)
        if len(text) > allowed:
            text = clip(text, allowed)
        escaped = escape(text)
        self.text_left -= len(escaped.encode())
        return escaped

    def section(self, anchor: str, heading: str, body: str) -> None:
        self.sections.append((anchor, heading, body))

    def render(self) -> str:
        shared = next((chart.markers for chart in self.charts if chart.shares_markers), [])
        data = {
            "charts": [chart.spec() for chart in self.charts],
            "runMarkers": thin(shared),
            "markerStyles": {k: {"colour": c, "dash": d} for k, (c, d, _) in MARKER_STYLES.items()},
        }
        payload = json.dumps(data, separators=(",", ":"), allow_nan=False)
        payload = payload.replace("<", "\\u003c")
        nav = "".join(f'<li><a href="#{a}">{escape(h)}</a></li>' for a, h, _ in self.sections)
        sections = "".join(
            f'<section id="{a}" aria-labelledby="{a}-h"><h2 id="{a}-h">{escape(h)}</h2>'
            f"{body}</section>"
            for a, h, body in self.sections
        )
        banners = "".join(f'<div class="banner" role="alert">{b}</div>' for b in self.banners)
        page = "".join(line.strip() for line in asset("page.html").splitlines())
        return (
            "<!doctype html>\n"
            + Template(page).substitute(
                title=escape(self.title),
                subtitle=escape(self.subtitle),
                style=f"{asset('uPlot.min.css')}\n{asset('report.css')}",
                nav=nav,
                banners=banners,
                sections=sections,
                version=escape(eventbus.__version__),
                licence=escape(asset("uPlot.LICENSE")),
                payload=payload,
                uplot=asset("uPlot.iife.min.js"),
                script=asset("report.js"),
            )
            + "\n"
        )
