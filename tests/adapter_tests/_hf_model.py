"""The tiny Hugging Face job the adapter tests share (no downloads): a linear
regression on 4 features, trained on CPU by a real ``Trainer`` that logs, evaluates and
saves as its arguments say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn


class TinyModel(nn.Module):  # type: ignore[misc]  # torch is untyped to mypy
    """``fail_at_step``: the training forward pass of that step raises (counted from the
    start of this model's ``train()``), a crash in the middle of a run."""

    def __init__(self, fail_at_step: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 1)
        self.fail_at_step = fail_at_step
        self.steps = 0

    def forward(self, x: Any, y: Any) -> dict[str, Any]:
        if self.training:
            self.steps += 1
            if self.steps == self.fail_at_step:
                raise RuntimeError(f"forward failed at step {self.steps}")
        return {"loss": nn.functional.mse_loss(self.lin(x).squeeze(-1), y)}


class Regression(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 4, generator=generator)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": self.y[i]}


def tiny_trainer(
    output_dir: Path,
    callback: Any,
    *,
    fail_at_step: int | None = None,
    size: int = 64,
    evaluate: bool = False,
    **arguments: Any,
) -> Any:
    """A ``Trainer`` of ``TinyModel`` on ``size`` examples (also its evaluation set when
    it ``evaluate``s), batches of 4, with ``callback`` and ``TrainingArguments`` given."""
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=size,
        label_names=["y"],
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **arguments,
    )
    data = Regression(size)
    return transformers.Trainer(
        model=TinyModel(fail_at_step),
        args=args,
        train_dataset=data,
        eval_dataset=data if evaluate else None,
        callbacks=[callback],
    )
