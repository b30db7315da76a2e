"""Resuming through ``open_run`` as a user meets it (issue 13, items 2 to 5).

Each test writes a first run that stops (or is cut short) at a known point,
then resumes it, with relative paths from the test's own directory, as the
README tells users to.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from eventbus import (
    BudgetReport,
    Event,
    RoundGathered,
    RunResumed,
    RunStarted,
    StatefulCallback,
    TrainRunContext,
)
from eventbus.log import LogRecorder, read_log
from eventbus.log._history import rollbacks
from eventbus.log._recorder import RunIdMismatch
from eventbus.state import StateRestoreError
from eventbus.state._model import StateFormatError
from eventbus.testing import replay_log
from handlers import Reporter, ReportError, UserCallback, WorkerError, open_run

pytestmark = pytest.mark.anyio


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """Run from a fresh directory, as a user would: every path below is relative."""
    previous = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(previous)


class Trend(UserCallback, StatefulCallback):
    """A stateful callback that keeps every round's mean loss and checkpoint."""

    state_args = ("name",)
    state_attributes = ("means", "checkpoints")

    def __init__(self, name: str = "trend") -> None:
        self.name = name
        self.means: list[float] = []
        self.checkpoints: list[str] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.means.append(sum(m["loss"] for m in metrics) / len(metrics))
        if checkpoint is not None:
            self.checkpoints.append(checkpoint)


class Seen(UserCallback):
    def __init__(self) -> None:
        self.rounds: list[tuple[int, ...]] = []
        self.starts: list[TrainRunContext] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        self.starts.append(run_context)

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append(tuple(m["step"] for m in metrics))


def save(step: int, rank: int) -> str:
    """The checkpoint of ``rank`` at ``step`` (a worker's JSON); its location."""
    folder = Path("runs/a", f"checkpoint_{step:06d}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step}))
    return str(folder)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def read_bytes(path: str) -> bytes:
    return Path(path).read_bytes()


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data))


def training(steps: int, every: int, seen_from: dict[int, str | None]) -> Any:
    """A deterministic worker: the loss of a step is a function of rank and step, and it
    resumes from ``reporter.latest_checkpoint`` (a JSON file per rank)."""

    async def train(reporter: Reporter) -> None:
        step = 0
        seen_from[reporter.rank] = reporter.latest_checkpoint
        if reporter.latest_checkpoint is not None:
            step = read_json(Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json"))["step"]
        while step < steps and not reporter.should_stop:
            step += 1
            checkpoint = None
            if step % every == 0:
                checkpoint = save(step, reporter.rank)
            await reporter.report({"loss": 1 / step + reporter.rank, "step": step}, checkpoint)
            await reporter.sync()

    return train


async def run_once(
    callbacks: list[Any],
    *,
    steps: int = 12,
    every: int = 4,
    resume_from: str | None = None,
    log: str | None = "runs/a/run.evlog",
    **options: Any,
) -> tuple[Any, dict[int, str | None]]:
    seen_from: dict[int, str | None] = {}
    async with open_run(
        world_size=2,
        callbacks=callbacks,
        state_dir="runs/a",
        log=log,
        resume_from=resume_from,
        **options,
    ) as run:
        await run.workers(training(steps, every, seen_from))
    return run, seen_from


async def test_a_relative_resume_from_is_taken_from_the_cwd_and_workers_are_told(
    here: Path,
) -> None:
    first, _ = await run_once([Trend()], steps=10)  # its last checkpoint: 8
    assert (here / "runs/a/checkpoint_000008/callback_state.json").is_file()
    assert not (here / "runs/a/runs").exists()
    trend = Trend()
    second, seen_from = await run_once(
        [trend], resume_from="runs/a/checkpoint_000008", log="runs/a/second.evlog"
    )
    assert second.restored is not None and second.restored.warnings == ()
    assert seen_from == {0: "runs/a/checkpoint_000008", 1: "runs/a/checkpoint_000008"}
    # The user's own object holds the restored state, and went on from it.
    assert second.callbacks[0] is trend
    assert trend.means[:8] == pytest.approx([(1 / s + 1 / s + 1) / 2 for s in range(1, 9)])
    assert len(trend.means) == 12
    assert second.run_id == first.run_id  # one run, continued
    assert second.result is not None and second.result.rounds == 12


async def test_resuming_from_a_checkpoint_without_states_is_an_error_unless_allowed(
    here: Path,
) -> None:
    for rank in (0, 1):
        save(4, rank)
    with pytest.raises(StateRestoreError, match=r"callback_state\.json"):
        await run_once([Trend()], resume_from="runs/a/checkpoint_000004", log=None)
    trend = Trend()
    run, seen_from = await run_once(
        [trend], resume_from="runs/a/checkpoint_000004", log=None, allow_fresh_state=True
    )
    assert seen_from[0] == "runs/a/checkpoint_000004"  # the weights still resume
    assert len(trend.means) == 8  # steps 5..12; the callback started fresh
    assert run.restored is not None and any("no callback state" in w for w in run.restored.warnings)


async def test_a_log_already_there_is_never_overwritten(here: Path) -> None:
    await run_once([Trend()], steps=6)
    log = here / "runs/a/run.evlog"
    before = log.read_bytes()
    with pytest.raises(FileExistsError, match="never overwrites"):
        await run_once([Trend()])  # a new run, the same log path
    assert log.read_bytes() == before
    # Resuming the run it records appends to it: one history.
    await run_once([Trend()], resume_from="runs/a/checkpoint_000004")
    after = log.read_bytes()
    assert after.startswith(before)
    events = read_log(log).events
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # numbered on, not again
    (resumed,) = [e for e in events if isinstance(e, RunResumed)]
    starts = [e for e in events if isinstance(e, RunStarted)]
    assert len(starts) == 2 and starts[0].run_id == starts[1].run_id == resumed.run_id
    assert starts[1].wall_time == starts[0].wall_time  # the run's start, not the resume's
    assert resumed.position.rounds == 4 and resumed.position.next_index == (4, 4)
    ticks = [e.period for e in events if isinstance(e, BudgetReport)]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)


async def test_rounds_and_indices_continue_and_the_history_replays_as_one_run(
    here: Path,
) -> None:
    # The first run goes past its last checkpoint (rounds 9 and 10), then "dies":
    # the resumed run redoes them from checkpoint 8, and they are rolled back.
    await run_once([Trend()], steps=10, every=4)
    seen = Seen()
    await run_once([Trend(), seen], resume_from="runs/a/checkpoint_000008")
    assert seen.rounds == [(s, s) for s in range(9, 13)]
    gathered = [e for e in read_log("runs/a/run.evlog").events if isinstance(e, RoundGathered)]
    assert [e.round for e in gathered] == [*range(10), *range(8, 12)]
    plan = rollbacks("runs/a/run.evlog")
    assert plan is not None
    replayed = Seen()
    result = await replay_log("runs/a/run.evlog", replayed)
    assert replayed.rounds == [(s, s) for s in range(1, 13)]  # each round once
    assert len(replayed.starts) == 1  # before_run once, for one run
    assert result.summary.rolled_back > 0


async def test_a_rank_ahead_at_the_checkpoint_redoes_its_reports(here: Path) -> None:
    """The position is taken when the checkpoint's round is gathered: rank 0, three
    reports ahead then, gets back the indices of the reports the crash lost."""

    async def uneven(reporter: Reporter) -> None:
        for step in range(1, 7):
            checkpoint = None
            if step == 2:
                checkpoint = save(2, reporter.rank)
            if reporter.rank == 1:
                await anyio.sleep(0.01)
            await reporter.report({"loss": 1.0, "step": step}, checkpoint)

    async with open_run(world_size=2, callbacks=[Trend()], state_dir="runs/a") as run:
        await run.workers(uneven)
    saved = read_json(Path("runs/a/checkpoint_000002/callback_state.json"))
    assert saved["run"]["next_index"] == [2, 2]
    assert saved["run"]["rounds"] == 2
    seen = Seen()
    async with open_run(
        world_size=2,
        callbacks=[Trend(), seen],
        state_dir="runs/a",
        resume_from="runs/a/checkpoint_000002",
    ) as resumed:
        assert [resumed.reporter(r).reports for r in (0, 1)] == [2, 2]
        for rank in (0, 1):
            await resumed.reporter(rank).report({"loss": 1.0, "step": 3})
    assert seen.rounds == [(3, 3)]


async def test_after_exception_gets_the_workers_own_exception_in_process(here: Path) -> None:
    class Oops(Exception):
        pass

    got: list[dict[int, Exception]] = []

    class Catch(UserCallback):
        def after_exception(
            self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
        ) -> None:
            got.append(worker_exceptions)

    raised = Oops("lost the device")

    async def fail(reporter: Reporter) -> None:
        if reporter.rank == 1:
            raise raised

    with pytest.raises(Exception, match="failed"):
        async with open_run(world_size=2, callbacks=[Catch()], log="failure.evlog") as run:
            await run.workers(fail)
    assert got == [{1: raised}] and got[0][1] is raised
    # The log and a replay carry its text form.
    got.clear()
    await replay_log("failure.evlog", Catch())
    (replayed,) = got
    assert isinstance(replayed[1], WorkerError)
    assert replayed[1].error_type.endswith("Oops") and replayed[1].message == "lost the device"


def events_of(log: str, kind: type[Event]) -> list[Any]:
    return [e for e in read_log(log).events if isinstance(e, kind)]


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("world_size", 0, "world_size is 0"),
        ("next_index", [1, 2, 3], "next_index has 3 entries"),
        ("next_index", [-5, 2], "below -1"),
        ("required_ranks", [7], "required_ranks"),
        ("rounds", -1, "rounds is negative"),
        ("rounds", "many", r"\$\.run\.rounds"),
    ],
)
async def test_a_tampered_position_is_a_clear_error_naming_the_field(
    here: Path, field: str, value: Any, named: str
) -> None:
    await run_once([Trend()], steps=4, log=None)
    path = Path("runs/a/checkpoint_000004/callback_state.json")
    saved = read_json(path)
    saved["run"][field] = value
    write_json(path, saved)
    trend = Trend()
    with pytest.raises(StateFormatError, match=named):
        await run_once([trend], resume_from="runs/a/checkpoint_000004", log=None)
    assert trend.means == []  # refused before the callback given was touched


async def test_resuming_with_another_world_size_restores_callbacks_and_starts_rounds_over(
    here: Path,
) -> None:
    await run_once([Trend()], steps=4, log=None)
    trend, seen = Trend(), Seen()
    with capture_logs() as logs:
        run = await resume_with_three(trend, seen)
    assert len(trend.means) == 5  # 4 restored, 1 new
    assert seen.rounds == [(5, 5, 5)] and run.result is not None and run.result.rounds == 1
    assert any("another world size" in entry["event"] for entry in logs)


async def resume_with_three(*callbacks: Any) -> Any:
    async with open_run(
        world_size=3,
        callbacks=list(callbacks),
        state_dir="runs/a",
        resume_from="runs/a/checkpoint_000004",
    ) as run:
        for rank in range(3):
            await run.reporter(rank).report({"loss": 1.0, "step": 5})
    return run


async def test_resuming_into_another_runs_log_is_refused_and_leaves_it(here: Path) -> None:
    await run_once([Trend()], steps=4, log=None)
    async with open_run(world_size=1, log="other.evlog") as other:
        await other.reporter(0).report({"loss": 1.0})
    before = read_bytes("other.evlog")
    with pytest.raises(RunIdMismatch):
        await run_once([Trend()], resume_from="runs/a/checkpoint_000004", log="other.evlog")
    assert read_bytes("other.evlog") == before


async def test_sync_returns_for_a_report_that_was_refused(here: Path) -> None:
    async with open_run(world_size=2, callbacks=[Seen()]) as run:
        reporter = run.reporter(0)
        with pytest.raises(ReportError):
            await reporter.report({"loss": object()})  # refused: nothing waits for a round
        with anyio.fail_after(5):
            await reporter.sync()
        await reporter.report({"loss": 1.0, "step": 1})
        with anyio.move_on_after(0.2) as waiting:  # rank 1 has not reported: it waits
            await reporter.sync()
        assert waiting.cancelled_caught
        await run.reporter(1).report({"loss": 1.0, "step": 1})
        with anyio.fail_after(5):
            await reporter.sync()


async def test_sync_never_waits_for_a_rank_whose_worker_ended(here: Path) -> None:
    """Rank 1 stops after one report; rank 0's later rounds cannot complete, and its
    ``sync`` says so by returning instead of waiting forever."""
    seen = Seen()

    async def worker(reporter: Reporter) -> None:
        steps = 1 if reporter.rank == 1 else 4
        for step in range(steps):
            await reporter.report({"loss": 1.0, "step": step})
            await reporter.sync()

    with anyio.fail_after(10):
        async with open_run(world_size=2, callbacks=[seen]) as run:
            await run.workers(worker)
    assert run.result is not None and run.result.rounds == 1 and run.result.status == "finished"


async def test_the_period_a_crash_cut_is_reported_partial_when_the_run_resumes(
    here: Path,
) -> None:
    await run_once([Trend()], steps=10, log="runs/a/full.evlog", period=0.01)
    # The log as a crash leaves it: cut after the last checkpoint's snapshot, its run
    # never finished, its last period never reported.
    events = read_log("runs/a/full.evlog").events
    last_snapshot = max(i for i, e in enumerate(events) if type(e).__name__ == "StateSnapshotted")
    kept = events[: last_snapshot + 1]
    started = next(e for e in kept if isinstance(e, RunStarted))
    with LogRecorder("runs/a/run.evlog", run_id=started.run_id) as recorder:
        recorder.write_many(kept)
    ticks = [e for e in kept if isinstance(e, BudgetReport)]
    last = max(e.period for e in ticks) if ticks else -1

    await run_once([Trend()], resume_from="runs/a/checkpoint_000008", period=0.01)
    resumed = read_log("runs/a/run.evlog").events[len(kept) :]
    reports = [e for e in resumed if isinstance(e, BudgetReport)]
    cut = reports[0]
    assert cut.period == last + 1 and cut.partial and cut.over_budget == ()
    assert cut.handlers == () and cut.start <= cut.end
    assert [r.period for r in reports[1:]] == list(range(last + 2, last + 1 + len(reports)))


async def test_required_ranks_resume_with_the_rounds(here: Path) -> None:
    """Rounds of rank 0 alone (rank 1 not required) go on as such after the resume."""

    async def rank_zero(reporter: Reporter) -> None:
        for step in range(1, 5):
            checkpoint = save(step, 0) if step == 2 else None
            await reporter.report({"loss": 1.0, "step": step}, checkpoint)

    async with open_run(
        world_size=2, callbacks=[Trend()], state_dir="runs/a", required_ranks=[0]
    ) as run:
        await run.workers(rank_zero, ranks=[0])
    seen = Seen()
    async with open_run(
        world_size=2,
        callbacks=[Trend(), seen],
        state_dir="runs/a",
        resume_from="runs/a/checkpoint_000002",
    ) as resumed:
        assert resumed.reporter(0).reports == 2 and resumed.reporter(1).reports == 0
        await resumed.reporter(0).report({"loss": 1.0, "step": 3})
    assert seen.rounds == [(3,)]  # rank 0 alone makes a round, as before the crash
    assert resumed.result is not None and resumed.result.rounds == 3
