"""``eventbus report`` as a user meets it (subprocesses of the real command line).

The demo's hint run as printed, the page offline and whole, ``-o``, files that
are not logs, damaged logs, two runs, hostile values, a hostile log's size,
``bench --html``, an empty log and a resumed run.
"""

from __future__ import annotations

import html
import json
import os
import random
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec
import pytest
from _builders import eventbus as run

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    HandlerFailed,
    HandlerStateChanged,
    RoundGathered,
    RunFinished,
    RunStarted,
    TrainRunContext,
    WorkerFailure,
)
from eventbus._events import HandlerUsage
from eventbus.log import LogRecorder

#: What the page promises whatever the log (hostile ones included).
PAGE_LIMIT = 4 * 1024 * 1024


def run_line(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A command line as printed for a user (``eventbus ...``), run as a shell would split it."""
    words = shlex.split(line)
    assert words[0] == "eventbus", line
    return run(*words[1:], cwd=cwd)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eventbus report: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# --- reading a page ----------------------------------------------------------------


class Page(HTMLParser):
    """A page's tags, text (unescaped), scripts and styles."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.styles: list[str] = []
        self._inside: tuple[str, dict[str, str | None]] | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag in ("script", "style"):
            self._inside = (tag, dict(attrs))
            if tag == "script":
                self.scripts.append((dict(attrs), ""))
            else:
                self.styles.append("")

    def handle_endtag(self, tag: str) -> None:
        if self._inside is not None and tag == self._inside[0]:
            self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside is None:
            self.text.append(data)
        elif self._inside[0] == "script":
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)
        else:
            self.styles[-1] += data

    @property
    def all_text(self) -> str:
        return "".join(self.text)


def report_data(page: str) -> dict[str, Any]:
    """The page's embedded JSON (what report.js draws), parsed."""
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S
    )
    assert found is not None, "no report-data block"
    data = json.loads(found.group(1))
    assert isinstance(data, dict)
    return data


def strings(value: object) -> Iterator[str]:
    """Every string in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from strings(inner)


def facts(page: str) -> dict[str, str]:
    """The summary's cards: label -> value."""
    cards = re.findall(
        r'<span class="label">([^<]*)</span><span class="value[^"]*">([^<]*)</span>', page
    )
    return {html.unescape(label): html.unescape(value) for label, value in cards}


def stamped(events: Iterable[Event], start: int = 0) -> list[Event]:
    """Events numbered and timed in order, as a bus would (there is none here)."""
    return [
        msgspec.structs.replace(event, seq=start + n, time=1.0 + (start + n) * 1e-3)
        for n, event in enumerate(events)
    ]


def demo_run_id(log: Path) -> str:
    return log.stem  # the demo records <out>/<run id>.evlog


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small demo run with a failing rank (its log is copied, never changed)."""
    where = tmp_path_factory.mktemp("demo")
    result = run(
        "demo", "--out", "runs/a", "--workers", "3", "--steps", "30", "--fail-rank", "1",
        "--step-time", "0.002", cwd=where,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (log,) = (where / "runs" / "a").glob("*.evlog")
    return log


def copy_of(log: Path, where: Path, name: str | None = None) -> Path:
    target = where / (name or log.name)
    shutil.copyfile(log, target)
    return target


# --- 1. the demo's hint --------------------------------------------------------------


REPORT_HINT = re.compile(r"^report: (eventbus report .+?)  \(then open (.+)\)$", re.M)


def test_the_demo_hint_writes_the_page_it_names(tmp_path: Path) -> None:
    demo = run("demo", "--out", "runs/a", "--fail-rank", "2", "--steps", "60", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    hint = REPORT_HINT.search(demo.stdout)
    assert hint is not None, demo.stdout
    command, shown = hint.group(1), Path(hint.group(2))
    (log,) = (tmp_path / "runs" / "a").glob("*.evlog")
    assert not shown.is_absolute() and shown.parent == Path("runs/a")
    before = files_in(tmp_path / "runs" / "a")

    result = run_line(command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert f"report written to {shown} (" in result.stdout
    page_file = tmp_path / shown
    assert page_file.is_file()
    assert files_in(tmp_path / "runs" / "a") - before == {shown.name}  # one file, no leftovers
    assert files_in(tmp_path) == {"runs"}

    page = page_file.read_bytes().decode("utf-8")
    assert page.startswith("<!doctype html>")
    assert demo_run_id(log) in page
    for heading in ("Metrics over rounds", "Callback cost", "Failures"):
        assert f">{heading}</h2>" in page, heading
    assert "rank 2 lost its device" in page
    tracebacks = re.findall(r"<details><summary>traceback</summary><pre>(.*?)</pre>", page, re.S)
    assert tracebacks, "no traceback in a <details>"
    text = html.unescape(tracebacks[0])
    assert text.startswith("Traceback (most recent call last):")
    assert "RuntimeError: rank 2 lost its device" in text
    parsed = Page(page)
    policies = [
        attrs.get("content") or ""
        for tag, attrs in parsed.tags
        if tag == "meta" and (attrs.get("http-equiv") or "").lower() == "content-security-policy"
    ]
    assert len(policies) == 1 and "default-src 'none'" in policies[0]
    assert facts(page)["worker failures"].startswith("1 (rank 2: 1)")


def test_the_demo_hint_can_be_pasted_when_the_path_has_a_space(tmp_path: Path) -> None:
    demo = run(
        "demo", "--out", "my runs/a", "--workers", "2", "--steps", "12", "--step-time", "0.001",
        cwd=tmp_path,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stderr
    hint = REPORT_HINT.search(demo.stdout)
    assert hint is not None, demo.stdout
    result = run_line(hint.group(1), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    (log,) = (tmp_path / "my runs" / "a").glob("*.evlog")
    assert log.with_suffix(".html").is_file()


def test_the_page_is_as_readable_as_any_file_the_user_writes(
    demo_log: Path, tmp_path: Path
) -> None:
    log = copy_of(demo_log, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "report", log.name],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
        timeout=120,
        umask=0o022,  # the usual one: files readable by all, writable by their owner
    )
    assert result.returncode == 0, result.stderr
    mode = log.with_suffix(".html").stat().st_mode & 0o777
    assert mode == 0o644, oct(mode)  # what open(..., "w") gives under that umask


# --- 2. offline ------------------------------------------------------------------------


URL_ATTRIBUTES = {"src", "href", "srcset", "action", "formaction", "poster", "data", "background"}


def test_the_page_fetches_nothing(demo_log: Path, tmp_path: Path) -> None:
    log = copy_of(demo_log, tmp_path)
    result = run("report", log.name, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = log.with_suffix(".html").read_text(encoding="utf-8")

    # src= and href= in tags (script and style bodies left out) are in-page anchors only.
    bare = re.sub(r"<(script|style)\b[^>]*>.*?</\1>", "", page, flags=re.S | re.I)
    links = [
        value.strip("\"'")
        for tag in re.findall(r"<[a-zA-Z][^>]*>", bare)
        for _, value in re.findall(
            r"""\s(src|href)\s*=\s*("[^"]*"|'[^']*'|[^\s>]+)""", tag, flags=re.I
        )
    ]
    assert links, "expected the section anchors"
    assert all(link.startswith("#") for link in links), links
    parsed = Page(page)
    for tag, attrs in parsed.tags:
        assert tag not in ("link", "base", "iframe", "object", "embed", "img"), tag
        for name, value in attrs.items():
            if name in URL_ATTRIBUTES:
                assert (value or "").startswith("#"), (tag, name, value)
    assert [attrs for attrs, _ in parsed.scripts if "src" in attrs] == []
    assert len(parsed.scripts) == 3  # the data, uPlot and report.js, all inline

    assert parsed.styles
    for style in parsed.styles:
        assert "@import" not in style
        assert not re.search(r"url\(\s*['\"]?\s*(https?:)?//", style, re.I), style[:200]

    ours = (resources.files("adapters.report") / "_assets" / "report.js").read_text("utf-8")
    assert ours.strip() in page  # the script scanned below is the one the page carries
    for call in ("fetch(", "XMLHttpRequest", "sendBeacon", "WebSocket", "EventSource"):
        assert call not in ours, call
    assert "import(" not in ours


# --- 3. -o -----------------------------------------------------------------------------


def test_output_option(demo_log: Path, tmp_path: Path) -> None:
    log = copy_of(demo_log, tmp_path, "run.evlog")
    original = log.read_bytes()
    (tmp_path / "pages").mkdir()

    elsewhere = run("report", "run.evlog", "-o", "pages/mine.html", cwd=tmp_path)
    assert elsewhere.returncode == 0, elsewhere.stderr
    assert "report written to pages/mine.html (" in elsewhere.stdout
    assert files_in(tmp_path / "pages") == {"mine.html"}
    assert not (tmp_path / "run.html").exists()  # not beside the log as well
    assert (tmp_path / "pages" / "mine.html").read_text("utf-8").startswith("<!doctype html>")

    listing = files_in(tmp_path)
    for spelled in ("run.evlog", "./run.evlog", "pages/../run.evlog"):
        over_the_log = run("report", "run.evlog", "-o", spelled, cwd=tmp_path)
        assert_one_line_error(over_the_log, "is the log being read")
        assert log.read_bytes() == original
        assert files_in(tmp_path) == listing  # no temporary file left behind

    b = copy_of(demo_log, tmp_path, "b.evlog")
    over_b = run("report", "run.evlog", "b.evlog", "-o", "b.evlog", cwd=tmp_path)
    assert_one_line_error(over_b, "is the log being read")
    assert b.read_bytes() == original

    nowhere = run("report", "run.evlog", "-o", "missing/page.html", cwd=tmp_path)
    assert_one_line_error(nowhere, "missing", "no such directory")
    assert not (tmp_path / "missing").exists()

    folder = run("report", "run.evlog", "-o", "pages", cwd=tmp_path)
    assert_one_line_error(folder, "pages", "is a directory")
    assert files_in(tmp_path / "pages") == {"mine.html"}
    assert log.read_bytes() == original


def test_output_to_stdout_or_a_pipe_writes_into_it(demo_log: Path, tmp_path: Path) -> None:
    """``-o -`` is stdout; a pipe or a device (``/dev/stdout``) is written into, never
    replaced by a file (as root, replacing ``/dev/null`` would break the machine)."""
    log = copy_of(demo_log, tmp_path, "run.evlog")
    to_stdout = run("report", "run.evlog", "-o", "-", cwd=tmp_path)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert (
        to_stdout.stdout.startswith("<!doctype html>") and "report written to -" in to_stdout.stderr
    )
    assert files_in(tmp_path) == {log.name}

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_text("utf-8")))
    reader.start()
    into_pipe = run("report", "run.evlog", "-o", "pipe", cwd=tmp_path)
    reader.join(timeout=60)
    assert into_pipe.returncode == 0, into_pipe.stderr
    assert stat.S_ISFIFO(pipe.stat().st_mode)  # still the pipe
    assert got and got[0] == to_stdout.stdout


# --- 4. files that are not logs --------------------------------------------------------


def header_only(path: Path) -> Path:
    with LogRecorder(path, run_id="nothing-yet", fsync="never"):
        pass
    return path


def bad_inputs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """name -> (the path as typed, relative to ``tmp_path``; what the error says)."""
    (tmp_path / "empty.evlog").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("just some text\nnot a log at all\n")
    noise = random.Random(20240601).randbytes(4096)
    assert not noise.startswith((b"\x89EVB", b"{"))
    (tmp_path / "noise.evlog").write_bytes(noise)
    whole = header_only(tmp_path / "whole.evlog").read_bytes()
    (tmp_path / "cut-header.evlog").write_bytes(whole[: len(whole) // 2])
    whole_jsonl = header_only(tmp_path / "whole.jsonl").read_bytes()
    (tmp_path / "cut-header.jsonl").write_bytes(whole_jsonl[: len(whole_jsonl) // 2])
    (tmp_path / "other.jsonl").write_text('{"a": 1, "b": [2, 3], "c": "not a header"}\n{}\n')
    (tmp_path / "folder.evlog").mkdir()
    return {
        "missing": ("absent.evlog", "no such file"),
        "directory": ("folder.evlog", "is a directory"),
        "empty": ("empty.evlog", "empty file"),
        "text": ("notes.txt", "not an event log"),
        "random bytes": ("noise.evlog", "not an event log"),
        "header cut short": ("cut-header.evlog", "truncated log header"),
        "JSON Lines header cut short": ("cut-header.jsonl", "truncated log header"),
        "JSON Lines without a header": ("other.jsonl", "not an event-log header"),
    }


def test_files_that_are_not_logs_are_one_line_errors(demo_log: Path, tmp_path: Path) -> None:
    copy_of(demo_log, tmp_path, "good.evlog")
    for kind, (typed, message) in bad_inputs(tmp_path).items():
        listing = files_in(tmp_path)
        alone = run("report", typed, cwd=tmp_path)
        assert_one_line_error(alone, typed, message)
        second = run("report", "good.evlog", typed, cwd=tmp_path)
        assert_one_line_error(second, typed, message)
        first = run("report", typed, "good.evlog", cwd=tmp_path)
        assert_one_line_error(first, typed, message)
        assert files_in(tmp_path) == listing, kind  # no page, no temporary file


def test_a_short_first_line_that_is_no_header_is_called_so(tmp_path: Path) -> None:
    (tmp_path / "short.jsonl").write_text('{"a": 1}\n{"b": 2}\n')
    result = run("report", "short.jsonl", cwd=tmp_path)
    assert_one_line_error(result, "short.jsonl", "not an event-log header")


# --- 5. damaged logs -------------------------------------------------------------------


def assert_one_warning(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("eventbus report: warning: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def assert_charts_survive(page: str) -> None:
    charts = report_data(page)["charts"]
    metric_charts = [c for c in charts if c["id"].startswith("chart-m")]
    assert metric_charts, "no metric chart"
    assert all(len(c["x"]) > 1 and c["series"] for c in metric_charts)
    assert any(c["yLabel"] == "loss" for c in metric_charts)


def test_a_torn_tail_still_gives_a_page(demo_log: Path, tmp_path: Path) -> None:
    torn = tmp_path / "torn.evlog"
    torn.write_bytes(demo_log.read_bytes()[:-7])
    stats = run("stats", "torn.evlog", "--json", cwd=tmp_path)
    offset = json.loads(stats.stdout)["truncated_at"]
    assert isinstance(offset, int) and 0 < offset < torn.stat().st_size

    result = run("report", "torn.evlog", cwd=tmp_path)
    assert_one_warning(result, "torn.evlog", f"cut short at byte {offset}")
    page = (tmp_path / "torn.html").read_text("utf-8")
    assert "This log is damaged" in page
    banner = re.search(r'<div class="banner" role="alert">(.*?)</div>', page, re.S)
    assert banner is not None
    assert f"cut short at byte {offset} " in banner.group(1)
    assert f"({torn.stat().st_size - offset} bytes lost" in banner.group(1)
    assert_charts_survive(page)


def test_garbage_in_the_middle_still_gives_a_page(demo_log: Path, tmp_path: Path) -> None:
    data = bytearray(demo_log.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 20] = b"\xde\xad\xbe\xef" * 5
    damaged = tmp_path / "damaged.evlog"
    damaged.write_bytes(bytes(data))

    result = run("report", "damaged.evlog", cwd=tmp_path)
    assert_one_warning(result, "damaged.evlog", "1 corrupt record(s) skipped")
    page = (tmp_path / "damaged.html").read_text("utf-8")
    assert "This log is damaged" in page
    assert "1 corrupt record(s) skipped (" in page  # the warning's words, and the first error
    assert_charts_survive(page)
    # Only that record is lost: the failure and the run's end are still read.
    assert "lost its device" in page
    assert facts(page)["status"] != "unfinished"


# --- 6. two runs -----------------------------------------------------------------------


def test_two_runs_side_by_side(demo_log: Path, tmp_path: Path) -> None:
    (tmp_path / "runs" / "a").mkdir(parents=True)
    first = copy_of(demo_log, tmp_path / "runs" / "a")
    other = run(
        "demo", "--out", "runs/b", "--workers", "2", "--steps", "20", "--step-time", "0.001",
        cwd=tmp_path,
    )  # fmt: skip
    assert other.returncode == 0, other.stderr
    (second,) = (tmp_path / "runs" / "b").glob("*.evlog")
    a, b = first.relative_to(tmp_path), second.relative_to(tmp_path)
    before_b = files_in(tmp_path / "runs" / "b")

    result = run("report", a, b, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    expected = Path("runs/a") / f"{first.stem}-vs-{second.stem}.html"
    assert f"report written to {expected} (" in result.stdout
    assert files_in(tmp_path / "runs" / "a") == {first.name, expected.name}
    assert files_in(tmp_path / "runs" / "b") == before_b
    page = (tmp_path / expected).read_text("utf-8")
    assert page.startswith("<!doctype html>")
    assert f"A: {demo_run_id(first)}" in page and f"B: {demo_run_id(second)}" in page
    assert "mean change" in page and "share change" in page
    charts = report_data(page)["charts"]
    loss = next(c for c in charts if c["yLabel"] == "loss")
    labels = {s["label"] for s in loss["series"]}
    assert f"A: {demo_run_id(first)} mean" in labels
    assert f"B: {demo_run_id(second)} mean" in labels


# --- 7. hostile values -----------------------------------------------------------------


EVIL = (
    "</script><script>alert(1)</script><img src=x onerror=alert(2)> "
    "\"double\" 'single' & &amp; \U0001f680 \u05e9\u05dc\u05d5\u05dd \u0639\u0627\u0644\u0645"
)
RAW_TAGS = ("<script>alert(1)", "<img src=x", "</script><script>alert")


def evil(what: str) -> str:
    return f"{what} {EVIL}"


def write_hostile_values(path: Path) -> None:
    run_id = evil("run")
    context = TrainRunContext(run_id=run_id, name=evil("name"), world_size=2)
    rounds = [
        RoundGathered(
            context=context,
            round=r,
            ranks=(0, 1),
            metrics=[{evil("loss"): 1.0 / (r + 1), "plain": float(r + k)} for k in range(2)],
        )
        for r in range(6)
    ]
    usage = HandlerUsage(handler=evil("handler"), calls=3, total=0.001, max=0.0005, budget=0.01)
    events: list[Event] = [
        RunStarted(run_id=run_id, name=evil("name"), world_size=2),
        *rounds,
        BudgetReport(
            period=0,
            start=0.0,
            end=1.0,
            budget=0.01,
            total=0.001,
            fraction=0.001,
            handlers=(usage,),
        ),
        WorkerFailure(
            run_id=run_id,
            rank=1,
            error_type="RuntimeError",
            message=evil("message"),
            traceback=evil("traceback"),
        ),
        CheckpointSaved(run_id=run_id, checkpoint=evil("checkpoint"), index=4),
        HandlerFailed(
            handler=evil("handler"),
            event_seq=3,
            event_type="RoundGathered",
            error_type="ValueError",
            message=evil("fault"),
            traceback=evil("fault traceback"),
        ),
        HandlerStateChanged(handler=evil("handler"), state="disabled", reason=evil("reason")),
        RunFinished(run_id=run_id, status="failed", error=evil("error")),
    ]
    with LogRecorder(path, run_id=run_id, fsync="never") as recorder:
        recorder.write_many(stamped(events))


def test_hostile_values_are_escaped_and_kept(tmp_path: Path) -> None:
    write_hostile_values(tmp_path / "hostile.evlog")
    result = run("report", "hostile.evlog", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    raw = (tmp_path / "hostile.html").read_bytes()
    page = raw.decode("utf-8")  # strict: valid UTF-8
    assert '<meta charset="utf-8">' in page

    for tag in RAW_TAGS:
        assert tag not in page, tag
    assert page.count("</script>") == 3  # only the page's own three scripts end
    parsed = Page(page)
    names = [tag for tag, _ in parsed.tags]
    assert "img" not in names and names.count("script") == 3
    for tag, attrs in parsed.tags:
        assert not [a for a in attrs if a.startswith("on")], (tag, attrs)

    text = parsed.all_text
    for what in ("run", "name", "message", "traceback", "checkpoint", "fault", "handler"):
        assert evil(what) in text, what  # shown verbatim once unescaped
    assert "\U0001f680" in page and "\u05e9\u05dc\u05d5\u05dd" in page  # as UTF-8 text
    escaped = html.escape(evil("run"), quote=True)
    assert f"<title>Run {escaped}</title>" in page

    data = report_data(page)
    found = set(strings(data))
    assert evil("loss") in {c["yLabel"] for c in data["charts"]}
    cost = next(c for c in data["charts"] if c["id"] == "chart-cost")
    assert evil("handler") in {s["label"] for s in cost["series"]}
    # Marker and span labels are cut to 120 characters (their start and end kept).
    label = f"checkpoint {evil('checkpoint')}"
    assert any(s.startswith(label[:40]) and s.endswith(label[-20:]) for s in found), label
    assert any(s.endswith(evil("reason")[-20:]) for s in found)  # a span's label


# --- 8. a hostile log's size -----------------------------------------------------------


def write_big_hostile_log(
    path: Path,
    *,
    rounds: int,
    ranks: int,
    metrics: int,
    handlers: int,
    periods: int,
    failures: int,
    faults: int,
    traceback_size: int,
    message_size: int,
) -> None:
    """Every dimension the page caps, past its cap; texts that escape to several bytes."""
    context = TrainRunContext(run_id="big", name="big", world_size=ranks)
    metric_names = [f"metric_{i:03d}" for i in range(metrics)]
    handler_names = [f"handler_{i:03d}" for i in range(handlers)]
    rank_ids = tuple(range(ranks))
    noisy = "'\"<>& \U0001f680"  # 6 bytes escaped per quote, 4 per <, 4 bytes per emoji
    traceback = (noisy * traceback_size)[:traceback_size]
    message = (noisy * message_size)[:message_size]
    seq = 0
    with LogRecorder(path, run_id="big", fsync="never") as recorder:

        def write(events: list[Event]) -> None:
            nonlocal seq
            recorder.write_many(stamped(events, seq))
            seq += len(events)

        write([RunStarted(run_id="big", name="big", world_size=ranks)])
        for start in range(0, rounds, 100):
            batch: list[Event] = []
            for r in range(start, min(start + 100, rounds)):
                rows = [{n: float(r + i + k) for i, n in enumerate(metric_names)} for k in range(4)]
                batch.append(
                    RoundGathered(
                        context=context,
                        round=r,
                        ranks=rank_ids,
                        metrics=[rows[k % 4] for k in range(ranks)],
                    )
                )
            write(batch)
        per_period = min(handlers, 40)
        for start in range(0, periods, 200):
            write(
                [
                    BudgetReport(
                        period=p,
                        start=float(p),
                        end=p + 1.0,
                        budget=0.01,
                        total=0.002,
                        fraction=0.002,
                        handlers=tuple(
                            HandlerUsage(
                                handler=handler_names[(p * 7 + j) % handlers],
                                calls=5,
                                total=1e-4 * (j + 1),
                                max=1e-4,
                                timeouts=j % 2,
                                faults=1,
                                budget=1e-3,
                            )
                            for j in range(per_period)
                        ),
                    )
                    for p in range(start, min(start + 200, periods))
                ]
            )
        for f in range(failures):
            write(
                [
                    WorkerFailure(
                        run_id="big",
                        rank=f % ranks,
                        error_type="RuntimeError",
                        message=message,
                        traceback=traceback,
                    ),
                    CheckpointSaved(run_id="big", checkpoint=f"ckpt/{f:06d}", index=f),
                ]
            )
        for f in range(faults):
            write(
                [
                    HandlerFailed(
                        handler=handler_names[f % handlers],
                        event_seq=1,
                        event_type="Report",
                        error_type="ValueError",
                        message=message,
                        traceback=traceback,
                    )
                ]
            )
        write([RunFinished(run_id="big", status="failed", error=message)])


class BigReport(msgspec.Struct, frozen=True):
    result: subprocess.CompletedProcess[str]
    page: Path
    size: int
    seconds: float


@pytest.fixture(scope="module")
def big_report(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BigReport]:
    where = tmp_path_factory.mktemp("big")
    log = where / "big.evlog"
    started = time.perf_counter()
    write_big_hostile_log(
        log,
        rounds=1_200,  # > 2 x 256 buckets: downsampled
        ranks=64,  # > MAX_RANK_LINES (8)
        metrics=100,  # > MAX_METRICS (16)
        handlers=300,  # > MAX_HANDLERS (64)
        periods=2_000,  # > 2 x 256 buckets
        failures=250,  # > MAX_LISTED (100) and > 200 markers a kind
        faults=250,  # > MAX_LISTED
        traceback_size=200_000,  # > MAX_TRACEBACK (16,000)
        message_size=50_000,  # > MAX_MESSAGE (2,000)
    )
    result = run("report", "big.evlog", cwd=where)
    page = where / "big.html"
    size = page.stat().st_size if page.exists() else -1
    yield BigReport(result, page, size, time.perf_counter() - started)
    log.unlink()  # a few hundred MB: not left in pytest's temporary directories
    page.unlink(missing_ok=True)


def test_a_hostile_log_gives_a_capped_page(big_report: BigReport) -> None:
    result = big_report.result
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert big_report.seconds < 30, big_report.seconds
    page = big_report.page.read_text("utf-8")
    data = report_data(page)
    metric_charts = [c for c in data["charts"] if c["id"].startswith("chart-m")]
    assert len(metric_charts) == 16
    assert re.search(r'<p class="note">[^<]*metric_016, metric_017', page)  # named, not drawn
    assert all(len(c["x"]) <= 2 * 256 for c in data["charts"])
    assert "64 ranks: drawn as a band, not a line each." in page
    assert {s["label"] for s in metric_charts[0]["series"]} == {
        "highest rank",
        "mean of ranks",
        "lowest rank",
    }
    assert "150 more worker failure(s) not listed" in page
    assert "150 more not listed" in page  # the callbacks' faults
    section = page[page.index('<section id="cost"') : page.index('<section id="failures"')]
    cost = section.rsplit("</figure>", 1)[1]  # the table, not the chart's text alternative
    assert '<th scope="col">callback</th>' in cost
    rows = re.findall(r"<tr><td>(handler_\d{3}|\(other handlers\))</td>", cost)
    assert len(rows) == 65 and "(other handlers)" in rows
    assert "characters cut]" in page  # the tracebacks' middles


def test_a_hostile_log_gives_a_page_under_4_mb(big_report: BigReport) -> None:
    assert big_report.result.returncode == 0, big_report.result.stderr
    assert 0 < big_report.size < PAGE_LIMIT, f"{big_report.size / 2**20:.1f} MB"


def test_long_names_keep_the_page_under_4_mb(tmp_path: Path) -> None:
    length = 5_000

    def long(prefix: str, i: int) -> str:
        return f"{prefix}{i:03d}" + "&" * length

    context = TrainRunContext(run_id="long", name="long", world_size=2)
    names = [long("metric", i) for i in range(20)]
    events: list[Event] = [
        RoundGathered(
            context=context, round=r, ranks=(0, 1), metrics=[{n: 1.0 + r for n in names}] * 2
        )
        for r in range(3)
    ]
    events.append(
        BudgetReport(
            period=0,
            start=0.0,
            end=1.0,
            budget=0.01,
            total=0.002,
            fraction=0.002,
            handlers=tuple(
                HandlerUsage(handler=long("handler", j), calls=1, total=1e-4, max=1e-4)
                for j in range(100)
            ),
        )
    )
    events += [
        CheckpointSaved(run_id="long", checkpoint=long("checkpoint", c), index=c)
        for c in range(250)
    ]
    log = tmp_path / "long.evlog"
    with LogRecorder(log, run_id="long", fsync="never") as recorder:
        recorder.write_many(stamped(events))
    assert log.stat().st_size < PAGE_LIMIT  # a small log...
    result = run("report", "long.evlog", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    size = (tmp_path / "long.html").stat().st_size
    assert size < PAGE_LIMIT, f"{size / 2**20:.1f} MB"  # ...gives a small page


@pytest.mark.parametrize("field", ["error", "stopped_by", "stop_reason"])
def test_a_huge_run_end_keeps_the_page_under_4_mb(tmp_path: Path, field: str) -> None:
    huge = "'" * 1_000_000  # 1 MB in the log, 6 MB escaped
    end = msgspec.structs.replace(
        RunFinished(run_id="huge", status="failed", stopped_by="EarlyStopping", stop_reason="x"),
        **{field: huge},
    )
    log = tmp_path / "huge.evlog"
    with LogRecorder(log, run_id="huge", fsync="never") as recorder:
        recorder.write_many(stamped([RunStarted(run_id="huge", name="n", world_size=1), end]))
    result = run("report", "huge.evlog", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    size = (tmp_path / "huge.html").stat().st_size
    assert size < PAGE_LIMIT, f"{size / 2**20:.1f} MB"


# --- 9. bench --html -------------------------------------------------------------------


def test_bench_html(tmp_path: Path) -> None:
    result = run(
        "bench", *["noop"] * 12, "--world-size", "4", "--rate", "5", "--duration", "10",
        "--repeat", "1", "--html", "out.html", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert files_in(tmp_path) == {"out.html"}
    page = (tmp_path / "out.html").read_text("utf-8")
    assert page.startswith("<!doctype html>")
    assert ">Callback cost</h2>" in page
    assert "<td>NoOp.after_report</td>" in page
    (cost,) = report_data(page)["charts"]
    assert "NoOp.after_report" in {s["label"] for s in cost["series"]}
    assert len({s["colour"] for s in cost["series"]}) == 12  # each callback its own
    assert cost["threshold"]["label"] == "budget 5% of a period"


# --- 10. an empty log ------------------------------------------------------------------


def test_a_log_without_events(tmp_path: Path) -> None:
    header_only(tmp_path / "quiet.evlog")
    result = run("report", "quiet.evlog", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    page = (tmp_path / "quiet.html").read_text("utf-8")
    assert "This log holds no events." in page
    assert "nothing-yet" in page  # the header's run id
    assert "No numeric metrics were reported." in page
    assert "This log is damaged" not in page
    assert report_data(page)["charts"] == []


# --- 11. a resumed run -----------------------------------------------------------------


def test_a_resumed_run(tmp_path: Path) -> None:
    fast = ["--workers", "2", "--checkpoint-every", "10", "--step-time", "0.001"]
    first = run("demo", "--out", "runs/a", *fast, "--steps", "30", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    checkpoint = "runs/a/checkpoint_000020"
    again = run(
        "demo", "--out", "runs/a", "--resume", checkpoint, *fast, "--steps", "40", cwd=tmp_path
    )
    assert again.returncode == 0, again.stderr
    assert f"resumed from {checkpoint}" in again.stdout
    rounds = int(re.search(r"run finished: (\d+) rounds", again.stdout).group(1))  # type: ignore[union-attr]
    (log,) = (tmp_path / "runs" / "a").glob("*.evlog")  # one history, appended
    relative = log.relative_to(tmp_path)
    stats = run("stats", relative, "--json", cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    rolled_back = json.loads(stats.stdout)["rolled_back"]
    assert rolled_back > 0  # the first run's rounds 21 to 30

    result = run("report", relative, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    page = log.with_suffix(".html").read_text("utf-8")
    summary = facts(page)
    assert summary["resumes"] == "1"
    assert summary["events rolled back by resumes"] == f"{rolled_back:,}"
    assert summary["rounds"] == f"{rounds:,}" == "40"  # rolled-back rounds not counted twice
    assert f"Resumed from <code>{checkpoint}</code>." in page
    markers = report_data(page)["runMarkers"]  # one copy for every metric chart
    assert {"x": 20.0, "kind": "resume", "label": f"resumed from {checkpoint}"} in markers
