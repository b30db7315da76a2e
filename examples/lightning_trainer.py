"""Our callbacks on a PyTorch Lightning Trainer: train, checkpoint, fail, resume with state.

A tiny regression trains on the CPU with ``EarlyStopping`` (stateful) and a
stateful tracker behind ``EventBusCallback``; ``ModelCheckpoint`` saves every
5 steps and ``last.ckpt``. The first ``fit`` fails at step 8 (an injected
error): our callbacks get it in ``after_exception`` and ``after_run``. A
second ``fit(ckpt_path="last")`` resumes from step 5 with the same callback
objects: they come back with their state as of that checkpoint, in place.

    pip install torch==2.13.0 && pip install -e '.[lightning]'
    python examples/lightning_trainer.py [root_dir]
"""

from __future__ import annotations

import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from adapters.lightning import EventBusCallback
from eventbus import RunResult, StatefulCallback, TrainRunContext
from eventbus.log import read_log
from handlers import EarlyStopping, UserCallback


class Regression(pl.LightningModule):  # type: ignore[misc]  # lightning is untyped to mypy
    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)
        self.fail_at_step = fail_at_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_step + 1 == self.fail_at_step:
            raise RuntimeError(f"injected failure at step {self.fail_at_step}")
        x, y = batch
        loss = nn.functional.mse_loss(self.lin(x).squeeze(-1), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> Any:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=4)


class LossTracker(UserCallback, StatefulCallback):
    """Counts rounds and keeps the lowest loss: its state survives the resume."""

    state_attributes = ("rounds", "lowest")

    def __init__(self) -> None:
        self.rounds = 0
        self.lowest: float | None = None

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1
        loss = metrics[0].get("loss")
        if isinstance(loss, float) and (self.lowest is None or loss < self.lowest):
            self.lowest = loss
        saved = f"  saved {Path(checkpoint).name}" if checkpoint else ""
        print(f"  round {self.rounds:2d}  step {metrics[0]['step']:2d}  loss {loss}{saved}")

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        for rank, exc in worker_exceptions.items():
            print(f"  rank {rank} failed: {exc}")

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        print(f"  run ended: {result.status}, {result.rounds} rounds")


def make_trainer(root: str, callback: EventBusCallback) -> Any:
    checkpoints = ModelCheckpoint(
        dirpath=Path(root, "checkpoints"), every_n_train_steps=5, save_top_k=-1, save_last=True
    )
    return pl.Trainer(
        default_root_dir=root,
        max_steps=15,
        log_every_n_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback, checkpoints],
    )


def main() -> int:
    warnings.filterwarnings("ignore", module="lightning")  # its advice for real jobs
    root = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="lightning_trainer_")
    tracker, early_stopping = LossTracker(), EarlyStopping("loss", patience=20)

    print(f"== training into {root}; step 8 fails")
    callback = EventBusCallback([tracker, early_stopping], log=True)
    try:
        make_trainer(root, callback).fit(Regression(fail_at_step=8))
    except RuntimeError as exc:
        print(f"  fit() raised: {exc}")
    assert callback.log_path is not None
    print(f"  event log {callback.log_path.name}: {len(read_log(callback.log_path).events)} events")

    print("== resuming from last.ckpt (step 5), the same callback objects")
    resumed = EventBusCallback([tracker, early_stopping])
    trainer = make_trainer(root, resumed)
    trainer.fit(Regression(), ckpt_path="last")
    assert resumed.restored is not None and resumed.callbacks[0] is tracker
    print(f"  restored in place: {', '.join(resumed.restored.restored)}")
    print(f"  tracker: rounds={tracker.rounds} lowest={tracker.lowest}")
    print(f"  early stopping: best={early_stopping.best} rounds={early_stopping.rounds}")
    print(f"  stopped at step {trainer.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
