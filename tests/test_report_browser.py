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
