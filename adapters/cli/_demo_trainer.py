"""The demo trainer behind ``eventbus demo``: data-parallel linear regression in pure Python.

N workers (anyio tasks) each fit a linear model by minibatch SGD on their own
shard of generated data, report the loss every step, and write a JSON
checkpoint every few steps; one rank may be told to fail once, in which case
the group restarts from the latest complete checkpoint. The built-in
callbacks are attached; the summary comes from the run's own figures.
``examples/demo_trainer.py`` is the short version to copy.
"""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

from eventbus import BudgetReport, CheckpointSaved
from handlers import (
    BestCheckpoints,
    EarlyStopping,
    MetricsLogger,
    ProgressDisplay,
    Reporter,
    open_run,
)

__all__ = ["DemoSummary", "LinearModel", "make_shard", "run_demo"]

FEATURES = 4


def make_shard(seed: int, samples: int) -> list[tuple[list[float], float]]:
    """Samples of ``y = w.x + b + noise``; every shard shares ``w`` and ``b`` (from seed 0)."""
    truth = random.Random(0)
    w = [truth.uniform(-2, 2) for _ in range(FEATURES)]
    b = truth.uniform(-1, 1)
    rng = random.Random(seed)
    data = []
    for _ in range(samples):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        data.append((x, sum(wi * xi for wi, xi in zip(w, x, strict=True)) + b + rng.gauss(0, 0.1)))
    return data


@dataclass
class LinearModel:
    weights: list[float] = field(default_factory=lambda: [0.0] * FEATURES)
    bias: float = 0.0
    step: int = 0

    def sgd_step(self, batch: list[tuple[list[float], float]], lr: float) -> float:
        """One minibatch step of mean-squared-error SGD; returns the batch loss before it."""
        grad_w = [0.0] * len(self.weights)
        grad_b = 0.0
        loss = 0.0
        for x, y in batch:
            err = sum(w * xi for w, xi in zip(self.weights, x, strict=True)) + self.bias - y
            loss += err * err
            for i, xi in enumerate(x):
                grad_w[i] += 2 * err * xi
            grad_b += 2 * err
        n = len(batch)
        self.weights = [w - lr * g / n for w, g in zip(self.weights, grad_w, strict=True)]
        self.bias -= lr * grad_b / n
        self.step += 1
        return loss / n

    def to_json(self) -> str:
        return json.dumps({"weights": self.weights, "bias": self.bias, "step": self.step})

    @classmethod
    def from_json(cls, text: str) -> LinearModel:
        data = json.loads(text)
        return cls(
            weights=[float(w) for w in data["weights"]],
            bias=float(data["bias"]),
            step=int(data["step"]),
        )


@dataclass
class DemoSummary:
    out: Path
    rounds: int = 0
    reports: int = 0
    checkpoints: int = 0
    failures: int = 0
    restarts: int = 0
    stopped_early: bool = False
    best_checkpoint: str | None = None
    final_loss: float | None = None
    status: str = ""
    callback_seconds: dict[str, float] = field(default_factory=dict)
    periods: int = 0
    log: Path | None = None
    resumed_from: Path | None = None
    restored: tuple[str, ...] = ()
    early_stopping: str = ""

    def lines(self) -> list[str]:
        total = sum(self.callback_seconds.values())
        worst = sorted(self.callback_seconds.items(), key=lambda kv: kv[1], reverse=True)[:4]
        loss = f"{self.final_loss:.5f}" if self.final_loss is not None else "n/a"
        resumed = (
            [f"resumed from {self.resumed_from}: restored {_class_names(self.restored)}"]
            if self.resumed_from is not None
            else []
        )
        return [
            *resumed,
            f"run {self.status}: {self.rounds} rounds from {self.reports} reports",
            f"checkpoints: {self.checkpoints} in {self.out} (best by loss: {self.best_checkpoint})",
            f"failures: {self.failures}, restarts: {self.restarts}, "
            f"stopped early: {'yes' if self.stopped_early else 'no'}, final mean loss: {loss}",
            f"early stopping: {self.early_stopping}",
            f"callback time: {total * 1e3:.3f} ms over {self.periods} health-check periods"
            + "".join(f"\n  {name}: {sec * 1e3:.3f} ms" for name, sec in worst),
            *([f"event log: {self.log}"] if self.log is not None else []),
        ]


def _class_names(keys: tuple[str, ...]) -> str:
    """``pkg.mod.Class[state key]`` -> ``Class``: the summary names what was restored."""
    return ", ".join(key.split("[")[0].rsplit(".", 1)[-1] for key in keys) or "nothing"


def _demo_checkpoint(path: Path, workers: int) -> Path:
    """``path`` resolved, once it is known to hold a checkpoint of every rank."""
    path = path.resolve()
    missing = [r for r in range(workers) if not (path / f"rank_{r}.json").is_file()]
    if missing:
        raise ValueError(
            f"{path}: not a demo checkpoint of {workers} ranks (no rank_{missing[0]}.json)"
        )
    return path


async def run_demo(
    *,
    workers: int = 4,
    steps: int = 100,
    checkpoint_every: int = 10,
    fail_rank: int | None = None,
    out: Path | None = None,
    seed: int = 0,
    period: float = 0.5,
    step_time: float = 0.01,
    lr: float = 0.05,
    progress: TextIO | None = None,
    resume: Path | None = None,
    log: bool = True,
) -> DemoSummary:
    """Train, and return what happened (see the module docstring).

    ``resume``: a checkpoint of an earlier demo run; the workers start from
    its weights and the callbacks from their saved state, in the same run
    directory (unless ``out`` says otherwise). ``log``: record the run's
    events to ``<out>/<run id>.evlog``.
    """
    if workers < 1 or steps < 1 or checkpoint_every < 1:
        raise ValueError("workers, steps and checkpoint_every must be at least 1")
    if fail_rank is not None and not 0 <= fail_rank < workers:
        raise ValueError(f"--fail-rank {fail_rank} is outside 0..{workers - 1}")
    if resume is not None:
        resume = _demo_checkpoint(resume, workers)
        out = out if out is not None else resume.parent
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="eventbus-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    log_path = out / f"{run_id}.evlog" if log else None
    summary = DemoSummary(out=out, log=log_path, resumed_from=resume)
    stopping = EarlyStopping("loss", patience=20, threshold=1e-4)
    best = BestCheckpoints("loss", k=3)
    callbacks = [
        stopping,
        best,
        MetricsLogger(every=max(1, steps // 4)),
        ProgressDisplay(progress if progress is not None else sys.stderr),
    ]
    last_losses: dict[int, float] = {}

    async def train(reporter: Reporter) -> None:
        rank = reporter.rank
        model = LinearModel()
        # A restart resumes where the group was; a resumed run, from its checkpoint.
        source = reporter.latest_checkpoint or (str(resume) if resume is not None else None)
        if source is not None:
            text = await anyio.Path(source, f"rank_{rank}.json").read_text()
            model = LinearModel.from_json(text)
        data = make_shard(seed * 1000 + rank + 1, 256)
        rng = random.Random(seed * 1000 + rank + 1 + 7919 * reporter.attempt)
        pace = step_time * (1 + 0.5 * rank / max(1, workers - 1))  # ranks run at different rates
        while model.step < steps and not reporter.should_stop:
            if rank == fail_rank and reporter.attempt == 0 and model.step == steps // 2:
                raise RuntimeError(f"rank {rank} lost its device at step {model.step} (demo)")
            loss = model.sgd_step(rng.sample(data, 16), lr)
            checkpoint = None
            if model.step % checkpoint_every == 0:
                folder = anyio.Path(out, f"checkpoint_{model.step:06d}")
                await folder.mkdir(exist_ok=True)
                await (folder / f"rank_{rank}.json").write_text(model.to_json())
                checkpoint = str(folder)
            last_losses[rank] = loss
            await reporter.report({"loss": loss, "step": model.step}, checkpoint=checkpoint)
            await anyio.sleep(pace)

    async with open_run(
        world_size=workers,
        callbacks=callbacks,
        name="demo",
        run_id=run_id,
        period=period,
        storage=str(out),
        config={"steps": steps, "lr": lr, "checkpoint_every": checkpoint_every, "seed": seed},
        log=summary.log,
        state_dir=out,
        resume_from=resume,
    ) as run:
        if run.restored is not None:
            summary.restored = run.restored.restored
        # Resuming rebuilt the stateful callbacks: report on the live ones.
        stopping = next(c for c in run.callbacks if isinstance(c, EarlyStopping))
        best = next(c for c in run.callbacks if isinstance(c, BestCheckpoints))

        def on_budget(report: BudgetReport) -> None:
            summary.periods += 1

        def on_checkpoint(event: CheckpointSaved) -> None:
            summary.checkpoints += 1

        run.bus.subscribe(BudgetReport, on_budget, name="demo.summary")
        run.bus.subscribe(CheckpointSaved, on_checkpoint, name="demo.checkpoints")
        await run.workers(train, max_restarts=1)

    # Each handler's time over the run, as the bus accounted it period by period.
    summary.callback_seconds = {s.name: s.total for s in run.bus.stats().subscriptions if s.total}

    result = run.result
    assert result is not None
    summary.status = result.status
    summary.rounds = result.rounds
    summary.reports = result.reports
    summary.failures = result.failures
    summary.restarts = result.restarts
    summary.stopped_early = stopping.should_stop
    summary.early_stopping = (
        f"best loss {stopping.best:.5f}, {stopping.wait} rounds without improvement "
        f"(patience {stopping.patience})"
        if stopping.best is not None
        else "no rounds yet"
    )
    summary.best_checkpoint = best.best
    finite = [v for v in last_losses.values() if math.isfinite(v)]
    summary.final_loss = sum(finite) / len(finite) if finite else None
    return summary


def main_sync(**options: Any) -> DemoSummary:
    """``run_demo`` from synchronous code (the command line)."""
    return anyio.run(lambda: run_demo(**options))
