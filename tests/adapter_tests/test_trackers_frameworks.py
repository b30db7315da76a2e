"""The trackers across a failure and a resume, through each framework: read back, the same
as an uninterrupted run's.

A run fails after a round its last checkpoint does not cover, and is resumed from
that checkpoint with fresh ``TensorBoardLogger`` and ``MLflowLogger`` objects given the
same directory and tracking URI. What TensorBoard's reader and MLflow's client then
read must be the uninterrupted run's: every round scalar, at the same steps, each step
once; both attempts in one TensorBoard directory (two event files, the second
purging the rolled-back steps the first really holds) and in one MLflow run, which
ends ``FINISHED``. Through Lightning (``fit(ckpt_path="last")``), the Hugging Face
Trainer (``train(resume_from_checkpoint=...)``) and ``open_run(engine=RayEngine())``
(``resume_from`` the job's ``state_dir``; and a worker-group restart inside one job).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported (here or by another module: the same settings)
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[lightning]')")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
pytest.importorskip("mlflow", reason="MLflow is not installed (pip install '.[mlflow]')")

from _trackers_readback import (  # noqa: E402
    each_by_step,
    event_files,
    mlflow_metrics,
    mlflow_only_run,
    rounds_only,
    tensorboard_scalars,
)

from adapters._options import BusRuns  # noqa: E402
from adapters.mlflow import MLflowLogger  # noqa: E402
from adapters.tensorboard import TensorBoardLogger  # noqa: E402
from handlers import Reporter, WorkerGroupError, open_run  # noqa: E402

BUS_RUNS: list[BusRuns] = ["in_hooks", "in_thread"]


@dataclass
class Trackers:
    """One run's trackers: a TensorBoard directory and an MLflow experiment (one database
    for the test, an experiment per run)."""

    root: Path
    uri: str
    name: str
    #: The loggers' ``step_metric`` (``None``: the run's config's, else the round's index).
    step_metric: str | None = None

    @property
    def log_dir(self) -> Path:
        return self.root / self.name / "tensorboard"

    def loggers(self) -> list[Any]:
        """Fresh logger objects for one attempt (a resumed process has new ones)."""
        step_metric = self.step_metric
        return [
            TensorBoardLogger(self.log_dir, step_metric=step_metric),
            MLflowLogger(self.uri, self.name, step_metric=step_metric),
        ]


def trackers(tmp_path: Path, step_metric: str | None) -> tuple[Trackers, Trackers]:
    """An uninterrupted run's trackers and an interrupted one's, in one MLflow database."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return (
        Trackers(tmp_path, uri, "uninterrupted", step_metric),
        Trackers(tmp_path, uri, "resumed", step_metric),
    )


def check_failed_attempt(resumed: Trackers, first: list[Any], purge_step: int) -> None:
    """After the failure: one MLflow run, FAILED, with the rounds up to the checkpoint
    only (the later ones are held, never written); TensorBoard has the later ones too."""
    run = mlflow_only_run(resumed.uri, resumed.name)
    assert run.info.status == "FAILED"
    assert run.info.run_id == first[1].mlflow_run_id
    metrics = each_by_step(rounds_only(mlflow_metrics(resumed.uri, run.info.run_id)))
    assert metrics and all(max(steps) < purge_step for steps in metrics.values())
    written = rounds_only(tensorboard_scalars(resumed.log_dir))
    assert max(step for points in written.values() for step, _ in points) >= purge_step


def check_resumed_as_uninterrupted(
    whole: Trackers, resumed: Trackers, first: list[Any], second: list[Any], purge_step: int
) -> None:
    """What both trackers hold of the resumed run is what they hold of the uninterrupted one."""
    # Both attempts wrote into the one directory; the second file's purge marker is the
    # first step after the checkpoint, and the first file really holds steps it drops.
    assert len(event_files(whole.log_dir)) == 1
    before, after = event_files(resumed.log_dir)
    assert (before.purge_step, after.purge_step) == (None, purge_step)
    dropped = {
        (tag, step)
        for tag, points in rounds_only(before.scalars).items()
        for step, _ in points
        if step >= purge_step
    }
    assert dropped, f"the failed attempt wrote nothing after step {purge_step - 1}"
    # ...which the resumed attempt wrote again: without the purge, they would be there twice.
    redone = {
        (tag, step) for tag, points in rounds_only(after.scalars).items() for step, _ in points
    }
    assert all(step >= purge_step for _, step in redone), (
        f"the resumed attempt wrote steps before its purge step {purge_step}: "
        f"{rounds_only(after.scalars)}"
    )
    assert dropped <= redone

    # TensorBoard, as its reader shows it: every round scalar, each step once, same values.
    expected_tb = each_by_step(rounds_only(tensorboard_scalars(whole.log_dir)))
    assert "loss" in expected_tb and len(expected_tb["loss"]) > 1
    assert each_by_step(rounds_only(tensorboard_scalars(resumed.log_dir))) == expected_tb

    # MLflow: one run, continued, FINISHED; each step once, with the uninterrupted values.
    expected_run = mlflow_only_run(whole.uri, whole.name)
    run = mlflow_only_run(resumed.uri, resumed.name)
    assert run.info.status == expected_run.info.status == "FINISHED"
    assert run.info.run_id == first[1].mlflow_run_id == second[1].mlflow_run_id
    assert run.data.tags["eventbus.status"] == "finished"
    expected_ml = each_by_step(rounds_only(mlflow_metrics(whole.uri, expected_run.info.run_id)))
    assert each_by_step(rounds_only(mlflow_metrics(resumed.uri, run.info.run_id))) == expected_ml
    # The two trackers agree on what was written, and where.
    assert {k: sorted(v) for k, v in expected_ml.items()} == {
        k: sorted(v) for k, v in expected_tb.items()
    }


# --- Lightning -----------------------------------------------------------------------


def lightning_model(fail_at_step: int | None = None) -> Any:
    """``_lightning_model.Regression`` with 5 batches an epoch: the checkpoint of step 5
    ends an epoch, so a resume from it sees the batches an uninterrupted run sees (from a
    checkpoint inside an epoch, Lightning starts that epoch's data over)."""
    import torch
    from _lightning_model import Regression
    from torch.utils.data import DataLoader, TensorDataset

    class FiveBatches(Regression):
        def train_dataloader(self) -> Any:
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(20, 4, generator=generator)
            return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=4)

    return FiveBatches(fail_at_step=fail_at_step)


#: Lightning's rounds: steps 2, 4, 5 (saved; no loss), 6, 8 and 10 (rounds 0 to 5); a
#: failure in step 8 rolls back step 6's round. The step is Lightning's, by default (the
#: adapter's config names it) or given as ``step_metric="step"``: the resume redoes from
#: step 6 on.
@pytest.mark.parametrize(
    ("step_metric", "purge_step"), [(None, 6), ("step", 6)], ids=["default", "step-metric"]
)
@pytest.mark.parametrize("bus_runs", BUS_RUNS)
def test_lightning_resumed_from_last_continues_the_tensorboard_dir_and_mlflow_run(
    tmp_path: Path, bus_runs: BusRuns, step_metric: str | None, purge_step: int
) -> None:
    pytest.importorskip(
        "lightning", reason="lightning is not installed (pip install '.[lightning]')"
    )
    from _lightning_model import make_trainer

    from adapters.lightning import EventBusCallback

    whole, resumed = trackers(tmp_path, step_metric)
    trainer = make_trainer(
        tmp_path / "whole", [EventBusCallback(whole.loggers(), bus_runs=bus_runs)]
    )
    trainer.fit(lightning_model())

    first = resumed.loggers()
    trainer = make_trainer(tmp_path / "resumed", [EventBusCallback(first, bus_runs=bus_runs)])
    with pytest.raises(RuntimeError, match="failed at step 8"):
        trainer.fit(lightning_model(fail_at_step=8))
    check_failed_attempt(resumed, first, purge_step)

    second = resumed.loggers()
    callback = EventBusCallback(second, bus_runs=bus_runs)
    trainer = make_trainer(tmp_path / "resumed", [callback])
    trainer.fit(lightning_model(), ckpt_path="last")  # last.ckpt: step 5's
    assert callback.restored is not None and len(callback.restored.restored) == 2
    check_resumed_as_uninterrupted(whole, resumed, first, second, purge_step)


# --- Hugging Face --------------------------------------------------------------------


def hf_trainer(output_dir: Path, callback: Any, *, fail_at_step: int | None = None) -> Any:
    """10 steps, a log every 2, a save every 4 (at a logging step: the loss HF logs is
    the mean since its last log, which a resume restarts)."""
    from _hf_model import tiny_trainer

    return tiny_trainer(
        output_dir,
        callback,
        fail_at_step=fail_at_step,
        max_steps=10,
        logging_steps=2,
        save_steps=4,
        save_strategy="steps",
    )


#: HF's rounds: steps 2, 4 (checkpoint-4), 6, 8 (checkpoint-8) and 10 (rounds 0 to 4); a
#: failure in step 8 rolls back step 6's round. The step is HF's, by default (the
#: adapter's config names it) or given: the resume redoes from step 5 on.
@pytest.mark.parametrize(
    ("step_metric", "purge_step"), [(None, 5), ("step", 5)], ids=["default", "step-metric"]
)
@pytest.mark.parametrize("bus_runs", BUS_RUNS)
def test_hugging_face_resumed_from_a_checkpoint_continues_the_tensorboard_dir_and_mlflow_run(
    tmp_path: Path, bus_runs: BusRuns, step_metric: str | None, purge_step: int
) -> None:
    pytest.importorskip(
        "transformers", reason="transformers is not installed (pip install '.[transformers]')"
    )
    from adapters.transformers import EventBusCallback, run_with_failures

    whole, resumed = trackers(tmp_path, step_metric)
    hf_trainer(tmp_path / "whole", EventBusCallback(whole.loggers(), bus_runs=bus_runs)).train()

    first = resumed.loggers()
    trainer = hf_trainer(
        tmp_path / "resumed", EventBusCallback(first, bus_runs=bus_runs), fail_at_step=8
    )
    with pytest.raises(RuntimeError, match="forward failed at step 8"):
        run_with_failures(trainer)
    check_failed_attempt(resumed, first, purge_step)

    second = resumed.loggers()
    callback = EventBusCallback(second, bus_runs=bus_runs)
    trainer = hf_trainer(tmp_path / "resumed", callback)
    trainer.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))
    assert callback.restored is not None and len(callback.restored.restored) == 2
    check_resumed_as_uninterrupted(whole, resumed, first, second, purge_step)


# --- Ray -----------------------------------------------------------------------------

STEPS = 8
#: Checkpoints at steps 2 and 5: the round of step 3 comes after the first one.
CHECKPOINT_EVERY = 3
FAIL_RANK = 1

TrainFn = Callable[[Reporter], Awaitable[None]]


def make_train(fail_at: int | None = None) -> TrainFn:
    """Two ranks, deterministic losses, a checkpoint every 3 steps; rank 1 fails at step
    ``fail_at`` of a run that did not resume (its checkpoint says where to go on)."""

    async def train(reporter: Reporter) -> None:
        start = 0
        if reporter.latest_checkpoint is not None:
            start = saved_step(reporter.latest_checkpoint, reporter.rank) + 1
        for step in range(start, STEPS):
            if start == 0 and reporter.rank == FAIL_RANK and step == fail_at:
                raise ValueError(f"boom at step {step}")
            metrics = {"step": step, "loss": 1.0 / (step + 1) + 0.125 * reporter.rank}
            if step % CHECKPOINT_EVERY == CHECKPOINT_EVERY - 1:
                with tempfile.TemporaryDirectory() as directory:
                    save_step(directory, reporter.rank, step)
                    await reporter.report(metrics, checkpoint=directory)
            else:
                await reporter.report(metrics)
            await reporter.sync()

    return train


def save_step(directory: str, rank: int, step: int) -> None:
    Path(directory, f"rank{rank}.json").write_text(json.dumps({"step": step}))


def saved_step(checkpoint: str, rank: int) -> int:
    return int(json.loads(Path(checkpoint, f"rank{rank}.json").read_text())["step"])


@pytest.fixture(scope="module")
def cluster(ray_cluster: None) -> None:
    """The Ray test files' shared cluster (tests/conftest.py), this module's worker
    function shipped to it by value: Ray's workers cannot import this test module."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def run_job(
    state_dir: Path,
    loggers: list[Any],
    *,
    on_ray: bool = True,
    fail_at: int | None = None,
    max_restarts: int = 0,
    resume: bool = False,
) -> Any:
    """One job of ``make_train(fail_at)``, on Ray (or the local engine), its state in
    ``state_dir`` (``resume``: from there), the loggers in the driver; the ended ``Run``."""
    import anyio

    from adapters.ray import RayEngine

    async def job() -> Any:
        async with open_run(
            world_size=2,
            callbacks=loggers,
            state_dir=state_dir,
            resume_from=state_dir if resume else None,
            engine=RayEngine() if on_ray else None,
            period=0.5,
        ) as run:
            await run.workers(make_train(fail_at), max_restarts=max_restarts)
        return run

    return anyio.run(job)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Trackers:
    """The job without a failure, 8 rounds (steps 0 to 7) of both ranks, on the local
    engine: the same rounds as on Ray (tests/adapter_tests/test_ray_engine.py), and the
    trackers run in the driver either way; a Ray job costs 10-30 s here."""
    root = tmp_path_factory.mktemp("uninterrupted")
    whole = Trackers(root, f"sqlite:///{root}/mlflow.db", "uninterrupted")
    run = run_job(root / "state", whole.loggers(), on_ray=False)
    assert run.result.status == "finished" and run.result.rounds == STEPS
    return whole


def test_ray_job_resumed_from_its_state_dir_continues_the_tensorboard_dir_and_mlflow_run(
    cluster: None, uninterrupted: Trackers, tmp_path: Path
) -> None:
    """Rank 1 fails at step 4, after step 3's round, which the checkpoint of step 2 does
    not cover; the job is resumed from its state_dir and redoes steps 3 to 7."""
    whole = uninterrupted
    resumed = Trackers(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", "resumed")
    first = resumed.loggers()
    with pytest.raises(WorkerGroupError):
        run_job(tmp_path / "state", first, fail_at=4)
    check_failed_attempt(resumed, first, purge_step=3)

    second = resumed.loggers()
    run = run_job(tmp_path / "state", second, resume=True)
    assert run.result.status == "finished"
    check_resumed_as_uninterrupted(whole, resumed, first, second, purge_step=3)


def test_a_worker_group_restart_inside_a_ray_job_keeps_one_mlflow_run(
    cluster: None, uninterrupted: Trackers, tmp_path: Path
) -> None:
    """Rank 1 fails once at step 3 (its round incomplete, discarded); the group restarts
    from step 2's checkpoint: one MLflow run, one TensorBoard file, the uninterrupted data."""
    whole = uninterrupted
    restarted = Trackers(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", "restarted")
    loggers = restarted.loggers()
    run = run_job(tmp_path / "state", loggers, fail_at=3, max_restarts=1)
    assert (run.result.status, run.result.restarts, run.result.failures) == ("finished", 1, 1)

    expected = each_by_step(rounds_only(tensorboard_scalars(whole.log_dir)))
    assert each_by_step(rounds_only(tensorboard_scalars(restarted.log_dir))) == expected
    (only,) = event_files(restarted.log_dir)
    assert only.purge_step is None

    mlflow_run = mlflow_only_run(restarted.uri, restarted.name)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.info.run_id == loggers[1].mlflow_run_id
    expected_run = mlflow_only_run(whole.uri, whole.name)
    expected_ml = each_by_step(rounds_only(mlflow_metrics(whole.uri, expected_run.info.run_id)))
    got = each_by_step(rounds_only(mlflow_metrics(restarted.uri, mlflow_run.info.run_id)))
    assert got == expected_ml


def test_a_stop_on_ray_ends_both_ranks_at_the_deciding_round_with_both_trackers(
    cluster: None, tmp_path: Path
) -> None:
    """Trackers never change training, on Ray too (issue 41, item 3; the other ways in:
    tests/adapter_tests/test_stops_with_trackers.py): ``EarlyStopping`` decides at round
    5 (the loss never improves after round 0, patience 5), and with TensorBoard and
    MLflow in the driver both ranks report rounds 0 to 5 and no more."""
    import anyio

    from adapters.ray import RayEngine
    from handlers import EarlyStopping

    async def train(reporter: Reporter) -> None:
        for step in range(100):
            await reporter.report({"step": step, "loss": 1.0})
            await reporter.sync()
            if reporter.should_stop:
                return

    async def job() -> Any:
        loggers = Trackers(tmp_path, f"sqlite:///{tmp_path}/mlflow.db", "stops").loggers()
        callbacks = [EarlyStopping("loss", patience=5), *loggers]
        async with open_run(
            world_size=2, callbacks=callbacks, engine=RayEngine(), state_dir=tmp_path / "state"
        ) as run:
            await run.workers(train)
        return run

    run = anyio.run(job)
    assert (run.result.stopped_by or "").startswith("EarlyStopping")
    assert (run.result.rounds, run.result.reports) == (6, 12)
