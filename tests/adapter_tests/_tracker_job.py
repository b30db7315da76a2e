"""A two-rank ``open_run`` job writing to TensorBoard and MLflow, SIGKILLed at a chosen step.

    python _tracker_job.py WORK KILL_AT [--resume] [--live] [--kill-in-flush]

Runs in ``WORK`` with relative paths (``runs/job``, ``runs/tb``,
``sqlite:///runs/mlflow.db``), as the README types them: 12 steps, a checkpoint every
4. A rank's loss is a function of its rank and step, so every attempt reports the same
values; ``attempt`` says which attempt wrote a step. With ``KILL_AT`` > 0 the process
SIGKILLs itself once the round of that step has reached both trackers' writers (and
TensorBoard's file: its writer flushes every 50 ms here): nothing of Python's shutdown
runs, as when an operator or the OOM killer kills a job. With ``--kill-in-flush`` it is
killed in the middle of MLflow's write at the checkpoint of step ``KILL_AT`` instead: the
store has the first half of that write's rows (the rounds since the checkpoint before).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import anyio

import adapters.mlflow
from adapters.mlflow import MLflowLogger
from adapters.tensorboard import TensorBoardLogger
from handlers import Reporter, WorkerFn, open_run

STEPS = 12
EVERY = 4


def save_checkpoint(root: str, step: int, rank: int) -> str:
    """A rank's checkpoint of ``step``: its step, in ``root/checkpoint_<step>``."""
    folder = Path(root, f"checkpoint_{step:06d}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step}))
    return str(folder)


def saved_step(checkpoint: str | None, rank: int) -> int:
    """The step a rank's checkpoint holds (0 without one)."""
    if checkpoint is None:
        return 0
    return int(json.loads(Path(checkpoint, f"rank_{rank}.json").read_text())["step"])


def worker(attempt: int, kill_at: int) -> WorkerFn:
    async def train(reporter: Reporter) -> None:
        step = saved_step(reporter.latest_checkpoint, reporter.rank)
        while step < STEPS:
            step += 1
            checkpoint = None
            if step % EVERY == 0:
                checkpoint = save_checkpoint("runs/job", step, reporter.rank)
            loss = 1.0 / step + reporter.rank
            await reporter.report({"loss": loss, "step": step, "attempt": attempt}, checkpoint)
            await reporter.sync()  # the round is through the callbacks
            if step == kill_at:
                await anyio.sleep(0.5)  # TensorBoard's writer flushes every 50 ms
                os.kill(os.getpid(), signal.SIGKILL)

    return train


def kill_in_flush(step: int) -> None:
    """SIGKILL this process halfway through MLflow's write at the checkpoint of ``step``."""
    adapters.mlflow._HOLD_SECS = 3600.0  # only the checkpoints write, however slow the machine
    flush = MLflowLogger._flush

    def flushing(self: MLflowLogger) -> None:
        if self.last_step == step - 1:  # the checkpoint's round is the last one given
            write = self._client.log_batch

            def torn(run_id: str, metrics: Any = (), **kwargs: Any) -> None:
                if metrics:
                    write(run_id, metrics=metrics[: len(metrics) // 2])
                    os.kill(os.getpid(), signal.SIGKILL)
                write(run_id, metrics=metrics, **kwargs)

            self._client.log_batch = torn
        flush(self)

    MLflowLogger._flush = flushing  # type: ignore[method-assign]


async def main(kill_at: int, resume: bool, live: bool) -> None:
    attempt = 2 if resume else 1
    trackers = [
        TensorBoardLogger("runs/tb", flush_secs=0.05),
        MLflowLogger("sqlite:///runs/mlflow.db", "jobs", live=live),
    ]
    async with open_run(
        world_size=2,
        callbacks=trackers,
        state_dir="runs/job",
        resume_from="runs/job" if resume else None,
        config={"lr": 0.1, "optimizer": {"name": "sgd", "momentum": 0.9}},
    ) as run:
        await run.workers(worker(attempt, kill_at))


if __name__ == "__main__":
    work, kill_at, *flags = sys.argv[1:]
    os.chdir(work)
    if "--kill-in-flush" in flags:
        kill_in_flush(int(kill_at))
        kill_at = "0"
    anyio.run(main, int(kill_at), "--resume" in flags, "--live" in flags)
