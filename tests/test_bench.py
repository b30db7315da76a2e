"""The callback benchmark: workload shape, figures that add up, over-budget detection."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from adapters.cli import BenchResult, Workload, run_bench, synthetic_events
from eventbus import CheckpointSaved, Report, RunFinished, RunStarted, WorkerFailure
from handlers import UserCallback


class Counting(UserCallback):
    def __init__(self) -> None:
        self.rounds: list[int] = []
        self.failures = 0

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        self.rounds.append(len(metrics))

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        self.failures += len(worker_exceptions)


class Sleepy(UserCallback):
    """Costs at least 2 ms a round: over any 1% budget of a 1 s period at 10 rounds/s."""

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        time.sleep(0.002)


def test_synthetic_workload_shape() -> None:
    events = synthetic_events(Workload(world_size=4, rate=10, duration=3, checkpoint_every=5))
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    reports = [e for e in events if isinstance(e, Report)]
    assert len(reports) == 4 * 30
    assert {r.rank for r in reports} == {0, 1, 2, 3}
    checkpoints = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [c.index for c in checkpoints] == [4, 9, 14, 19, 24, 29]
    times = [e.time for e in events]
    assert times == sorted(times)
    for rank in range(4):
        assert [r.index for r in reports if r.rank == rank] == list(range(30))


def test_failures_are_injected_at_the_given_rate() -> None:
    events = synthetic_events(Workload(world_size=8, rate=10, duration=10, failure_rate=0.1))
    failures = [e for e in events if isinstance(e, WorkerFailure)]
    assert 40 <= len(failures) <= 130  # 800 reports at 10%, seed 0


def test_figures_add_up() -> None:
    made: list[Counting] = []

    def make() -> list[Any]:
        made.append(Counting())
        return [made[-1]]

    events = synthetic_events(Workload(world_size=4, rate=20, duration=5, failure_rate=0.02))
    result = run_bench(make, events, period=1.0, budget=0.05)
    through_bus, floor, timed = made  # fresh callbacks for each pass
    assert result.rounds == 100 == len(through_bus.rounds) == len(floor.rounds)
    assert len(timed.rounds) == 100
    assert set(through_bus.rounds) == {4}
    assert through_bus.failures == floor.failures == timed.failures > 0
    figures = {f.name: f for f in result.callbacks}
    report = figures["Counting.after_report"]
    assert report.calls == 100
    assert 0 < report.p50 <= report.p99 <= report.max
    assert report.periods_over_budget == 0
    assert result.periods >= 5
    assert len(result.per_period["Counting.after_report"]) == result.periods
    assert result.events == len(events)


def test_a_slow_callback_is_over_budget() -> None:
    events = synthetic_events(Workload(world_size=2, rate=10, duration=3))
    result = run_bench(lambda: [Sleepy()], events, period=1.0, budget=0.01)
    sleepy = next(f for f in result.callbacks if f.name == "Sleepy.after_report")
    assert sleepy.periods_over_budget >= 2
    assert sleepy.period_share_max > 0.01
    assert sleepy.p50 >= 0.002


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def test_cli_json_matches_the_schema(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_cli(
        "noop", "early-stopping", "--events", "400", "--world-size", "4", "--json", str(out)
    )
    assert done.returncode == 0, done.stderr
    result = msgspec.json.decode(out.read_bytes(), type=BenchResult)
    assert {f.name for f in result.callbacks} >= {"NoOp.after_report", "EarlyStopping.after_report"}
    assert result.rounds == 100
    assert "NoOp.after_report" in done.stdout  # the table is printed too


def test_cli_rejects_an_unknown_callback() -> None:
    done = run_cli("no.such.module:Thing", "--events", "10")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "no.such.module" in done.stderr


def test_cli_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    done = run_cli("noop", "--events", "200", "--plot", str(out), "--json", "-")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(done.stdout)["rounds"] == 25


def test_a_plain_handler_gets_every_event_of_the_workload() -> None:
    seen: list[list[Any]] = []

    def make() -> list[Any]:
        seen.append([])
        return [seen[-1].append]

    events = synthetic_events(Workload(world_size=2, rate=10, duration=2))
    result = run_bench(make, events, period=1.0)
    assert result.rounds == 0  # no training callback: nothing gathered
    through_bus, floor, timed = seen
    assert len(through_bus) == len(floor) == len(timed) == len(events)
    figures = {f.name: f for f in result.callbacks}
    assert figures["list.append"].calls == len(events)
    assert result.baseline_seconds > 0
