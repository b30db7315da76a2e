"""The headless-Chromium harness itself, on tiny pages: it must see drawn and blank canvases,
console errors, uncaught exceptions and any network request, or the report's browser tests
would pass vacuously."""

from __future__ import annotations

import os
import time
from pathlib import Path

import _browser
import pytest
from _browser import (
    Rendered,
    distinct_colours,
    nonblank_canvases_js,
    png_size,
    render_page,
    require_chromium,
)


@pytest.fixture(scope="module", autouse=True)
def chromium() -> str:
    """Skip the module, saying how to install it, when Chromium cannot be had."""
    return require_chromium()


def render(tmp_path: Path, body: str) -> Rendered:
    """Render ``body`` as a whole page (width 800, height 600) with the canvas check."""
    html = tmp_path / "page.html"
    html.write_text(
        f"<!doctype html><html><head><meta charset=utf-8></head><body>{body}</body></html>"
    )
    return render_page(
        html,
        tmp_path / "shot.png",
        width=800,
        height=600,
        script=nonblank_canvases_js,
        timeout=30,
    )


# Ends the harness's wait for the page at once (else it waits 2 s for data-ready).
READY = '<script>document.body.dataset.ready = "1"</script>'

CHART = """<canvas id="c" width="400" height="200"></canvas>
<script>
  const ctx = document.getElementById("c").getContext("2d");
  ["#d62728", "#2ca02c", "#1f77b4"].forEach((colour, i) => {
    ctx.strokeStyle = colour;
    ctx.lineWidth = 3;
    ctx.beginPath();
    ctx.moveTo(10, 20 + 50 * i);
    ctx.lineTo(390, 180 - 40 * i);
    ctx.stroke();
  });
  document.body.dataset.ready = "1";
</script>"""


def test_a_drawn_canvas_renders_offline_and_clean(tmp_path: Path) -> None:
    started = time.monotonic()
    rendered = render(tmp_path, CHART)
    assert rendered.console_errors == []
    assert rendered.network_requests == []
    assert rendered.ready
    assert rendered.value == {"canvases": 1, "drawn": 1, "unreadable": 0}
    assert rendered.screenshot == tmp_path / "shot.png"
    assert png_size(rendered.screenshot) == (800, 600)
    assert distinct_colours(rendered.screenshot) > 10
    # data-ready="1" ends the wait at once, rather than after the 2 s for pages without it
    # (a hang guard: a loaded machine takes 15 s to start Chromium).
    assert time.monotonic() - started < 60


def test_a_blank_canvas_is_not_drawn(tmp_path: Path) -> None:
    rendered = render(tmp_path, '<canvas width="300" height="150"></canvas>')
    assert rendered.value == {"canvases": 1, "drawn": 0, "unreadable": 0}
    assert not rendered.ready  # it never said so; the 2 s wait ran out
    assert rendered.console_errors == []
    assert distinct_colours(rendered.screenshot) <= 2


def test_a_filled_but_otherwise_blank_canvas_is_not_drawn(tmp_path: Path) -> None:
    """A chart library clears to white before drawing: that alone is not a chart."""
    body = """<canvas id="c" width="300" height="150"></canvas><script>
      const ctx = document.getElementById("c").getContext("2d");
      ctx.fillStyle = "white";
      ctx.fillRect(0, 0, 300, 150);
      document.body.dataset.ready = "1";
    </script>"""
    assert render(tmp_path, body).value == {"canvases": 1, "drawn": 0, "unreadable": 0}


def test_console_error_is_collected(tmp_path: Path) -> None:
    rendered = render(
        tmp_path, '<script>console.error("boom"); console.log("fine")</script>' + READY
    )
    assert len(rendered.console_errors) == 1
    assert "boom" in rendered.console_errors[0]
    assert rendered.value == {"canvases": 0, "drawn": 0, "unreadable": 0}


def test_uncaught_exception_is_collected(tmp_path: Path) -> None:
    rendered = render(tmp_path, '<script>throw new Error("kaput")</script>' + READY)
    assert len(rendered.console_errors) == 1
    assert "Error: kaput" in rendered.console_errors[0]


def test_any_network_request_is_reported(tmp_path: Path) -> None:
    """Port 9 on the loopback only: the test itself must never reach another host."""
    rendered = render(tmp_path, '<img src="http://127.0.0.1:9/x.png">' + READY)
    assert rendered.network_requests == ["http://127.0.0.1:9/x.png"]
    assert any("http://127.0.0.1:9/x.png" in error for error in rendered.console_errors)


def test_a_missing_page_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        render_page(tmp_path / "absent.html", tmp_path / "shot.png")


def test_a_timeout_says_what_it_waited_for(tmp_path: Path) -> None:
    html = tmp_path / "page.html"
    html.write_text("<p>hi</p>")
    with pytest.raises(RuntimeError, match=r"timed out after .* waiting for .*stderr"):
        render_page(html, tmp_path / "shot.png", timeout=0.01)
    assert not (tmp_path / "shot.png").exists()


def test_a_script_that_throws_is_an_error(tmp_path: Path) -> None:
    html = tmp_path / "page.html"
    html.write_text("<body><p>hi</p>" + READY)
    with pytest.raises(RuntimeError, match="nope"):
        render_page(html, tmp_path / "shot.png", script='(() => { throw new Error("nope") })()')


def test_a_browser_that_stalls_on_start_is_replaced_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI once saw Chromium answer nothing after Target.attachToTarget for 30 s; the harness
    starts a second browser rather than fail the test that wanted a page."""
    real = require_chromium()
    stalled = tmp_path / "stalled-once"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "chromium"
    wrapper.write_text(
        f'#!/bin/sh\nif [ ! -e "{stalled}" ]; then : > "{stalled}"; exec sleep 60; fi\n'
        f'exec "{real}" "$@"\n'
    )
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(_browser, "_START_WAIT", 1.0)
    rendered = render(tmp_path, CHART)
    assert stalled.exists()
    assert rendered.ready and rendered.console_errors == []
    assert rendered.value == {"canvases": 1, "drawn": 1, "unreadable": 0}
