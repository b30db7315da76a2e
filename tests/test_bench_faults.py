"""A callback that raises is a fault in the bench's table (its calls, faults and first
error, in one bounded line), never a traceback, and the command exits 0 (issue 28,
item 6); a callback the bus disabled leaves the runtime's cost per event "not
measured", saying why, never negative (item 9)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from adapters.cli._bench_runner import Timings, runtime_cost

CALLBACKS = '''
import time

from handlers import UserCallback


class Fine(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        pass


class ReadsMissing(UserCallback):
    """Reads a metric the reports do not carry: a KeyError at every call."""

    def after_report(self, run_context, metrics, checkpoint):
        return metrics[0]["epoch_loss"]


class Wordy(UserCallback):
    """Raises with a message of many lines."""

    def after_report(self, run_context, metrics, checkpoint):
        raise RuntimeError("it went wrong\\n" + "and on\\n" * 1000)


class Fragile(UserCallback):
    """Disabled by the bus after its third fault."""

    on_error = "disable"
    max_faults = 3

    def after_report(self, run_context, metrics, checkpoint):
        raise RuntimeError("broken")


class SlowDisabled(UserCallback):
    """20 ms a round: 20% of a 1 s period at 10 rounds a second, over a 5% budget."""

    over_budget = "disable"

    def after_report(self, run_context, metrics, checkpoint):
        time.sleep(0.02)


class NoHooksCalled(UserCallback):
    def after_exception(self, run_context, worker_exceptions):
        pass
'''


@pytest.fixture
def callbacks_dir(tmp_path: Path) -> Path:
    """A directory with ``faulty_callbacks.py``; the command runs there (``module:Name``)."""
    (tmp_path / "faulty_callbacks.py").write_text(CALLBACKS)
    return tmp_path


def bench(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "adapters.cli", "bench", *args, "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in result["callbacks"]}


def test_a_callback_that_raises_is_a_fault_in_the_table_not_a_traceback(
    callbacks_dir: Path,
) -> None:
    """Before: the first KeyError ended the command in a traceback, exit 1."""
    done = bench(
        *("faulty_callbacks:Fine", "faulty_callbacks:ReadsMissing", "--events", "80"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert "handler failed" not in done.stderr  # said once, in the table, not per period
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("callback "))
    assert header.split()[-1] == "faults"
    row = next(line for line in lines if line.startswith("ReadsMissing.after_report "))
    assert row.split()[1] == "10" and row.split()[-1] == "10"  # calls, faults
    fine = next(line for line in lines if line.startswith("Fine.after_report "))
    assert fine.split()[-1] == "0"
    assert (
        "ReadsMissing.after_report: 10 of 10 calls raised; first: KeyError: 'epoch_loss' "
        "('epoch_loss' is not among the reports' metrics: --metrics names them)"
    ) in lines


def test_the_json_has_each_callbacks_faults_and_first_error(callbacks_dir: Path) -> None:
    done = bench(
        *("faulty_callbacks:ReadsMissing", "faulty_callbacks:Wordy", "--events", "40"),
        *("--json", "-"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr  # measured: each raising, as it does
    rows = by_name(json.loads(done.stdout))
    missing = rows["ReadsMissing.after_report"]
    assert (missing["calls"], missing["faults"], missing["bus_faults"]) == (5, 5, 5)
    assert missing["first_error"] == "KeyError: 'epoch_loss'"
    wordy = rows["Wordy.after_report"]["first_error"]
    assert wordy.startswith("RuntimeError: it went wrong and on and on")
    assert "\n" not in wordy and len(wordy) <= 160 and wordy.endswith("…")


def test_a_table_without_faults_has_no_faults_column(callbacks_dir: Path) -> None:
    done = bench("faulty_callbacks:Fine", "--events", "40", cwd=callbacks_dir)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("callback "))
    assert header.split()[-1] == "over"


def no_negative_cost(text: str) -> None:
    assert not re.search(r"-\d[\d,.]* ?ns", text), text


def test_a_callback_disabled_after_its_faults_leaves_the_cost_not_measured(
    callbacks_dir: Path,
) -> None:
    done = bench(
        *("faulty_callbacks:Fine", "faulty_callbacks:Fragile", "--events", "160"),
        *("--json", "-"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    fragile = by_name(result)["Fragile.after_report"]
    assert (fragile["calls"], fragile["faults"]) == (20, 20)  # called directly: every round
    assert (fragile["bus_calls"], fragile["bus_faults"]) == (3, 3)  # the bus stopped at 3
    assert fragile["bus_skipped"] == 17
    assert fragile["bus_note"].startswith("disabled: ")
    assert "max_faults=3" in fragile["bus_note"]
    assert result["overhead_note"].startswith("not measured: ")
    assert result["overhead_note"] == (
        "not measured: the bus did not make every call the floor makes: "
        "Fragile.after_report (3 of 20 calls, disabled)"
    )
    assert result["floor_ratio"] is None
    assert result["floor_ratio_note"] == result["overhead_note"]
    spread = result["overhead_per_event_ns"]
    assert min(spread.values()) >= 0


def test_a_slow_callback_disabled_over_budget_gives_no_negative_cost(
    callbacks_dir: Path,
) -> None:
    """Before: ``the runtime adds -5658695 ns per event``: the floor called the slow
    callback at every round, the bus only until it disabled it."""
    done = bench(
        *("faulty_callbacks:SlowDisabled", "--world-size", "1", "--rate", "10"),
        *("--duration", "3", "--period", "1"),
        cwd=callbacks_dir,
    )
    assert done.returncode == 0, done.stderr
    no_negative_cost(done.stdout + done.stderr)
    lines = done.stdout.splitlines()
    (cost,) = [line for line in lines if line.startswith("the runtime")]
    assert cost.startswith(
        "the runtime's cost per event: not measured: the bus did not make every call the "
        "floor makes: SlowDisabled.after_report ("
    ), cost
    assert cost.endswith(" of 30 calls, disabled)"), cost
    (said,) = [line for line in lines if line.startswith("SlowDisabled.after_report: ")]
    assert "through the bus" in said and "disabled: " in said
    assert "its per-call figures are of all 30, called directly" in said


def test_a_cost_below_zero_is_noise_never_a_negative_figure() -> None:
    timings = Timings(bus=[0.010, 0.011, 0.012], baseline=[0.004] * 3, floor=[0.008] * 3)
    overhead, _, _ = runtime_cost(timings, events=1000)
    assert (overhead.low, overhead.median, overhead.high) == (0.0, 0.0, 0.0)


def test_nothing_measured_is_an_error_after_the_table(callbacks_dir: Path) -> None:
    done = bench("faulty_callbacks:NoHooksCalled", "--events", "40", cwd=callbacks_dir)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "eventbus bench: error: nothing measured: no callback was called by this workload "
        "(the bench times before_run, after_report and after_exception, which needs worker "
        "failures: --failure-rate)"
    )
    assert "Traceback" not in done.stderr
