"""What the trackers cost a training loop: steps per second with and without them.

Two ranks of an ``open_run`` job in this process, each step a training step
of a small torch MLP (``--work torch``, the default: torch's kernels release
the GIL, as real training does) or a fixed slice of pure-Python work
(``--work python``, ``--step-ms``: the GIL held all the time, the worst case
for the trackers' threads, whose every microsecond then comes out of the
steps), then a report of four metrics (12 scalars with the per-rank ones),
and a checkpoint every ``--save-every`` steps (a JSON file a rank).
Conditions, alternated in each repeat, timed the same way (from each rank's
first step to its last, the median over repeats): the plain loop without a
bus, ``open_run`` without callbacks, with ``TensorBoardLogger``, with
``MLflowLogger`` (SQLite store made before the timing: its first creation,
about 1.4 s here, is once per store), with the MLflow callback users write
by hand (``MlflowClient.log_batch`` of each round's values in
``after_report``: the peer), and with both of ours. The loss is against
``open_run`` without callbacks, repeat by repeat. Each tracker's time a
round is reported too: its hook's on the bus (a round's hand-over, and at a
checkpoint the wait for its thread's flush) and its thread's CPU.

    python benchmarks/bench_trackers.py [--quick] [--json] [--repeats N] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import print_targets, spread, target

from adapters.mlflow import MLflowLogger
from adapters.tensorboard import TensorBoardLogger
from eventbus import RunResult, TrainRunContext, configure_logging
from handlers import Reporter, UserCallback, open_run

CONDITIONS = ("plain", "bus", "tensorboard", "mlflow", "mlflow-by-hand", "both")
WORLD = 2


class TorchStep:
    """One SGD step of an MLP on a fixed batch (CPU)."""

    def __init__(self, hidden: int) -> None:
        import torch

        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.inputs = torch.randn(256, 64)
        self.targets = torch.randn(256, 1)

    def __call__(self) -> float:
        self.optimizer.zero_grad()
        loss = self.torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())


def python_step(n: int) -> Callable[[], float]:
    return lambda: work(n)


def calibrate(step_ms: float) -> int:
    """Loop iterations that take about ``step_ms`` here."""
    n = 20_000
    start = time.perf_counter()
    work(n)
    took = time.perf_counter() - start
    return max(1, int(n * step_ms / 1000 / took))


def work(n: int) -> float:
    total = 0.0
    for i in range(n):
        total += i * 0.5
    return total


def save(root: Path, step: int, rank: int) -> str:
    folder = root / f"checkpoint_{step:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"rank_{rank}.json").write_text(json.dumps({"step": step}))
    return str(folder)


class MLflowByHand(UserCallback):
    """The callback users write today: each round's values logged at once, in the hook."""

    def __init__(self, uri: str) -> None:
        from mlflow import MlflowClient

        self.client = MlflowClient(uri)
        self.run_id = ""

    def before_run(self, run_context: TrainRunContext) -> None:
        experiment = self.client.get_experiment_by_name("bench")
        assert experiment is not None
        self.run_id = self.client.create_run(experiment.experiment_id).info.run_id

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        from mlflow.entities import Metric

        step = int(metrics[0]["step"])
        now = int(time.time() * 1000)
        rows = [
            Metric(f"{key}/rank_{rank}", float(value), now, step)
            for rank, values in enumerate(metrics)
            for key, value in values.items()
        ]
        means = {key: sum(m[key] for m in metrics) / len(metrics) for key in metrics[0]}
        rows += [Metric(key, float(value), now, step) for key, value in means.items()]
        self.client.log_batch(self.run_id, metrics=rows)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.client.set_terminated(self.run_id)


def trackers(condition: str, root: Path, uri: str) -> list[Any]:
    made: list[Any] = []
    if condition == "mlflow-by-hand":
        made.append(MLflowByHand(uri))
    if condition in ("tensorboard", "both"):
        made.append(TensorBoardLogger(root / "tb"))
    if condition in ("mlflow", "both"):
        made.append(MLflowLogger(uri, "bench"))
    return made


StepMaker = Callable[[], Callable[[], float]]


async def one_job(
    condition: str,
    steps: int,
    make_step: StepMaker,
    *,
    save_every: int,
    root: Path,
    uri: str,
    costs: dict[str, list[float]] | None = None,
) -> float:
    """Steps per second of one job, the slowest rank's, first step to last; ``costs``
    gets each tracker's time per round: its hooks' (on the bus) and its thread's CPU."""
    rates: list[float] = []

    async def train(reporter: Reporter) -> None:
        train_step = make_step()
        start = time.perf_counter()
        for step in range(1, steps + 1):
            loss = train_step()
            checkpoint = save(root, step, reporter.rank) if step % save_every == 0 else None
            metrics = {"loss": loss, "lr": 0.01, "grad_norm": 1.0 / step, "step": step}
            await reporter.report(metrics, checkpoint)
        rates.append(steps / (time.perf_counter() - start))

    if condition == "plain":
        return Reporterless(steps, make_step, save_every, root).run()
    made = trackers(condition, root, uri)
    async with open_run(world_size=WORLD, callbacks=made, state_dir=root / "run") as run:
        await run.workers(train)
    if costs is not None and run.result is not None:
        for tracker in made:
            name = type(tracker).__name__
            # Its events' hook: a round's hand-over, and at checkpoints the wait for the flush.
            hooks = sum(c.total for c in run.result.callbacks if c.handler == f"{name}.on_event")
            costs.setdefault(f"{name}.on_event", []).append(hooks / steps)
            costs.setdefault(f"{name} thread", []).append(tracker._thread.cpu_seconds / steps)
    return min(rates)


class Reporterless:
    """The same steps, checkpoints and metrics with no bus: the floor."""

    def __init__(self, steps: int, make_step: StepMaker, save_every: int, root: Path) -> None:
        self.steps, self.make_step, self.save_every, self.root = steps, make_step, save_every, root

    def run(self) -> float:
        kept: list[dict[str, Any]] = []
        train_steps = [self.make_step() for _ in range(WORLD)]
        start = time.perf_counter()
        for step in range(1, self.steps + 1):
            for rank, train_step in enumerate(train_steps):
                loss = train_step()
                if step % self.save_every == 0:
                    save(self.root, step, rank)
                kept.append({"loss": loss, "lr": 0.01, "grad_norm": 1.0 / step, "step": step})
        # Two ranks' steps one after the other, as the in-process ranks share one core.
        return self.steps / (time.perf_counter() - start)


def measure(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    make_step: StepMaker
    if args.work == "torch":
        make_step = lambda: TorchStep(args.hidden)  # noqa: E731
    else:
        n = calibrate(args.step_ms)
        make_step = lambda: python_step(n)  # noqa: E731
    rates: dict[str, list[float]] = {c: [] for c in CONDITIONS}
    costs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        uri = f"sqlite:///{scratch}/mlflow.db"
        warm = Path(scratch, "warm")
        # The store made and the imports done before anything is timed.
        anyio.run(partial(one_job, "both", 20, make_step, save_every=10, root=warm, uri=uri))
        for repeat in range(args.repeats):
            for condition in CONDITIONS:
                root = Path(scratch, f"{condition}-{repeat}")
                job = partial(
                    one_job,
                    save_every=args.save_every,
                    root=root,
                    uri=uri,
                    costs=costs if condition in ("tensorboard", "mlflow") else None,
                )
                rate = anyio.run(job, condition, args.steps, make_step)
                rates[condition].append(rate)
                log(f"repeat {repeat}: {condition} {rate:.1f} steps/s")
    lost = {
        c: [100 * (1 - t / b) for t, b in zip(rates[c], rates["bus"], strict=True)]
        for c in ("tensorboard", "mlflow", "mlflow-by-hand", "both")
    }
    return {
        "work": args.work,
        "step_ms": args.step_ms,
        "hidden": args.hidden,
        "steps": args.steps,
        "save_every": args.save_every,
        "steps_per_s": {c: spread(r) for c, r in rates.items()},
        "lost_pct": {c: spread(v) for c, v in lost.items()},
        "us_per_round": {name: spread(v, 1e6) for name, v in costs.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--work", choices=("torch", "python"), default="torch")
    parser.add_argument("--hidden", type=int, default=512, help="the MLP's width (torch)")
    parser.add_argument("--step-ms", type=float, default=1.0, help="the work's length (python)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps = 2, 300
    configure_logging("ERROR")  # budget warnings are expected with 1 ms steps; not timed
    results = measure(args, log=lambda line: print(line, file=sys.stderr))
    plain = results["steps_per_s"]["plain"]["median"]
    what = f"MLP {args.hidden}" if args.work == "torch" else f"{args.step_ms:g} ms Python steps"
    what += f", {1000 / plain:.2f} ms a step"
    both = results["steps_per_s"]["both"]["median"]
    bus = results["steps_per_s"]["bus"]["median"]
    by_hand = results["lost_pct"]["mlflow-by-hand"]["median"]
    results["targets"] = [
        target(
            f"steps/s lost to TensorBoardLogger ({what})",
            results["lost_pct"]["tensorboard"]["median"],
            10.0,
            "%",
            peer=f"open_run without callbacks: {bus} steps/s; with both trackers {both}",
        ),
        target(
            f"steps/s lost to MLflowLogger, in points over a hand-written callback ({what})",
            results["lost_pct"]["mlflow"]["median"] - by_hand,
            0.0,
            "%",
            peer=f"a callback calling MlflowClient.log_batch each round: {by_hand}% lost",
        ),
    ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for condition, figures in results["steps_per_s"].items():
        print(
            f"{condition:12} {figures['median']:8.1f} steps/s ({figures['min']}-{figures['max']})"
        )
    for condition, figures in results["lost_pct"].items():
        print(
            f"lost to {condition:12} {figures['median']:5.1f}% "
            f"({figures['min']} to {figures['max']})"
        )
    for name, figures in results["us_per_round"].items():
        print(f"{name:26} {figures['median']:7.1f} us a round ({figures['min']}-{figures['max']})")
    print_targets(results["targets"])


if __name__ == "__main__":
    main()
