"""``eventbus replay LOG --cost NAME=SECONDS``: a callback charged a cost on the command
line, its budget policy acting deterministically, and bad flags refused in one line."""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from _builders import eventbus

from adapters.cli._common import CliError
from adapters.cli._log import _cost_flags
from eventbus.testing import report_rounds, write_log
from handlers import Reporter, UserCallback, open_run

CALLBACKS = textwrap.dedent(
    """
    from handlers import UserCallback

    class Slow(UserCallback):
        over_budget = "disable"

        def after_report(self, run_context, metrics, checkpoint):
            pass
    """
)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    # 20 rounds of two ranks, one every 0.2 s: 5 rounds a period of 1 s.
    return write_log(tmp_path / "run.evlog", report_rounds(20, world_size=2), start=100.0)


def table(stdout: str) -> list[str]:
    """The output but its first line (which says how long the replay took)."""
    return stdout.splitlines()[1:]


def test_a_cost_flag_charges_the_callback_and_says_what_its_policy_did(
    log: Path, tmp_path: Path
) -> None:
    args = ("replay", log, "--callbacks", "my_callbacks:Slow", "--period", "1")
    done = eventbus(*args, "--cost", "Slow.after_report=0.05", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = table(done.stdout)
    (row,) = [line for line in lines if line.split()[0] == "Slow.after_report"]
    calls, total_ms = int(row.split()[1]), float(row.split()[5])
    assert 0 < calls < 20  # disabled for a while: some rounds skipped
    assert total_ms == pytest.approx(calls * 50.0)
    assert any(line.startswith("over budget: Slow.after_report in ") for line in lines)
    assert any(line.startswith("Slow.after_report: disabled (") for line in lines)
    again = eventbus(*args, "--cost", "Slow.after_report=0.05", cwd=tmp_path)
    assert table(again.stdout) == lines  # deterministic: virtual time

    free = eventbus(*args, cwd=tmp_path)  # without --cost: as before, nothing over budget
    assert free.returncode == 0, free.stderr
    assert "over budget" not in free.stdout and "disabled" not in free.stdout


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("Slow.after_report=nan", "--cost Slow.after_report must be a number of seconds"),
        ("Slwo.after_report=0.05", "--cost: no handler named 'Slwo.after_report'"),
    ],
)
def test_a_bad_cost_flag_is_one_line_naming_the_flag(
    log: Path, tmp_path: Path, value: str, message: str
) -> None:
    done = eventbus(
        "replay", log, "--callbacks", "my_callbacks:Slow", "--cost", value, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"eventbus replay: error: {message}"), lines[0]
    assert done.stdout == ""


def test_cost_flags_are_seconds_by_handler_name() -> None:
    assert _cost_flags(
        ["Slow.after_report=0.05", "mod:handler=2", "EarlyStopping.after_report#2=0"]
    ) == {
        "Slow.after_report": 0.05,
        "mod:handler": 2.0,
        "EarlyStopping.after_report#2": 0.0,
    }
    assert _cost_flags([]) == {}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("Slow.after_report", "--cost must be NAME=SECONDS"),
        ("=0.05", "--cost must be NAME=SECONDS"),
        ("Slow.after_report=", "--cost must be NAME=SECONDS"),
        ("Slow.after_report=fast", "--cost must be NAME=SECONDS"),
        ("Slow.after_report=-0.01", "--cost Slow.after_report must be a number of seconds"),
        ("Slow.after_report=inf", "--cost Slow.after_report must be a number of seconds"),
        ("Slow.after_report=1e9", "--cost Slow.after_report must be a number of seconds"),
    ],
)
def test_a_bad_cost_flag_names_the_flag_and_what_it_must_be(flag: str, message: str) -> None:
    with pytest.raises(CliError) as raised:
        _cost_flags([flag])
    assert str(raised.value).startswith(message), raised.value


def test_a_handler_given_two_costs_is_refused() -> None:
    with pytest.raises(CliError, match=r"--cost Slow\.after_report is given twice"):
        _cost_flags(["Slow.after_report=0.05", "Slow.after_report=0.1"])


# --- against a live run (issue 43, item 1) -----------------------------------------------------

#: What the words of a budget verdict say: "took 205 ms of a 1 s period", "cut short after
#: 430 ms", in the stdout's state changes and the stderr's warnings.
TOOK = re.compile(r"took ([\d,.]+) (s|ms|µs|ns) of a ([\d,.]+) (s|ms|µs|ns) period")
CUT = re.compile(r"cut short after ([\d,.]+) (s|ms|µs|ns)")
UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}


def seconds(figure: str, unit: str) -> float:
    return float(figure.replace(",", "")) * UNITS[unit]


class Sleeping(UserCallback):
    """The live run's ``Slow``: the same hook, asleep 30 ms a call."""

    over_budget = "disable"

    def __init__(self) -> None:
        self.calls = 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.calls += 1
        time.sleep(0.03)


def said_right(said: str) -> None:
    """No callback took more of a period than the period, or than the cut last one lasted."""
    took = TOOK.findall(said)
    assert took  # the state change and the warning say what it took
    for used, unit, length, length_unit in took:
        assert seconds(used, unit) <= seconds(length, length_unit), said
    for line in said.splitlines():
        if (cut := CUT.search(line)) is not None:
            for used, unit, _, _ in TOOK.findall(line):
                assert seconds(used, unit) <= seconds(*cut.groups()), line


def test_the_issues_log_of_rounds_milliseconds_apart_is_replayed_as_a_held_trainer(
    tmp_path: Path,
) -> None:
    """Issue 43: 42 rounds 1.5 ms apart, 50 ms charged a call, "disable". The replay made
    all 42 calls, 0 skipped, and said "1.25 s of a 1 s period ... cut short after 101 ms".
    Live, a sync callback holds the trainer: period 0 holds 20 calls of 50 ms, then it is
    disabled, and the 22 rounds left are skipped."""
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    log = write_log(
        tmp_path / "ms.evlog", report_rounds(42, world_size=2), start=100.0, interval=0.0015
    )
    args = ("replay", log, "--callbacks", "my_callbacks:Slow", "--period", "1")
    done = eventbus(*args, "--cost", "Slow.after_report=0.05", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in table(done.stdout) if line.split()[0] == "Slow.after_report"]
    calls, skipped, state = int(row.split()[1]), int(row.split()[4]), row.split()[-1]
    assert (calls, skipped, state) == (20, 22, "disabled")
    said_right(done.stdout + done.stderr)


def test_a_charged_replay_prints_the_live_runs_calls_and_no_period_longer_than_it_was(
    tmp_path: Path,
) -> None:
    """Rounds a millisecond apart, 30 ms a call, "disable", periods of 1 s and the budget
    5%: live, the callback blocks the trainer, fills period 0 and is disabled. The
    replay charged 30 ms a call prints the calls and skips the live run made, and never
    a callback busy longer than a period, or than the cut last one lasted."""
    (tmp_path / "my_callbacks.py").write_text(CALLBACKS)
    log = tmp_path / "live.evlog"
    sleeping = type("Slow", (Sleeping,), {})()

    async def train(reporter: Reporter) -> None:
        for step in range(40):
            await reporter.report({"step": step})
            await anyio.sleep(0.001)

    async def live() -> None:
        async with open_run(world_size=1, callbacks=[sleeping], log=log, period=1.0) as run:
            await run.workers(train)

    anyio.run(live)
    assert 0 < sleeping.calls < 40  # disabled live

    args = ("replay", log, "--callbacks", "my_callbacks:Slow", "--period", "1")
    done = eventbus(*args, "--cost", "Slow.after_report=0.03", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (row,) = [line for line in table(done.stdout) if line.split()[0] == "Slow.after_report"]
    calls, skipped, state = int(row.split()[1]), int(row.split()[4]), row.split()[-1]
    assert (calls, skipped, state) == (sleeping.calls, 40 - sleeping.calls, "disabled")

    said_right(done.stdout + done.stderr)
