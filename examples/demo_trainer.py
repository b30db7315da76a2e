"""A data-parallel async trainer with callbacks: the example to copy.

Four workers fit a linear model by SGD (the model and data come from the
demo, ``adapters.demo``; swap in yours), report their loss every step and a
checkpoint every ten. Rounds of reports reach the callbacks once every rank
has reported; a worker failure reaches ``after_exception`` and the group
restarts from the latest complete checkpoint.

    python examples/demo_trainer.py
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

import anyio

from adapters.demo import LinearModel, make_shard
from handlers import (
    BestCheckpoints,
    EarlyStopping,
    Reporter,
    TrainRunContext,
    UserCallback,
    open_run,
)


class PrintFailures(UserCallback):
    """A user callback: any method may be sync or async; each runs under the bus's deadline."""

    async def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        for rank, exc in worker_exceptions.items():
            print(f"rank {rank} failed: {exc}")


async def main(out: Path, steps: int = 60) -> None:
    best = BestCheckpoints("loss", k=2)

    async def train(reporter: Reporter) -> None:
        model = LinearModel()
        if reporter.latest_checkpoint:  # restarted: resume from the last complete round
            path = anyio.Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json")
            model = LinearModel.from_json(await path.read_text())
        data = make_shard(reporter.rank + 1, 256)
        rng = random.Random(reporter.rank)
        while model.step < steps and not reporter.should_stop:
            if reporter.rank == 1 and reporter.attempt == 0 and model.step == steps // 2:
                raise RuntimeError("simulated failure")
            loss = model.sgd_step(rng.sample(data, 16), lr=0.05)
            checkpoint: str | None = None
            if model.step % 10 == 0:
                folder = anyio.Path(out, f"step_{model.step:04d}")
                await folder.mkdir(exist_ok=True)
                await (folder / f"rank_{reporter.rank}.json").write_text(model.to_json())
                checkpoint = str(folder)
            metrics: dict[str, Any] = {"loss": loss}
            await reporter.report(metrics, checkpoint=checkpoint)
            await anyio.sleep(0.005 * (1 + reporter.rank))  # ranks run at different rates

    callbacks = [EarlyStopping("loss", patience=10), best, PrintFailures()]
    async with open_run(world_size=4, callbacks=callbacks, name="example", period=0.5) as run:
        await run.workers(train, max_restarts=1)
    print(run.result)
    print("best checkpoint:", best.best)


if __name__ == "__main__":
    anyio.run(main, Path(tempfile.mkdtemp(prefix="example-")))
