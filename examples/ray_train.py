"""One worker function and its callbacks, run on Ray Train: ``open_run(engine=RayEngine())``.

``train`` is an ordinary ``open_run`` worker: it resumes from
``reporter.latest_checkpoint``, reads its learning rate from a callback,
reports a checkpoint (a local folder it wrote) every other step, syncs, and
stops when a callback says so. Leave out ``engine=`` and the same code runs
as local tasks; with it, each rank is a Ray Train worker on a local
cluster (2 CPUs). Rank 1 fails once, at step 5: Ray restarts the worker
group (``max_restarts=1``), the workers resume from the latest checkpoint,
and the callbacks, in this process, keep going. Run it again with the same
folder and the run resumes from its latest checkpoint instead of starting over.

    pip install torch==2.13.0 && pip install -e '.[ray]'
    python examples/ray_train.py [state_dir]
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

for _name, _value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}.items():
    os.environ.setdefault(_name, _value)

import anyio  # noqa: E402

from adapters.ray import RayEngine  # noqa: E402
from eventbus import RunResult, StatefulCallback, TrainRunContext  # noqa: E402
from handlers import EarlyStopping, Reporter, UserCallback, open_run  # noqa: E402

STEPS = 40
FAILING_RANK, FAILS_AT = 1, 5


async def train(reporter: Reporter) -> None:
    """A rank's training loop: the same on the local engine and on Ray."""
    import torch

    torch.manual_seed(reporter.rank)
    inputs = torch.randn(64, 4)
    targets = inputs @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.3 * torch.randn(64, 1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if reporter.latest_checkpoint is not None:  # resumed: after a restart or a new run
        saved = torch.load(Path(reporter.latest_checkpoint, f"rank{reporter.rank}.pt"))
        model.load_state_dict(saved["model"])
        start = saved["step"] + 1
    for step in range(start, STEPS):
        if reporter.attempt == 0 and reporter.rank == FAILING_RANK and step == FAILS_AT:
            raise RuntimeError(f"injected failure on rank {reporter.rank} at step {step}")
        for group in optimizer.param_groups:  # the learning rate the callbacks chose
            group["lr"] = reporter.from_callbacks.get("HalveOnPlateau", {}).get("lr", 0.1)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        metrics = {"step": step, "loss": round(loss.item(), 4)}
        if step % 2 == 1:
            with tempfile.TemporaryDirectory() as folder:  # any local folder: it is copied
                torch.save(
                    {"model": model.state_dict(), "step": step}, f"{folder}/rank{reporter.rank}.pt"
                )
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
    """Prints what it gets: in this process, whichever engine runs the workers."""

    def before_run(self, run_context: TrainRunContext) -> None:
        print(f"run {run_context.run_id}: {run_context.world_size} workers")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        saved = f", checkpoint {Path(checkpoint).name}" if checkpoint else ""
        print(f"step {metrics[0]['step']}: losses {[m['loss'] for m in metrics]}{saved}")

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        for rank, exc in sorted(worker_exceptions.items()):
            print(f"rank {rank} failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        print(f"run ended: {result.status}, {result.rounds} rounds, {result.restarts} restart(s)")


async def main(state_dir: Path, resume: bool) -> RunResult:
    plateau = HalveOnPlateau()
    run = open_run(
        world_size=2,
        callbacks=[Console(), plateau, EarlyStopping("loss", patience=3, threshold=0.001)],
        state_dir=state_dir,
        resume_from=state_dir if resume else None,
        log=state_dir / "events.evlog",
        engine=RayEngine(init={"num_cpus": 2, "include_dashboard": False}),
    )
    async with run:
        await run.workers(train, max_restarts=1)
    result = run.result
    print(f"stopped by {result.stopped_by}; learning rate now {plateau.lr}")
    return result


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ray_train_"))
    resume = folder.is_dir() and any(folder.glob("checkpoint_*"))  # a run was here
    result = anyio.run(main, folder, resume)
    sys.exit(0 if result.status == "finished" else 1)
