"""What a new user hits first (issue 14): checkpoint rounds as Ray defines them,
training callbacks in replays, why a run stopped, integer metrics, pruning
checkpoints, one import per callback."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio.lowlevel
import pytest
import structlog

from eventbus import (
    CheckpointMismatch,
    EventBus,
    Report,
    RoundGathered,
    RunResult,
    RunStarted,
    StatefulCallback,
    TrainRunContext,
    VirtualClock,
)
from eventbus.log import read_log
from eventbus.testing import BusRecording, replay_log, report_rounds, write_log
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, Reporter, UserCallback, open_run
from handlers._attach import attach_user_callbacks

pytestmark = pytest.mark.anyio
CTX = TrainRunContext(run_id="r", name="t", world_size=2)


def stored(root: Path) -> TrainRunContext:
    """A run whose storage is ``root``: checkpoints inside it may be pruned."""
    return TrainRunContext(run_id="r", name="t", world_size=2, storage=str(root))


class LossTrend(UserCallback, StatefulCallback):
    """A training callback as users write it: one import, hooks and state."""

    state_attributes = ("losses",)

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.checkpoints: list[str | None] = []
        self.results: list[RunResult] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.losses.append(sum(m["loss"] for m in metrics) / len(metrics))
        self.checkpoints.append(checkpoint)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


# --- 1. a checkpoint named by rank 0 only ---------------------------------------------------


async def test_a_checkpoint_named_by_one_rank_is_the_rounds_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 alone names the checkpoint (Ray's and DDP's pattern): the round has it,
    the best checkpoints track it and the callbacks' state is snapshotted into it."""
    monkeypatch.chdir(tmp_path)
    trend, best = LossTrend(), BestCheckpoints("loss", k=2)

    for step in (1, 3):
        (tmp_path / f"runs/ck_{step}").mkdir(parents=True)

    async def worker(reporter: Reporter) -> None:
        for step in range(4):
            checkpoint = f"runs/ck_{step}" if reporter.rank == 0 and step % 2 == 1 else None
            await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=checkpoint)

    with structlog.testing.capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[trend, best], state_dir="runs") as run:
            await run.workers(worker)
    assert trend.checkpoints == [None, "runs/ck_1", None, "runs/ck_3"]
    assert best.checkpoints == ["runs/ck_3", "runs/ck_1"]
    assert (tmp_path / "runs/ck_3/callback_state.json").is_file()
    assert run.latest_checkpoint == "runs/ck_3"
    assert trend.results[0].checkpoint_mismatches == 0
    assert not [log for log in logs if log["log_level"] == "warning"]


async def test_ranks_naming_different_checkpoints_are_a_loud_mismatch() -> None:
    trend = LossTrend()
    mismatches: list[CheckpointMismatch] = []
    with structlog.testing.capture_logs() as logs:
        async with EventBus(clock=VirtualClock(), period=1000) as bus:
            bus.subscribe(CheckpointMismatch, mismatches.append)
            attachment = attach_user_callbacks(bus, [trend], world_size=3)
            for rank, checkpoint in [(0, "a"), (1, None), (2, "b")]:
                await bus.publish(
                    Report(
                        run_id="r",
                        rank=rank,
                        world_size=3,
                        index=0,
                        metrics={"loss": 1.0},
                        checkpoint=checkpoint,
                    )
                )
    assert trend.checkpoints == [None]
    assert [m.checkpoints for m in mismatches] == [{0: "a", 1: None, 2: "b"}]
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["checkpoints"] == {0: "a", 2: "b"}
    assert attachment.result().checkpoint_mismatches == 1


# --- 2-4. replaying training callbacks ---------------------------------------------------------


async def test_replay_log_attaches_a_training_callback_as_a_live_run_does(tmp_path: Path) -> None:
    log = write_log(tmp_path / "run.evlog", report_rounds(5, world_size=2))
    trend = LossTrend()
    seen: list[Any] = []
    result = await replay_log(log, trend, seen.append, types=Report)
    assert trend.losses == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert [type(e) for e in result.events_of(trend)] == [RoundGathered] * 5
    assert result.summary.failed == 0
    # 4: a bound method read again is a new object, but an equal one.
    assert len(result.events_of(seen.append)) == 10


async def test_replay_log_refuses_an_object_that_is_neither_handler_nor_callback(
    tmp_path: Path,
) -> None:
    log = write_log(tmp_path / "run.evlog", report_rounds(1))

    class Duck:
        def after_report(self, *args: Any) -> None: ...

    with pytest.raises(TypeError, match=r"subclass handlers\.UserCallback"):
        await replay_log(log, Duck())
    with pytest.raises(TypeError, match=r"training callback, not a bus handler.*attach_user_"):
        async with EventBus() as bus:
            bus.subscribe(Report, LossTrend())  # type: ignore[arg-type]


async def test_recorded_bus_attaches_training_callbacks_too(tmp_path: Path) -> None:
    recording = BusRecording(tmp_path / "rec.evlog")
    trend = LossTrend()
    async with recording(trend) as bus:
        await bus.publish(RunStarted(run_id="run", name="t", world_size=2))
        for report in report_rounds(3, world_size=2):
            await bus.publish(report)
    assert trend.losses == pytest.approx([1.0, 0.5, 1 / 3])
    assert len(recording.received[0]) == 3
    assert len(recording.of_type(RoundGathered)) == 3


def test_cli_replay_of_a_demo_run_calls_each_hook_once_per_round(tmp_path: Path) -> None:
    """3, through the real commands: each recorded round reaches a callback once."""
    (tmp_path / "cli_probe.py").write_text(
        textwrap.dedent(
            """
            from handlers import UserCallback

            class CountRounds(UserCallback):
                def after_report(self, run_context, metrics, checkpoint): ...

                def after_run(self, run_context, result): ...
            """
        )
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = [sys.executable, "-m", "adapters.cli"]
    subprocess.run(
        [*cli, "demo", "--out", "runs/a", "--steps", "30"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    (log,) = (tmp_path / "runs/a").glob("*.evlog")
    rounds = sum(isinstance(e, RoundGathered) for e in read_log(log).events)
    assert rounds > 0
    out = subprocess.run(
        [*cli, "replay", str(log), "--callbacks", "cli_probe:CountRounds"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    calls = {line.split()[0]: int(line.split()[1]) for line in out.splitlines()[2:]}
    assert calls["CountRounds.after_report"] == rounds
    assert calls["CountRounds.after_run"] == 1


# --- 10. why the run stopped --------------------------------------------------------------------


async def test_early_stopping_says_which_callback_stopped_the_run_and_why() -> None:
    trend = LossTrend()
    stopping = EarlyStopping("loss", patience=2)

    async def worker(reporter: Reporter) -> None:
        for step in range(100):
            if reporter.should_stop:
                return
            await reporter.report({"loss": 1.0 if step else 0.5})
            await anyio.lowlevel.checkpoint()  # a training step yields

    with structlog.testing.capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[trend, stopping]) as run:
            await run.workers(worker)
    (result,) = trend.results
    assert result.status == "finished" and result.rounds < 100
    assert result.stopped_by == "EarlyStopping(metric='loss', mode='min')"
    assert result.stop_reason == "loss did not improve for 2 rounds (best 0.5, last 1)"
    assert [log["reason"] for log in logs if log["event"] == "early stopping"] == [
        result.stop_reason
    ]


async def test_a_requested_stop_is_in_the_result_and_the_log(tmp_path: Path) -> None:
    trend = LossTrend()
    async with open_run(world_size=1, callbacks=[trend], log=tmp_path / "run.evlog") as run:
        run.request_stop("the operator asked")
    (result,) = trend.results
    assert (result.stopped_by, result.stop_reason) == ("Run.request_stop", "the operator asked")
    finished = [
        e for e in read_log(tmp_path / "run.evlog").events if type(e).__name__ == "RunFinished"
    ]
    assert [(e.stopped_by, e.stop_reason) for e in finished] == [  # type: ignore[attr-defined]
        ("Run.request_stop", "the operator asked")
    ]


async def test_a_run_nothing_stopped_says_so() -> None:
    trend = LossTrend()
    async with open_run(world_size=1, callbacks=[trend, EarlyStopping("loss")]) as run:
        await run.reporter(0).report({"loss": 1.0})
    assert (trend.results[0].stopped_by, trend.results[0].stop_reason) == (None, None)


# --- 11. integer metrics stay integers ----------------------------------------------------------


def test_metrics_logger_keeps_integer_metrics_integers() -> None:
    with structlog.testing.capture_logs() as logs:
        logger = MetricsLogger()
        logger.log = structlog.get_logger("test")
        logger.after_report(CTX, [{"step": 1, "loss": 0.5}, {"step": 1, "loss": 1.5}], None)
        logger.after_report(CTX, [{"step": 1}, {"step": 2}], None)
        logger.after_report(CTX, [{"step": 2}, {"step": 2.0}], None)
    steps = [log["step"] for log in logs]
    assert steps == [1, 1.5, 2.0]
    assert [type(s) for s in steps] == [int, float, float]
    assert logs[0]["loss"] == 1.0


# --- 13. where a callback's names come from ------------------------------------------------


def test_a_stateful_training_callback_imports_from_its_two_homes() -> None:
    """``UserCallback`` is ``handlers``', ``StatefulCallback`` ``eventbus``' (its one home;
    ``handlers.StatefulCallback`` went in 0.3.0, see the CHANGELOG's migration table)."""
    import eventbus
    import eventbus.testing
    import handlers

    assert "UserCallback" in handlers.__all__ and "StatefulCallback" in eventbus.__all__
    assert "StatefulCallback" not in handlers.__all__
    assert not hasattr(handlers, "StatefulCallback")
    assert "replay_log" in eventbus.testing.__all__


# --- 14. pruning checkpoints -------------------------------------------------------------------


def test_best_checkpoints_deletes_what_leaves_the_top_but_never_the_latest(
    tmp_path: Path,
) -> None:
    best = BestCheckpoints("loss", k=2, delete_worse=True)
    losses = {"ck1": 0.5, "ck2": 0.9, "ck3": 0.4, "ck4": 0.8, "ck5": 0.3}
    for name, loss in losses.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights").write_text("w")
        best.after_report(stored(tmp_path), [{"loss": loss}], str(tmp_path / name))
        kept = sorted(p.name for p in tmp_path.iterdir())
        assert best.latest is not None and Path(best.latest).exists()  # a resume needs it
        assert all(Path(c).exists() for c in best.checkpoints)
    assert best.checkpoints == [str(tmp_path / "ck5"), str(tmp_path / "ck3")]
    assert kept == ["ck3", "ck5"]
    assert sorted(Path(d).name for d in best.deleted) == ["ck1", "ck2", "ck4"]


def test_best_checkpoints_deletes_nothing_by_default_and_never_a_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep_all = BestCheckpoints("loss", k=1)
    for i in range(3):
        (tmp_path / f"ck{i}").mkdir()
        keep_all.after_report(CTX, [{"loss": float(i)}], str(tmp_path / f"ck{i}"))
    assert len(list(tmp_path.iterdir())) == 3 and keep_all.deleted == []

    hostile = BestCheckpoints("loss", k=1, delete_worse=True)
    monkeypatch.chdir(tmp_path)
    with structlog.testing.capture_logs() as logs:  # each checkpoint better than the last
        for loss, location in enumerate(["ck1", "ck0", "missing", "..", ".", "/"][::-1]):
            hostile.after_report(stored(tmp_path), [{"loss": -float(loss)}], location)
    assert hostile.deleted == ["ck0"]  # the only real checkpoint that left the top
    assert (tmp_path / "ck1").exists() and (tmp_path / "ck2").exists()
    refused = [log for log in logs if log["event"].startswith("not deleting")]
    assert [log["checkpoint"] for log in refused] == ["/", ".", ".."]


def test_best_checkpoints_state_round_trips_with_pruning_and_latest() -> None:
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    best.after_report(CTX, [{"loss": 1.0}], "nowhere/ck")
    state = best.state()
    assert state["args"]["delete_worse"] is True
    assert state["attributes"] == {"top": [[1.0, "nowhere/ck"]], "latest": "nowhere/ck"}


async def test_two_training_callback_classes_share_one_gathering(tmp_path: Path) -> None:
    """Each round once, whatever the mix of callback classes; a second gathering on
    one bus is refused, since it would deliver every round twice."""
    log = write_log(tmp_path / "run.evlog", report_rounds(3, world_size=2))
    trend, stopping = LossTrend(), EarlyStopping("loss", patience=5)
    await replay_log(log, trend, stopping)
    assert len(trend.losses) == 3 and stopping.rounds == 3
    async with EventBus() as bus:
        attach_user_callbacks(bus, [LossTrend()])
        with pytest.raises(ValueError, match="already gathers reports"):
            attach_user_callbacks(bus, [LossTrend()])


class HostileStopper(UserCallback):
    """``should_stop`` and ``stop_reason`` as an attacker writes them."""

    def __init__(self, raises: bool) -> None:
        self.raises = raises

    @property
    def should_stop(self) -> bool:
        if self.raises:
            raise RuntimeError("should_stop exploded")
        return True

    @property
    def stop_reason(self) -> str:
        return "x" * 10**6


async def test_a_hostile_should_stop_cannot_break_the_end_of_a_run() -> None:
    trend = LossTrend()
    async with open_run(world_size=1, callbacks=[HostileStopper(raises=True), trend]) as run:
        await run.reporter(0).report({"loss": 1.0})
    assert trend.results[0].status == "finished" and trend.results[0].stopped_by is None

    trend = LossTrend()
    async with open_run(world_size=1, callbacks=[HostileStopper(raises=False), trend]):
        pass
    (result,) = trend.results
    assert result.stopped_by == "HostileStopper"
    assert result.stop_reason is not None and len(result.stop_reason) == 1000


def test_best_checkpoints_survives_a_location_no_path_can_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    best = BestCheckpoints("loss", k=1, delete_worse=True)
    with structlog.testing.capture_logs() as logs:
        best.after_report(stored(tmp_path), [{"loss": 1.0}], "bad\0name")
        best.after_report(stored(tmp_path), [{"loss": 0.5}], str(tmp_path / "ck"))
    assert best.deleted == [] and best.checkpoints == [str(tmp_path / "ck")]
    assert [log["event"] for log in logs] == ["could not delete a checkpoint"]
