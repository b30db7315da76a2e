"""``open_run(engine=RayEngine())`` against a real local Ray cluster (2 CPU workers), with
TensorBoard and MLflow in the driver.

One worker function and one set of callbacks (and both trackers), run on both engines: the
rounds, the stop EarlyStopping decides, the values handed to workers, the final callback
states, the run's counts and what the trackers hold must be the same. Then what only a
cluster has to get right: Ray's restart inside a job, and a job that failed for good
resumed from its ``state_dir``: the callbacks go on as in the uninterrupted job, and the
trackers hold one MLflow run and one TensorBoard directory with its data (the checks
tests/adapter_tests/test_trackers_frameworks.py makes through Lightning and Hugging Face).
The restart also shows the order of a run's hooks on Ray, as on every way in (issue 39,
item 2): ``before_run`` returns before any worker starts, and the failure, an exception
Ray cannot pickle, reaches ``after_exception`` as a ``WorkerError`` (made sendable inside
the worker) before the restarted group's first round.
Each Ray job costs 10-30 s here: the module runs four, each once (module fixtures),
and several tests read each one's outcome.
"""

from __future__ import annotations

import collections
import json
import shutil
import sys
import tempfile
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")
pytest.importorskip("tensorboard", reason="tensorboard is not installed (pip install tensorboard)")
pytest.importorskip("mlflow", reason="MLflow is not installed (pip install '.[mlflow]')")

import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
from _tracker_resume import (  # noqa: E402
    Trackers,
    check_failed_attempt,
    check_resumed_as_uninterrupted,
)
from _trackers_readback import (  # noqa: E402
    each_by_step,
    event_files,
    mlflow_metrics,
    mlflow_only_run,
    rounds_only,
    tensorboard_scalars,
)

from adapters.ray import RayEngine  # noqa: E402
from eventbus import RunResult, StatefulCallback, TrainRunContext  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from eventbus.state._files import STATE_FILENAME  # noqa: E402
from handlers import (  # noqa: E402
    EarlyStopping,
    Reporter,
    UserCallback,
    WorkerError,
    WorkerGroupError,
    open_run,
)

# Ray's workers cannot import this test module: ship the worker function by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.anyio

STEPS = 8
#: A loss that plateaus from step 2: EarlyStopping(patience=2) stops after step 4.
LOSSES = [1.0, 0.8, 0.6, 0.6, 0.6, 0.6, 0.5, 0.4]
FAIL_RANK = 1
#: A restart's failure: after step 3's checkpoint, which covers every round before it;
#: an exception Ray cannot pickle (``Held``).
RESTART_AT = 4
#: The file ``Order.before_run`` writes as it returns; each worker says whether it saw it.
MARKER = "before_run_returned"
#: A failure that ends the job: after step 2's round, which step 1's checkpoint does not
#: cover; the resume redoes steps 2 to 4, and TensorBoard purges from step 2 (the round's
#: index, the trackers' step here).
FAIL_AT, PURGE_STEP = 3, 2

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


class Held(Exception):
    """An exception holding a lock: it cannot be pickled, so Ray cannot ship it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class Order(UserCallback):
    """Records its hooks in the order they are called, and the exceptions it was given;
    ``before_run`` writes ``marker`` as it returns."""

    timeout = 10.0

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.calls: list[tuple[Any, ...]] = []
        self.exceptions: list[dict[int, Exception]] = []

    async def before_run(self, run_context: TrainRunContext) -> None:
        import anyio

        self.calls.append(("before_run",))
        await anyio.sleep(0.2)  # a worker started meanwhile would not see the marker
        self.marker.write_text("returned")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.calls.append(("after_report", metrics[0]["step"]))

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.calls.append(("after_exception", *sorted(worker_exceptions)))
        self.exceptions.append(dict(worker_exceptions))

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.calls.append(("after_run", result.status))


def make_train(
    fail_at: int | None = None, error: type[Exception] = ValueError, marker: Path | None = None
) -> TrainFn:
    """A deterministic worker: resumes from its checkpoint, checkpoints at odd steps,
    syncs after every report, reads the learning rate and the stop from callbacks; a
    rank's loss is its own (the trackers write each rank's); rank 1 raises ``error`` at
    step ``fail_at`` of an attempt that did not start from a checkpoint. With ``marker``,
    each worker writes whether it existed when it started, beside it (a metric would
    change what the trackers hold)."""

    async def train(reporter: Reporter) -> None:
        if marker is not None:
            import anyio

            saw = await anyio.Path(marker).exists()
            seen_file = marker.with_name(f"saw-rank{reporter.rank}-attempt{reporter.attempt}")
            await anyio.Path(seen_file).write_text(json.dumps(saw))
        start = 0
        if reporter.latest_checkpoint is not None:
            start = saved_step(reporter.latest_checkpoint, reporter.rank) + 1
        for step in range(start, STEPS):
            if start == 0 and reporter.rank == FAIL_RANK and step == fail_at:
                raise error(f"boom at step {step}")
            lr = reporter.from_callbacks.get("PlateauLR", {}).get("lr")
            loss = LOSSES[step] + 0.125 * reporter.rank
            metrics = {"step": step, "loss": loss, "lr": lr, "rank": reporter.rank}
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


@dataclass
class Job:
    """One Ray (or local) job: where it runs, its callbacks (``Seen`` first), its
    trackers and their loggers in its driver (fresh for each attempt), its ended ``Run``."""

    where: Path
    cbs: list[Any]
    trackers: Trackers
    loggers: list[Any] = field(init=False)
    run: Any = None

    def __post_init__(self) -> None:
        self.loggers = self.trackers.loggers()


def tracked(where: Path, name: str) -> Trackers:
    """A job's trackers: a TensorBoard directory and an MLflow database in ``where``."""
    return Trackers(where, f"sqlite:///{where}/mlflow.db", name)


async def run_job(
    job: Job,
    engine: RayEngine | None,
    *,
    fail_at: int | None = None,
    error: type[Exception] = ValueError,
    marker: Path | None = None,
    max_restarts: int = 0,
    resume: bool = False,
    folder: str = "run",
) -> Any:
    where = job.where
    async with open_run(
        world_size=2,
        callbacks=[*job.cbs, *job.loggers],
        state_dir=where / folder,
        log=where / "events.jsonl",
        resume_from=where / folder if resume else None,
        engine=engine,
        period=0.5,
    ) as run:
        await run.workers(make_train(fail_at, error, marker), max_restarts=max_restarts)
    job.run = run
    return run


@pytest.fixture(scope="module")
def both(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Job]:
    """The same job run locally and on Ray, uninterrupted: EarlyStopping ends it after
    step 4. The local one's trackers hold what the restarted and resumed jobs' must."""
    import anyio

    out: dict[str, Job] = {}
    for name, engine in (("local", None), ("ray", RayEngine())):
        where = tmp_path_factory.mktemp(name)
        out[name] = Job(where, [*callbacks(), Faulty()], tracked(where, name))
        anyio.run(run_job, out[name], engine)
    return out


def test_the_same_rounds_stop_values_and_states_on_both_engines(both: dict[str, Job]) -> None:
    local, on_ray = both["local"], both["ray"]
    seen: Seen = on_ray.cbs[0]
    assert seen.rounds == local.cbs[0].rounds
    assert [m[0]["step"] for m in seen.rounds] == [0, 1, 2, 3, 4]  # stopped after step 4
    assert [m[0]["lr"] for m in seen.rounds] == [1.0, 1.0, 1.0, 1.0, 0.5]  # the plateau's lr
    assert seen.checkpoints == local.cbs[0].checkpoints
    assert seen.checkpoints == [None, "checkpoint_000001", None, "checkpoint_000003", None]
    assert states(on_ray.cbs) == states(local.cbs)
    assert outcome(on_ray.run.result) == outcome(local.run.result)
    assert on_ray.run.result.stopped_by == "EarlyStopping(metric='loss', mode='min')"


def test_the_same_events_are_logged_on_both_engines(both: dict[str, Job]) -> None:
    ray_counts = counts(both["ray"].where / "events.jsonl")
    assert ray_counts == counts(both["local"].where / "events.jsonl")
    assert ray_counts["Report"] == 10 and ray_counts["RoundGathered"] == 5
    assert ray_counts["StateSnapshotted"] == 2 and ray_counts["RunFinished"] == 1
    assert ray_counts["HandlerFailed"] == 1 and ray_counts["HandlerTimedOut"] == 1
    ray_log = read_log(both["ray"].where / "events.jsonl").events
    assert any(type(e).__name__ == "BudgetReport" for e in ray_log)  # periods, as locally


def test_states_are_saved_inside_rays_checkpoints(both: dict[str, Job]) -> None:
    run_dir = both["ray"].where / "run"
    for name in ("checkpoint_000001", "checkpoint_000003"):
        checkpoint = run_dir / name
        assert sorted(p.name for p in checkpoint.iterdir()) == [
            STATE_FILENAME,
            "rank0.json",
            "rank1.json",
        ]
        saved = json.loads((checkpoint / STATE_FILENAME).read_text())
        assert saved["run_id"] == both["ray"].run.run_id


def test_a_stop_on_ray_ends_both_ranks_at_the_deciding_round_with_both_trackers(
    both: dict[str, Job],
) -> None:
    """Trackers never change training, on Ray too (issue 41, item 3; the other ways in:
    tests/adapter_tests/test_stops_with_trackers.py): ``EarlyStopping`` decides at round
    4 (the loss plateaus from round 2, patience 2), and with TensorBoard and MLflow in
    the driver both ranks report rounds 0 to 4 and no more; the trackers hold those, as
    the local job's do."""
    result = both["ray"].run.result
    assert (result.stopped_by or "").startswith("EarlyStopping")
    assert (result.rounds, result.reports) == (5, 10)
    on_ray, local = both["ray"].trackers, both["local"].trackers
    written = each_by_step(rounds_only(tensorboard_scalars(on_ray.log_dir)))
    assert sorted(written["loss"]) == [0, 1, 2, 3, 4]
    assert written == each_by_step(rounds_only(tensorboard_scalars(local.log_dir)))
    assert mlflow_rounds(on_ray) == mlflow_rounds(local)  # float64 there, float32 here
    assert sorted(mlflow_rounds(on_ray)["loss"]) == [0, 1, 2, 3, 4]


def mlflow_rounds(trackers: Trackers) -> dict[str, dict[int, float]]:
    """The round scalars of the trackers' one MLflow run, each step once."""
    run = mlflow_only_run(trackers.uri, trackers.name)
    return each_by_step(rounds_only(mlflow_metrics(trackers.uri, run.info.run_id)))


@pytest.fixture(scope="module")
def restarted(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Job:
    """A Ray job whose rank 1 fails once, at step 4 (its round incomplete, discarded),
    with an exception Ray cannot pickle: Ray restarts the group, which goes on from step
    3's checkpoint. ``Order`` (last) records the hooks' order."""
    import anyio

    where = tmp_path_factory.mktemp("restarted")
    job = Job(where, [*callbacks(), Order(where / MARKER)], tracked(where, "restarted"))
    anyio.run(
        lambda: run_job(
            job, RayEngine(), fail_at=RESTART_AT, error=Held, marker=where / MARKER, max_restarts=1
        )
    )
    return job


def test_a_restart_inside_the_job_keeps_the_callbacks_going(
    restarted: Job, both: dict[str, Job]
) -> None:
    seen: Seen = restarted.cbs[0]
    assert seen.failures == [{"1": "WorkerError: Held: boom at step 4"}]
    # Not rolled back: the failed attempt's rounds stay; the restart resumed at step 4.
    assert [m[0]["step"] for m in seen.rounds] == [0, 1, 2, 3, 4]
    assert states(restarted.cbs)[1:] == states(both["ray"].cbs)[1:]
    result = restarted.run.result
    assert (result.status, result.restarts, result.failures) == ("finished", 1, 1)
    logged = counts(restarted.where / "events.jsonl")
    assert logged["WorkerGroupRestarted"] == 1 and logged["WorkerFailure"] == 1


def test_before_run_returns_before_any_worker_starts(restarted: Job) -> None:
    order: Order = restarted.cbs[-1]
    assert order.calls[0] == ("before_run",)
    saw = {
        path.name: json.loads(path.read_text())
        for path in restarted.where.glob("saw-rank*-attempt0")
    }
    assert saw == {"saw-rank0-attempt0": True, "saw-rank1-attempt0": True}


def test_a_restarting_failure_reaches_after_exception_before_the_restarted_groups_rounds(
    restarted: Job,
) -> None:
    """Rank 1 fails at step 4, before reporting it: the round of step 4 is the restarted
    group's first."""
    order: Order = restarted.cbs[-1]
    assert order.calls == [
        ("before_run",),
        *[("after_report", step) for step in range(RESTART_AT)],
        ("after_exception", FAIL_RANK),
        ("after_report", RESTART_AT),
        ("after_run", "finished"),
    ]
    assert restarted.run.result.rounds == RESTART_AT + 1


def test_an_exception_ray_cannot_pickle_arrives_as_a_worker_error_with_its_text(
    restarted: Job,
) -> None:
    order: Order = restarted.cbs[-1]
    assert [list(failed) for failed in order.exceptions] == [[FAIL_RANK]]
    error = order.exceptions[0][FAIL_RANK]
    message = f"boom at step {RESTART_AT}"
    assert isinstance(error, WorkerError), f"{type(error).__name__}: {error}"
    assert (error.rank, error.error_type, error.message) == (FAIL_RANK, "Held", message)
    assert str(error) == f"Held: {message}"
    assert 'raise error(f"boom at step {step}")' in error.traceback  # the worker's own
    assert error.traceback.rstrip().endswith(f"Held: {message}")
    # The log holds its text too (whichever of its fields the run files it under).
    log = read_log(restarted.where / "events.jsonl").events
    (failure,) = [e for e in log if type(e).__name__ == "WorkerFailure"]
    said = f"{getattr(failure, 'error_type')}: {getattr(failure, 'message')}"  # noqa: B009
    assert f"Held: {message}" in said


def test_a_worker_group_restart_inside_a_ray_job_keeps_one_mlflow_run(
    restarted: Job, both: dict[str, Job]
) -> None:
    """One MLflow run, one TensorBoard file, the uninterrupted job's data."""
    whole, trackers = both["local"].trackers, restarted.trackers
    expected = each_by_step(rounds_only(tensorboard_scalars(whole.log_dir)))
    assert each_by_step(rounds_only(tensorboard_scalars(trackers.log_dir))) == expected
    (only,) = event_files(trackers.log_dir)
    assert only.purge_step is None

    mlflow_run = mlflow_only_run(trackers.uri, trackers.name)
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.info.run_id == restarted.loggers[1].mlflow_run_id
    assert mlflow_rounds(trackers) == mlflow_rounds(whole)


@dataclass
class Resumed:
    """A Ray job that failed for good (``first``, its ``failure``; ``after_failure``: a
    copy of its trackers as it left them), then resumed from its state_dir (``second``),
    with relative paths."""

    first: Job
    failure: WorkerGroupError
    after_failure: Trackers
    second: Job


@pytest.fixture(scope="module")
def resumed(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """With relative paths, as the README types them: Ray's workers run in folders of
    their own, so the checkpoint they resume from must reach them absolute. Rank 1
    fails at step 3, after step 2's round, which step 1's checkpoint does not cover."""
    import anyio

    root = tmp_path_factory.mktemp("resumed")
    trackers = tracked(root, "resumed")
    first = Job(Path("runs"), callbacks(), trackers)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        with pytest.raises(WorkerGroupError) as failed:
            anyio.run(lambda: run_job(first, RayEngine(), fail_at=FAIL_AT, folder="job"))
        # The resume writes on: keep what the failed attempt left, to read it back.
        after_failure = tracked(root / "after_failure", trackers.name)
        shutil.copytree(trackers.root / trackers.name, after_failure.root / trackers.name)
        shutil.copy(root / "mlflow.db", after_failure.root / "mlflow.db")
        second = Job(Path("runs"), callbacks(), trackers)  # fresh loggers, as a new process
        anyio.run(lambda: run_job(second, RayEngine(), resume=True, folder="job"))
    first.where = second.where = root / "runs"
    return Resumed(first, failed.value, after_failure, second)


def test_a_failed_job_resumed_from_its_state_dir_ends_as_an_uninterrupted_one(
    resumed: Resumed, both: dict[str, Job]
) -> None:
    assert list(resumed.failure.failures) == [FAIL_RANK]
    assert resumed.first.cbs[0].results == ["failed"]
    # A worker's exception that pickles reaches the callbacks itself: it travels.
    assert resumed.first.cbs[0].failures == [{"1": f"ValueError: boom at step {FAIL_AT}"}]
    run = resumed.second.run
    assert run.run_id == first_run_id(resumed.first.where)
    seen: Seen = resumed.second.cbs[0]
    assert seen.rounds == both["ray"].cbs[0].rounds
    assert states(resumed.second.cbs)[1:] == states(both["ray"].cbs)[1:]
    assert run.result.rounds == 5 and run.result.stopped_by is not None


def test_ray_job_resumed_from_its_state_dir_continues_the_tensorboard_dir_and_mlflow_run(
    resumed: Resumed, both: dict[str, Job]
) -> None:
    """The failed attempt's MLflow run holds the rounds to step 1's checkpoint only;
    the resume redoes steps 2 to 4 into the same directory and run."""
    first, second = resumed.first.loggers, resumed.second.loggers
    check_failed_attempt(resumed.after_failure, first, purge_step=PURGE_STEP)
    assert resumed.second.run.result.status == "finished"
    whole, trackers = both["local"].trackers, resumed.second.trackers
    check_resumed_as_uninterrupted(whole, trackers, first, second, PURGE_STEP)


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
