"""A Ray worker that hangs without dying is found (issue 42, item 5), on a real local Ray
cluster (tests/conftest.py's ``ray_cluster``, shared with the other Ray test files).

Ray gathers each round itself and ``ray.train.report`` holds every rank until all made
that report, so no round the driver sees is ever partial: the hung rank shows only in
the ranks' progress, which each worker tells the hub. Two jobs of 2 workers, a period
of 0.5 s, ``stall_periods=2``, one job of 2 workers: both ranks pause before report 2
(a pause every rank takes is no stall), then rank 1 sleeps 4 s before its report 5
while rank 0 waits in its own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install '.[ray]')")

import ray.cloudpickle  # noqa: E402
from structlog.testing import capture_logs  # noqa: E402

from adapters.ray import RayEngine  # noqa: E402
from eventbus import RankRecovered, RankStalled, TrainRunContext  # noqa: E402
from eventbus.log import read_log  # noqa: E402
from handlers import RankStalledError, Reporter, UserCallback, open_run  # noqa: E402

# Ray's workers cannot import this test module: ship the worker function by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.anyio

STEPS, PERIOD, STALL_PERIODS = 10, 0.5, 2
HANG_RANK, HANG_AT, HANG_S = 1, 5, 4.0
#: A pause every rank takes, shorter than the stall limit (1 s) less the half period
#: a rank's progress may take to be told.
PAUSE_AT, PAUSE_S = 2, 0.4


class Heard(UserCallback):
    """Keeps what ``after_exception`` was given."""

    def __init__(self) -> None:
        self.exceptions: list[dict[int, Exception]] = []

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self.exceptions.append(dict(worker_exceptions))


def step(rank: int, index: int) -> None:
    """A step of 50 ms on the worker's thread; both ranks pause before report 2, and
    rank 1 blocks (a stuck collective) before report 5."""
    time.sleep(0.05)
    if index == PAUSE_AT:
        time.sleep(PAUSE_S)
    if index == HANG_AT and rank == HANG_RANK:
        time.sleep(HANG_S)


async def train(reporter: Reporter) -> None:
    for index in range(STEPS):
        step(reporter.rank, index)
        await reporter.report({"step": index})


def run_job(where: Path) -> dict[str, Any]:
    import anyio

    heard = Heard()

    async def main() -> Any:
        async with open_run(
            world_size=2,
            callbacks=[heard],
            state_dir=where / "run",
            log=where / "events.jsonl",
            engine=RayEngine(),
            period=PERIOD,
            stall_periods=STALL_PERIODS,
        ) as run:
            await run.workers(train)
        return run

    with capture_logs() as logs:
        run = anyio.run(main)
    return {
        "run": run,
        "heard": heard,
        "events": read_log(where / "events.jsonl").events,
        "said": [str(entry["event"]) for entry in logs],
    }


@pytest.fixture(scope="module")
def job(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_job(tmp_path_factory.mktemp("hang"))


def test_a_hung_rank_is_said_stalled_once_then_recovered(job: dict[str, Any]) -> None:
    """Once: not at the pause both ranks took, and not again while it hangs."""
    assert job["run"].result.status == "finished" and job["run"].result.rounds == STEPS
    (stall,) = [e for e in job["events"] if isinstance(e, RankStalled)]
    assert (stall.rank, stall.last_index, stall.others_at) == (HANG_RANK, HANG_AT - 1, HANG_AT)
    assert (stall.periods, stall.period) == (STALL_PERIODS, PERIOD)
    lines = [line for line in job["said"] if "stalled" in line]
    assert lines == [
        f"rank 1 stalled: no report for {stall.silent_s:.1f} s (2 periods of 0.5 s), "
        "last at step 4; the other ranks are at step 5"
    ]
    (exceptions,) = job["heard"].exceptions
    assert list(exceptions) == [HANG_RANK] and isinstance(exceptions[1], RankStalledError)
    (recovered,) = [e for e in job["events"] if isinstance(e, RankRecovered)]
    # Said at the next tick, with the rank's latest report then.
    assert recovered.rank == HANG_RANK and HANG_AT <= recovered.index < STEPS
    # Its hang, and at most two periods more: the tick's, and the worker's own report (4.76 s
    # was seen with three test processes on two cores).
    assert HANG_S - 0.1 <= recovered.silent_s <= HANG_S + 2 * PERIOD
    assert recovered.seq > stall.seq
    assert [line for line in job["said"] if "recovered" in line] == [
        f"rank 1 recovered after {recovered.silent_s:.1f} s: reported step {recovered.index}"
    ]


def test_the_stall_is_found_within_stall_periods_plus_one_of_its_last_report(
    job: dict[str, Any],
) -> None:
    """By the run's clock: the silence it measured when it said so. (By the wall clock,
    a tick on a loaded machine may come late; the run's own figure says what it saw.)"""
    (stall,) = [e for e in job["events"] if isinstance(e, RankStalled)]
    assert STALL_PERIODS * PERIOD <= stall.silent_s <= (STALL_PERIODS + 1) * PERIOD
