"""Our callbacks on a Hugging Face Trainer: train, checkpoint, resume with callback state.

A tiny GPT-2 built from a config (no hub download) learns random token
sequences on the CPU for 10 steps, with ``EarlyStopping`` (stateful) and a
stateful counter behind ``EventBusCallback``. A second Trainer then resumes
from ``checkpoint-10`` for 5 more steps: our callbacks come back with their
state, read from the checkpoint's ``callback_state.json``.

    pip install torch==2.13.0 && pip install -e '.[transformers]'
    python examples/hf_trainer.py [output_dir]
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

for _name in (
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HUB_DISABLE_TELEMETRY",
    "HF_HUB_DISABLE_PROGRESS_BARS",
):
    os.environ.setdefault(_name, "1")

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    PrinterCallback,
    Trainer,
    TrainingArguments,
)
from transformers import logging as hf_logging  # noqa: E402

from adapters.transformers import EventBusCallback, run_with_failures  # noqa: E402
from eventbus import StatefulCallback, TrainRunContext  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from handlers import EarlyStopping, UserCallback  # noqa: E402

VOCAB, LENGTH = 64, 16


class RandomTokens(Dataset):  # type: ignore[misc]  # torch is untyped to mypy
    def __init__(self, n: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


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
        print(f"  round {self.rounds:2d}  step {metrics[0]['step']:2d}  loss {loss}")


def make_trainer(output_dir: str, max_steps: int, callback: EventBusCallback) -> Any:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=8,
        logging_steps=2,
        save_steps=5,
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
        log_level="error",
    )
    trainer = Trainer(
        model=GPT2LMHeadModel(config),
        args=args,
        train_dataset=RandomTokens(),
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # our tracker prints the rounds
    return trainer


def main() -> int:
    hf_logging.set_verbosity_error()
    output_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="hf_trainer_")

    print(f"== training 10 steps into {output_dir}")
    tracker = LossTracker()
    callback = EventBusCallback([tracker, EarlyStopping("loss", patience=20)], log=True)
    run_with_failures(make_trainer(output_dir, 10, callback))
    print(f"  tracker: rounds={tracker.rounds} lowest={tracker.lowest}")
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    print(f"  event log {callback.log_path.name}: {len(events)} events")

    print("== resuming from checkpoint-10 for 5 more steps, with fresh callbacks")
    resumed = EventBusCallback([LossTracker(), EarlyStopping("loss", patience=20)])
    trainer = make_trainer(output_dir, 15, resumed)
    run_with_failures(trainer, resume_from_checkpoint=os.path.join(output_dir, "checkpoint-10"))
    assert resumed.restored is not None
    print(f"  restored: {', '.join(resumed.restored.restored)}")
    restored_tracker, early_stopping = resumed.callbacks
    print(
        f"  tracker: rounds={restored_tracker.rounds} (5 when checkpoint-10 was saved) "
        f"lowest={restored_tracker.lowest}"
    )
    print(f"  early stopping: best={early_stopping.best} rounds={early_stopping.rounds}")
    print(f"  stopped at step {trainer.state.global_step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
