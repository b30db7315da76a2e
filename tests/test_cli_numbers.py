"""The command line takes its numbers through the same checks as the library: a NaN, an
infinity, a zero or an absurd size is one line naming the flag, exit 2, never a
traceback, and before anything runs (issue 23, item 3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _builders import eventbus

from eventbus import Report, RunStarted
from eventbus.log import LogRecorder

CASES = [
    ("demo", "--workers", "200000"),
    ("demo", "--workers", "0"),
    ("demo", "--steps", "-3"),
    ("demo", "--checkpoint-every", "0"),
    ("demo", "--period", "nan"),
    ("demo", "--period", "1e-12"),
    ("demo", "--step-time", "inf"),
    ("demo", "--patience", "0"),
    ("bench", "--duration", "1e308"),
    ("bench", "--duration", "nan"),
    ("bench", "--rate", "inf"),
    ("bench", "--rate", "0"),
    ("bench", "--world-size", "200000"),
    ("bench", "--metrics", "-1"),
    ("bench", "--failure-rate", "1.5"),
    ("bench", "--events", "0"),
    ("bench", "--period", "nan"),
    ("bench", "--budget", "inf"),
    ("bench", "--timeout", "-1"),
    ("bench", "--repeat", "0"),
    ("replay", "--speed", "nan"),
    ("replay", "--speed", "0"),
    ("replay", "--speed", "inf"),
    ("replay", "--period", "0"),
    ("replay", "--timeout", "nan"),
]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("numbers") / "run.evlog"
    with LogRecorder(path) as recorder:
        recorder.write(RunStarted(run_id="r", name="r", world_size=1, seq=0, time=1.0))
        recorder.write(
            Report(run_id="r", rank=0, world_size=1, index=0, metrics={}, seq=1, time=2.0)
        )
    return path


@pytest.mark.parametrize(("command", "flag", "value"), CASES)
def test_a_number_out_of_range_is_one_line_naming_its_flag(
    tmp_path: Path, log: Path, command: str, flag: str, value: str
) -> None:
    args: list[str | Path] = [command, flag, value]
    if command == "replay":
        args = [command, log, "--callbacks", "json:dumps", flag, value]
    if command == "demo":
        args += ["--out", tmp_path / "out"]
    done = eventbus(*args, cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"eventbus {command}: error: {flag} "), lines[0]
    assert done.stdout == ""  # refused before anything ran
    assert not (tmp_path / "out").exists()


def test_a_workload_too_big_to_build_is_refused_in_words(tmp_path: Path) -> None:
    done = eventbus("bench", "--world-size", "100000", "--rate", "100", cwd=tmp_path)
    assert done.returncode == 2
    assert "600,000,000 reports" in done.stderr and "more than 2,000,000" in done.stderr


def test_a_count_of_events_to_show_is_checked_by_argparse(log: Path) -> None:
    done = eventbus("show", log, "--limit", "-1")
    assert done.returncode == 2
    assert "argument --limit: must be a whole number, 0 or more, got '-1'" in done.stderr
