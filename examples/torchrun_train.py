"""One worker function and its callbacks, run under torchrun: ``open_run(engine=TorchrunEngine())``.

Every process torchrun starts runs this script. ``train`` is an ordinary
``open_run`` worker around a DDP step (its own gloo process group, which the
engine does not touch): it resumes from ``reporter.latest_checkpoint``,
reads its learning rate from a callback, reports every step (rank 0 a
checkpoint every other step), syncs, and stops when a callback says so.
Rank 0 hosts the run: its callbacks, ``--out`` folder and log. Run it again
with the same ``--out`` and the run resumes from its latest checkpoint, the
callbacks' states with it (as does a restart by torchrun's ``--max-restarts``).
``--summary FILE.json`` has rank 0 write the run's status, its rounds, what
stopped it and the callbacks' final states.

    pip install torch==2.13.0 && pip install -e .
    torchrun --standalone --nproc-per-node 2 examples/torchrun_train.py --out runs/t
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import anyio

from adapters.torchrun import TorchrunEngine
from eventbus import RunResult, StatefulCallback, TrainRunContext
from handlers import EarlyStopping, Reporter, UserCallback, open_run

STEPS = 40


async def train(reporter: Reporter) -> None:
    """A rank's training loop: the same on the local engine, on Ray and on torchrun."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(reporter.rank)
    inputs = torch.randn(64, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3 * torch.randn(64, 1)
    torch.manual_seed(0)  # every rank starts from the same model (as DDP checks)
    model = torch.nn.Linear(4, 1)
    start = 0
    if reporter.latest_checkpoint is not None:  # resumed: a new launch, or torchrun's restart
        saved = torch.load(Path(reporter.latest_checkpoint, "model.pt"))
        model.load_state_dict(saved["model"])
        start = saved["step"] + 1
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(start, STEPS):
        for group in optimizer.param_groups:  # the learning rate the callbacks chose
            group["lr"] = reporter.from_callbacks.get("HalveOnPlateau", {}).get("lr", 0.1)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        loss.backward()  # the gradients' all-reduce, on the job's own process group
        optimizer.step()
        metrics = {"step": step, "loss": round(loss.item(), 4)}
        if step % 2 == 1 and dist.get_rank() == 0:  # one copy of the model is enough
            with tempfile.TemporaryDirectory() as folder:  # any local folder: it is copied
                torch.save({"model": model.state_dict(), "step": step}, f"{folder}/model.pt")
                await reporter.report(metrics, checkpoint=folder)
        else:
            await reporter.report(metrics)
        await reporter.sync()  # every rank sees the callbacks' answer to this round
        if reporter.should_stop:
            return


class HalveOnPlateau(UserCallback, StatefulCallback):
    """Halves the learning rate when the loss stops improving; workers read ``lr``."""

    state_attributes = ("lr", "best")

    def __init__(self, lr: float = 0.1, threshold: float = 0.01) -> None:
        self.lr, self.threshold = lr, threshold
        self.best: float | None = None

    @property
    def for_workers(self) -> dict[str, float]:
        return {"lr": self.lr}

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        loss = max(m["loss"] for m in metrics)
        if self.best is None or loss < self.best - self.threshold:
            self.best = loss
        else:
            self.lr /= 2


class Console(UserCallback):
    """Prints what it gets, and keeps the rounds: in rank 0, which hosts the run."""

    def __init__(self) -> None:
        self.rounds: list[list[dict[str, Any]]] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        print(f"run {run_context.run_id}: {run_context.world_size} workers")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append([dict(m) for m in metrics])
        saved = f", checkpoint {Path(checkpoint).name}" if checkpoint else ""
        print(f"step {metrics[0]['step']}: losses {[m['loss'] for m in metrics]}{saved}")

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        for rank, exc in sorted(worker_exceptions.items()):
            print(f"rank {rank} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        print(f"run ended: {result.status}, {result.rounds} rounds")


async def main(out: Path, resume: bool) -> dict[str, Any] | None:
    """Run this rank's worker; on rank 0, the run's summary (``None`` elsewhere)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")  # the job's own group, for DDP
    console, plateau = Console(), HalveOnPlateau()
    stopper = EarlyStopping("loss", patience=3, threshold=0.001)
    run = open_run(
        world_size=int(os.environ["WORLD_SIZE"]),
        callbacks=[console, plateau, stopper],
        state_dir=out,
        resume_from=out if resume else None,
        log=out / "events.evlog",
        engine=TorchrunEngine(),
    )
    try:
        async with run:
            await run.workers(train)
    finally:
        dist.destroy_process_group()
    if not run.hosted:  # ranks but 0: the run, its result and its summary are rank 0's
        return None
    result = run.result
    print(f"stopped by {result.stopped_by}; learning rate now {plateau.lr}")
    states = {type(cb).__name__: dict(cb.state()["attributes"]) for cb in (plateau, stopper)}
    return {
        "status": result.status,
        "rounds": console.rounds,
        "stopped_by": result.stopped_by,
        "states": states,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the run's folder (rank 0's)")
    parser.add_argument("--summary", type=Path, help="a JSON file rank 0 writes at the end")
    args = parser.parse_args()
    # A run was here (an earlier launch, or this one before torchrun restarted it).
    resume = args.out.is_dir() and any(args.out.glob("checkpoint_*"))
    summary = anyio.run(main, args.out, resume)
    if summary is not None and args.summary is not None:
        args.summary.write_text(json.dumps(summary, indent=1))
    raise SystemExit(0 if summary is None or summary["status"] == "finished" else 1)
