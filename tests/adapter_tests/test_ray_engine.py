"""``open_run(engine=RayEngine())`` against a real local Ray cluster (2 CPU workers).

One worker function and one set of callbacks, run on both engines: the
rounds, the stop, the values handed to workers, the final callback states
and the run's counts must be the same. Then what only a cluster has to get
right: Ray's restart inside a job, and a job that failed for good resumed
from its ``state_dir``. One cluster for the module; each Ray job costs
10-30 s here, so the module runs four.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")

import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402

from adapters.ray import RayEngine  # noqa: E402
from eventbus import RunResult, StatefulCallback, TrainRunContext  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from eventbus.state._files import STATE_FILENAME  # noqa: E402
from handlers import EarlyStopping, Reporter, UserCallback, WorkerGroupError, open_run  # noqa: E402

# Ray's workers cannot import this test module: ship the worker function by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.anyio

STEPS = 8
#: A loss that plateaus from step 2: EarlyStopping(patience=2) stops after step 4.
LOSSES = [1.0, 0.8, 0.6, 0.6, 0.6, 0.6, 0.5, 0.4]
FAIL_RANK, FAIL_AT = 1, 4

TrainFn = Callable[[Reporter], Awaitable[None]]


class PlateauLR(UserCallback, StatefulCallback):
    """Halves the learning rate after a round without improvement; workers read it."""

    state_attributes = ("lr", "best")

    def __init__(self) -> None:
        self.lr = 1.0
        self.best: float | None = None

    @property
    def for_workers(self) -> dict[str, float]:
        return {"lr": self.lr}

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        loss = metrics[0]["loss"]
        if self.best is None or loss < self.best:
            self.best = loss
        else:
            self.lr /= 2


class Seen(UserCallback, StatefulCallback):
    """Keeps every round's metrics, checkpoint folder name and failures (its state)."""

    state_attributes = ("rounds", "checkpoints", "failures", "results")

    def __init__(self) -> None:
        self.rounds: list[list[dict[str, Any]]] = []
        self.checkpoints: list[str | None] = []
        self.failures: list[dict[str, str]] = []
        self.results: list[str] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append([dict(m) for m in metrics])
        self.checkpoints.append(None if checkpoint is None else Path(checkpoint).name)

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.failures.append(
            {str(rank): f"{type(exc).__name__}: {exc}" for rank, exc in worker_exceptions.items()}
        )

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result.status)


class Faulty(UserCallback):
    """Raises at its second round and overruns its deadline at its third: on either
    engine the bus isolates both (``HandlerFailed``, ``HandlerTimedOut``), the
    others see every round."""

    timeout = 0.2

    def __init__(self) -> None:
        self.calls = 0

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        import anyio

        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("a callback's own fault")
        if self.calls == 3:
            await anyio.sleep(5)


def make_train(fail: bool = False) -> TrainFn:
    """A deterministic worker: resumes from its checkpoint, checkpoints at odd steps,
    syncs after every report, reads the learning rate and the stop from callbacks."""

    async def train(reporter: Reporter) -> None:
        start = 0
        if reporter.latest_checkpoint is not None:
            start = saved_step(reporter.latest_checkpoint, reporter.rank) + 1
        for step in range(start, STEPS):
            if fail and start == 0 and reporter.rank == FAIL_RANK and step == FAIL_AT:
                raise ValueError(f"boom at step {step}")
            lr = reporter.from_callbacks.get("PlateauLR", {}).get("lr")
            metrics = {"step": step, "loss": LOSSES[step], "lr": lr, "rank": reporter.rank}
            if step % 2 == 1:
                with tempfile.TemporaryDirectory() as directory:
                    save_step(directory, reporter.rank, step)
                    await reporter.report(metrics, checkpoint=directory)
            else:
                await reporter.report(metrics)
            await reporter.sync()
            if reporter.should_stop:
                return

    return train


def save_step(directory: str, rank: int, step: int) -> None:
    Path(directory, f"rank{rank}.json").write_text(json.dumps({"step": step}))


def saved_step(checkpoint: str, rank: int) -> int:
    return int(json.loads(Path(checkpoint, f"rank{rank}.json").read_text())["step"])


def callbacks() -> list[Any]:
    return [Seen(), PlateauLR(), EarlyStopping("loss", patience=2)]


def states(cbs: list[Any]) -> list[dict[str, Any]]:
    return [dict(cb.state()["attributes"]) for cb in cbs if isinstance(cb, StatefulCallback)]


#: Events of time, not of the job: their counts follow how long a run took.
TIMED = ("HealthCheckTick", "BudgetReport")


def counts(log: Path) -> dict[str, int]:
    names = (type(e).__name__ for e in read_log(log).events)
    return dict(collections.Counter(name for name in names if name not in TIMED))


def outcome(result: RunResult | None) -> dict[str, Any]:
    assert result is not None
    keep = ("status", "rounds", "reports", "failures", "restarts", "stopped_by", "stop_reason")
    return {name: getattr(result, name) for name in keep}


async def run_job(
    where: Path,
    engine: RayEngine | None,
    cbs: list[Any],
    *,
    fail: bool = False,
    max_restarts: int = 0,
    resume: bool = False,
    folder: str = "run",
) -> Any:
    async with open_run(
        world_size=2,
        callbacks=cbs,
        state_dir=where / folder,
        log=where / "events.jsonl",
        resume_from=where / folder if resume else None,
        engine=engine,
        period=0.5,
    ) as run:
        await run.workers(make_train(fail), max_restarts=max_restarts)
    return run


@pytest.fixture(scope="module")
def both(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same job run locally and on Ray, uninterrupted."""
    import anyio

    out: dict[str, Any] = {}
    for name, engine in (("local", None), ("ray", RayEngine())):
        where = tmp_path_factory.mktemp(name)
        cbs = [*callbacks(), Faulty()]
        run = anyio.run(run_job, where, engine, cbs)
        out[name] = {"where": where, "cbs": cbs, "run": run}
    return out


def test_the_same_rounds_stop_values_and_states_on_both_engines(both: dict[str, Any]) -> None:
    local, on_ray = both["local"], both["ray"]
    seen: Seen = on_ray["cbs"][0]
    assert seen.rounds == local["cbs"][0].rounds
    assert [m[0]["step"] for m in seen.rounds] == [0, 1, 2, 3, 4]  # stopped after step 4
    assert [m[0]["lr"] for m in seen.rounds] == [1.0, 1.0, 1.0, 1.0, 0.5]  # the plateau's lr
    assert seen.checkpoints == local["cbs"][0].checkpoints
    assert seen.checkpoints == [None, "checkpoint_000001", None, "checkpoint_000003", None]
    assert states(on_ray["cbs"]) == states(local["cbs"])
    assert outcome(on_ray["run"].result) == outcome(local["run"].result)
    assert on_ray["run"].result.stopped_by == "EarlyStopping(metric='loss', mode='min')"


def test_the_same_events_are_logged_on_both_engines(both: dict[str, Any]) -> None:
    ray_counts = counts(both["ray"]["where"] / "events.jsonl")
    assert ray_counts == counts(both["local"]["where"] / "events.jsonl")
    assert ray_counts["Report"] == 10 and ray_counts["RoundGathered"] == 5
    assert ray_counts["StateSnapshotted"] == 2 and ray_counts["RunFinished"] == 1
    assert ray_counts["HandlerFailed"] == 1 and ray_counts["HandlerTimedOut"] == 1
    ray_log = read_log(both["ray"]["where"] / "events.jsonl").events
    assert any(type(e).__name__ == "BudgetReport" for e in ray_log)  # periods, as locally


def test_states_are_saved_inside_rays_checkpoints(both: dict[str, Any]) -> None:
    run_dir = both["ray"]["where"] / "run"
    for name in ("checkpoint_000001", "checkpoint_000003"):
        checkpoint = run_dir / name
        assert sorted(p.name for p in checkpoint.iterdir()) == [
            STATE_FILENAME,
            "rank0.json",
            "rank1.json",
        ]
        saved = json.loads((checkpoint / STATE_FILENAME).read_text())
        assert saved["run_id"] == both["ray"]["run"].run_id


def test_a_restart_inside_the_job_keeps_the_callbacks_going(
    ray_cluster: None, tmp_path: Path, both: dict[str, Any]
) -> None:
    import anyio

    cbs = callbacks()
    run = anyio.run(lambda: run_job(tmp_path, RayEngine(), cbs, fail=True, max_restarts=1))
    seen: Seen = cbs[0]
    assert seen.failures == [{"1": seen.failures[0]["1"]}]
    assert seen.failures[0]["1"] == "ValueError: boom at step 4"  # itself: it travels
    # Not rolled back: the failed attempt's rounds stay; the restart resumed at step 4.
    assert [m[0]["step"] for m in seen.rounds] == [0, 1, 2, 3, 4]
    assert states(cbs)[1:] == states(both["ray"]["cbs"])[1:]
    result = run.result
    assert (result.status, result.restarts, result.failures) == ("finished", 1, 1)
    logged = counts(tmp_path / "events.jsonl")
    assert logged["WorkerGroupRestarted"] == 1 and logged["WorkerFailure"] == 1


def test_a_failed_job_resumed_from_its_state_dir_ends_as_an_uninterrupted_one(
    ray_cluster: None, tmp_path: Path, both: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With relative paths, as the README types them: Ray's workers run in folders of
    their own, so the checkpoint they resume from must reach them absolute."""
    import anyio

    monkeypatch.chdir(tmp_path)
    where = Path("runs")
    first = callbacks()
    with pytest.raises(WorkerGroupError) as failed:
        anyio.run(lambda: run_job(where, RayEngine(), first, fail=True, folder="job"))
    assert list(failed.value.failures) == [FAIL_RANK]
    assert first[0].results == ["failed"]

    resumed = callbacks()
    run = anyio.run(lambda: run_job(where, RayEngine(), resumed, resume=True, folder="job"))
    uninterrupted = both["ray"]
    assert run.run_id == first_run_id(where)
    seen: Seen = resumed[0]
    assert seen.rounds == uninterrupted["cbs"][0].rounds
    assert states(resumed)[1:] == states(uninterrupted["cbs"])[1:]
    assert run.result.rounds == 5 and run.result.stopped_by is not None


def first_run_id(where: Path) -> str:
    (started, *_) = [
        e for e in read_log(where / "events.jsonl").events if type(e).__name__ == "RunStarted"
    ]
    return str(getattr(started, "run_id"))  # noqa: B009


def test_a_worker_function_ray_cannot_send_is_refused_in_one_line(tmp_path: Path) -> None:
    import threading

    import anyio

    lock = threading.Lock()

    async def train(reporter: Reporter) -> None:
        with lock:
            await reporter.report({"step": 0})

    async def main() -> None:
        async with open_run(world_size=2, state_dir=tmp_path / "run", engine=RayEngine()) as run:
            await run.workers(train)

    with pytest.raises(TypeError) as refused:
        anyio.run(main)
    message = str(refused.value)
    assert message.startswith("engine=RayEngine(): the worker function ")
    assert "train cannot be sent to Ray's workers (TypeError: cannot pickle" in message
    assert "\n" not in message
