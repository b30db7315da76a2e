"""One order of hooks, through ``open_run`` on asyncio and trio (DESIGN.md section 16):

- ``before_run`` returns before any worker starts, a resumed run's included,
  and no event reaches a callback before it;
- a failure that restarts the worker group reaches ``after_exception`` before
  the restarted group's first round; one that ends the run, before
  ``after_run``; one that does neither, at the end of its health-check period.

The Ray engine's half is in ``tests/adapter_tests/test_ray_engine.py`` (its restarted job).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from eventbus import (
    BudgetReport,
    Event,
    HandlerFailed,
    RunResult,
    RunResumed,
    StateRestored,
    TrainRunContext,
)
from eventbus.log import read_log
from handlers import Reporter, UserCallback, WorkerGroupError, open_run

pytestmark = pytest.mark.anyio


class Hooks(UserCallback):
    """Writes every hook it gets, in order, beside the workers' own lines in ``lines``."""

    event_types = (RunResumed, StateRestored, BudgetReport)

    def __init__(self, lines: list[Any], *, slow_start: float = 0.0) -> None:
        self.lines = lines
        self.slow_start = slow_start

    async def before_run(self, run_context: TrainRunContext) -> None:
        await anyio.sleep(self.slow_start)  # a callback that takes its time to set up
        self.lines.append("before_run")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        self.lines.append(("round", metrics[0]["attempt"], metrics[0]["step"]))

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.lines.append(("after_exception", sorted(worker_exceptions)))

    def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        self.lines.append(type(event).__name__)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.lines.append(("after_run", result.status))


def failing_once(lines: list[Any], *, at_step: int = 1, attempts: int = 1) -> Any:
    """Workers of 3 steps; rank 1 fails at ``at_step`` in its first ``attempts`` attempts."""

    async def train(reporter: Reporter) -> None:
        lines.append(("worker", reporter.rank, reporter.attempt))
        for step in range(3):
            await reporter.report({"step": step, "attempt": reporter.attempt})
            if reporter.rank == 1 and step == at_step and reporter.attempt < attempts:
                raise RuntimeError(f"rank 1 fell over at step {step}")

    return train


async def test_before_run_returns_before_any_worker_starts() -> None:
    lines: list[Any] = []
    async with open_run(world_size=2, callbacks=[Hooks(lines, slow_start=0.05)]) as run:
        await run.workers(failing_once(lines, attempts=0))
    assert lines[0] == "before_run"
    assert sorted(lines[1:3]) == [("worker", 0, 0), ("worker", 1, 0)]
    assert lines[-1] == ("after_run", "finished")


async def test_a_failure_that_restarts_the_group_is_heard_before_the_restarted_groups_rounds() -> (
    None
):
    lines: list[Any] = []
    # An hour-long period: only the restart can deliver the failure early.
    async with open_run(world_size=2, callbacks=[Hooks(lines)], period=3600.0) as run:
        await run.workers(failing_once(lines), max_restarts=1)
    heard = lines.index(("after_exception", [1]))
    restarted = [i for i, line in enumerate(lines) if line in (("worker", 0, 1), ("worker", 1, 1))]
    first_new_round = lines.index(("round", 1, 0))
    assert lines.count(("after_exception", [1])) == 1
    assert heard < min(restarted) < first_new_round
    assert lines[-1] == ("after_run", "finished")


async def test_a_failure_that_ends_the_run_is_heard_before_after_run() -> None:
    lines: list[Any] = []
    with pytest.raises(WorkerGroupError):
        async with open_run(world_size=2, callbacks=[Hooks(lines)], period=3600.0) as run:
            await run.workers(failing_once(lines), max_restarts=0)
    # after_run is last, also for a callback that takes the bus's budget reports: the
    # verdict on the period the run ended in comes after it, and is not given to it.
    assert lines[-2:] == [("after_exception", [1]), ("after_run", "failed")]


async def test_a_failure_that_neither_restarts_nor_ends_waits_for_its_period() -> None:
    lines: list[Any] = []
    period = 0.05

    async def fails(reporter: Reporter) -> None:
        lines.append("rank 1 failing")
        raise RuntimeError("rank 1 fell over")

    async def reports(reporter: Reporter) -> None:
        for step in range(20):
            await reporter.report({"step": step, "attempt": reporter.attempt})
            await anyio.sleep(period / 5)

    async with open_run(
        world_size=2, required_ranks=[0], callbacks=[Hooks(lines)], period=period
    ) as run:
        run.start_worker(1, fails)
        await run.workers(reports, ranks=[0])
    failed, heard = lines.index("rank 1 failing"), lines.index(("after_exception", [1]))
    # Delivered at its period's end, while rank 0 went on: rounds came in between.
    assert any(isinstance(line, tuple) and line[0] == "round" for line in lines[failed:heard])
    assert heard < lines.index(("after_run", "finished"))


async def test_a_resumed_run_says_nothing_to_a_callback_before_its_before_run(
    tmp_path: Path,
) -> None:
    async def train(reporter: Reporter) -> None:
        start = 3 if reporter.latest_checkpoint is not None else 0
        for step in range(start, start + 3):
            checkpoint = None
            if reporter.rank == 0 and step == 2:
                checkpoint = tmp_path / "checkpoint_2"
                checkpoint.mkdir()
            await reporter.report(
                {"step": step, "attempt": reporter.attempt}, checkpoint=checkpoint
            )

    log = tmp_path / "run.evlog"
    first: list[Any] = []
    async with open_run(world_size=2, callbacks=[Hooks(first)], state_dir=tmp_path, log=log) as run:
        await run.workers(train)
    lines: list[Any] = []
    async with open_run(
        world_size=2,
        callbacks=[Hooks(lines, slow_start=0.05)],
        state_dir=tmp_path,
        log=log,
        resume_from=tmp_path,
    ) as resumed:
        await resumed.workers(train)
    assert resumed.run_id == run.run_id
    assert lines[0] == "before_run"
    assert lines.index("RunResumed") < lines.index("StateRestored") < lines.index(("round", 0, 3))
    assert not [e for e in read_log(log).events if isinstance(e, HandlerFailed)]
