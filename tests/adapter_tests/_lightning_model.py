"""A tiny Lightning model and trainer for the adapter's tests (CPU, a few steps, no downloads)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from eventbus import StatefulCallback, TrainRunContext
from handlers import UserCallback

BATCHES_PER_EPOCH = 8


class Regression(pl.LightningModule):  # type: ignore[misc]  # lightning is untyped to mypy
    """A linear regression that logs its loss and its rank every step; it can fail at a step."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)
        self.fail_at_step = fail_at_step

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.global_step + 1 == self.fail_at_step:
            raise RuntimeError(f"training_step failed at step {self.fail_at_step}")
        x, y = batch
        loss = nn.functional.mse_loss(self.lin(x).squeeze(-1), y)
        self.log("loss", loss)
        self.log("rank", float(self.global_rank))
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self) -> Any:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(4 * BATCHES_PER_EPOCH, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=4)


def make_trainer(root: Path, callbacks: list[Any], **overrides: Any) -> Any:
    """A CPU Trainer writing under ``root``: a log every 2 steps, a checkpoint every 5
    (every one kept) and ``last.ckpt``, no logger files, no progress bar."""
    checkpoint = pl.callbacks.ModelCheckpoint(
        dirpath=root / "checkpoints", every_n_train_steps=5, save_top_k=-1, save_last=True
    )
    options: dict[str, Any] = {
        "default_root_dir": str(root),
        "max_steps": 10,
        "log_every_n_steps": 2,
        "accelerator": "cpu",
        "devices": 1,
        "logger": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [*callbacks, checkpoint],
        **overrides,
    }
    return pl.Trainer(**options)


class NthRoundCounter(UserCallback, StatefulCallback):
    """A stateful callback counting every ``every``-th round, and its step; two of them,
    told apart by their ``state_key``."""

    state_args = ("every",)
    state_attributes = ("seen", "rounds", "last_step")

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.seen = 0
        self.rounds = 0
        self.last_step = -1

    @property
    def state_key(self) -> str:
        return f"every={self.every}"

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.seen += 1
        if (self.seen - 1) % self.every == 0:
            self.rounds += 1
            self.last_step = metrics[0]["step"]
