"""Each figure of a run has one owner that the others ask: the gathering counts rounds,
reports, rejections and restarts; the failure gathering counts failures; the run and
its reporters ask them, live, replayed and resumed alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from eventbus import RunResult, VirtualClock
from eventbus.state._files import STATE_FILENAME
from eventbus.testing import replay_log
from handlers import Reporter, UserCallback, open_run

pytestmark = pytest.mark.anyio


class Result(UserCallback):
    def __init__(self) -> None:
        self.result: RunResult | None = None

    def after_run(self, run_context: Any, result: RunResult) -> None:
        self.result = result


def failing_once(out: Path) -> Any:
    """Rank 1 fails at its first attempt; after the restart, a checkpoint at step 1."""

    async def worker(reporter: Reporter) -> None:
        for step in range(3):
            if reporter.rank == 1 and reporter.attempt == 0 and step == 1:
                raise RuntimeError("lost its device")
            checkpoint = None
            if reporter.attempt == 1 and step == 1:
                checkpoint = out / "ck"
                checkpoint.mkdir(parents=True, exist_ok=True)
            await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=checkpoint)
            await reporter.sync()

    return worker


async def test_restarts_are_counted_once_live_replayed_and_resumed(tmp_path: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "run.evlog"
    live = Result()
    async with open_run(
        world_size=2, callbacks=[live], state_dir=out, log=log, clock=VirtualClock()
    ) as run:
        await run.workers(failing_once(out), max_restarts=1)
    assert live.result is not None and (live.result.restarts, live.result.failures) == (1, 1)
    assert run.restarts == 1 and run.result is not None
    # after_run's result, its callbacks' costs brought up to the bus's close.
    assert run.result == msgspec.structs.replace(live.result, callbacks=run.result.callbacks)
    # A replay counts the restart from the log as the live run did (it said 0 before).
    replayed = Result()
    await replay_log(log, replayed)
    assert replayed.result is not None and replayed.result.restarts == 1
    # The checkpoint's position holds it, and the resumed run continues from it.
    saved = json.loads((out / "ck" / STATE_FILENAME).read_text())
    assert (saved["run"]["restarts"], saved["run"]["failures"]) == (1, 1)
    resumed = Result()
    async with open_run(
        world_size=2, callbacks=[resumed], state_dir=out, log=log, resume_from=out / "ck"
    ) as again:
        assert again.restarts == 1
    assert resumed.result is not None and resumed.result.restarts == 1


async def test_wait_gathered_returns_once_the_rank_s_round_is_complete() -> None:
    async with open_run(world_size=2, clock=VirtualClock()) as run:
        await run.wait_gathered(0)  # nothing reported: nothing to wait for
        await run.reporter(0).report({"loss": 1.0})
        waiting = anyio.Event()

        async def sync() -> None:
            await run.wait_gathered(0)
            waiting.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(sync)
            await run.bus.wait_idle()
            assert not waiting.is_set()  # rank 1's report is missing
            await run.reporter(1).report({"loss": 1.0})
        assert waiting.is_set()
        with pytest.raises(RuntimeError, match="still running"):
            run.result  # noqa: B018  # the property raises
    assert run.result is not None and run.result.rounds == 1
