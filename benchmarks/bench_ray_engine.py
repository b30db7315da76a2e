"""What ``open_run(engine=RayEngine())`` costs a Ray Train job, against plain Ray Train.

One local Ray cluster (``ray.init(num_cpus=2)``; the one ``RAY_ADDRESS`` names, if
set), two CPU workers, the same
training step in both conditions: a small MLP (``--hidden`` wide, batch 64,
one torch thread) doing forward, backward and an SGD step, one report per
step, a checkpoint (the model's ``state_dict`` in a local temporary folder)
every ``--save-every`` steps.

- ``plain``: a ``TorchTrainer`` whose loop calls ``ray.train.report``, with four
  hand-written Ray ``UserCallback``s in Ray's controller doing our four's
  work: early stopping on the loss (it can only record that it would stop:
  Ray's callbacks cannot stop a job), the 3 best checkpoints by loss, each
  round's metrics appended to a JSONL file, and a trivial counter;
- ``ours``: ``open_run(engine=RayEngine(), ...)`` with ``EarlyStopping``,
  ``BestCheckpoints``, ``MetricsLogger`` (the same JSONL lines) and a
  trivial counter in the driver, the event log, and the callbacks' states
  snapshotted into every checkpoint; the worker function reads
  ``reporter.should_stop`` every step, as a worker that can be stopped does.

The conditions alternate, job by job, in the same run on the same cluster
(``--pairs`` of each; the order swaps every pair). Each worker times its
steps after ``--warmup`` untimed ones; a job's figure is the mean of its
ranks' steps/s. Reported: steps/s per condition and the % lost, pair by
pair (median and range); per round, the driver's CPU time (all its
threads: Ray's own and, in ``ours``, the bus, the callbacks and the log)
and the four callbacks' own time where they run (Ray's controller for
``plain``, the driver for ``ours``); each job's wall time.

    python benchmarks/bench_ray_engine.py [--quick] [--json] [--pairs N] [--steps N]
        [--hidden N] [--save-every N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _name, _value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_V2_ENABLED": "1",
    # Ray's result queue holds one report per worker, taken at each poll of the
    # controller (every 2 s by default): at one report per step, Ray's default
    # would time the poll, not the step, in both conditions.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.01",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}.items():
    os.environ.setdefault(_name, _value)

import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
import ray.train  # noqa: E402
from _harness import print_targets, spread, target  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchTrainer  # noqa: E402

from eventbus import TrainRunContext  # noqa: E402
from handlers import Reporter, UserCallback  # noqa: E402

# Ray's workers and controller cannot import this script: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

WORKERS = 2
BATCH = 64
PATIENCE = 10**6  # never stops: both conditions run every step
TARGET_LOST_PCT = 5.0
CONDITIONS = ("plain", "ours", "ours-nostop", "ours-bare")


class Steps:
    """The training step both conditions run, and the timing of a worker's steps."""

    def __init__(self, config: dict[str, Any], rank: int) -> None:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(rank)
        hidden = config["hidden"]
        self.torch = torch
        self.model = torch.nn.Sequential(
            torch.nn.Linear(64, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.inputs = torch.randn(BATCH, 64)
        self.targets = torch.randn(BATCH, 1)
        self.config = config
        self.rank = rank
        self.started = 0.0

    def step(self) -> float:
        self.optimizer.zero_grad()
        loss = self.torch.nn.functional.mse_loss(self.model(self.inputs), self.targets)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    def checkpoint(self, step: int, directory: str) -> str | None:
        """Save the model into ``directory`` at a checkpoint step, else None."""
        if (step + 1) % self.config["save_every"]:
            return None
        self.torch.save(self.model.state_dict(), os.path.join(directory, "model.pt"))
        return directory

    def timing(self, step: int) -> None:
        """Start the clock after the warm-up; write the figure after the last step."""
        if step + 1 == self.config["warmup"]:
            self.started = time.perf_counter()
        elif step + 1 == self.config["steps"]:
            timed = self.config["steps"] - self.config["warmup"]
            rate = timed / (time.perf_counter() - self.started)
            out = Path(self.config["out"], f"{self.config['job']}-rank{self.rank}.json")
            out.write_text(json.dumps({"steps_per_s": rate}))


def plain_loop(config: dict[str, Any]) -> None:
    """A plain Ray Train worker: ``ray.train.report`` every step."""
    steps = Steps(config, ray.train.get_context().get_world_rank())
    for step in range(config["steps"]):
        loss = steps.step()
        with tempfile.TemporaryDirectory() as directory:
            saved = steps.checkpoint(step, directory)
            checkpoint = None if saved is None else ray.train.Checkpoint.from_directory(saved)
            ray.train.report({"step": step, "loss": loss}, checkpoint=checkpoint)
        steps.timing(step)


def ours_worker(config: dict[str, Any]) -> Any:
    """The same loop as ``async def train(reporter)`` for ``open_run``."""

    async def train(reporter: Reporter) -> None:
        steps = Steps(config, reporter.rank)
        for step in range(config["steps"]):
            loss = steps.step()
            with tempfile.TemporaryDirectory() as directory:
                saved = steps.checkpoint(step, directory)
                await reporter.report({"step": step, "loss": loss}, checkpoint=saved)
            steps.timing(step)
            if config["stoppable"] and reporter.should_stop:
                return

    return train


class CallbackClock:
    """The four callbacks' own time, summed, in the process they run in."""

    seconds = 0.0
    rounds = 0


def timed(method: Any) -> Any:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            CallbackClock.seconds += time.perf_counter() - start

    return call


def plain_callbacks(out: Path, job: str, steps: int) -> list[Any]:
    """What a Ray user writes for our four callbacks' work (in Ray's controller)."""

    class RayEarlyStopping(ray.train.UserCallback):  # type: ignore[misc]  # ray is untyped
        def __init__(self) -> None:
            self.best: float | None = None
            self.wait = 0
            self.would_stop = False

        @timed
        def after_report(
            self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> None:
            loss = metrics[0]["loss"]
            if self.best is None or loss < self.best:
                self.best, self.wait = loss, 0
            else:
                self.wait += 1
                self.would_stop = self.would_stop or self.wait >= PATIENCE

    class RayBestCheckpoints(ray.train.UserCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.top: list[tuple[float, str]] = []

        @timed
        def after_report(
            self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> None:
            if checkpoint is not None:
                entry = (metrics[0]["loss"], checkpoint.path)
                self.top = sorted([*self.top, entry])[:3]

    class RayMetricsFile(ray.train.UserCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.path = out / f"{job}-metrics.jsonl"
            self.stream: Any = None

        @timed
        def after_report(
            self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> None:
            if self.stream is None:
                self.stream = self.path.open("a")
            self.stream.write(json.dumps({"metrics": metrics}) + "\n")
            self.stream.flush()

    class RayTrivial(ray.train.UserCallback):  # type: ignore[misc]
        @timed
        def after_report(
            self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> None:
            CallbackClock.rounds += 1
            if metrics[0]["step"] + 1 == steps:  # the last round: say what this process saw
                seen = {"seconds": CallbackClock.seconds, "rounds": CallbackClock.rounds}
                (out / f"{job}-callbacks.json").write_text(json.dumps(seen))

    return [RayEarlyStopping(), RayBestCheckpoints(), RayMetricsFile(), RayTrivial()]


class Counted(UserCallback):
    """Our trivial callback: counts the rounds it sees."""

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        CallbackClock.rounds += 1


def ours_callbacks(out: Path, job: str) -> list[Any]:
    """Our four (as ``bench_trainer_overhead.py``'s), timed the same way."""
    import logging

    import structlog

    from handlers import BestCheckpoints, EarlyStopping, MetricsLogger

    stream = (out / f"{job}-metrics.jsonl").open("a")
    wrapper: Any = structlog.make_filtering_bound_logger(logging.INFO)
    lines = wrapper(structlog.WriteLogger(stream), [structlog.processors.JSONRenderer()], {})
    callbacks: list[Any] = [
        EarlyStopping("loss", patience=PATIENCE),
        BestCheckpoints("loss", k=3),
        MetricsLogger(logger=lines),
        Counted(),
    ]
    for callback in callbacks:  # time each one's after_report where it runs: here
        callback.after_report = timed(type(callback).after_report).__get__(callback)
    return callbacks


def run_job(condition: str, job: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    config = {
        "hidden": args.hidden,
        "steps": args.steps,
        "warmup": args.warmup,
        "save_every": args.save_every,
        "out": str(out),
        "job": job,
        "stoppable": condition != "ours-nostop",
    }
    storage = out / job
    CallbackClock.seconds, CallbackClock.rounds = 0.0, 0
    cpu, wall = time.process_time(), time.perf_counter()
    if condition == "plain":
        TorchTrainer(
            plain_loop,
            train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=WORKERS),
            run_config=RunConfig(
                name=job,
                storage_path=str(out),
                callbacks=plain_callbacks(out, job, args.steps),
            ),
        ).fit()
        seen = json.loads((out / f"{job}-callbacks.json").read_text())
    else:
        import anyio

        from adapters.ray import RayEngine
        from handlers import open_run

        async def main() -> None:
            bare = condition == "ours-bare"
            run = open_run(
                world_size=WORKERS,
                callbacks=[Counted()] if bare else ours_callbacks(out, job),
                log=None if bare else storage / "run.evlog",
                state_dir=storage,
                engine=RayEngine(),
            )
            async with run:
                await run.workers(ours_worker(config))

        anyio.run(main)
        seen = {"seconds": CallbackClock.seconds, "rounds": CallbackClock.rounds}
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rates = [
        json.loads((out / f"{job}-rank{rank}.json").read_text())["steps_per_s"]
        for rank in range(WORKERS)
    ]
    if seen["rounds"] != args.steps:
        raise SystemExit(f"{job}: the callbacks saw {seen['rounds']} of {args.steps} rounds")
    return {
        "steps_per_s": statistics.fmean(rates),
        "driver_cpu_ms_per_round": 1e3 * cpu / args.steps,
        "callbacks_ms_per_round": 1e3 * seen["seconds"] / args.steps,
        "wall_s": wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="1 pair of 150 steps")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument(
        "--conditions",
        nargs="+",
        choices=CONDITIONS,
        default=["plain", "ours"],
        help="plain is always run; ours-nostop never reads should_stop; ours-bare has "
        "one trivial callback, no log",
    )
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.steps, args.warmup = 1, 150, 30
    if not 0 < args.warmup < args.steps:
        parser.error("--warmup must be between 0 and --steps")
    out = Path(tempfile.mkdtemp(prefix="bench_ray_engine_"))
    if os.environ.get("RAY_ADDRESS"):
        ray.init(logging_level="WARNING")
    else:
        ray.init(num_cpus=WORKERS, include_dashboard=False, logging_level="WARNING")
    conditions = ["plain", *dict.fromkeys(c for c in args.conditions if c != "plain")]
    jobs: dict[str, list[dict[str, Any]]] = {name: [] for name in conditions}
    try:
        for pair in range(args.pairs):
            shift = pair % len(conditions)
            for condition in conditions[shift:] + conditions[:shift]:
                job = f"{condition}-{pair}"
                print(f"running {job} ...", file=sys.stderr, flush=True)
                jobs[condition].append(run_job(condition, job, args, out))
    finally:
        ray.shutdown()
    results = summarize(jobs, args)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print_summary(results)
    return 0


def summarize(jobs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    lost = {
        name: spread(
            [
                100 * (1 - job["steps_per_s"] / plain["steps_per_s"])
                for plain, job in zip(jobs["plain"], runs, strict=True)
            ],
            digits=1,
        )
        for name, runs in jobs.items()
        if name != "plain"
    }
    conditions = {
        name: {
            figure: spread([job[figure] for job in runs], digits=2)
            for figure in (
                "steps_per_s",
                "driver_cpu_ms_per_round",
                "callbacks_ms_per_round",
                "wall_s",
            )
        }
        for name, runs in jobs.items()
    }
    plain_rate = conditions["plain"]["steps_per_s"]["median"]
    return {
        "setup": {
            "workers": WORKERS,
            "steps": args.steps,
            "timed_steps": args.steps - args.warmup,
            "hidden": args.hidden,
            "save_every": args.save_every,
            "pairs": args.pairs,
        },
        "conditions": conditions,
        "lost_pct": lost,
        "jobs": jobs,
        "targets": [
            target(
                "Ray Train steps/s lost to RayEngine (4 callbacks, log, snapshots)",
                lost["ours"]["median"],
                TARGET_LOST_PCT,
                "%",
                peer=f"plain Ray Train: {plain_rate} steps/s",
            )
        ]
        if "ours" in lost
        else [],
    }


def print_summary(results: dict[str, Any]) -> None:
    setup = results["setup"]
    print(
        f"{setup['workers']} Ray workers, {setup['timed_steps']} timed steps per job, "
        f"MLP hidden {setup['hidden']}, a checkpoint every {setup['save_every']} steps, "
        f"{setup['pairs']} pair(s) of jobs"
    )
    for name, figures in results["conditions"].items():
        print(
            f"{name:>6}: {figures['steps_per_s']['median']} steps/s "
            f"({figures['steps_per_s']['min']}-{figures['steps_per_s']['max']}); "
            f"driver CPU {figures['driver_cpu_ms_per_round']['median']} ms/round; "
            f"callbacks {figures['callbacks_ms_per_round']['median']} ms/round; "
            f"job {figures['wall_s']['median']} s"
        )
    for name, lost in results["lost_pct"].items():
        print(f"{name} steps/s lost: {lost['median']}% ({lost['min']} to {lost['max']}), by pair")
    print_targets(results["targets"])


if __name__ == "__main__":
    sys.exit(main())
