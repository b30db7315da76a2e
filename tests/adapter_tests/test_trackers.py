"""TensorBoard and MLflow trackers through ``open_run``, read back with the real libraries."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

pytest.importorskip("tensorboard", reason="pip install '.[tensorboard]'")
pytest.importorskip("mlflow", reason="pip install '.[mlflow]'")

from _tracker_job import save_checkpoint, saved_step
from _trackers_readback import (
    by_step,
    event_files,
    mlflow_history,
    mlflow_metrics,
    mlflow_runs,
    tensorboard_scalars,
    tensorboard_texts,
)

import adapters.tensorboard as tensorboard_adapter
from adapters._tracker import round_scalars
from adapters.mlflow import MLflowLogger, mlflow_key
from adapters.tensorboard import TensorBoardLogger
from eventbus import (
    AfterRun,
    BudgetReport,
    CheckpointSaved,
    HandlerFailed,
    RunResult,
    TrainRunContext,
)
from handlers import Reporter, UserCallback, WorkerGroupError, open_run

JOB = Path(__file__).with_name("_tracker_job.py")

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Relative paths, as users type them."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def training(steps: int, every: int = 4, *, fail_at: int | None = None, once: bool = False) -> Any:
    """Two ranks; a rank's loss depends on rank and step; a checkpoint every ``every``
    steps; ``fail_at``: rank 1 raises after reporting that step (``once``: only the
    first time, so a restart goes on)."""
    failed: list[int] = []

    async def train(reporter: Reporter) -> None:
        step = saved_step(reporter.latest_checkpoint, reporter.rank)
        while step < steps and not reporter.should_stop:
            step += 1
            checkpoint = None
            if step % every == 0:
                checkpoint = save_checkpoint("runs/a", step, reporter.rank)
            await reporter.report({"loss": 1.0 / step + reporter.rank, "step": step}, checkpoint)
            if step == fail_at and reporter.rank == 1 and not (once and failed):
                failed.append(step)
                raise ValueError(f"rank 1 fails at step {step}")

    return train


async def run_job(callbacks: list[Any], steps: int = 12, **options: Any) -> Any:
    fail_at = options.pop("fail_at", None)
    once = options.pop("once", False)
    max_restarts = options.pop("max_restarts", 0)
    async with open_run(
        world_size=2,
        callbacks=callbacks,
        state_dir="runs/a",
        config={"lr": 0.1, "optimizer": {"name": "sgd"}},
        **options,
    ) as run:
        await run.workers(training(steps, fail_at=fail_at, once=once), max_restarts=max_restarts)
    return run


URI = "sqlite:///runs/mlflow.db"


def read_uri() -> str:
    """The store's absolute address, for reading it back (MLflow caches a store per
    address: a relative one would mean the first test's folder)."""
    return f"sqlite:///{Path.cwd()}/runs/mlflow.db"


# --- TensorBoard ------------------------------------------------------------------------


@pytest.fixture(params=["torch", "tensorboardX"])
def writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both writers the logger takes: torch's, and tensorboardX's when torch is missing."""
    if request.param == "tensorboardX":
        import tensorboardX
        from tensorboardX.proto.summary_pb2 import Summary

        monkeypatch.setattr(
            tensorboard_adapter,
            "summary_writer_class",
            lambda: (tensorboardX.SummaryWriter, Summary),
        )
    else:
        pytest.importorskip("torch")
    return str(request.param)


async def test_each_round_is_the_mean_and_each_ranks_scalar_at_the_rounds_index(
    writer: str,
) -> None:
    logger = TensorBoardLogger("runs/tb")
    await run_job([logger], steps=8)
    scalars = tensorboard_scalars("runs/tb")
    assert dict(scalars["loss"]) == pytest.approx({r: 1 / (r + 1) + 0.5 for r in range(8)})
    assert dict(scalars["loss/rank_0"]) == pytest.approx({r: 1 / (r + 1) for r in range(8)})
    assert dict(scalars["loss/rank_1"]) == pytest.approx({r: 1 / (r + 1) + 1 for r in range(8)})
    assert len(scalars["loss"]) == 8
    texts = tensorboard_texts("runs/tb")
    assert [step for step, _ in texts["checkpoints"]] == [3, 7]
    assert "runs/a/checkpoint_000004" in texts["checkpoints"][0][1]
    assert texts["status"] == [(7, "finished")]


async def test_a_named_metric_gives_the_step(writer: str) -> None:
    await run_job([TensorBoardLogger("runs/tb", step_metric="step", per_rank=False)], steps=6)
    scalars = tensorboard_scalars("runs/tb")
    assert [step for step, _ in scalars["loss"]] == [1, 2, 3, 4, 5, 6]
    assert not any("/rank_" in tag for tag in scalars)


async def test_failures_and_restarts_are_text_entries() -> None:
    await run_job([TensorBoardLogger("runs/tb")], fail_at=5, once=True, max_restarts=1)
    texts = tensorboard_texts("runs/tb")
    (failure,) = texts["failures"]
    assert "rank 1: ValueError: rank 1 fails at step 5" in failure[1]
    assert [text for _, text in texts["restarts"]] == ["worker group restarted: 2 workers"]


# --- MLflow -----------------------------------------------------------------------------


async def test_mlflow_gets_params_metrics_tags_artifacts_and_our_status() -> None:
    logger = MLflowLogger(URI, "exp", log_checkpoints=True, tags={"team": "vision"})
    run = await run_job([logger], steps=8)
    (found,) = mlflow_runs(read_uri(), "exp")
    assert found.info.run_id == logger.mlflow_run_id
    assert found.info.status == "FINISHED"
    assert found.data.params == {"lr": "0.1", "optimizer.name": "sgd"}
    tags = found.data.tags
    assert (tags["eventbus.run_id"], tags["eventbus.status"], tags["team"]) == (
        run.run_id,
        "finished",
        "vision",
    )
    history = mlflow_history(read_uri(), found.info.run_id, "loss")
    assert dict(history) == pytest.approx({r: 1 / (r + 1) + 0.5 for r in range(8)})
    assert len(history) == 8
    assert mlflow_history(read_uri(), found.info.run_id, "loss/rank_1")[0] == (0, 2.0)
    from mlflow import MlflowClient

    artifacts = MlflowClient(read_uri()).list_artifacts(found.info.run_id, "checkpoints")
    assert sorted(Path(a.path).name for a in artifacts) == [
        "checkpoint_000004",
        "checkpoint_000008",
    ]


async def test_a_failed_run_ends_its_mlflow_run_failed_and_says_what_it_left_out() -> None:
    logger = MLflowLogger(URI, "exp")
    with capture_logs() as logs, pytest.raises(WorkerGroupError, match="fails at step 6"):
        await run_job([logger], fail_at=6)
    (found,) = mlflow_runs(read_uri(), "exp")
    assert found.info.status == "FAILED"
    assert found.data.tags["eventbus.status"] == "failed"
    assert "rank 1: ValueError" in found.data.tags["eventbus.failures"]
    # Rounds 0-3 were made final by the checkpoint of step 4; 4 and 5 were not.
    history = mlflow_history(read_uri(), found.info.run_id, "loss")
    assert [step for step, _ in history] == [0, 1, 2, 3]
    (warning,) = [e for e in logs if "not written to MLflow" in e["event"]]
    assert "steps 4 to 5" in warning["event"] and "resume" in warning["event"]


def test_mlflow_keys_keep_what_mlflow_takes_and_rename_the_rest_apart() -> None:
    kept = "callbacks/Trend.after_report/share"
    assert mlflow_key(kept) == kept
    renamed = mlflow_key("callbacks/Trend.after_report#2/share")
    assert renamed.startswith(kept.replace("report", "report_2") + "-")
    assert mlflow_key("acc@1 (top)").startswith("acc_1 _top_-")
    assert mlflow_key("acc@1") != mlflow_key("acc#1") != mlflow_key("acc_1") == "acc_1"
    from mlflow.utils.validation import _validate_metric_name

    for path in ("eval/", "//", "./", "", "../x", "a/./b", "..x", "/a"):
        _validate_metric_name(mlflow_key(path))  # MLflow's own check: raises if refused
    assert mlflow_key("eval/").startswith("eval-")


async def test_a_worker_group_restart_keeps_one_mlflow_run_and_every_round() -> None:
    logger = MLflowLogger(URI, "exp")
    await run_job([logger], fail_at=5, once=True, max_restarts=1)
    (found,) = mlflow_runs(read_uri(), "exp")
    steps = [step for step, _ in mlflow_history(read_uri(), found.info.run_id, "loss")]
    assert steps == sorted(set(steps)) and found.info.status == "FINISHED"


# --- callback cost ----------------------------------------------------------------------


class Slow(UserCallback):
    """Takes a known slice of each round, so its share of a period is plain to see."""

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        threading.Event().wait(0.01)


class Raises(UserCallback):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        raise RuntimeError("a faulty callback")


async def test_each_callbacks_share_of_each_period_and_its_faults_are_scalars() -> None:
    tb, ml = TensorBoardLogger("runs/tb"), MLflowLogger(URI, "exp")
    seen: list[BudgetReport | AfterRun] = []
    async with open_run(
        world_size=2, callbacks=[Slow(), Raises(), tb, ml], state_dir="runs/a", period=0.05
    ) as run:
        run.bus.subscribe((BudgetReport, AfterRun), seen.append)
        await run.workers(training(30))
    # The periods that ended before the run did (the trackers close at its end).
    end = next(i for i, e in enumerate(seen) if isinstance(e, AfterRun))
    scalars = tensorboard_scalars("runs/tb")
    shares = [value for _, value in scalars["callbacks/Slow.after_report/share"]]
    assert shares and max(shares) > 0.1  # 10 ms a round, rounds back to back
    faults = [
        u.faults
        for r in seen[:end]
        if isinstance(r, BudgetReport)
        for u in r.handlers
        if u.handler.startswith("Raises")
    ]
    assert sum(faults) >= 20
    assert sum(v for _, v in scalars["callbacks/Raises.after_report/faults"]) == sum(faults)
    assert "callbacks/share" in scalars
    (found,) = mlflow_runs(read_uri(), "exp")
    assert mlflow_history(read_uri(), found.info.run_id, "callbacks/Slow.after_report/share")


# --- never silent, never a stalled step ------------------------------------------------


async def test_a_write_that_fails_is_named_and_the_run_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = TensorBoardLogger("runs/tb")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("disk full")

    failed: list[HandlerFailed] = []
    async with open_run(world_size=2, callbacks=[logger], state_dir="runs/a") as run:
        run.bus.subscribe(HandlerFailed, failed.append)
        monkeypatch.setattr(logger, "_scalars", refuse)
        await run.workers(training(6))
    assert run.result is not None and run.result.status == "finished"
    assert failed and failed[0].handler == "TensorBoardLogger.on_event"
    assert "writing to TensorBoard failed: OSError: disk full" in failed[0].message


async def test_a_tracker_that_cannot_open_says_so_once_and_writes_nothing_more(
    in_tmp: Path,
) -> None:
    (in_tmp / "runs").mkdir()
    (in_tmp / "runs/tb").write_text("a file where the log folder goes")
    failed: list[HandlerFailed] = []
    async with open_run(world_size=2, callbacks=[TensorBoardLogger("runs/tb")]) as run:
        run.bus.subscribe(HandlerFailed, failed.append)
        await run.workers(training(6))
    assert run.result is not None and run.result.status == "finished"
    assert len(failed) == 1 and "nothing more is written" in failed[0].message


class Gate:
    """Holds the tracker's writes until the workers have finished every step."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.held = 0

    def hold(self, write: Any) -> Any:
        def held(*args: Any, **kwargs: Any) -> Any:
            self.held += 1
            assert self.open.wait(30), "the workers never finished while the tracker was slow"
            return write(*args, **kwargs)

        return held


async def test_a_slow_tracker_does_not_hold_the_workers_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tracker's writes block until every worker has reported its last step: with
    the writes on the training step, the workers would never get there."""
    tb, ml = TensorBoardLogger("runs/tb"), MLflowLogger(URI, "exp", live=True)
    gate = Gate()
    monkeypatch.setattr(tb, "_scalars", gate.hold(tb._scalars))
    monkeypatch.setattr(ml, "_scalars", gate.hold(ml._scalars))

    async def train(reporter: Reporter) -> None:
        for step in range(1, 41):
            await reporter.report({"loss": 1.0 / step})
        if reporter.rank == 0:
            gate.open.set()

    async with open_run(world_size=2, callbacks=[tb, ml]) as run:
        await run.workers(train)
    assert gate.held >= 2
    assert len(tensorboard_scalars("runs/tb")["loss"]) == 40
    (found,) = mlflow_runs(read_uri(), "exp")
    assert len(mlflow_history(read_uri(), found.info.run_id, "loss")) == 40


# --- kill and resume --------------------------------------------------------------------


def job(work: Path, kill_at: int, *flags: str) -> subprocess.CompletedProcess[str]:
    """``_tracker_job.py`` in ``work``; it exits 0, or -9 when it killed itself."""
    done = subprocess.run(
        [sys.executable, str(JOB), str(work), str(kill_at), *flags],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode in (0, -9), done.stderr[-3000:]
    return done


def read_back(work: Path) -> dict[str, Any]:
    uri = f"sqlite:///{work}/runs/mlflow.db"
    runs = mlflow_runs(uri, "jobs")
    tags = ("loss", "loss/rank_0", "loss/rank_1", "attempt")
    return {
        "tensorboard": {
            t: v for t, v in tensorboard_scalars(work / "runs/tb").items() if t in tags
        },
        "mlflow": {t: mlflow_history(uri, runs[0].info.run_id, t) for t in tags},
        "mlflow_runs": [(r.info.run_id, r.info.status) for r in runs],
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("uninterrupted")
    assert job(work, 0).returncode == 0
    return read_back(work)


def without_attempt(data: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    return {tag: points for tag, points in data.items() if tag != "attempt"}


def test_a_killed_run_resumed_writes_each_step_once_as_an_uninterrupted_one(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    """Killed at step 10 (the checkpoint is step 8's), resumed: steps 9 and 10 (rounds 8
    and 9) were written to TensorBoard before the kill and are redone; each step is in
    each tracker once, with the uninterrupted run's values, in one MLflow run."""
    assert job(tmp_path, 10).returncode == -9
    (first,) = event_files(tmp_path / "runs/tb")
    assert {8, 9} <= {step for step, _ in first.scalars["loss"]}  # written, then rolled back
    resume = job(tmp_path, 0, "--resume")
    assert resume.returncode == 0
    # Nothing of the resume reaches a tracker before its before_run (issue 39).
    assert "handler failed" not in resume.stderr, resume.stderr
    resumed = read_back(tmp_path)
    assert without_attempt(resumed["tensorboard"]) == without_attempt(uninterrupted["tensorboard"])
    assert without_attempt(resumed["mlflow"]) == without_attempt(uninterrupted["mlflow"])
    # The redone rounds are the second attempt's in TensorBoard; MLflow keeps what it was
    # given before the kill (rows wait 30 s at most: on a slow machine rounds 8 and 9 may
    # have been written), and says so.
    attempts = dict(resumed["tensorboard"]["attempt"])
    assert [attempts[r] for r in range(12)] == [1.0] * 8 + [2.0] * 4
    attempts = dict(resumed["mlflow"]["attempt"])
    assert [attempts[r] for r in (*range(8), 10, 11)] == [1.0] * 8 + [2.0] * 2
    if 1.0 in (attempts[8], attempts[9]):
        assert "already holds steps 8 to" in resume.stderr
    ((_, status),) = resumed["mlflow_runs"]
    assert status == "FINISHED"
    files = event_files(tmp_path / "runs/tb")  # the same folder, a file each
    assert [f.purge_step for f in files] == [None, 8]


def test_live_mlflow_rows_rolled_back_by_a_kill_are_kept_and_each_step_is_there_once(
    tmp_path: Path,
) -> None:
    """``live=True`` wrote rounds 8 and 9 before the kill; MLflow cannot take them back, so
    the resume does not write them again, and says so."""
    assert job(tmp_path, 10, "--live").returncode == -9
    resume = job(tmp_path, 0, "--resume", "--live")
    assert resume.returncode == 0
    assert "already holds steps 8 to 9, which this resume redoes" in resume.stderr
    uri = f"sqlite:///{tmp_path}/runs/mlflow.db"
    (found,) = mlflow_runs(uri, "jobs")
    attempts = by_step(mlflow_history(uri, found.info.run_id, "attempt"))
    assert attempts == {step: 1.0 if step < 10 else 2.0 for step in range(12)}
    for points in mlflow_metrics(uri, found.info.run_id).values():
        by_step(points)  # each step once, in every key


def test_a_kill_halfway_through_a_write_then_a_resume_leaves_each_step_once_everywhere(
    uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    """SIGKILLed halfway through MLflow's write at the checkpoint of step 8 (so that
    checkpoint is never snapshotted): the store has part of rounds 4-7, TensorBoard's file
    whatever its writer had written. Resumed from step 4's checkpoint: each tracker holds
    each step once, read back with its own reader, with the uninterrupted run's values."""
    assert job(tmp_path, 8, "--kill-in-flush").returncode == -9
    uri = f"sqlite:///{tmp_path}/runs/mlflow.db"
    (found,) = mlflow_runs(uri, "jobs")
    torn = mlflow_metrics(uri, found.info.run_id)
    written = sum(1 for points in torn.values() for step, _ in points if 4 <= step <= 7)
    assert 0 < written < 4 * len([k for k in torn if not k.startswith("callbacks/")])
    resume = job(tmp_path, 0, "--resume")
    assert resume.returncode == 0, resume.stderr[-3000:]
    resumed = read_back(tmp_path)
    assert without_attempt(resumed["tensorboard"]) == without_attempt(uninterrupted["tensorboard"])
    assert without_attempt(resumed["mlflow"]) == without_attempt(uninterrupted["mlflow"])
    (found,) = mlflow_runs(uri, "jobs")
    assert found.info.status == "FINISHED"
    for key, points in mlflow_metrics(uri, found.info.run_id).items():
        if not key.startswith("callbacks/"):
            assert sorted(by_step(points)) == list(range(12)), key
    for points in tensorboard_scalars(tmp_path / "runs/tb").values():
        by_step(points)


async def test_a_checkpoint_after_the_run_ended_does_not_wait_for_the_closed_tracker() -> None:
    """Lightning saves a checkpoint after ``fit``'s end: the tracker, closed at the run's
    end, has nothing to flush for it, and must not wait for a thread that is gone."""
    logger = TensorBoardLogger("runs/tb")
    context = TrainRunContext(run_id="r", name="r", world_size=1)
    await logger.before_run(context)
    await logger.after_run(context, RunResult(run_id="r", status="finished"))
    with anyio.fail_after(5):
        await logger.on_event(context, CheckpointSaved(run_id="r", checkpoint="c", index=0))


@pytest.mark.parametrize("flush_secs", [float("nan"), float("inf"), 0.0, -1.0])
def test_a_flush_interval_out_of_range_is_refused_by_name(flush_secs: float) -> None:
    with pytest.raises(ValueError, match="flush_secs"):
        TensorBoardLogger("runs/tb", flush_secs=flush_secs)


def test_mlflow_keys_longer_than_mlflow_takes_are_cut_and_stay_apart() -> None:
    assert len(mlflow_key("x" * 1000)) == 250
    assert mlflow_key("x" * 260 + "a") != mlflow_key("x" * 260 + "b")


async def test_one_tracker_object_in_two_runs_at_once_is_refused_by_the_second() -> None:
    logger = TensorBoardLogger("runs/tb")
    context = TrainRunContext(run_id="r", name="r", world_size=1)
    await logger.before_run(context)
    with pytest.raises(RuntimeError, match="already writing a run"):
        await logger.before_run(context)
    await logger.after_run(context, RunResult(run_id="r", status="finished"))
    await logger.before_run(context)  # the next run, once the first has ended
    await logger.after_run(context, RunResult(run_id="r", status="finished"))


async def test_rows_a_failed_flush_could_not_write_are_written_at_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store refuses the first checkpoint's flush (a locked database, a server away):
    those rounds are written at the next checkpoint, each once, and the failure is named."""
    logger = MLflowLogger(URI, "exp")
    failed: list[HandlerFailed] = []
    refused: list[int] = []

    def refusing(write: Any) -> Any:
        def once(*args: Any, **kwargs: Any) -> Any:
            if not refused and kwargs.get("metrics"):
                refused.append(len(kwargs["metrics"]))
                raise OSError("database is locked")
            return write(*args, **kwargs)

        return once

    original = logger._open

    def open_then_refuse(*args: Any) -> None:
        original(*args)
        monkeypatch.setattr(logger._client, "log_batch", refusing(logger._client.log_batch))

    monkeypatch.setattr(logger, "_open", open_then_refuse)
    async with open_run(world_size=2, callbacks=[logger], state_dir="runs/a") as run:
        run.bus.subscribe(HandlerFailed, failed.append)
        await run.workers(training(12))
    assert refused and "database is locked" in failed[0].message
    (found,) = mlflow_runs(read_uri(), "exp")
    history = mlflow_history(read_uri(), found.info.run_id, "loss")
    assert [step for step, _ in history] == list(range(12))


def test_a_rounds_mean_is_the_runs_own_and_each_rank_keeps_what_it_reported() -> None:
    """The mean is the one the run's summary and report show (finite values only: one
    rank's NaN does not hide the other's loss); the per-rank scalars are as reported."""
    nan = float("nan")
    scalars = round_scalars(
        [{"loss": nan, "note": "x", "ok": True}, {"loss": 2.0, "step": 3}], (0, 1), per_rank=True
    )
    assert scalars["loss"] == 2.0 and scalars["step"] == 3.0
    assert math.isnan(scalars["loss/rank_0"]) and scalars["loss/rank_1"] == 2.0
    assert not {"note", "ok", "note/rank_0", "ok/rank_0"} & set(scalars)
    assert set(round_scalars([{"loss": 1.0}], (0,), per_rank=True)) == {"loss"}


@pytest.mark.parametrize("step", [float("nan"), float("inf"), 1e30, -(2.0**64), "3", True])
async def test_a_step_no_tracker_can_store_is_not_written_and_said_once(step: object) -> None:
    tb = TensorBoardLogger("runs/tb", step_metric="step")

    async def train(reporter: Reporter) -> None:
        for index in range(3):
            await reporter.report({"loss": 1.0, "step": step if index == 1 else index})

    with capture_logs() as logs:
        async with open_run(world_size=1, callbacks=[tb]) as run:
            await run.workers(train)
    assert run.result is not None and run.result.status == "finished"
    assert [s for s, _ in tensorboard_scalars("runs/tb")["loss"]] == [0, 2]
    said = [e for e in logs if "is not written (step_metric='step')" in e["event"]]
    assert len(said) == 1 and tb.rounds_without_step == 1


def refusing_store(logger: MLflowLogger, monkeypatch: pytest.MonkeyPatch, refuse: Any) -> None:
    """Once the MLflow run is open, its store refuses each metrics write for which
    ``refuse()`` is true, as a locked database does."""
    original = logger._open

    def open_then_refuse(*args: Any) -> None:
        original(*args)
        write = logger._client.log_batch

        def log_batch(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("metrics") and refuse():
                raise OSError("database is locked")
            return write(*args, **kwargs)

        monkeypatch.setattr(logger._client, "log_batch", log_batch)

    monkeypatch.setattr(logger, "_open", open_then_refuse)


async def test_a_store_refusing_writes_for_a_while_is_said_once_and_loses_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = MLflowLogger(URI, "exp", live=True)  # a write each round: each one refused
    calls = iter(range(1_000_000))
    refusing_store(logger, monkeypatch, lambda: next(calls) < 2)  # at the first checkpoint too
    failed: list[HandlerFailed] = []
    with capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[logger], state_dir="runs/a") as run:
            run.bus.subscribe(HandlerFailed, failed.append)
            await run.workers(training(12))
    assert [f.message.count("database is locked") for f in failed] == [1]
    assert "rows are kept (at most 50,000)" in failed[0].message
    assert any("MLflow takes writes again" in e["event"] for e in logs)
    (found,) = mlflow_runs(read_uri(), "exp")
    assert sorted(by_step(mlflow_history(read_uri(), found.info.run_id, "loss"))) == list(range(12))


async def test_a_store_that_never_takes_a_row_ends_its_run_finished_and_says_what_was_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows kept are bounded (10 here): the oldest are lost first; at the end one
    warning says how many rows of which steps MLflow never got, and the MLflow run still
    ends with our status."""
    import adapters.mlflow as mlflow_adapter

    monkeypatch.setattr(mlflow_adapter, "_KEPT_ROWS", 10)
    logger = MLflowLogger(URI, "exp", per_rank=False, costs=False, live=True)
    refusing_store(logger, monkeypatch, lambda: True)
    failed: list[HandlerFailed] = []
    with capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[logger], state_dir="runs/a") as run:
            run.bus.subscribe(HandlerFailed, failed.append)
            await run.workers(training(12))
    assert run.result is not None and run.result.status == "finished"
    assert len(failed) == 1
    (said,) = [e["event"] for e in logs if "not written to MLflow" in e["event"]]
    assert "24 rows (steps 0 to 11) are not written to MLflow" in said  # loss and step
    (found,) = mlflow_runs(read_uri(), "exp")
    assert found.info.status == "FINISHED" and found.data.tags["eventbus.status"] == "finished"
