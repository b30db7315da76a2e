"""The Ray Train v2 adapter against a real local Ray cluster (2 CPU workers).

One cluster (tests/conftest.py's ``ray_cluster``, shared with the other Ray test files)
and two ``fit()`` calls for the whole module (each costs 15-35 s here): a run that reports
4 rounds with checkpoints, and a run whose rank 1 fails. The callbacks run in Ray's
controller process, so the test callback writes what it receives to a file that the test
reads back. A third ``fit()``, without the ``lifecycle`` companion, runs only where the
installed Ray's ``UserCallback`` has ``before_run``/``after_run`` (none up to Ray 2.60
has); both ways of starting and ending the run are also driven by hand, without a
cluster, with that detection patched.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")

import anyio  # noqa: E402
import ray  # noqa: E402
import ray.cloudpickle  # noqa: E402
import ray.train  # noqa: E402
from ray.train import FailureConfig, RunConfig, ScalingConfig  # noqa: E402
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer  # noqa: E402

import adapters.ray as ray_adapter  # noqa: E402
from adapters._bus_thread import BusThread  # noqa: E402
from adapters.ray import EventBusUserCallback, recorded_logs  # noqa: E402
from eventbus import RoundGathered, RunFinished, RunResult, RunStarted, TrainRunContext  # noqa: E402
from eventbus._subscription import ErrorPolicy  # noqa: E402
from eventbus.log import read_log, replay_file  # noqa: E402
from handlers import UserCallback  # noqa: E402
from handlers._attach import attach_user_callbacks  # noqa: E402

# The controller cannot import this test module: ship its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ITERATIONS = 4
FAIL_RANK, FAIL_AT = 1, 2


class Inputs(UserCallback):
    """Keeps what each hook received, as JSON values (to a file when given a path)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.calls: list[dict[str, Any]] = []

    def _keep(self, call: dict[str, Any]) -> None:
        self.calls.append(call)
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as file:
                file.write(json.dumps(call) + "\n")

    def before_run(self, run_context: TrainRunContext) -> None:
        self._keep({"hook": "before_run", "world_size": run_context.world_size})

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self._keep({"hook": "after_report", "metrics": metrics, "checkpoint": checkpoint})

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        ranks = sorted(worker_exceptions.items())
        self._keep(
            {
                "hook": "after_exception",
                # The same live and on replay: a message and a type name...
                "failures": {str(rank): getattr(exc, "message", str(exc)) for rank, exc in ranks},
                "error_types": {
                    str(rank): getattr(exc, "error_type", type(exc).__name__) for rank, exc in ranks
                },
                # ... and what differs: live, Ray's object; on replay, its text form.
                "types": {str(rank): type(exc).__name__ for rank, exc in ranks},
            }
        )

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self._keep({"hook": "after_run", "status": result.status, "rounds": result.rounds})


class RayHandsOver(ray.train.UserCallback):  # type: ignore[misc]  # ray is untyped to mypy
    """A plain Ray callback beside ours: keeps the type of what Ray gives ``after_exception``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_exception(self, run_context: Any, worker_exceptions: dict[int, Exception]) -> None:
        types = {str(rank): type(exc).__name__ for rank, exc in sorted(worker_exceptions.items())}
        with open(self.path, "a", encoding="utf-8") as file:
            file.write(json.dumps(types) + "\n")


def train_fn(config: dict[str, Any]) -> None:
    context = ray.train.get_context()
    rank = context.get_world_rank()
    for i in range(ITERATIONS):
        if rank == config.get("fail_rank") and i == config.get("fail_at"):
            time.sleep(1.0)  # so the other rank's previous report is gathered first
            raise ValueError(f"boom from rank {rank} at iteration {i}")
        metrics = {"iteration": i, "rank": rank, "loss": 1.0 / (i + 1 + rank)}
        if i % 2 == 1:
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "step.json").write_text(json.dumps({"iteration": i}))
                checkpoint = ray.train.Checkpoint.from_directory(directory)
                ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics)


def expected_metrics(i: int) -> list[dict[str, Any]]:
    return [{"iteration": i, "rank": r, "loss": 1.0 / (i + 1 + r)} for r in range(2)]


class Fit:
    """What one ``fit()`` left behind."""

    def __init__(self, storage: Path, name: str, error: BaseException | None) -> None:
        self.error = error
        self.calls = read_jsonl(storage / f"{name}.jsonl")
        #: What Ray itself handed a plain Ray callback's ``after_exception``: type names.
        self.ray_exceptions = read_jsonl(storage / f"{name}-ray.jsonl")
        self.logs = recorded_logs(storage, name)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def run_fit(storage: Path, name: str, config: dict[str, Any], *, lifecycle: bool = True) -> Fit:
    bus_callback = EventBusUserCallback([Inputs(str(storage / f"{name}.jsonl"))], period=1.0)
    companion = [bus_callback.lifecycle] if lifecycle else []
    trainer = DataParallelTrainer(
        train_fn,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=name,
            storage_path=str(storage),
            callbacks=[bus_callback, *companion, RayHandsOver(str(storage / f"{name}-ray.jsonl"))],
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    error: BaseException | None = None
    try:
        trainer.fit()
    except Exception as exc:
        error = exc
    assert bus_callback.run_id == ""  # the driver's object is never called: the controller's is
    return Fit(storage, name, error)


@pytest.fixture(scope="module")
def fits(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Fit]:
    storage = tmp_path_factory.mktemp("ray-storage")
    return {
        "ok": run_fit(storage, "ok", {}),
        "fail": run_fit(storage, "fail", {"fail_rank": FAIL_RANK, "fail_at": FAIL_AT}),
    }


def test_gathered_reports_equal_what_the_workers_reported(fits: dict[str, Fit]) -> None:
    fit = fits["ok"]
    assert fit.error is None
    hooks = [call["hook"] for call in fit.calls]
    assert hooks == ["before_run"] + ["after_report"] * ITERATIONS + ["after_run"]
    reports = [call for call in fit.calls if call["hook"] == "after_report"]
    assert [r["metrics"] for r in reports] == [expected_metrics(i) for i in range(ITERATIONS)]
    # Ray persists the checkpoints of odd iterations in the run's storage.
    checkpoints = [r["checkpoint"] for r in reports]
    assert [c is not None for c in checkpoints] == [i % 2 == 1 for i in range(ITERATIONS)]
    for checkpoint in filter(None, checkpoints):
        assert json.loads(Path(checkpoint, "step.json").read_text())["iteration"] in (1, 3)
    assert fit.calls[0]["world_size"] == 2
    assert fit.calls[-1] == {"hook": "after_run", "status": "finished", "rounds": ITERATIONS}


def test_a_failing_worker_reaches_after_exception(fits: dict[str, Fit]) -> None:
    fit = fits["fail"]
    assert type(fit.error).__name__ == "WorkerGroupError"
    hooks = [call["hook"] for call in fit.calls]
    assert hooks == ["before_run"] + ["after_report"] * FAIL_AT + ["after_exception", "after_run"]
    (failure,) = [call for call in fit.calls if call["hook"] == "after_exception"]
    assert list(failure["failures"]) == [str(FAIL_RANK)]
    assert f"boom from rank {FAIL_RANK} at iteration {FAIL_AT}" in failure["failures"]["1"]
    assert fit.calls[-1]["status"] == "failed"


def test_ray_hands_over_the_workers_exception_and_our_callbacks_get_it(
    fits: dict[str, Fit],
) -> None:
    """Ray gives ``after_exception`` the worker's own exception, and so do we, live in the
    controller; the log and a replay carry its text form, a ``WorkerError``."""
    fit = fits["fail"]
    assert fit.ray_exceptions == [{str(FAIL_RANK): "ValueError"}]
    (failure,) = [call for call in fit.calls if call["hook"] == "after_exception"]
    assert failure["types"] == {str(FAIL_RANK): "ValueError"}
    assert failure["error_types"] == {str(FAIL_RANK): "ValueError"}
    (log,) = fit.logs
    replayed = Inputs()
    anyio.run(replay_file, log, lambda bus: attach_user_callbacks(bus, [replayed]))
    (again,) = [call for call in replayed.calls if call["hook"] == "after_exception"]
    assert again["types"] == {str(FAIL_RANK): "WorkerError"}
    assert {**again, "types": None} == {**failure, "types": None}


@pytest.mark.skipif(
    not ray_adapter._RAY_RUN_HOOKS,
    reason="the installed Ray's UserCallback has no before_run/after_run (none up to 2.60 has)",
)
def test_with_rays_run_hooks_no_lifecycle_is_needed(ray_cluster: None, tmp_path: Path) -> None:
    fit = run_fit(tmp_path, "hooks", {}, lifecycle=False)
    assert fit.error is None
    hooks = [call["hook"] for call in fit.calls]
    assert hooks == ["before_run"] + ["after_report"] * ITERATIONS + ["after_run"]
    (log,) = fit.logs
    events = read_log(log).events
    assert isinstance(events[0], RunStarted)
    assert sum(isinstance(e, RunFinished) for e in events) == 1


@pytest.mark.parametrize("run", ["ok", "fail"])
def test_recorded_log_replays_to_the_same_callback_inputs(fits: dict[str, Fit], run: str) -> None:
    fit = fits[run]
    (log,) = fit.logs  # one run, one log: the lifecycle and the callback shared one bus
    events = read_log(log).events
    assert isinstance(events[0], RunStarted)
    assert sum(isinstance(e, RunFinished) for e in events) == 1
    live_rounds = [e.metrics for e in events if isinstance(e, RoundGathered)]
    assert live_rounds == [c["metrics"] for c in fit.calls if c["hook"] == "after_report"]

    replayed = Inputs()
    anyio.run(replay_file, log, lambda bus: attach_user_callbacks(bus, [replayed]))
    assert untyped(replayed.calls) == untyped(fit.calls)


# --- without a cluster: the controller's side, driven by hand ----------------------------


def untyped(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls without the exceptions' types: live, Ray's objects; replayed, WorkerErrors."""
    return [{k: v for k, v in call.items() if k != "types"} for call in calls]


def fake_run_context(storage: Path) -> SimpleNamespace:
    """The fields of Ray's ``TrainRunContext`` the adapter reads."""
    return SimpleNamespace(
        run_id="run-1",
        run_config=SimpleNamespace(
            name="fake",
            storage_context=SimpleNamespace(
                storage_filesystem=SimpleNamespace(type_name="local"),
                experiment_fs_path=str(storage / "fake"),
            ),
        ),
        scaling_config=SimpleNamespace(num_workers=2),
        train_loop_config={"lr": 0.1},
    )


@pytest.fixture
def without_run_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray whose ``UserCallback`` has no ``before_run``/``after_run``: the companion's way."""
    monkeypatch.setattr(ray_adapter, "_RAY_RUN_HOOKS", False)


@pytest.fixture
def with_run_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray whose ``UserCallback`` has ``before_run``/``after_run`` (as ray-project/ray
    issue 64252 proposes): Ray's hooks start and end the run."""
    monkeypatch.setattr(ray_adapter, "_RAY_RUN_HOOKS", True)


def test_run_hooks_are_looked_up_on_rays_user_callback_class() -> None:
    base = ray.train.UserCallback
    assert ray_adapter._RAY_RUN_HOOKS is (
        hasattr(base, "before_run") and hasattr(base, "after_run")
    )

    class Newer(ray.train.UserCallback):  # type: ignore[misc]  # ray is untyped to mypy
        def before_run(self, run_context: Any) -> None: ...

        def after_run(self, run_context: Any, result: Any) -> None: ...

    class Older:
        def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None: ...

        def after_exception(self, run_context: Any, worker_exceptions: Any) -> None: ...

    assert ray_adapter._has_run_hooks(Newer) and not ray_adapter._has_run_hooks(Older)


@pytest.mark.usefixtures("without_run_hooks")
def test_the_callback_pickles_as_configuration_and_keeps_its_lifecycle(tmp_path: Path) -> None:
    inputs = Inputs()
    bus_callback = EventBusUserCallback([inputs], period=1.0)
    # Ray pickles the callback and its lifecycle in one list: one object on the other side.
    copy, lifecycle = ray.cloudpickle.loads(
        ray.cloudpickle.dumps([bus_callback, bus_callback.lifecycle])
    )
    assert lifecycle.owner is copy and copy.run_id == ""

    lifecycle.after_controller_start(fake_run_context(tmp_path))
    # Ray calls its callbacks in its controller's event loop: the bus gets a thread.
    assert isinstance(copy.bus_thread, BusThread)
    copy.after_report(run_context=None, metrics=[{"a": 1}, {"a": 2}], checkpoint=None)
    copy.after_report(run_context=None, metrics=["not a dict", {"a": 2}], checkpoint=None)
    # Ray's round goes to the run whole: one rank's bad metric refuses it whole (said in
    # words), and leaves no rank's report behind to shift the rounds after it.
    copy.after_report(run_context=None, metrics=[{"a": 3}, {"a": object()}], checkpoint=None)
    copy.after_report(run_context=None, metrics=[{"a": 5}, {"a": 7}], checkpoint=None)
    # A started callback pickles too (Ray may ship it on): without its thread or bus.
    again = ray.cloudpickle.loads(ray.cloudpickle.dumps(copy))
    assert again.run_id == "" and again.attachment is None
    lifecycle.after_controller_finish(SimpleNamespace(error=None))

    (log,) = recorded_logs(tmp_path, "fake")
    replayed = Inputs()
    anyio.run(replay_file, log, lambda bus: attach_user_callbacks(bus, [replayed]))
    expected = [
        {"hook": "before_run", "world_size": 2},
        {"hook": "after_report", "metrics": [{"a": 1}, {"a": 2}], "checkpoint": None},
        {"hook": "after_report", "metrics": [{"a": 5}, {"a": 7}], "checkpoint": None},
        {"hook": "after_run", "status": "finished", "rounds": 2},
    ]
    assert replayed.calls == expected  # the bad reports were caught, logged, never raised into Ray
    assert inputs.calls == []  # the driver's object is never called


def test_a_bus_stepped_in_rays_hooks_is_refused_in_words() -> None:
    with pytest.raises(ValueError, match="bus_runs='in_hooks' is not possible here"):
        EventBusUserCallback([], bus_runs="in_hooks")


class FailsTheRun(UserCallback):
    """``on_error="raise"``: its failure fails the run, so Ray must hear of it."""

    on_error: ClassVar[ErrorPolicy] = "raise"

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        raise RuntimeError("this callback fails the run")


@pytest.mark.usefixtures("without_run_hooks")
def test_a_callback_failing_the_run_is_raised_into_ray_after_after_run(tmp_path: Path) -> None:
    inputs = Inputs()
    bus_callback = EventBusUserCallback([FailsTheRun(), inputs], period=1.0)
    lifecycle = bus_callback.lifecycle
    lifecycle.after_controller_start(fake_run_context(tmp_path))
    bus_callback.after_report(run_context=None, metrics=[{"a": 1}, {"a": 2}], checkpoint=None)
    assert bus_callback.attachment is not None and bus_callback.wait_idle(10)
    # Ray's next hook gets the exception (Ray then fails the run as a ControllerError)...
    with pytest.raises(RuntimeError, match="this callback fails the run"):
        bus_callback.after_report(run_context=None, metrics=[{"a": 3}, {"a": 4}], checkpoint=None)
    # ... once the run has ended: after_run came first, and comes once.
    lifecycle.after_controller_finish(SimpleNamespace(error=RuntimeError("ControllerError")))
    assert [call["hook"] for call in inputs.calls] == ["before_run", "after_report", "after_run"]
    assert inputs.calls[-1]["status"] == "failed"
    (log,) = recorded_logs(tmp_path, "fake")
    finished = [e for e in read_log(log).events if isinstance(e, RunFinished)]
    assert [(e.status, e.error) for e in finished] == [
        ("failed", "RuntimeError: this callback fails the run")
    ]


def replayed_calls(storage: Path) -> list[dict[str, Any]]:
    (log,) = recorded_logs(storage, "fake")
    replayed = Inputs()
    anyio.run(replay_file, log, lambda bus: attach_user_callbacks(bus, [replayed]))
    return replayed.calls


@pytest.mark.usefixtures("with_run_hooks")
def test_with_rays_run_hooks_they_start_and_end_the_run_not_the_lifecycle(tmp_path: Path) -> None:
    bus_callback = EventBusUserCallback([Inputs()], period=1.0)
    # Both registered (a config written for an older Ray): Ray's hooks decide, once.
    copy, lifecycle = ray.cloudpickle.loads(
        ray.cloudpickle.dumps([bus_callback, bus_callback.lifecycle])
    )
    context = fake_run_context(tmp_path)
    lifecycle.after_controller_start(context)
    assert copy.attachment is None  # left to before_run
    copy.before_run(context)
    copy.after_report(run_context=context, metrics=[{"a": 1}, {"a": 2}], checkpoint=None)
    copy.after_exception(run_context=context, worker_exceptions={1: ValueError("boom")})
    lifecycle.after_controller_finish(SimpleNamespace(error=RuntimeError("WorkerGroupError")))
    assert copy.close_report is None  # left to after_run
    copy.after_run(context, SimpleNamespace(error=RuntimeError("WorkerGroupError")))
    assert copy.close_report is not None

    (live,) = copy.callbacks
    assert [call["hook"] for call in live.calls] == [
        "before_run",
        "after_report",
        "after_exception",
        "after_run",
    ]
    failure = live.calls[2]
    # In the controller, Ray's own exception; on replay, its text form, a WorkerError.
    assert failure["types"] == {"1": "ValueError"} and failure["error_types"] == {"1": "ValueError"}
    assert live.calls[-1] == {"hook": "after_run", "status": "failed", "rounds": 1}
    replayed = replayed_calls(tmp_path)
    assert replayed[2]["types"] == {"1": "WorkerError"}
    assert untyped(replayed) == untyped(live.calls)
    (log,) = recorded_logs(tmp_path, "fake")
    finished = [e for e in read_log(log).events if isinstance(e, RunFinished)]
    assert [(e.status, e.error) for e in finished] == [("failed", "RuntimeError: WorkerGroupError")]


@pytest.mark.usefixtures("with_run_hooks")
def test_with_rays_run_hooks_no_lifecycle_is_needed_and_it_still_ends_an_abort(
    tmp_path: Path,
) -> None:
    context = fake_run_context(tmp_path)
    alone = EventBusUserCallback([Inputs()], period=1.0)  # no lifecycle registered
    alone.before_run(context)
    alone.after_report(run_context=context, metrics=[{"a": 1}, {"a": 2}], checkpoint=None)
    alone.after_run(context, SimpleNamespace(error=None))
    expected = [
        {"hook": "before_run", "world_size": 2},
        {"hook": "after_report", "metrics": [{"a": 1}, {"a": 2}], "checkpoint": None},
        {"hook": "after_run", "status": "finished", "rounds": 1},
    ]
    assert alone.callbacks[0].calls == expected == replayed_calls(tmp_path)

    # An aborted run gets no after_run from Ray: the lifecycle, if registered, ends it.
    aborted_storage = tmp_path / "aborted"
    aborted = EventBusUserCallback([Inputs()], period=1.0)
    aborted.before_run(fake_run_context(aborted_storage))
    aborted.lifecycle.before_controller_abort()
    assert aborted.callbacks[0].calls[-1] == {
        "hook": "after_run",
        "status": "cancelled",
        "rounds": 0,
    }
    assert replayed_calls(aborted_storage) == aborted.callbacks[0].calls


@pytest.mark.usefixtures("without_run_hooks")
def test_without_rays_run_hooks_the_lifecycle_starts_and_ends_the_run(tmp_path: Path) -> None:
    bus_callback = EventBusUserCallback([Inputs()], period=1.0)
    context = fake_run_context(tmp_path)
    bus_callback.lifecycle.after_controller_start(context)
    assert bus_callback.attachment is not None  # the companion started it
    bus_callback.after_report(run_context=context, metrics=[{"a": 1}, {"a": 2}], checkpoint=None)
    bus_callback.lifecycle.after_controller_finish(SimpleNamespace(error=None))
    assert bus_callback.close_report is not None
    assert [call["hook"] for call in bus_callback.callbacks[0].calls] == [
        "before_run",
        "after_report",
        "after_run",
    ]
    assert replayed_calls(tmp_path) == bus_callback.callbacks[0].calls
