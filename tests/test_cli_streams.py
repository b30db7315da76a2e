"""What the ``eventbus`` commands write where: data on stdout, every diagnostic on
stderr, and a reader that goes away (``| head``) ends a command quietly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _builders import sample_event

from eventbus import CheckpointSaved, WorkerFailure
from eventbus.testing import report_rounds, write_log

CLI = [sys.executable, "-m", "adapters.cli"]
#: What a command must never say about a closed stdout.
PIPE_NOISE = ("Broken pipe", "BrokenPipeError", "cannot read", "Traceback", "Exception ignored")

CALLBACKS = '''
import time

from handlers import UserCallback


class Slow(UserCallback):
    """20 ms a round: 40% of a 1 s period at 20 rounds a second, over any 5% budget."""

    def after_report(self, run_context, metrics, checkpoint):
        time.sleep(0.02)


def count(event):
    """A handler for replays."""
'''


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A directory with ``user_callbacks.py`` and a small log; commands run there."""
    (tmp_path / "user_callbacks.py").write_text(CALLBACKS)
    events = [
        *report_rounds(3, world_size=2),
        sample_event(WorkerFailure, rank=1, message="CUDA out of memory"),
        sample_event(CheckpointSaved, checkpoint="ckpt-2", index=2),
    ]
    write_log(tmp_path / "run.evlog", events, run_id="demo", start=100.0)
    return tmp_path


def test_bench_json_on_stdout_is_one_document_and_the_warning_is_on_stderr(
    workdir: Path,
) -> None:
    """Issue 14, item 6: `eventbus bench ... --json - | python -m json.tool` failed with
    "Extra data": the bus's budget warnings went to stdout (structlog's default)."""
    done = subprocess.run(
        [
            *CLI,
            "bench",
            "user_callbacks:Slow",
            *("--world-size", "2", "--rate", "10", "--duration", "3", "--period", "1"),
            *("--repeat", "1", "--json", "-"),
        ],
        capture_output=True,
        text=True,
        cwd=workdir,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # exactly one JSON document: "Extra data" otherwise
    assert result["callbacks"][0]["periods_over_budget"] >= 2
    assert "over budget" not in done.stdout
    assert "callbacks over budget: Slow.after_report" in done.stderr


def test_a_library_logging_without_configure_logging_writes_to_stderr(workdir: Path) -> None:
    """``run_bench`` from code, structlog never configured: the bus's warnings are
    diagnostics, on stderr (structlog's own default is stdout)."""
    script = (
        "from adapters.cli._bench_runner import Workload, run_bench, synthetic_events\n"
        "from user_callbacks import Slow\n"
        "events = synthetic_events(Workload(world_size=2, rate=10, duration=2))\n"
        "run_bench(lambda: [Slow()], events, period=1.0, repeats=1)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=workdir,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert "callbacks over budget" in done.stderr


def test_demo_prints_only_its_summary_on_stdout(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "demo", "--steps", "20", "--step-time", "0.001", "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("run finished:")
    assert "[info" not in done.stdout and "[warning" not in done.stdout
    assert "[info" in done.stderr  # the run's logs, where diagnostics go


def test_show_into_head_ends_quietly(tmp_path: Path) -> None:
    """Issue 14, item 12: `eventbus show LOG | head -1` ended with "cannot read: Broken
    pipe", blaming the log. Far more than a pipe's buffer, read one line, close."""
    log = write_log(tmp_path / "big.evlog", report_rounds(2000, world_size=2))
    child = subprocess.Popen(
        [*CLI, "show", str(log)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout is not None and child.stderr is not None
    assert child.stdout.readline().split()[0] == b"seq"
    child.stdout.close()
    stderr = child.stderr.read().decode()
    child.stderr.close()
    code = child.wait(timeout=60)
    assert not [noise for noise in PIPE_NOISE if noise in stderr], stderr
    assert code in (0, 141)


COMMANDS = {
    "show": ["show", "run.evlog"],
    "show --json": ["show", "--json", "run.evlog"],
    "stats": ["stats", "run.evlog"],
    "stats --json": ["stats", "--json", "run.evlog"],
    "convert": ["convert", "run.evlog", "run.jsonl"],
    "replay": ["replay", "run.evlog", "--callbacks", "user_callbacks:count"],
    "bench": ["bench", "noop", "--events", "40", "--repeat", "1"],
    "bench --json -": ["bench", "noop", "--events", "40", "--repeat", "1", "--json", "-"],
    "demo": ["demo", "--steps", "10", "--step-time", "0.001", "--out", "demo", "--no-log"],
    "help": ["--help"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_command_ends_quietly_when_stdout_is_closed(
    workdir: Path, command: list[str]
) -> None:
    """The reader went away before the command wrote anything: exit 141 (a shell's
    SIGPIPE), and not a word on stderr about it."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout now fails with EPIPE
    try:
        done = subprocess.run(
            [*CLI, *command],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=workdir,
            check=False,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert not [noise for noise in PIPE_NOISE if noise in done.stderr], done.stderr
    # argparse's own --help ignores a failed write and exits 0: quiet too.
    assert done.returncode in ((0, 141) if command == ["--help"] else (141,)), done.stderr
