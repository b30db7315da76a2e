"""The trackers across a failure and a resume, through the trainers' hooks: read back, the
same as an uninterrupted run's.

A run fails after a round its last checkpoint does not cover, and is resumed from
that checkpoint with fresh ``TensorBoardLogger`` and ``MLflowLogger`` objects given the
same directory and tracking URI. What TensorBoard's reader and MLflow's client then
read must be the uninterrupted run's: every round scalar, at the same steps, each step
once; both attempts in one TensorBoard directory (two event files, the second
purging the rolled-back steps the first really holds) and in one MLflow run, which
ends ``FINISHED``. Through Lightning (``fit(ckpt_path="last")``) and the Hugging Face
Trainer (``train(resume_from_checkpoint=...)``); through ``open_run(engine=RayEngine())``
the same checks run on tests/adapter_tests/test_ray_engine.py's jobs (one Ray job each).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[lightning]')")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
pytest.importorskip("mlflow", reason="MLflow is not installed (pip install '.[mlflow]')")

from _tracker_resume import (  # noqa: E402
    Trackers,
    check_failed_attempt,
    check_resumed_as_uninterrupted,
)

from adapters._options import BusRuns  # noqa: E402

BUS_RUNS: list[BusRuns] = ["in_hooks", "in_thread"]


def trackers(tmp_path: Path, step_metric: str | None) -> tuple[Trackers, Trackers]:
    """An uninterrupted run's trackers and an interrupted one's, in one MLflow database."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return (
        Trackers(tmp_path, uri, "uninterrupted", step_metric),
        Trackers(tmp_path, uri, "resumed", step_metric),
    )


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
