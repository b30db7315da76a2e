"""The trackers through the Hugging Face and Lightning adapters: the trainer's step as the
x-axis, train and eval series apart, the trainer's arguments as params; and failures
marked where they happened, with the worker's own exception type, before and after a
resume. Read back with TensorBoard's ``EventAccumulator`` and MLflow's client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[lightning]')")
pytest.importorskip("tensorboard", reason="pip install '.[tensorboard]'")
pytest.importorskip("mlflow", reason="pip install '.[mlflow]'")

from _tracker_job import save_checkpoint, saved_step  # noqa: E402
from _trackers_readback import (  # noqa: E402
    by_step,
    mlflow_history,
    mlflow_only_run,
    rounds_only,
    tensorboard_scalars,
    tensorboard_texts,
)

from adapters.mlflow import MLflowLogger  # noqa: E402
from adapters.tensorboard import TensorBoardLogger  # noqa: E402
from handlers import Reporter, open_run  # noqa: E402


def loggers(root: Path, **options: Any) -> list[Any]:
    """A TensorBoard directory and an MLflow experiment under ``root``."""
    return [
        TensorBoardLogger(root / "tb", **options),
        MLflowLogger(f"sqlite:///{root}/mlflow.db", "axes", **options),
    ]


def steps_of(scalars: dict[str, list[tuple[int, float]]], tag: str) -> list[int]:
    """The steps of ``tag``, each once (``by_step`` fails on a step given twice)."""
    return sorted(by_step(scalars[tag]))


# --- Hugging Face ----------------------------------------------------------------------


def hf_trainer(
    output_dir: Path, callback: Any, *, evaluate: bool = True, fail_at: int | None = None
) -> Any:
    """10 steps, a log every 2, an evaluation and a save every 4; ``fail_at``: the
    training forward pass of that step raises (counted from the start of this ``train()``)."""
    from _hf_model import tiny_trainer

    return tiny_trainer(
        output_dir,
        callback,
        fail_at_step=fail_at,
        evaluate=evaluate,
        max_steps=10,
        learning_rate=0.01,
        logging_steps=2,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=4,
        save_strategy="steps",
        save_steps=4,
    )


def test_hugging_face_trackers_plot_at_the_global_step_with_eval_apart_and_args_as_params(
    tmp_path: Path,
) -> None:
    """HF logs train at steps 2, 4, ..., 10 and evaluates at 4 and 8: two logs, two rounds,
    at one step. Each series is at HF's global step, each step once; ``step`` itself is the
    axis, not a series; the non-default ``TrainingArguments`` are MLflow params and
    TensorBoard's ``config`` text."""
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from adapters.transformers import EventBusCallback

    trainer = hf_trainer(tmp_path / "out", EventBusCallback(loggers(tmp_path)))
    trainer.train()
    logged = trainer.state.log_history
    evaluated = [log["step"] for log in logged if "eval_loss" in log]
    assert evaluated[:2] == [4, 8]  # and 10, the last step, in some versions

    scalars = rounds_only(tensorboard_scalars(tmp_path / "tb"))
    assert steps_of(scalars, "loss") == [2, 4, 6, 8, 10]
    assert steps_of(scalars, "learning_rate") == [2, 4, 6, 8, 10]
    assert steps_of(scalars, "eval_loss") == evaluated
    assert steps_of(scalars, "eval_runtime") == evaluated
    assert "step" not in scalars

    run = mlflow_only_run(f"sqlite:///{tmp_path}/mlflow.db", "axes")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    assert [s for s, _ in mlflow_history(uri, run.info.run_id, "loss")] == [2, 4, 6, 8, 10]
    assert [s for s, _ in mlflow_history(uri, run.info.run_id, "eval_loss")] == evaluated
    assert "step" not in run.data.metrics
    # The two trackers hold the same points.
    assert by_step(mlflow_history(uri, run.info.run_id, "eval_loss")) == pytest.approx(
        by_step(scalars["eval_loss"])
    )

    params = run.data.params
    assert params["training_args.learning_rate"] == "0.01"
    assert params["training_args.max_steps"] == "10"
    assert params["training_args.eval_strategy"] == "steps"
    assert params["training_args.logging_steps"] == "2"
    assert params["step_metric"] == "step"
    assert "training_args.adam_beta1" not in params  # a default
    assert not any("token" in key for key in params)  # HF hides them; none were given
    ((step, config),) = tensorboard_texts(tmp_path / "tb")["config"]
    assert step == 0 and "| training_args.learning_rate | 0.01 |" in config


# --- Lightning -------------------------------------------------------------------------


def test_lightning_trackers_plot_at_the_global_step_and_hparams_are_params(
    tmp_path: Path,
) -> None:
    """Lightning logs every 2 steps and saves at 5 (a round of ``{"step": 5}`` alone): the
    loss at Lightning's steps 2, 4, 6, 8, 10, and the module's hparams as params."""
    pytest.importorskip("lightning", reason="pip install '.[lightning]'")
    from _lightning_model import Regression, make_trainer

    from adapters.lightning import EventBusCallback

    class WithHparams(Regression):
        def __init__(self, lr: float = 0.05, optimizer: str = "sgd") -> None:
            super().__init__()
            self.save_hyperparameters()

    make_trainer(tmp_path / "out", [EventBusCallback(loggers(tmp_path))]).fit(WithHparams(lr=0.02))

    scalars = rounds_only(tensorboard_scalars(tmp_path / "tb"))
    assert steps_of(scalars, "loss") == [2, 4, 6, 8, 10]
    assert "step" not in scalars
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    run = mlflow_only_run(uri, "axes")
    assert [s for s, _ in mlflow_history(uri, run.info.run_id, "loss")] == [2, 4, 6, 8, 10]
    params = run.data.params
    assert (params["hparams.lr"], params["hparams.optimizer"]) == ("0.02", "sgd")
    assert params["step_metric"] == "step"
    ((_, config),) = tensorboard_texts(tmp_path / "tb")["config"]
    assert "| hparams.lr | 0.02 |" in config


# --- failures ---------------------------------------------------------------------------


def test_a_restart_is_marked_at_the_step_of_the_failure_with_the_workers_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 fails once after its report of step 11; the group restarts from step 10's
    checkpoint and runs to step 30. The failure and the restart are at step 11 (the run's
    config names the step metric, as the framework adapters' do), not where the run
    stood when ``after_exception`` came."""
    monkeypatch.chdir(tmp_path)
    failed: list[int] = []

    async def train(reporter: Reporter) -> None:
        step = saved_step(reporter.latest_checkpoint, reporter.rank)
        while step < 30:
            step += 1
            checkpoint = save_checkpoint("runs/a", step, reporter.rank) if step % 10 == 0 else None
            await reporter.report({"loss": 1.0 / step, "step": step}, checkpoint)
            await reporter.sync()  # the rank fails once its round of step 11 is in
            if step == 11 and reporter.rank == 1 and not failed:
                failed.append(step)
                raise ValueError("rank 1 fails at step 11")

    async def job() -> None:
        async with open_run(
            world_size=2,
            callbacks=loggers(tmp_path),
            state_dir="runs/a",
            config={"step_metric": "step"},
        ) as run:
            await run.workers(train, max_restarts=1)

    anyio.run(job)
    texts = tensorboard_texts(tmp_path / "tb")
    assert texts["failures"] == [(11, "rank 1: ValueError: rank 1 fails at step 11")]
    assert texts["restarts"] == [(11, "worker group restarted: 2 workers")]
    run = mlflow_only_run(f"sqlite:///{tmp_path}/mlflow.db", "axes")
    tags = run.data.tags
    assert tags["eventbus.failures"] == "step 11: rank 1: ValueError: rank 1 fails at step 11"
    assert tags["eventbus.restarts"] == "step 11: worker group restarted: 2 workers"
    # The restarted group redoes step 11 (gathered, past the checkpoint) and goes on.
    assert max(step for step, _ in tensorboard_scalars(tmp_path / "tb")["loss"]) == 30


def test_a_hugging_face_failure_is_marked_at_its_step_with_its_own_type_across_a_resume(
    tmp_path: Path,
) -> None:
    """``train()`` fails in step 8 (after the round of step 6, past checkpoint-4), then
    again in the run resumed from checkpoint-4. Each time the failure is marked at step 6,
    as ``RuntimeError`` (not the ``WorkerError`` that carries it on the bus), in
    TensorBoard and in MLflow's tag (the latest), though the failure reaches the bus
    before the rounds of steps 4 and 6, which wait in the adapter's hand-off."""
    pytest.importorskip("transformers", reason="pip install '.[transformers]'")
    from adapters.transformers import EventBusCallback, run_with_failures

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    said = "rank 0: RuntimeError: forward failed at step 8"
    out = tmp_path / "out"
    first = hf_trainer(out, EventBusCallback(loggers(tmp_path)), evaluate=False, fail_at=8)
    with pytest.raises(RuntimeError, match="forward failed at step 8"):
        run_with_failures(first)
    assert tensorboard_texts(tmp_path / "tb")["failures"] == [(6, said)]
    run = mlflow_only_run(uri, "axes")
    assert (run.info.status, run.data.tags["eventbus.failures"]) == ("FAILED", f"step 6: {said}")

    # Resumed from checkpoint-4 (step 5 on): its 4th step is step 8 again.
    again = hf_trainer(out, EventBusCallback(loggers(tmp_path)), evaluate=False, fail_at=4)
    with pytest.raises(RuntimeError, match="forward failed at step 4"):
        run_with_failures(again, resume_from_checkpoint=str(out / "checkpoint-4"))
    resaid = "rank 0: RuntimeError: forward failed at step 4"
    # TensorBoard's reader keeps the first attempt's mark (its purge drops the redone
    # scalars, not text), so each attempt's failure is there, at its step.
    assert tensorboard_texts(tmp_path / "tb")["failures"] == [(6, said), (6, resaid)]
    run = mlflow_only_run(uri, "axes")
    assert run.data.tags["eventbus.failures"] == f"step 6: {resaid}"
    assert steps_of(rounds_only(tensorboard_scalars(tmp_path / "tb")), "loss") == [2, 4, 6]
