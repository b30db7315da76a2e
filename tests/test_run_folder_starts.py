"""A run's folder always starts (issue 40, item 4).

A run killed before its first checkpoint leaves a folder with a log and no
complete checkpoint. Started again as it was (``resume_from=`` the folder, or
the ``latest_checkpoint(folder)`` pattern of ``examples/trackers.py``), it
starts fresh, says so in one line naming the paths, and keeps the earlier
log's records whole under ``<stem>.<n><suffix>``: never refused, never
overwritten. A folder that does not exist is an error naming it. In
process on both backends, then through real processes killed with SIGKILL
(``open_run`` and ``eventbus demo``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from eventbus import Report, RunFinished, RunResumed, RunStarted
from eventbus.log import LogInUse, LogRecorder, read_log
from handlers import Reporter, UserCallback, open_run

pytestmark = pytest.mark.anyio

STEP_FILE = "rank_0.json"


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """Run from a fresh directory, as a user would: every path below is relative."""
    previous = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(previous)


class Rounds(UserCallback):
    """Counts the rounds it was given."""

    def __init__(self) -> None:
        self.rounds = 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: str | None) -> None:
        self.rounds += 1


def training(steps: int, seen: dict[int, str | None], *, checkpoint_at: int = 0) -> Any:
    async def train(reporter: Reporter) -> None:
        seen[reporter.rank] = reporter.latest_checkpoint
        for step in range(1, steps + 1):
            checkpoint = None
            if step == checkpoint_at:
                checkpoint = save(step, reporter.rank)
            await reporter.report({"loss": 1 / step}, checkpoint)
            await reporter.sync()

    return train


async def run_once(
    *,
    resume_from: str | None,
    log: str | None = "runs/a/run.evlog",
    steps: int = 3,
    checkpoint_at: int = 0,
    **options: Any,
) -> tuple[Any, Rounds, dict[int, str | None]]:
    rounds, seen = Rounds(), dict[int, str | None]()
    async with open_run(
        world_size=2,
        callbacks=[rounds],
        state_dir="runs/a",
        log=log,
        resume_from=resume_from,
        **options,
    ) as run:
        await run.workers(training(steps, seen, checkpoint_at=checkpoint_at))
    return run, rounds, seen


def data(path: str | Path) -> bytes:
    return Path(path).read_bytes()


def there(path: str | Path) -> bool:
    return Path(path).exists()


def save(step: int, rank: int) -> str:
    folder = Path("runs/a", f"checkpoint_{step:06d}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.json").write_text(str(step))
    return str(folder)


def finished_status(log: str) -> list[str]:
    return [e.status for e in read_log(log).events if isinstance(e, RunFinished)]


def warnings_of(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [entry["event"] for entry in logs if entry["log_level"] == "warning"]


@pytest.mark.parametrize("suffix", [".evlog", ".jsonl"])
@pytest.mark.parametrize("allow_fresh_state", [False, True])
async def test_the_run_folder_without_a_checkpoint_starts_fresh_and_keeps_the_earlier_log(
    here: Path, suffix: str, allow_fresh_state: bool
) -> None:
    log = f"runs/a/run{suffix}"
    first, _, _ = await run_once(resume_from=None, log=log)  # no checkpoint: nothing to resume
    earlier = data(log)
    with capture_logs() as logs:
        run, rounds, seen = await run_once(
            resume_from="runs/a", log=log, allow_fresh_state=allow_fresh_state
        )
    kept = Path(f"runs/a/run.1{suffix}")
    assert data(kept) == earlier  # every record of the earlier run, byte for byte
    assert warnings_of(logs) == [
        "no complete checkpoint in runs/a to continue: this run starts a new "
        f"history in {log}; the earlier one is kept as {kept}"
    ]
    # Fresh: a new run, its own log, nothing resumed, workers given no checkpoint.
    assert run.run_id != first.run_id and run.resume is None and run.restored is None
    assert seen == {0: None, 1: None}
    assert run.result.status == "finished" and rounds.rounds == 3
    events = read_log(log).events
    assert [type(e) for e in events if isinstance(e, RunStarted | RunResumed)] == [RunStarted]
    assert {e.run_id for e in events if isinstance(e, RunStarted | RunFinished)} == {run.run_id}
    assert sum(isinstance(e, Report) for e in events) == 6


async def test_without_a_log_the_fresh_start_is_said_in_one_line(here: Path) -> None:
    save(5, 0)  # cut short by a kill: rank 0's part, and no states
    with capture_logs() as logs:
        run, rounds, seen = await run_once(resume_from="runs/a", log=None)
    assert warnings_of(logs) == ["no complete checkpoint in runs/a yet: the run starts fresh"]
    assert run.resume is None and seen == {0: None, 1: None} and rounds.rounds == 3


async def test_a_fresh_run_in_a_folder_without_a_checkpoint_moves_the_log_to_a_free_name(
    here: Path,
) -> None:
    """The pattern of examples/trackers.py: ``resume_from`` only once there is a checkpoint."""
    await run_once(resume_from=None)
    await anyio.Path("runs/a/run.1.evlog").write_bytes(b"someone else's file")
    earlier = data("runs/a/run.evlog")
    await run_once(resume_from=None)
    later = data("runs/a/run.evlog")
    await run_once(resume_from=None)
    assert data("runs/a/run.1.evlog") == b"someone else's file"
    assert data("runs/a/run.2.evlog") == earlier
    assert data("runs/a/run.3.evlog") == later
    assert finished_status("runs/a/run.evlog") == ["finished"]


async def test_a_log_that_a_checkpoint_can_continue_is_still_refused_to_a_fresh_run(
    here: Path,
) -> None:
    await run_once(resume_from=None, checkpoint_at=2)
    before = data("runs/a/run.evlog")
    with pytest.raises(FileExistsError, match=r"resume_from=.*runs/a"):
        await run_once(resume_from=None)
    assert data("runs/a/run.evlog") == before
    assert not there("runs/a/run.1.evlog")
    # And resuming it continues the one log, as before.
    _, _, seen = await run_once(resume_from="runs/a", steps=3)
    assert seen[0] == str(Path("runs/a/checkpoint_000002"))
    assert not there("runs/a/run.1.evlog")
    assert sum(isinstance(e, RunResumed) for e in read_log("runs/a/run.evlog").events) == 1


@pytest.mark.parametrize("allow_fresh_state", [False, True])
async def test_resuming_from_a_folder_that_does_not_exist_is_an_error_naming_it(
    here: Path, allow_fresh_state: bool
) -> None:
    with pytest.raises(FileNotFoundError, match="resume_from=runs/gone: no such checkpoint"):
        await run_once(resume_from="runs/gone", allow_fresh_state=allow_fresh_state)
    assert not there("runs/a/run.evlog")  # refused before anything was written


async def test_a_log_another_recorder_is_writing_is_neither_moved_nor_written(here: Path) -> None:
    first, _, _ = await run_once(resume_from=None)
    recorder = LogRecorder("runs/a/run.evlog", run_id=first.run_id, append=True, overwrite=False)
    before = data("runs/a/run.evlog")
    with recorder, pytest.raises(LogInUse, match="another recorder"):
        await run_once(resume_from="runs/a")
    assert data("runs/a/run.evlog") == before
    assert not there("runs/a/run.1.evlog")


async def test_an_empty_log_a_kill_left_before_its_header_never_stops_a_run(here: Path) -> None:
    await anyio.Path("runs/a").mkdir(parents=True)
    await anyio.Path("runs/a/run.evlog").write_bytes(b"")
    with capture_logs() as logs:
        await run_once(resume_from="runs/a")  # fresh: the empty file moved aside
    assert len(warnings_of(logs)) == 1 and "kept as runs/a/run.1.evlog" in warnings_of(logs)[0]
    assert data("runs/a/run.1.evlog") == b"" and finished_status("runs/a/run.evlog") == ["finished"]
    await anyio.Path("runs/a/run.evlog").unlink()
    await run_once(resume_from=None, checkpoint_at=2)
    await anyio.Path("runs/a/run.evlog").write_bytes(b"")  # as if cut before its header
    _, _, seen = await run_once(resume_from="runs/a")
    assert seen[0] == str(Path("runs/a/checkpoint_000002"))
    events = read_log("runs/a/run.evlog").events
    assert [type(e) for e in events if isinstance(e, RunStarted | RunResumed)] == [
        RunStarted,
        RunResumed,
    ]
    assert not there("runs/a/run.2.evlog")


# --- real processes, killed before their first checkpoint ------------------------------

SCRIPT = """
import sys
from pathlib import Path

import anyio

from handlers import Reporter, latest_checkpoint, open_run

folder, pattern, backend = sys.argv[1:4]


async def train(reporter: Reporter) -> None:
    for step in range(1, 7):
        if step == 4:  # the first run is killed here, before its first checkpoint
            while not Path("go").exists():
                await anyio.sleep(0.01)
        checkpoint = None
        if step == 5:
            checkpoint = f"{folder}/checkpoint_{step:06d}"
            Path(checkpoint).mkdir(exist_ok=True)
        await reporter.report({"loss": 1 / step}, checkpoint)
        await reporter.sync()


async def main() -> None:
    if pattern == "always":  # the folder made once, and always resumed from
        Path(folder).mkdir(parents=True, exist_ok=True)
        resume_from = folder
    else:  # examples/trackers.py: once there is a checkpoint
        resume_from = folder if latest_checkpoint(folder) else None
    async with open_run(
        world_size=2, state_dir=folder, log=f"{folder}/run.evlog", resume_from=resume_from
    ) as run:
        await run.workers(train)
    print(run.run_id, run.result.status, run.result.rounds)


anyio.run(main, backend=backend)
"""


def wait_for_reports(log: Path, count: int, process: subprocess.Popen[str]) -> None:
    """Until ``log`` holds ``count`` reports (read back whole) while ``process`` runs."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if log.exists() and sum(isinstance(e, Report) for e in read_log(log).events) >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{log}: fewer than {count} reports after 60 s")


def warning_lines(stderr: str) -> list[str]:
    """The console's warnings, but a budget's (it depends on the machine's load)."""
    return [
        line for line in stderr.splitlines() if "[warning" in line and "over budget" not in line
    ]


def kill(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert process.returncode == -signal.SIGKILL


# Each backend once, each pattern once: the rule is the same on both (shown in process above).
@pytest.mark.parametrize(("pattern", "backend"), [("always", "asyncio"), ("trackers", "trio")])
def test_a_process_killed_before_its_first_checkpoint_starts_again_as_it_was_run(
    tmp_path: Path, pattern: str, backend: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    command = [sys.executable, str(script), "runs/k", pattern, backend]
    log = tmp_path / "runs/k/run.evlog"
    first = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for_reports(log, 6, first)  # steps 1 to 3 of both ranks, written out
    kill(first)
    earlier = log.read_bytes()
    (tmp_path / "go").touch()
    again = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert again.returncode == 0, again.stderr
    run_id, status, rounds = again.stdout.split()
    assert (status, rounds) == ("finished", "6")
    said = warning_lines(again.stderr)
    assert len(said) == 1, again.stderr
    assert "this run starts a new history in runs/k/run.evlog" in said[0]
    assert "the earlier one is kept as runs/k/run.1.evlog" in said[0]
    assert (tmp_path / "runs/k/run.1.evlog").read_bytes() == earlier
    killed = read_log(tmp_path / "runs/k/run.1.evlog").events
    assert sum(isinstance(e, Report) for e in killed) >= 6  # the earlier records, all there
    assert not any(isinstance(e, RunFinished) for e in killed)
    events = read_log(log).events
    assert [e.run_id for e in events if isinstance(e, RunStarted)] == [run_id]
    assert run_id != killed[0].run_id  # type: ignore[attr-defined]
    # A third time, the folder holds a complete checkpoint: it resumes, one log continued.
    third = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert third.returncode == 0, third.stderr
    assert third.stdout.split()[0] == run_id
    assert not (tmp_path / "runs/k/run.2.evlog").exists()


def test_the_demo_killed_before_its_first_checkpoint_resumes_from_its_folder(
    tmp_path: Path,
) -> None:
    demo = [sys.executable, "-m", "adapters.cli", "demo", "--workers", "2"]
    first = subprocess.Popen(
        [*demo, "--out", "X", "--steps", "1000", "--checkpoint-every", "1000", "--step-time", "1"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    folder = tmp_path / "X"
    deadline = time.monotonic() + 60
    while not list(folder.glob("*.evlog")) and time.monotonic() < deadline:
        assert first.poll() is None, first.communicate()
        time.sleep(0.05)
    (earlier_log,) = folder.glob("*.evlog")
    wait_for_reports(earlier_log, 2, first)
    kill(first)
    earlier = earlier_log.read_bytes()
    again = subprocess.run(
        [*demo, "--resume", "X", "--steps", "6", "--checkpoint-every", "3", "--step-time", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert again.returncode == 0, again.stderr
    said = warning_lines(again.stderr)
    assert len(said) == 1, again.stderr
    assert "no complete checkpoint in X yet: the run starts fresh" in said[0]
    assert "resumed from" not in again.stdout and "run finished: 6 rounds" in again.stdout
    assert earlier_log.read_bytes() == earlier  # the killed run's log, untouched
    (later_log,) = set(folder.glob("*.evlog")) - {earlier_log}
    assert [type(e) for e in read_log(later_log).events if isinstance(e, RunStarted)] == [
        RunStarted
    ]
    # Its checkpoints are complete: the next --resume continues it.
    resumed = subprocess.run(
        [*demo, "--resume", "X", "--steps", "9", "--step-time", "0"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from X/checkpoint_000006" in resumed.stdout


def test_the_demo_refuses_a_resume_folder_that_does_not_exist(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "adapters.cli", "demo", "--resume", "nowhere"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "eventbus demo: error: nowhere: no such checkpoint or run directory to resume"
    )
    assert not (tmp_path / "nowhere").exists()
