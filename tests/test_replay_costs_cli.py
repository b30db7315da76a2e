"""``eventbus replay LOG --cost NAME=SECONDS``: a callback charged a cost on the command
line, its budget policy acting deterministically, and bad flags refused in one line."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from _builders import eventbus

from adapters.cli import CliError
from adapters.cli._log import _cost_flags
from eventbus.testing import report_rounds, write_log

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
