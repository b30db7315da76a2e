"""What ``callbacks=`` takes: training callbacks, refused otherwise where they are passed,
at run time and for mypy (issue 23, item 15); and which checkpoint a run directory
resumes from (item 20)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import StatefulCallback
from eventbus.state._files import STATE_FILENAME
from handlers import EarlyStopping, Reporter, UserCallback, latest_checkpoint, open_run

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("callback", "says"),
    [
        (42, "callbacks[1]: 42 is not a training callback: expected a handlers.UserCallback"),
        ("early-stopping", "'early-stopping' is not a training callback"),
        (lambda event: None, "is a function, not a training callback: subclass"),
        (EarlyStopping, "is a class: pass an instance, EarlyStopping(...)"),
        (object(), "is not a training callback"),
    ],
)
def test_what_is_not_a_callback_is_refused_by_open_run_itself(callback: Any, says: str) -> None:
    with pytest.raises(TypeError) as info:
        open_run(world_size=1, callbacks=[EarlyStopping("loss"), callback])
    assert says in str(info.value)


def test_callbacks_must_be_a_list_of_them() -> None:
    with pytest.raises(TypeError, match="callbacks must be a list"):
        open_run(world_size=1, callbacks=EarlyStopping("loss"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callbacks must be a list"):
        open_run(world_size=1, callbacks="loss")  # type: ignore[arg-type]


class Hooks:
    """An object with UserCallback's hooks, not its class: taken as it always was."""

    def __init__(self) -> None:
        self.rounds = 0

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        self.rounds += 1


class StateOnly(StatefulCallback):
    state_attributes = ("n",)

    def __init__(self) -> None:
        self.n = 0


@pytest.mark.anyio
async def test_objects_with_hooks_or_state_only_are_callbacks() -> None:
    hooks, state = Hooks(), StateOnly()
    # A duck-typed callback is taken at run time; for mypy, subclass UserCallback.
    callbacks: list[Any] = [hooks, state, UserCallback()]
    async with open_run(world_size=1, callbacks=callbacks) as run:
        await run.reporter(0).report({"loss": 1.0})
    assert hooks.rounds == 1


def test_mypy_catches_what_is_not_a_callback(tmp_path: Path) -> None:
    """``callbacks`` is typed: a user's own type check refuses the number and the class."""
    user = tmp_path / "mine.py"
    user.write_text(
        textwrap.dedent(
            """
            from handlers import EarlyStopping, open_run

            open_run(world_size=1, callbacks=[EarlyStopping("loss")])
            open_run(world_size=1, callbacks=[42])
            open_run(world_size=1, callbacks=[EarlyStopping])
            open_run(world_size=1, perod=2.0)
            """
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(user)],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    lines = sorted({int(line.split(":")[1]) for line in errors})
    assert lines == [5, 6, 7], done.stdout


# --- the latest complete checkpoint of a run directory ------------------------------------


async def _run_with_checkpoints(out: Path, steps: int) -> None:
    async def worker(reporter: Reporter) -> None:
        for step in range(steps):
            checkpoint = None
            if step % 2 == 1:
                checkpoint = out / f"checkpoint_{step:03d}"
                checkpoint.mkdir(parents=True, exist_ok=True)
            await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=checkpoint)

    async with open_run(world_size=1, callbacks=[EarlyStopping("loss")], state_dir=out) as run:
        await run.workers(worker)


def test_the_latest_complete_checkpoint_is_the_last_snapshot_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    anyio.run(_run_with_checkpoints, out, 8)
    assert latest_checkpoint(out) == out / "checkpoint_007"
    (out / "checkpoint_009").mkdir()  # a kill left this one without its snapshot
    (out / "checkpoint_011").mkdir()
    (out / "checkpoint_011" / STATE_FILENAME).write_text("{ torn")  # half a file
    (out / "zz").symlink_to(out / "checkpoint_001")  # a link is not a checkpoint of the run
    assert latest_checkpoint(out) == out / "checkpoint_007"
    os.utime(out / "checkpoint_003" / STATE_FILENAME, (4e9, 4e9))  # written last, say
    assert latest_checkpoint(out) == out / "checkpoint_003"


def test_no_checkpoint_no_directory_is_none(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    assert latest_checkpoint(tmp_path / "missing") is None
    (tmp_path / "file").write_text("")
    assert latest_checkpoint(tmp_path / "file") is None


@pytest.mark.anyio
async def test_resume_from_the_run_directory_takes_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    await _run_with_checkpoints(out, 6)
    early = EarlyStopping("loss")
    async with open_run(world_size=1, callbacks=[early], state_dir=out, resume_from=out) as run:
        pass
    assert run.resume is not None and run.resume.checkpoint == str(out / "checkpoint_005")
    assert early.rounds == 6 and run.latest_checkpoint == str(out / "checkpoint_005")
