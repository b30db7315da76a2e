"""Our callbacks on your own Ray Train v2 job: 2 workers on a local cluster, one injected failure.

The callbacks run in Ray's TrainController actor, not in this process, so
they print there (Ray forwards the lines, prefixed with the actor) and the
run's events are recorded to its storage path. After ``fit()`` the driver
reads that log and replays it into the same callbacks, here, on virtual time.

This is for a ``TorchTrainer`` you keep: the callbacks see every round and
failure, but cannot stop the job and keep no state across a resume (Ray's
callbacks have neither). ``examples/ray_train.py`` runs the same kind of
callbacks with both, through ``open_run(engine=RayEngine())``.

    pip install torch==2.13.0 && pip install -e '.[ray]'
    python examples/ray_own_trainer.py [storage_dir]
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from typing import Any

for _name, _value in {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
}.items():
    os.environ.setdefault(_name, _value)

import anyio  # noqa: E402
import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402

from adapters.ray import EventBusUserCallback, recorded_logs  # noqa: E402
from eventbus import RunResult, TrainRunContext  # noqa: E402
from eventbus.log import replay_file  # noqa: E402
from handlers import UserCallback, attach_user_callbacks  # noqa: E402

FAILING_RANK, FAILS_AT = 1, 3


class Console(UserCallback):
    """Prints what it gets (in the controller process during the run)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def before_run(self, run_context: TrainRunContext) -> None:
        print(f"{self.prefix} run {run_context.name}: {run_context.world_size} workers")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        losses = [round(m["loss"], 3) for m in metrics]
        print(f"{self.prefix} round {metrics[0]['step']}: losses {losses} checkpoint={checkpoint}")

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        for rank, exc in sorted(worker_exceptions.items()):
            print(f"{self.prefix} rank {rank} failed: {str(exc).splitlines()[0]}")

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        print(f"{self.prefix} run ended: {result.status}, {result.rounds} rounds")


def train_fn(config: dict[str, Any]) -> None:
    rank = ray.train.get_context().get_world_rank()
    for step in range(5):
        if rank == FAILING_RANK and step == FAILS_AT:
            time.sleep(1.0)  # let the other rank's report for step 2 be gathered first
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        ray.train.report({"step": step, "loss": 1.0 / (step + 1) + 0.1 * rank})


def main() -> int:
    storage = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ray_train_")
    if not os.environ.get("RAY_ADDRESS"):  # else the cluster it names (`ray job submit`)
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    bus_callback = EventBusUserCallback([Console("[controller]")], period=1.0)
    # Ray's annotation says UserCallbacks; its controller takes the lifecycle's kind too.
    callbacks: list[Any] = [bus_callback, bus_callback.lifecycle]
    trainer = DataParallelTrainer(
        train_fn,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="example",
            storage_path=storage,
            callbacks=callbacks,
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    try:
        trainer.fit()
    except ray.train.WorkerGroupError as exc:
        print(f"fit() raised {type(exc).__name__}, as injected")
    finally:
        ray.shutdown()

    (log,) = recorded_logs(storage, "example")
    print(f"== replaying {log} in the driver")
    console = Console("[replay]")
    summary = anyio.run(replay_file, log, lambda bus: attach_user_callbacks(bus, [console]))
    print(f"replayed {summary.replayed} events")
    return 0


if __name__ == "__main__":
    sys.exit(main())
