"""The order of a run's hooks on the Ray engine, as on every way in (issue 39, item 2).

One Ray job (each costs 10-30 s here), on the local cluster the Ray test files share
(tests/conftest.py's ``ray_cluster``): ``before_run`` returns before any worker starts; a
worker fails once, after two rounds, with an exception Ray cannot pickle, and the group restarts.
``after_exception`` must come before the restarted group's first round and get
the worker's text as a ``WorkerError``, made sendable inside the worker.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")

import ray.cloudpickle  # noqa: E402

from adapters.ray import RayEngine  # noqa: E402
from eventbus import RunResult, TrainRunContext  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from handlers import Reporter, UserCallback, WorkerError, open_run  # noqa: E402

# Ray's workers cannot import this test module: ship the worker function by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

STEPS = 4
FAIL_RANK, FAIL_AT = 1, 2
MESSAGE = f"rank {FAIL_RANK} gave up at step {FAIL_AT}"
#: The file ``before_run`` writes as it returns; each worker says whether it saw it.
MARKER = "before_run_returned"


class Held(Exception):
    """An exception holding a lock: it cannot be pickled, so Ray cannot ship it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class Order(UserCallback):
    """Records its hooks in the order they are called, and what they were given."""

    timeout = 10.0

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.calls: list[tuple[Any, ...]] = []
        self.rounds: list[list[dict[str, Any]]] = []
        self.exceptions: list[dict[int, Exception]] = []

    async def before_run(self, run_context: TrainRunContext) -> None:
        import anyio

        self.calls.append(("before_run",))
        await anyio.sleep(0.2)  # a worker started meanwhile would not see the marker
        self.marker.write_text("returned")

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.calls.append(("after_report", metrics[0]["attempt"], metrics[0]["step"]))
        self.rounds.append([dict(m) for m in metrics])

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.calls.append(("after_exception", *sorted(worker_exceptions)))
        self.exceptions.append(dict(worker_exceptions))

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.calls.append(("after_run", result.status))


def make_train(marker: Path) -> Callable[[Reporter], Awaitable[None]]:
    """Each worker looks for the marker before its first report; rank 1's first
    attempt raises ``Held`` after two rounds; the restarted group runs all steps."""

    async def train(reporter: Reporter) -> None:
        import anyio

        saw_marker = await anyio.Path(marker).exists()
        for step in range(STEPS):
            if reporter.attempt == 0 and reporter.rank == FAIL_RANK and step == FAIL_AT:
                raise Held(MESSAGE)
            metrics = {"step": step, "attempt": reporter.attempt, "saw_marker": saw_marker}
            await reporter.report(metrics)
            await reporter.sync()

    return train


@pytest.fixture(scope="module")
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One Ray job: before_run, two rounds, the failure, a restart, four rounds."""
    import anyio

    request.getfixturevalue("ray_cluster")

    where = tmp_path_factory.mktemp("order")
    order = Order(where / MARKER)

    async def main() -> Any:
        async with open_run(
            world_size=2,
            callbacks=[order],
            state_dir=where / "run",
            log=where / "events.jsonl",
            engine=RayEngine(),
            period=0.5,
        ) as run:
            await run.workers(make_train(where / MARKER), max_restarts=1)
        return run

    run = anyio.run(main)
    return {"order": order, "run": run, "log": where / "events.jsonl"}


def test_before_run_returns_before_any_worker_starts(job: dict[str, Any]) -> None:
    order: Order = job["order"]
    assert order.calls[0] == ("before_run",)
    first_attempt = [ranks for ranks in order.rounds if ranks[0]["attempt"] == 0]
    assert first_attempt, "the first attempt reported no round"
    assert [[m["saw_marker"] for m in ranks] for ranks in first_attempt] == [[True, True]] * len(
        first_attempt
    )


def test_a_restarting_failure_reaches_after_exception_before_the_restarted_groups_rounds(
    job: dict[str, Any],
) -> None:
    order: Order = job["order"]
    assert order.calls == [
        ("before_run",),
        ("after_report", 0, 0),
        ("after_report", 0, 1),
        ("after_exception", FAIL_RANK),
        *[("after_report", 1, step) for step in range(STEPS)],
        ("after_run", "finished"),
    ]
    result = job["run"].result
    assert (result.status, result.restarts, result.failures, result.rounds) == (
        "finished",
        1,
        1,
        2 + STEPS,
    )


def test_an_exception_ray_cannot_pickle_arrives_as_a_worker_error_with_its_text(
    job: dict[str, Any],
) -> None:
    order: Order = job["order"]
    assert [list(failed) for failed in order.exceptions] == [[FAIL_RANK]]
    error = order.exceptions[0][FAIL_RANK]
    assert isinstance(error, WorkerError), f"{type(error).__name__}: {error}"
    assert (error.rank, error.error_type, error.message) == (FAIL_RANK, "Held", MESSAGE)
    assert str(error) == f"Held: {MESSAGE}"
    assert "raise Held(MESSAGE)" in error.traceback  # the worker's own traceback, as text
    assert error.traceback.rstrip().endswith(f"Held: {MESSAGE}")
    # The log holds its text too (whichever of its fields the run files it under).
    (failure,) = [e for e in read_log(job["log"]).events if type(e).__name__ == "WorkerFailure"]
    said = f"{getattr(failure, 'error_type')}: {getattr(failure, 'message')}"  # noqa: B009
    assert f"Held: {MESSAGE}" in said
