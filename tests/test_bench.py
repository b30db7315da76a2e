"""The callback benchmark: workload shape, figures that add up, over-budget detection."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from adapters.cli._bench import plot_figure
from adapters.cli._bench_runner import (
    BenchResult,
    Timings,
    Workload,
    run_bench,
    runtime_cost,
    synthetic_events,
)
from eventbus import CheckpointSaved, Report, RunFinished, RunStarted, WorkerFailure
from eventbus.log import read_log
from eventbus.log._replay import log_timing
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
    result = run_bench(make, events, period=1.0, budget=0.05, repeats=1)
    through_bus, floor, timed = made  # fresh callbacks for each pass
    assert result.rounds == 100 == len(through_bus.rounds) == len(floor.rounds)
    assert len(timed.rounds) == 100
    assert set(through_bus.rounds) == {4}
    assert through_bus.failures == floor.failures == timed.failures > 0
    figures = {f.name: f for f in result.callbacks}
    report = figures["Counting.after_report"]
    assert report.calls == report.bus_calls == 100
    assert 0 < report.p50_us <= report.p99_us <= report.max_us
    assert report.periods_over_budget == 0
    assert result.periods == 5 and 0 < result.partial_period_s < 1.0
    shares = result.per_period_pct["Counting.after_report"]
    assert len(shares) == len(result.period_lengths_s) == result.periods + 1
    assert result.events == len(events)


def test_a_slow_callback_is_over_budget() -> None:
    events = synthetic_events(Workload(world_size=2, rate=10, duration=3))
    result = run_bench(lambda: [Sleepy()], events, period=1.0, budget=0.01, repeats=1)
    sleepy = next(f for f in result.callbacks if f.name == "Sleepy.after_report")
    assert sleepy.periods_over_budget >= 2
    assert sleepy.period_share_max_pct > 1.0
    assert sleepy.p50_us >= 2000


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
        "noop",
        "early-stopping",
        "--events",
        "400",
        "--world-size",
        "4",
        "--repeat",
        "2",
        "--json",
        str(out),
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
    done = run_cli("noop", "--events", "200", "--repeat", "1", "--plot", str(out), "--json", "-")
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(done.stdout)["rounds"] == 25


def test_a_plain_handler_gets_every_event_of_the_workload() -> None:
    seen: list[list[Any]] = []

    def make() -> list[Any]:
        seen.append([])
        return [seen[-1].append]

    events = synthetic_events(Workload(world_size=2, rate=10, duration=2))
    result = run_bench(make, events, period=1.0, repeats=1)
    assert result.rounds == 0  # no training callback: nothing gathered
    through_bus, floor, timed = seen
    assert len(through_bus) == len(floor) == len(timed) == len(events)
    figures = {f.name: f for f in result.callbacks}
    assert figures["list.append"].calls == figures["list.append"].bus_calls == len(events)
    assert result.baseline_ms.median > 0


# --- what the figures mean (issue 14) ----------------------------------------------------------

CALLBACKS = '''
import time

from handlers import UserCallback


class ThirtyPercent(UserCallback):
    """Sleeps 20 ms on rounds 0, 1, 2 of every ten: 60 ms a second at 10 rounds a second."""

    def __init__(self):
        self.round = 0

    def after_report(self, run_context, metrics, checkpoint):
        if self.round % 10 < 3:
            time.sleep(0.02)
        self.round += 1


class EveryRound(UserCallback):
    """Sleeps 2 ms on every round."""

    def after_report(self, run_context, metrics, checkpoint):
        time.sleep(0.002)
'''


@pytest.fixture
def callbacks_dir(tmp_path: Path) -> Path:
    """A directory with ``slow_callbacks.py``; the command runs there (``module:Name``)."""
    (tmp_path / "slow_callbacks.py").write_text(CALLBACKS)
    return tmp_path


def bench_json(*args: str, cwd: Path | None = None) -> tuple[dict[str, Any], str]:
    done = run_cli(*args, "--json", "-", cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_no_empty_period_after_the_workload_and_a_partial_one_weighs_by_its_length(
    callbacks_dir: Path,
) -> None:
    """A known answer: 30 rounds over 3 s, 20 ms of sleep on 3 rounds in each second.

    Before, two empty periods closed every bench (the one after the last event
    and the one the bus cut when it closed) and counted as whole periods: the
    mean share came out near 6% x 3/5 = 3.6%, "under" a 5% budget."""
    result, _ = bench_json(
        *("slow_callbacks:ThirtyPercent", "--world-size", "1", "--rate", "10"),
        *("--duration", "3", "--period", "1", "--repeat", "1"),
        cwd=callbacks_dir,
    )
    assert result["periods"] == 3  # [0, 1), [1, 2), [2, 3): whole periods of the workload
    assert 0 < result["partial_period_s"] < 0.1  # up to RunFinished, one interval after
    assert result["period_lengths_s"][:3] == [1.0, 1.0, 1.0]
    assert len(result["period_lengths_s"]) == 4  # and nothing after the workload
    (figures,) = result["callbacks"]
    shares = result["per_period_pct"]["ThirtyPercent.after_report"]
    assert all(share >= 6.0 for share in shares[:3])  # at least 3 x 20 ms of 1 s each
    assert shares[3] == 0.0  # the partial period holds RunFinished alone
    # The mean is the callback's share of the run's time: a partial period weighs
    # by its length, an empty one never counts as a whole period.
    timeline = sum(result["period_lengths_s"])
    assert result["timeline_s"] == pytest.approx(timeline)
    assert figures["period_share_mean_pct"] == pytest.approx(
        figures["bus_total_ms"] / 10 / timeline
    )
    assert figures["period_share_mean_pct"] >= 6.0 * 3 / timeline > 5.0  # over budget
    assert figures["periods_over_budget"] == 3


@pytest.fixture
def recorded_log(tmp_path: Path) -> Path:
    """A run recorded with 0.5 s periods: 40 rounds of 4 ranks, one every 0.1 s from t=1000."""
    from eventbus import VirtualClock
    from handlers import open_run

    path = tmp_path / "run.evlog"

    async def record() -> None:
        clock = VirtualClock(start=1000.0)
        async with open_run(world_size=4, log=path, clock=clock, period=0.5) as run:
            reporters = [run.reporter(rank) for rank in range(4)]
            for index in range(40):
                clock.advance(0.1)
                for reporter in reporters:
                    await reporter.report({"loss": 1.0 / (index + 1)})
                await run.bus.wait_idle()

    anyio.run(record)
    return path


def test_a_log_is_benched_with_its_recorded_periods(
    recorded_log: Path, callbacks_dir: Path
) -> None:
    """Before: 2 s periods from the first event on, the log's own ticks and budget
    reports counted as the bench's, its rounds delivered a second time: mostly
    zeros, then a spike larger than all the time the callback took."""
    timing = log_timing(recorded_log)
    assert (timing.start, timing.period) == (1000.0, 0.5)
    last = read_log(recorded_log).events[-1].time
    result, _ = bench_json(
        "slow_callbacks:EveryRound", "--log", str(recorded_log), "--repeat", "1", cwd=callbacks_dir
    )
    assert (result["start_s"], result["period_s"]) == (1000.0, 0.5)
    assert result["periods"] == round((last - timing.start) / 0.5) == 8
    assert result["partial_period_s"] < 0.5
    (figures,) = result["callbacks"]
    assert figures["bus_calls"] == figures["calls"] == result["rounds"] == 40  # each round once
    shares = result["per_period_pct"]["EveryRound.after_report"]
    whole = shares[: result["periods"]]
    assert all(share > 0 for share in whole)  # 5 rounds in each: no zero between spikes
    # Each period holds what was spent in it, and they add up to the callback's time.
    spent = [share / 100 * result["period_s"] * 1e3 for share in shares]
    assert max(spent) <= figures["bus_total_ms"]
    assert sum(spent) == pytest.approx(figures["bus_total_ms"])

    given, _ = bench_json(
        *("slow_callbacks:EveryRound", "--log", str(recorded_log), "--period", "1"),
        *("--repeat", "1"),
        cwd=callbacks_dir,
    )
    assert (given["period_s"], given["periods"]) == (1.0, 4)


UNITLESS = {
    *("events", "rounds", "periods", "repeats", "calls", "bus_calls", "periods_over_budget"),
    *("faults", "bus_faults", "bus_skipped"),  # counts, as calls are
    "period",  # a state change's: the index of the period it holds from
}
UNITS = ("_us", "_ms", "_ns", "_s", "_pct")


def test_json_figures_name_their_units() -> None:
    result, _ = bench_json("noop", "early-stopping", "--events", "200", "--repeat", "1")

    def bare(node: Any, key: str = "") -> list[str]:
        if isinstance(node, dict):
            if set(node) == {"median", "low", "high"}:  # a Spread: its key has the unit
                return [] if key.endswith(UNITS) or key == "floor_ratio" else [key]
            return [k for name, value in node.items() for k in bare(value, name)]
        if isinstance(node, list):
            return [k for item in node for k in bare(item, key)]
        if isinstance(node, float) or (isinstance(node, int) and not isinstance(node, bool)):
            return [] if key in UNITLESS or key.endswith(UNITS) else [key]
        return []

    series = result.pop("per_period_pct")  # keyed by callback: percentages, as it says
    assert bare(result) == []
    assert set(series) == {"NoOp.after_report", "EarlyStopping.after_report"}


def test_the_over_budget_warning_is_one_line_at_the_end(callbacks_dir: Path) -> None:
    done = run_cli(
        *("slow_callbacks:ThirtyPercent", "--world-size", "1", "--rate", "10"),
        *("--duration", "3", "--period", "1", "--repeat", "1"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "over budget" in line]
    assert len(warnings) == 1, done.stderr  # not one per period
    assert "ThirtyPercent.after_report in 3 of 4 periods" in warnings[0]
    assert "over budget" not in done.stdout  # stdout holds the table alone


def test_a_ratio_to_the_floor_says_how_sure_it_is_or_why_there_is_none() -> None:
    timings = Timings(bus=[0.012, 0.011, 0.013], baseline=[0.002] * 3, floor=[0.002] * 3)
    overhead, ratio, note = runtime_cost(timings, events=1000)
    assert ratio is not None and note == ""
    assert (ratio.low, ratio.median, ratio.high) == pytest.approx((4.5, 5.0, 5.5))
    assert overhead.median == pytest.approx(8000)  # (12 - 2 - 2) ms / 1000 events, in ns

    noisy = Timings(bus=[0.012, 0.030, 0.013], baseline=[0.002] * 3, floor=[0.002] * 3)
    assert runtime_cost(noisy, 1000)[1] is None
    assert "disagree" in runtime_cost(noisy, 1000)[2]
    one_pause = Timings(bus=[0.012, 0.011, 0.013, 0.012, 0.050], baseline=[0.002] * 5)
    one_pause.floor = [0.002] * 5
    paused = runtime_cost(one_pause, 1000)[1]  # of 5 runs, the extremes do not veto
    assert paused is not None and (paused.median, paused.high) == pytest.approx((5.0, 24.0))
    tiny = Timings(bus=[0.012] * 3, baseline=[0.002] * 3, floor=[0.00001] * 3)
    assert runtime_cost(tiny, 1000)[1] is None and "too little" in runtime_cost(tiny, 1000)[2]
    once = Timings(bus=[0.012], baseline=[0.002], floor=[0.002])
    assert runtime_cost(once, 1000)[1] is None and "--repeat" in runtime_cost(once, 1000)[2]


def test_a_short_bench_gives_no_ratio_and_says_why() -> None:
    """A 2 s bench of a no-op: 20 calls, microseconds in all; its "52x the floor" was noise."""
    done = run_cli("noop", "--duration", "2")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "the runtime" in line]
    assert "no ratio to the floor: the callbacks' own time" in line
    assert "x the floor" not in line
    assert "over 5 runs" in line  # the per-event figure comes with its range


def test_the_plot_uses_a_log_scale(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = run_bench(
        lambda: [Counting(), Sleepy()],
        synthetic_events(Workload(world_size=2, rate=10, duration=3)),
        period=1.0,
        repeats=1,
    )
    figure = plot_figure(result)
    (axes,) = figure.axes
    assert axes.get_yscale() == "log"  # 0.001% and 20% both visible
    low, _ = axes.get_ylim()
    cheapest = min(v for s in result.per_period_pct.values() for v in s if v > 0)
    assert 0 < low <= cheapest
