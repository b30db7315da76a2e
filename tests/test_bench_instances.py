"""Two callbacks of one class are two rows of the bench, named as a live run names
their subscriptions (``Watcher.after_report``, ``Watcher.after_report#2``), never merged
into one (issue 28, item 8)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from handlers import EarlyStopping, UserCallback, open_run

CALLBACKS = """
from handlers import UserCallback


class Watcher(UserCallback):
    def before_run(self, run_context):
        pass

    def after_report(self, run_context, metrics, checkpoint):
        pass


def every_event(event):
    pass
"""


@pytest.fixture
def callbacks_dir(tmp_path: Path) -> Path:
    """A directory with ``twin_callbacks.py``; the command runs there (``module:Name``)."""
    (tmp_path / "twin_callbacks.py").write_text(CALLBACKS)
    return tmp_path


def bench_json(*args: str, cwd: Path | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args, "--repeat", "1", "--json", "-"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in result["callbacks"]}


def live_names(callbacks: list[Any]) -> set[str]:
    """The names a live run gives the callbacks' subscriptions."""

    async def run() -> set[str]:
        async with open_run(world_size=1, callbacks=callbacks) as run:
            names = {s.name for s in run.bus.stats().subscriptions}
        return names

    return anyio.run(run)


def test_two_instances_of_one_class_have_a_row_each(callbacks_dir: Path) -> None:
    """Before: one row, ``Watcher.after_report 400``, with the first one's bus figures."""
    result = bench_json(
        *("twin_callbacks:Watcher", "twin_callbacks:Watcher", "--events", "80"),
        *("--world-size", "4"),
        cwd=callbacks_dir,
    )
    rows = by_name(result)
    assert set(rows) == {
        "Watcher.before_run",
        "Watcher.before_run#2",
        "Watcher.after_report",
        "Watcher.after_report#2",
    }
    for name in ("Watcher.after_report", "Watcher.after_report#2"):
        assert rows[name]["calls"] == rows[name]["bus_calls"] == 20  # each its own rounds
        assert len(result["per_period_pct"][name]) == len(result["period_lengths_s"])
    for name in ("Watcher.before_run", "Watcher.before_run#2"):
        assert rows[name]["calls"] == rows[name]["bus_calls"] == 1


class Watcher(UserCallback):
    """As the module's: a live run names its subscriptions by class name and hook."""

    def before_run(self, run_context: Any) -> None:
        pass

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        pass


def test_the_rows_are_named_as_in_a_live_run(callbacks_dir: Path) -> None:
    live = live_names([Watcher(), EarlyStopping("loss"), Watcher(), EarlyStopping("loss")])
    result = bench_json(
        *("twin_callbacks:Watcher", "early-stopping", "twin_callbacks:Watcher"),
        *("early-stopping", "--events", "40"),
        cwd=callbacks_dir,
    )
    rows = set(by_name(result))
    assert rows == {
        "Watcher.before_run",
        "Watcher.before_run#2",
        "Watcher.after_report",
        "Watcher.after_report#2",
        "EarlyStopping.after_report",
        "EarlyStopping.after_report#2",
    }
    assert rows <= live


def test_two_plain_handlers_of_one_name_have_a_row_each(callbacks_dir: Path) -> None:
    result = bench_json(
        *("twin_callbacks:every_event", "twin_callbacks:every_event", "--events", "40"),
        cwd=callbacks_dir,
    )
    rows = by_name(result)
    assert set(rows) == {"every_event", "every_event#2"}
    assert rows["every_event"]["calls"] == rows["every_event#2"]["calls"] == result["events"]
    assert rows["every_event#2"]["bus_calls"] == result["events"]
