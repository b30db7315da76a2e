"""Send a run where you already look: TensorBoard and MLflow, one history across a resume.

    pip install -e '.[tensorboard,mlflow]'
    python examples/trackers.py runs/trackers     # rank 1 fails at step 25: the run fails
    python examples/trackers.py runs/trackers     # resumes from step 20's checkpoint

The second run continues the same TensorBoard folder and the same MLflow run
(their ids are in the checkpoint's callback states) and redoes steps 21 to 25:
each step is in each tracker once. Then look where you always look:

    tensorboard --logdir runs/trackers/tb
    mlflow ui --backend-store-uri sqlite:///runs/trackers/mlflow.db   # the UI: pip install mlflow
"""

from __future__ import annotations

import json
import sys

import anyio

from adapters.mlflow import MLflowLogger
from adapters.tensorboard import TensorBoardLogger
from handlers import Reporter, WorkerFn, latest_checkpoint, open_run

STEPS = 30


def make_worker(folder: str, *, fail: bool) -> WorkerFn:
    async def train(reporter: Reporter) -> None:
        step = 0
        if reporter.latest_checkpoint:  # resumed: start from the checkpoint
            saved = anyio.Path(reporter.latest_checkpoint, f"rank_{reporter.rank}.json")
            step = json.loads(await saved.read_text())["step"]
        while step < STEPS and not reporter.should_stop:
            step += 1
            checkpoint = None
            if step % 10 == 0:
                path = anyio.Path(folder, f"checkpoint_{step:06d}")
                await path.mkdir(parents=True, exist_ok=True)
                await (path / f"rank_{reporter.rank}.json").write_text(json.dumps({"step": step}))
                checkpoint = str(path)
            await reporter.report({"loss": 1 / step + 0.1 * reporter.rank}, checkpoint)
            await reporter.sync()  # ranks meet each step, as at a gradient all-reduce
            if fail and step == 25 and reporter.rank == 1:
                raise RuntimeError("injected failure on rank 1 at step 25")

    return train


async def main(folder: str) -> None:
    # Its latest complete checkpoint, once there is one.
    resume_from = folder if latest_checkpoint(folder) else None
    trackers = [
        TensorBoardLogger(f"{folder}/tb"),  # loss, loss/rank_0, loss/rank_1, callbacks/...
        MLflowLogger(f"sqlite:///{folder}/mlflow.db", experiment="examples"),
    ]
    async with open_run(
        world_size=2,
        callbacks=trackers,
        state_dir=folder,
        resume_from=resume_from,
        config={"lr": 0.01, "batch_size": 32},  # MLflow's params
    ) as run:
        await run.workers(make_worker(folder, fail=resume_from is None))


def show(folder: str) -> None:
    """What TensorBoard and MLflow show now."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(f"{folder}/tb")
    board.Reload()
    steps = [event.step for event in board.Scalars("loss")]
    print(f"TensorBoard: loss at {len(steps)} steps, {len(set(steps))} distinct")
    client = MlflowClient(f"sqlite:///{folder}/mlflow.db")
    experiment = client.get_experiment_by_name("examples")
    assert experiment is not None  # the logger made it
    (run,) = client.search_runs([experiment.experiment_id])
    history = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    print(
        f"MLflow: run {run.info.run_id} {run.info.status}, "
        f"loss at {len(history)} steps, {len(set(history))} distinct"
    )


if __name__ == "__main__":
    where = sys.argv[1] if len(sys.argv) > 1 else "runs/trackers"
    try:
        anyio.run(main, where)
    except Exception as exc:  # the first run fails, as injected
        print(f"the run failed: {exc}")
    show(where)
