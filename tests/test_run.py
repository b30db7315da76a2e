"""The run composition API: lifecycle exactly once on every way out, workers, restarts."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

import anyio
import msgspec
import pytest

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    Report,
    RunFinished,
    RunResult,
    RunStarted,
    TrainRunContext,
    WorkerFailure,
)
from eventbus.log import read_log
from eventbus.state import StateRestoreError
from eventbus.state._model import state_key_of
from handlers import EarlyStopping, Reporter, UserCallback, WorkerGroupError, open_run
from handlers._reporter import CALLBACKS_TURN_S
from handlers._run import Run

pytestmark = pytest.mark.anyio


class Lifecycle(UserCallback):
    event_types: ClassVar[tuple[type[Event], ...]] = (RunStarted, RunFinished, WorkerFailure)

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.events: list[Event] = []
        self.rounds: list[tuple[list[Any], str | None]] = []
        self.result: RunResult | None = None
        self.exceptions: list[dict[int, Exception]] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        self.calls.append("before_run")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.calls.append("after_report")
        self.rounds.append(([m["step"] for m in metrics], checkpoint))

    async def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.calls.append("after_exception")
        self.exceptions.append(worker_exceptions)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.calls.append("after_run")
        self.result = result

    def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        self.events.append(event)

    def check_once(self, status: str) -> None:
        assert self.calls[0] == "before_run" and self.calls.count("before_run") == 1
        assert self.calls[-1] == "after_run" and self.calls.count("after_run") == 1
        kinds = [type(e) for e in self.events]
        assert kinds.count(RunStarted) == 1 and kinds.count(RunFinished) == 1
        assert self.result is not None and self.result.status == status


def steps(n: int) -> Any:
    async def worker(reporter: Reporter) -> None:
        for step in range(n):
            await reporter.report({"step": step}, checkpoint="ck" if step == n - 1 else None)

    return worker


async def test_success_runs_lifecycle_once_and_gathers_every_round() -> None:
    cb = Lifecycle()
    async with open_run(world_size=3, callbacks=[cb], name="t") as run:
        await run.workers(steps(4))
    cb.check_once("finished")
    assert cb.rounds == [([s] * 3, "ck" if s == 3 else None) for s in range(4)]
    assert cb.result is not None and (cb.result.rounds, cb.result.reports) == (4, 12)
    # after_run's result, its callbacks' costs brought up to the bus's close.
    assert run.result is not None
    assert run.result == msgspec.structs.replace(cb.result, callbacks=run.result.callbacks)
    assert run.latest_checkpoint == "ck"


async def test_started_workers_are_awaited_and_their_failures_become_events() -> None:
    cb = Lifecycle()

    async def broken(reporter: Reporter) -> None:
        raise ValueError("bad weights")

    async with open_run(world_size=2, callbacks=[cb]) as run:
        run.start_worker(0, steps(2))
        run.start_worker(1, broken)
    cb.check_once("finished")
    failures = [e for e in cb.events if isinstance(e, WorkerFailure)]
    assert [(f.rank, f.error_type, f.message) for f in failures] == [
        (1, "ValueError", "bad weights")
    ]
    # In the run's own process, the worker's own exception (as Ray hands it over).
    assert [{r: repr(e) for r, e in x.items()} for x in cb.exceptions] == [
        {1: "ValueError('bad weights')"}
    ]


async def test_body_failure_still_runs_after_run_once_and_propagates() -> None:
    cb = Lifecycle()
    with pytest.raises(KeyError):
        async with open_run(world_size=1, callbacks=[cb]) as run:
            await run.reporter(0).report({"step": 0})
            raise KeyError("oops")
    cb.check_once("failed")
    assert cb.result is not None and "KeyError" in (cb.result.error or "")


async def test_worker_group_failure_without_restarts_fails_the_run() -> None:
    cb = Lifecycle()

    async def flaky(reporter: Reporter) -> None:
        await reporter.report({"step": 0})
        if reporter.rank == 1:
            raise RuntimeError("lost device")
        await anyio.sleep(10)  # the group is stopped when rank 1 fails

    with pytest.raises(WorkerGroupError) as info:
        async with open_run(world_size=2, callbacks=[cb]) as run:
            await run.workers(flaky)
    assert list(info.value.failures) == [1]
    cb.check_once("failed")
    assert cb.calls.count("after_exception") == 1


async def test_restart_resumes_from_the_latest_complete_checkpoint() -> None:
    cb = Lifecycle()
    resumed: list[str | None] = []

    async def worker(reporter: Reporter) -> None:
        resumed.append(reporter.latest_checkpoint)
        start = 2 if reporter.latest_checkpoint else 0
        for step in range(start, 4):
            await reporter.report({"step": step}, checkpoint=f"ck{step}" if step == 1 else None)
            if reporter.attempt == 0 and step == 1:
                await reporter.run.bus.wait_idle()
                if reporter.rank == 0:
                    raise RuntimeError("crash after the checkpoint")
                await anyio.sleep(10)

    announced: list[CheckpointSaved] = []
    async with open_run(world_size=2, callbacks=[cb]) as run:
        run.bus.subscribe(CheckpointSaved, announced.append)
        await run.workers(worker, max_restarts=1)
    cb.check_once("finished")
    assert resumed == [None, None, "ck1", "ck1"]
    assert [m for m, _ in cb.rounds] == [[0, 0], [1, 1], [2, 2], [3, 3]]
    assert [(c.checkpoint, c.index, c.ranks) for c in announced] == [("ck1", 1, (0, 1))]
    assert cb.result is not None and (cb.result.restarts, cb.result.failures) == (1, 1)


@pytest.mark.parametrize("where", ["body", "workers"])
async def test_cancellation_still_runs_after_run_once(where: str) -> None:
    cb = Lifecycle()
    with anyio.CancelScope() as scope:
        async with open_run(world_size=2, callbacks=[cb]) as run:

            async def worker(reporter: Reporter) -> None:
                await reporter.report({"step": 0})
                await anyio.sleep(10)

            if where == "workers":
                run.start_worker(0, worker)
                run.start_worker(1, worker)
                await run.bus.wait_idle()
                await anyio.sleep(0.01)
                scope.cancel()
            else:
                scope.cancel()
                await anyio.sleep(10)
    assert scope.cancelled_caught
    cb.check_once("cancelled")


async def test_should_stop_follows_callbacks_and_requests() -> None:
    class Stopper(UserCallback):
        should_stop = False

        def after_report(self, *args: Any) -> None:
            self.should_stop = True

    stopper = Stopper()
    async with open_run(world_size=1, callbacks=[stopper]) as run:
        reporter = run.reporter(0)
        assert not reporter.should_stop
        await reporter.report({"step": 0})
        await run.bus.wait_idle()
        assert reporter.should_stop
    async with open_run(world_size=1) as run:
        run.request_stop()
        assert run.reporter(0).should_stop


async def test_workers_that_only_compute_and_report_share_the_loop_and_hear_callbacks() -> None:
    """Workers that await nothing but ``report`` (their steps compute, as a torch step
    does) give the loop a turn every ``CALLBACKS_TURN_S``, timed for the run: a round
    reaches the callbacks within three such turns, a stop is heard then, and neither
    rank runs ahead of the other by more than a turn's steps. Before, the callbacks ran
    only once the workers ended; with a time per reporter, one rank ran 2.5 times as
    many steps as the other."""
    step_s = 0.0005
    most_behind = 3 * round(CALLBACKS_TURN_S / step_s) + 2  # a step takes at least step_s
    steps_seen: list[int] = []
    done = [0, 0]

    class Watcher(UserCallback):
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
            steps_seen.append(metrics[0]["step"])

    async def worker(reporter: Reporter) -> None:
        for step in range(1000):
            computing_until = time.perf_counter() + step_s  # a step: it waits on nothing
            while time.perf_counter() < computing_until:
                pass
            await reporter.report({"loss": float(abs(step - 300)), "step": step})
            done[reporter.rank] = step + 1
            assert abs(done[0] - done[1]) <= most_behind, f"steps done per rank: {done}"
            seen = steps_seen[-1] if steps_seen else -1
            assert seen >= min(done) - most_behind, f"{done} steps done, callbacks saw {seen}"
            if reporter.should_stop:
                stopped.append(step)
                return

    stopped: list[int] = []
    stopping = EarlyStopping("loss", patience=2)
    async with open_run(world_size=2, callbacks=[Watcher(), stopping]) as run:
        await run.workers(worker)
    # The loss rose from step 301 on: patience 2 stops at step 302.
    assert len(stopped) == 2 and max(stopped) <= 302 + 2 * most_behind, stopped
    assert run.result.rounds == min(stopped) + 1


async def test_workers_that_await_between_steps_stay_in_step() -> None:
    """Workers that compute, report and then await (giving the loop a turn themselves)
    take turns: no report adds a turn of its own, which would leave the rank that took
    it a step behind each time (four such workers ran 300, 299, 231 and 150 steps)."""
    step_s = 0.004  # four ranks' steps: 16 ms between a rank's reports, past a turn's 10
    done = [0] * 4
    spread: list[int] = []

    async def worker(reporter: Reporter) -> None:
        for step in range(60):
            computing_until = time.perf_counter() + step_s
            while time.perf_counter() < computing_until:
                pass
            await reporter.report({"step": step})
            done[reporter.rank] = step + 1
            spread.append(max(done) - min(done))
            await anyio.lowlevel.checkpoint()

    async with open_run(world_size=4) as run:
        await run.workers(worker)
    assert max(spread) <= 2, f"the ranks drifted apart by up to {max(spread)} steps"
    assert run.result.rounds == 60


async def test_open_run_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="world_size"):
        open_run(world_size=0)
    with pytest.raises(ValueError, match="state_dir"):
        open_run(world_size=1, resume_from=tmp_path / "ck")


def snapshot_folders(root: Path) -> list[str]:
    return sorted(p.parent.name for p in root.glob("ck-*/callback_state.json"))


def checkpointing(n: int, root: Path) -> Any:
    """Each rank reports ``n`` steps, naming a checkpoint under ``root`` every 2 steps."""

    async def worker(reporter: Reporter) -> None:
        for step in range(n):
            checkpoint = str(root / f"ck-{step}") if step % 2 == 1 else None
            await reporter.report({"step": step, "loss": 1.0 / (step + 1)}, checkpoint=checkpoint)
            await anyio.lowlevel.checkpoint()

    return worker


async def test_log_records_the_whole_run_from_start_to_the_last_budget_report(
    tmp_path: Path,
) -> None:
    log = tmp_path / "run.evlog"
    async with open_run(world_size=2, log=log, name="logged") as run:
        await run.workers(steps(3))
    events = read_log(log).events
    assert isinstance(events[0], RunStarted)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert sum(isinstance(e, Report) for e in events) == 6
    assert any(isinstance(e, RunFinished) for e in events)
    assert isinstance(events[-1], BudgetReport) and events[-1].partial
    assert run.recorder is not None and run.recorder.closed


async def test_state_is_snapshotted_at_each_checkpoint_and_restored_on_resume(
    tmp_path: Path,
) -> None:
    early = EarlyStopping("loss", patience=50)
    async with open_run(world_size=2, callbacks=[early], state_dir=tmp_path) as run:
        await run.workers(checkpointing(6, tmp_path))
    assert early.best == pytest.approx(1 / 6)
    assert snapshot_folders(tmp_path) == ["ck-1", "ck-3", "ck-5"]

    fresh = EarlyStopping("loss", patience=50)
    async with open_run(
        world_size=2,
        callbacks=[fresh, Lifecycle()],
        state_dir=tmp_path,
        resume_from=tmp_path / "ck-3",
        strict_state=False,
    ) as resumed:
        restored = resumed.callbacks[0]
        assert restored is fresh  # the callback given holds the restored state
        # As it was at ck-3 (after the round of step 3), before any new round.
        assert fresh.best == pytest.approx(1 / 4) and fresh.wait == 0
        assert isinstance(resumed.callbacks[1], Lifecycle)  # order kept
    assert resumed.restored is not None
    assert resumed.restored.restored == (state_key_of(fresh),)
    assert resumed.restored.unsaved == () and resumed.restored.missing == ()


async def test_strict_resume_refuses_a_callback_set_that_does_not_match(tmp_path: Path) -> None:
    async with open_run(world_size=1, callbacks=[EarlyStopping("loss")], state_dir=tmp_path) as run:
        await run.workers(checkpointing(2, tmp_path))
    run = open_run(  # making a run reads nothing: entering it does
        world_size=1,
        callbacks=[],
        state_dir=tmp_path,
        resume_from=tmp_path / "ck-1",
        strict_state=True,
    )
    with pytest.raises(StateRestoreError, match="EarlyStopping"):
        async with run:
            pytest.fail("the body must not run")


async def test_an_interrupt_inside_the_runs_end_still_stops_its_bus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second Ctrl-C may land inside the run's end (trio raises ``KeyboardInterrupt``
    wherever Python code runs): the run stops its bus, which is shielded and stops only
    when told, and the interrupt is raised. Before, the run waited for its bus forever
    (two SIGINTs 1 ms apart to a trio run of computing workers hung one time in three)."""

    async def interrupted(self: Run, exc: BaseException | None) -> tuple[Any, bool]:
        raise KeyboardInterrupt

    async def worker(reporter: Reporter) -> None:
        await reporter.report({"loss": 1.0})

    monkeypatch.setattr(Run, "_end", interrupted)
    with anyio.fail_after(60), pytest.raises(KeyboardInterrupt):
        async with open_run(world_size=1) as run:
            await run.workers(worker)
