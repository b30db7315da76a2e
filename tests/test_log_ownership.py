"""One log, one writer: a run creates its log in one step and holds it while it records,
so no second run replaces or interleaves with it (issue 23, item 6)."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from eventbus import RunFinished, RunStarted
from eventbus.log import LogInUse, LogRecorder, read_log
from handlers import Reporter, UserCallback, open_run

pytestmark = pytest.mark.anyio


async def _worker(reporter: Reporter) -> None:
    for step in range(3):
        await reporter.report({"loss": 1.0 / (step + 1)})


async def test_a_second_run_built_before_the_first_ended_never_replaces_its_log(
    tmp_path: Path,
) -> None:
    log = tmp_path / "run.evlog"
    first = open_run(world_size=1, log=log, run_id="first")
    second = open_run(world_size=1, log=log, run_id="second")  # the name was free then
    async with first as run:
        await run.workers(_worker)
    kept = log.read_bytes()
    with pytest.raises(FileExistsError, match="never overwrites"):  # checked on entering
        async with second:
            pass
    assert log.read_bytes() == kept
    finished = [e for e in read_log(log).events if isinstance(e, RunFinished)]
    assert [e.run_id for e in finished] == ["first"]


async def test_two_runs_entered_at_once_do_not_interleave(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    first = open_run(world_size=1, log=log, run_id="first")
    second = open_run(world_size=1, log=log, run_id="second")
    async with first as run:
        with pytest.raises(FileExistsError):
            async with second:
                pass
        await run.workers(_worker)
    started = [e.run_id for e in read_log(log).events if isinstance(e, RunStarted)]
    assert started == ["first"]


def test_a_log_being_written_is_refused_to_a_second_recorder(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    with LogRecorder(log, run_id="r") as recorder:
        recorder.write(RunStarted(run_id="r", name="r", world_size=1, seq=0, time=1.0))
        for append in (True, False):
            with pytest.raises(LogInUse, match="another recorder is writing"):
                LogRecorder(log, run_id="r", append=append)
        recorder.write(RunFinished(run_id="r", status="finished", seq=1, time=2.0))
    assert [e.seq for e in read_log(log).events] == [0, 1]
    with LogRecorder(log, run_id="r", append=True) as again:  # free once closed
        assert again.appended is not None and again.appended.events == 2


class Counter(UserCallback):
    def __init__(self) -> None:
        self.rounds = 0

    def after_report(self, run_context: object, metrics: object, checkpoint: object) -> None:
        self.rounds += 1


async def test_two_resumed_runs_racing_for_one_log_leave_it_one_history(
    tmp_path: Path,
) -> None:
    """Both resume the same checkpoint; one records, the other is refused on entering."""
    out = tmp_path / "run"
    log = out / "run.evlog"

    async def first_part(reporter: Reporter) -> None:
        for step in range(4):
            checkpoint = None
            if step == 1:
                checkpoint = out / "checkpoint_1"
                checkpoint.mkdir(parents=True, exist_ok=True)
            await reporter.report({"step": step}, checkpoint=checkpoint)

    async with open_run(world_size=1, callbacks=[Counter()], state_dir=out, log=log) as run:
        await run.workers(first_part)
    one = open_run(world_size=1, callbacks=[Counter()], state_dir=out, log=log, resume_from=out)
    two = open_run(world_size=1, callbacks=[Counter()], state_dir=out, log=log, resume_from=out)
    async with one as resumed:
        with pytest.raises(LogInUse):
            async with two:
                pass
        await resumed.reporter(0).report({"step": 2})
        await anyio.lowlevel.checkpoint()
    events = read_log(log).events
    assert sum(isinstance(e, RunStarted) for e in events) == 2
    assert [e.seq for e in events] == sorted(e.seq for e in events)
