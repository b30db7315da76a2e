"""The report in a real browser: a demo run with a failure and a restart, a comparison,
a bench page and a damaged log's page each draw every chart, log no error, and fetch
nothing. Headless Chromium (Debian's ``chromium``; ``make test`` installs it when missing;
without it these tests skip and say how to get it, and fail in CI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _browser import Rendered, distinct_colours, nonblank_canvases_js, render_page, require_chromium
from _builders import eventbus as run_eventbus


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    return require_chromium()


def eventbus(*args: str, cwd: Path) -> str:
    done = run_eventbus(*args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two demo runs: ``a`` with a failing rank (so a restart), ``b`` without."""
    root = tmp_path_factory.mktemp("runs")
    eventbus(
        "demo", "--out", "a", "--fail-rank", "2", "--steps", "80", "--patience", "500", cwd=root
    )
    eventbus("demo", "--out", "b", "--steps", "60", "--workers", "3", cwd=root)
    return root


def log_of(runs: Path, name: str) -> Path:
    (log,) = (runs / name).glob("demo-*.evlog")
    return log


def charts_in(page: Path) -> int:
    text = page.read_text(encoding="utf-8")
    block = re.search(r'id="report-data">(.*?)</script>', text, re.S)
    assert block is not None
    return len(json.loads(block.group(1))["charts"])


def render(page: Path, shot: Path, height: int = 3000) -> Rendered:
    rendered = render_page(page, shot, height=height, script=nonblank_canvases_js)
    assert rendered.console_errors == []
    assert rendered.network_requests == []
    assert rendered.ready, "the page never said its charts drew (body data-ready)"
    return rendered


def test_a_demo_runs_report_draws_every_chart_with_no_error(runs: Path, tmp_path: Path) -> None:
    log = log_of(runs, "a")
    eventbus("report", str(log), "-o", str(tmp_path / "a.html"), cwd=runs)
    page = tmp_path / "a.html"
    expected = charts_in(page)
    assert expected >= 3  # loss and step over rounds, and the callback cost
    rendered = render(page, tmp_path / "a.png")
    assert rendered.value["canvases"] >= expected
    assert rendered.value["drawn"] == expected, rendered.value
    # Not a blank or text-only page: the charts' lines and markers are colours.
    assert distinct_colours(rendered.screenshot) > 50
    text = page.read_text(encoding="utf-8")
    assert "rank 2 lost its device" in text and "restart" in text


def test_a_comparison_and_a_bench_page_draw_too(runs: Path, tmp_path: Path) -> None:
    compared = tmp_path / "ab.html"
    eventbus(
        "report", str(log_of(runs, "a")), str(log_of(runs, "b")), "-o", str(compared), cwd=runs
    )
    rendered = render(compared, tmp_path / "ab.png")
    assert rendered.value["drawn"] == charts_in(compared)
    bench = tmp_path / "bench.html"
    eventbus(
        "bench",
        "noop",
        "early-stopping",
        "--world-size",
        "4",
        "--rate",
        "5",
        "--duration",
        "20",
        "--repeat",
        "1",
        "--html",
        str(bench),
        cwd=runs,
    )
    rendered = render(bench, tmp_path / "bench.png", height=1400)
    assert rendered.value["drawn"] == charts_in(bench) == 1


def test_a_damaged_logs_page_shows_its_banner_and_draws(runs: Path, tmp_path: Path) -> None:
    torn = tmp_path / "torn.evlog"
    data = log_of(runs, "a").read_bytes()
    torn.write_bytes(data[: len(data) - 7])
    page = tmp_path / "torn.html"
    done = run_eventbus("report", str(torn), "-o", str(page))
    assert done.returncode == 0 and "warning" in done.stderr
    rendered = render(page, tmp_path / "torn.png")
    assert rendered.value["drawn"] == charts_in(page) >= 2
    assert "This log is damaged" in page.read_text(encoding="utf-8")


def test_the_readmes_screenshot_command_makes_one(tmp_path: Path) -> None:
    """``docs/report.png`` is made by ``docs/screenshot.py``: the command still works."""
    shot = tmp_path / "report.png"
    script = Path(__file__).resolve().parent.parent / "docs" / "screenshot.py"
    done = subprocess.run(
        [sys.executable, str(script), str(shot)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert distinct_colours(shot) > 50


#: For each span shaded on the bench page's cost chart: the colour (RGBA) inside it on the
#: rows of the plot left clear at period 0, left of every span (no grid line, no series:
#: the plot is transparent there, the page's white shows through), the middle one by
#: opacity (a series crossing the span is not the shade), read from the canvas.
SHADES_JS = """(() => {
  const canvas = document.querySelector("#chart-cost canvas");
  const ctx = canvas.getContext("2d");
  function column(x, top, height) {
    const data = ctx.getImageData(Math.round(x), top, 1, height).data;
    const rows = [];
    for (let i = 0; i < data.length; i += 4) rows.push(Array.from(data.slice(i, i + 4)));
    return rows;
  }
  return (window.eventbusReport.spans["chart-cost"] || []).map((s) => {
    const outside = column(s.plotLeft + 3, s.top, s.height);
    const inside = column(s.left + Math.max(3, (s.right - s.left) / 4), s.top, s.height);
    const clear = inside.filter((_, row) => outside[row][3] === 0);
    clear.sort((a, b) => a[3] - b[3]);
    return {kind: s.kind, clear: clear.length, inside: clear[clear.length >> 1] || null};
  });
})()"""

SLOW_CALLBACK = """
import time

from handlers import UserCallback


class Slow(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        time.sleep(0.01)  # 100 ms of a 1 s period at 10 rounds a second: twice its budget
"""


def shade_of(colour: str, alpha: float = 0.15) -> list[float]:
    """``colour`` at ``alpha`` (RGBA, 0-255), as report.js shades a span."""
    return [int(colour[i : i + 2], 16) for i in (1, 3, 5)] + [alpha * 255]


@pytest.mark.parametrize(
    ("policy", "state", "colour"),
    [("disable", "disabled", "#777777"), ("coalesce", "coalescing", "#E69F00")],
)
def test_a_bench_page_shades_where_the_bus_disabled_or_coalesced_a_callback(
    tmp_path: Path, policy: str, state: str, colour: str
) -> None:
    """Before: a callback the bench disabled was one unbroken line, nothing shaded."""
    (tmp_path / "slow_bench.py").write_text(SLOW_CALLBACK)
    page = tmp_path / "bench.html"
    eventbus(
        *("bench", "slow_bench:Slow", "--over-budget", policy, "--world-size", "1"),
        *("--rate", "10", "--duration", "5", "--period", "1", "--repeat", "1"),
        *("--html", str(page)),
        cwd=tmp_path,
    )
    rendered = render_page(page, tmp_path / "bench.png", height=1400, script=SHADES_JS)
    assert rendered.console_errors == [] and rendered.network_requests == []
    shades = rendered.value
    assert shades and {s["kind"] for s in shades} == {state}, shades
    expected = shade_of(colour)
    for shade in shades:
        assert shade["clear"] > 20, shade
        # A faint colour is stored premultiplied: its channels come back a few units off.
        assert all(abs(a - b) <= 8 for a, b in zip(shade["inside"], expected, strict=True)), (
            shade,
            expected,
        )
