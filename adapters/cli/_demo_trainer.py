"""The demo trainer behind ``eventbus demo``: data-parallel linear regression in pure Python,
deterministic for a seed (the reference trainer of the resume guarantee)."""

from __future__ import annotations

import json
import math
import random
import sys
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, TextIO

import anyio
import msgspec
from msgspec import Meta

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    RunResult,
    StatefulCallback,
    TrainRunContext,
)
from eventbus._events import CallbackCost
from eventbus._logging import get_logger
from eventbus._options import Options, PeriodSeconds
from eventbus.options import OptionError
from eventbus.state import StateError, StateStore
from eventbus.state._model import is_stateful, state_key_of
from handlers import (
    BestCheckpoints,
    EarlyStopping,
    MetricsLogger,
    ProgressDisplay,
    Reporter,
    UserCallback,
    latest_checkpoint,
    open_run,
)

from ._common import same_file

_log = get_logger("adapters.demo")

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


class FinalLoss(UserCallback, StatefulCallback, state_name="eventbus.demo.FinalLoss"):
    """The mean loss of the latest round, stateful: a resumed run with nothing left to
    train still knows it."""

    state_attributes = ("loss",)

    def __init__(self) -> None:
        self.loss: float | None = None

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        finite = [m["loss"] for m in metrics if math.isfinite(m["loss"])]
        self.loss = sum(finite) / len(finite) if finite else None


@dataclass
class DemoSummary:
    out: Path
    #: How the run ended (``Run.result``, read after the bus closed: each hook's whole cost).
    result: RunResult
    checkpoints: int = 0
    stopped_early: bool = False
    best_checkpoint: str | None = None
    final_loss: float | None = None
    callback_seconds: dict[str, float] = field(default_factory=dict)
    periods: int = 0
    log: Path | None = None
    resumed_from: Path | None = None
    restored: tuple[str, ...] = ()
    early_stopping: str = ""
    #: Every stateful callback's final ``state()``, by state key.
    states: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """What ``--summary`` writes: what an uninterrupted run and a resumed one must agree
        on, and apart, under ``callback_costs``, what differs from run to run."""
        result = self.result
        return {
            "status": result.status,
            "rounds": result.rounds,
            "reports": result.reports,
            "failures": result.failures,
            "restarts": result.restarts,
            "stopped_early": self.stopped_early,
            "last_checkpoint": result.last_checkpoint,
            "final_mean_loss": self.final_loss,
            "states": self.states,
            "callback_costs": {
                "periods": self.periods,
                "callbacks": [_cost_json(cost) for cost in result.callbacks],
            },
        }

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
            f"run {self.result.status}: {self.result.rounds} rounds from {self.result.reports} "
            "reports",
            f"checkpoints: {self.checkpoints} in {self.out} (best by loss: {self.best_checkpoint})",
            f"failures: {self.result.failures}, restarts: {self.result.restarts}, "
            f"stopped early: {'yes' if self.stopped_early else 'no'}, final mean loss: {loss}",
            f"early stopping: {self.early_stopping}",
            f"callback time: {total * 1e3:.3f} ms over {self.periods} health-check periods"
            + "".join(f"\n  {name}: {sec * 1e3:.3f} ms" for name, sec in worst),
            *self._cost_lines(),
            *([f"event log: {self.log}"] if self.log is not None else []),
        ]

    def _cost_lines(self) -> list[str]:
        if not self.result.callbacks:
            return []
        lines = ["callbacks:"]
        for cost in self.result.callbacks:
            if not cost.calls:
                lines.append(f"  {cost.handler}: not called")
                continue
            troubles = [
                f"{count} {what}"
                for count, what in (
                    (cost.faults, "failed"),
                    (cost.timeouts, "timed out"),
                    (cost.skipped, "skipped"),
                )
                if count
            ]
            lines.append(
                f"  {cost.handler}: {_count(cost.calls, 'call')}, "
                f"{cost.total * 1e3:.3f} ms total, {cost.mean * 1e6:.1f} µs mean, "
                f"{cost.max * 1e3:.3f} ms max, over budget in {cost.periods_over_budget} "
                f"of {_count(self.periods, 'period')}"
                + "".join(f", {trouble}" for trouble in troubles)
            )
        return lines


def _count(number: int, what: str) -> str:
    return f"{number} {what}" if number == 1 else f"{number} {what}s"


def _cost_json(cost: CallbackCost) -> dict[str, Any]:
    """One callback hook's figures for ``--summary``, each unit in its key."""
    return {
        "handler": cost.handler,
        "calls": cost.calls,
        "total_ms": cost.total * 1e3,
        "mean_us": cost.mean * 1e6,
        "max_ms": cost.max * 1e3,
        "periods_over_budget": cost.periods_over_budget,
        "faults": cost.faults,
        "timeouts": cost.timeouts,
        "skipped": cost.skipped,
    }


def _class_names(keys: tuple[str, ...]) -> str:
    """``pkg.mod.Class[state key]`` -> ``Class``: the summary names what was restored."""
    return ", ".join(key.split("[")[0].rsplit(".", 1)[-1] for key in keys) or "nothing"


def _demo_checkpoint(path: Path, workers: int, out: Path | None) -> tuple[Path, Path]:
    """(what to resume from, the run directory): ``path`` if it holds every rank's
    checkpoint; for a run directory, its latest complete checkpoint, or with none yet
    the directory itself (``open_run`` then starts fresh)."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such checkpoint or run directory to resume")
    if not (path / "rank_0.json").is_file():
        latest = latest_checkpoint(path)
        if latest is not None:
            _log.info(f"resuming from {latest}: the latest complete checkpoint in {path}")
            path = latest
        elif path.is_dir() and (out is None or same_file(out, path)):
            return path, path
    missing = [r for r in range(workers) if not (path / f"rank_{r}.json").is_file()]
    if missing:
        raise ValueError(
            f"{path}: not a demo checkpoint of {workers} ranks (no rank_{missing[0]}.json), "
            "nor a run directory holding one"
        )
    return path, path.parent


class DemoOptions(Options, frozen=True, kw_only=True):
    """The demo's own options, checked as every option is (``eventbus demo --help``)."""

    workers: Annotated[int, Meta(ge=1, le=1024, description="whole number of ranks")] = 4
    steps: Annotated[int, Meta(ge=1, le=1_000_000, description="whole number of steps")] = 100
    checkpoint_every: Annotated[int, Meta(ge=1, le=1_000_000)] = 10
    fail_rank: Annotated[int, Meta(ge=0, le=1023)] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] = 0
    period: PeriodSeconds = 0.5
    step_time: Annotated[float, Meta(ge=0, le=60, description="number of seconds")] = 0.01
    lr: Annotated[float, Meta(gt=0, le=10)] = 0.05
    patience: Annotated[int, Meta(ge=1, le=1_000_000, description="whole number of rounds")] = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fail_rank is not None and self.fail_rank >= self.workers:
            raise OptionError(
                "fail_rank", f"fail_rank {self.fail_rank} is outside 0..{self.workers - 1}"
            )


async def run_demo(
    *,
    options: DemoOptions | None = None,
    out: Path | None = None,
    progress: TextIO | None = None,
    resume: Path | None = None,
    log: bool = True,
    sync: bool = True,
    **keywords: Any,
) -> DemoSummary:
    """Train, and return what happened. ``resume``: a checkpoint of an earlier demo run, or
    its run directory; ``sync=False``: ranks run ahead of each other."""
    opts = DemoOptions.build(options, **keywords)
    if resume is not None:
        resume, folder = _demo_checkpoint(resume, opts.workers, out)
        out = out if out is not None else folder
    out = out if out is not None else Path(tempfile.mkdtemp(prefix="eventbus-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    run_id = _resumed_run_id(out, resume) or f"demo-{uuid.uuid4().hex[:8]}"
    log_path = out / f"{run_id}.evlog" if log else None
    summary = DemoSummary(out, RunResult(run_id=run_id, status="cancelled"), log=log_path)
    stopping = EarlyStopping("loss", patience=opts.patience, threshold=1e-4)
    best = BestCheckpoints("loss", k=3)
    final = FinalLoss()
    callbacks = [
        stopping,
        best,
        final,
        MetricsLogger(every=max(1, opts.steps // 4)),
        ProgressDisplay(progress if progress is not None else sys.stderr),
    ]

    async def train(reporter: Reporter) -> None:
        rank = reporter.rank
        model = LinearModel()
        # A restart resumes where the group was; a resumed run, from its checkpoint.
        if reporter.latest_checkpoint is not None:
            text = await anyio.Path(reporter.latest_checkpoint, f"rank_{rank}.json").read_text()
            model = msgspec.json.decode(text, type=LinearModel)
        data = make_shard(opts.seed * 1000 + rank + 1, 256)
        # Ranks run at different rates.
        pace = opts.step_time * (1 + 0.5 * rank / max(1, opts.workers - 1))
        while model.step < opts.steps and not reporter.should_stop:
            if rank == opts.fail_rank and reporter.attempt == 0 and model.step == opts.steps // 2:
                raise RuntimeError(f"rank {rank} lost its device at step {model.step} (demo)")
            batch = random.Random(f"{opts.seed}:{rank}:{model.step}").sample(data, 16)
            loss = model.sgd_step(batch, opts.lr)
            checkpoint = None
            # And where SIGTERM asked every rank to save.
            if model.step % opts.checkpoint_every == 0 or reporter.should_checkpoint:
                folder = anyio.Path(out, f"checkpoint_{model.step:06d}")
                await folder.mkdir(exist_ok=True)
                # Whole or not at all.
                partial = folder / f"rank_{rank}.json.partial"
                await partial.write_text(json.dumps(asdict(model)))
                await partial.rename(folder / f"rank_{rank}.json")
                checkpoint = str(folder)
            await reporter.report({"loss": loss, "step": model.step}, checkpoint=checkpoint)
            await anyio.sleep(pace)
            if sync:
                await reporter.sync()

    async with open_run(
        world_size=opts.workers,
        callbacks=callbacks,
        name="demo",
        run_id=run_id,
        period=opts.period,
        storage=str(out),
        config={key: getattr(opts, key) for key in ("steps", "lr", "checkpoint_every", "seed")},
        log=summary.log,
        state_dir=out,
        resume_from=resume,
    ) as run:
        if run.resume is not None:  # not when the run directory had no checkpoint yet
            summary.resumed_from = resume
        if run.restored is not None:  # restored in place: `stopping` and `best` hold it
            summary.restored = run.restored.restored

        def on_budget(report: BudgetReport) -> None:
            summary.periods += 1

        def on_checkpoint(event: CheckpointSaved) -> None:
            summary.checkpoints += 1

        run.bus.subscribe(BudgetReport, on_budget, name="demo.summary")
        run.bus.subscribe(CheckpointSaved, on_checkpoint, name="demo.checkpoints")
        await run.workers(train, max_restarts=1)

    summary.callback_seconds = {s.name: s.total for s in run.bus.stats().subscriptions if s.total}

    summary.result = run.result
    summary.stopped_early = stopping.should_stop
    summary.early_stopping = (
        f"best loss {stopping.best:.5f}, {stopping.wait} rounds without improvement "
        f"(patience {stopping.patience})"
        if stopping.best is not None
        else "no rounds yet"
    )
    summary.best_checkpoint = best.best
    summary.states = {state_key_of(c): c.state() for c in run.callbacks if is_stateful(c)}
    summary.final_loss = final.loss
    return summary


def _resumed_run_id(out: Path, resume: Path | None) -> str:
    """The id of the run a checkpoint belongs to: a resumed run keeps it (and so its log)."""
    if resume is None:
        return ""
    try:
        return StateStore(out).load(resume).run_id
    except (OSError, StateError):
        return ""  # open_run says what is wrong with the checkpoint
