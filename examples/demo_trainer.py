"""A data-parallel async trainer with callbacks: the example to copy.

Four workers fit a line by SGD (the model and data below are a stand-in:
swap in yours), report their loss every step and a checkpoint every ten.
Rounds of reports reach the callbacks once every rank has reported; a worker
failure reaches ``after_exception`` and the group restarts from the latest
complete checkpoint.

    python examples/demo_trainer.py
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from eventbus import TrainRunContext
from handlers import BestCheckpoints, EarlyStopping, Reporter, UserCallback, open_run


def make_data(seed: int, samples: int = 256) -> list[tuple[float, float]]:
    """This rank's shard: noisy points of the line y = 3x + 1."""
    rng = random.Random(seed)
    points = [rng.uniform(-1, 1) for _ in range(samples)]
    return [(x, 3 * x + 1 + rng.gauss(0, 0.1)) for x in points]


@dataclass
class Line:
    """The model, y = w*x + b; its checkpoint is its JSON."""

    w: float = 0.0
    b: float = 0.0
    step: int = 0

    def sgd_step(self, batch: list[tuple[float, float]], lr: float) -> float:
        """One step down the mean squared error's gradient; the batch's loss before it."""
        errors = [(self.w * x + self.b - y, x) for x, y in batch]
        self.w -= lr * 2 * sum(e * x for e, x in errors) / len(batch)
        self.b -= lr * 2 * sum(e for e, _ in errors) / len(batch)
        self.step += 1
        return sum(e * e for e, _ in errors) / len(batch)


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
        model = Line()
        if reporter.latest_checkpoint:  # restarted: resume from the last complete round
            path = anyio.Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json")
            model = Line(**json.loads(await path.read_text()))
        data = make_data(reporter.rank + 1)
        rng = random.Random(reporter.rank)
        while model.step < steps and not reporter.should_stop:
            if reporter.rank == 1 and reporter.attempt == 0 and model.step == steps // 2:
                raise RuntimeError("simulated failure")
            loss = model.sgd_step(rng.sample(data, 16), lr=0.05)
            checkpoint: str | None = None
            if model.step % 10 == 0:
                folder = anyio.Path(out, f"step_{model.step:04d}")
                await folder.mkdir(exist_ok=True)
                await (folder / f"rank_{reporter.rank}.json").write_text(json.dumps(asdict(model)))
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
