"""Cancellation: a run cancelled at random points, with an event log and a state store attached.

The cancel comes during a user callback, during a checkpoint snapshot,
during a log flush, or from outside after a random delay. Afterwards the log
reads back whole (no torn or corrupt record, sequence numbers without gaps,
``RunFinished`` with status ``cancelled``), ``after_run`` ran exactly once
and last, each snapshot the log announces loads, and no task or thread of
the run is left behind.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import trio

from eventbus import RunFinished, RunResult, RunStarted, StateSnapshotted, TrainRunContext
from eventbus.log import LogRecorder, read_log
from eventbus.state import StateStore
from handlers import Reporter, UserCallback, open_run

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

POINTS = ("callback", "snapshot", "flush", "outside")
SEEDS = range(4)
ROUNDS = 120
CHECKPOINT_EVERY = 5


class Trap:
    """Cancels ``scope`` on the ``at``-th time ``hit`` is called."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.hits = 0
        self.scope: anyio.CancelScope | None = None
        self.fired = False

    def hit(self) -> None:
        self.hits += 1
        if self.hits == self.at and self.scope is not None:
            self.scope.cancel()
            self.fired = True


class Watcher(UserCallback):
    """Records the hooks it got; ``after_report`` is async and may spring the trap mid-call."""

    def __init__(self, trap: Trap | None) -> None:
        self.trap = trap
        self.calls: list[str] = []
        self.result: RunResult | None = None
        self.rounds = 0

    def before_run(self, run_context: TrainRunContext) -> None:
        self.calls.append("before_run")

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.calls.append("after_report")
        if self.trap is not None:
            self.trap.hit()
        await anyio.lowlevel.checkpoint()  # the cancel lands while this call is in progress
        self.rounds += 1

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.calls.append("after_run")
        self.result = result


class Tally:
    """A stateful callback: its state is snapshotted at every checkpoint."""

    def __init__(self, trap: Trap | None) -> None:
        self.trap = trap
        self.rounds = 0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds += 1

    def state(self) -> dict[str, Any]:
        if self.trap is not None:
            self.trap.hit()
        return {"args": {}, "attributes": {"rounds": self.rounds}}


class TrappedRecorder(LogRecorder):
    """A recorder whose flushes may spring the trap (between writing and syncing)."""

    trap: Trap | None = None

    def flush(self, *, fsync: bool = False) -> None:
        if self.trap is not None:
            self.trap.hit()
        super().flush(fsync=fsync)


def living_tasks(backend: str) -> int:
    if backend == "trio":
        return int(trio.lowlevel.current_statistics().tasks_living)
    return len(asyncio.all_tasks())


def run_threads() -> set[threading.Thread]:
    """Threads other than anyio's and trio's idle worker pools (which outlive any one run
    by design)."""
    pools = ("AnyIO worker", "Trio thread")
    return {t for t in threading.enumerate() if not t.name.startswith(pools)}


async def cancelled_run(tmp_path: Path, point: str, seed: int, backend: str) -> dict[str, int]:
    rng = random.Random(seed)
    trap = Trap(at=rng.randint(2, 20))
    watcher = Watcher(trap if point == "callback" else None)
    tally = Tally(trap if point == "snapshot" else None)
    run = open_run(world_size=2, callbacks=[watcher, tally], name="cancel", period=0.05)
    log = tmp_path / f"{point}-{seed}.evlog"
    recorder = TrappedRecorder(log, fsync="batch", batch_bytes=rng.choice((256, 2048)))
    if point == "flush":
        recorder.trap = trap
    recorder.attach(run.bus)
    store = StateStore(tmp_path / f"state-{point}-{seed}")
    store.register([tally])
    store.attach(run.bus)

    async def worker(reporter: Reporter) -> None:
        for i in range(ROUNDS):
            checkpoint = str(store.root / f"ckpt-{i}") if i % CHECKPOINT_EVERY == 0 else None
            await reporter.report({"loss": 1.0 / (i + 1)}, checkpoint=checkpoint)
            # Waits for the callbacks (a snapshot is written in a thread meanwhile): the
            # trap then fires while the workers still run, not in the run's final drain.
            await reporter.sync()

    tasks_before = living_tasks(backend)
    threads_before = run_threads()
    with anyio.CancelScope() as scope:
        trap.scope = scope
        async with run:
            if point == "outside":
                scope.deadline = anyio.current_time() + rng.uniform(0.0, 0.05)
            await run.workers(worker)
    recorder.close()
    assert scope.cancelled_caught, (point, seed, trap.hits)
    # after_run ran once, last; the run says it was cancelled.
    assert watcher.calls[0] == "before_run" and watcher.calls.count("before_run") == 1
    assert watcher.calls[-1] == "after_run" and watcher.calls.count("after_run") == 1
    assert watcher.result is not None and watcher.result.status == "cancelled"
    assert run.status == "cancelled"
    # The log is whole and consistent.
    contents = read_log(log)
    assert contents.truncated is None and contents.skipped == 0
    seqs = [e.seq for e in contents.events]
    assert seqs == list(range(len(seqs)))
    assert isinstance(contents.events[0], RunStarted)
    finished = [e for e in contents.events if isinstance(e, RunFinished)]
    assert len(finished) == 1 and finished[0].status == "cancelled"
    # Every snapshot the log announces loads.
    snapshots = [e for e in contents.events if isinstance(e, StateSnapshotted) and not e.error]
    for event in snapshots:
        assert store.load(event.checkpoint).states
    # Nothing left behind.
    assert living_tasks(backend) == tasks_before
    assert run_threads() <= threads_before
    return {"events_checked": len(contents.events), "snapshots_loaded": len(snapshots)}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("point", POINTS)
async def test_cancelled_run_leaves_a_consistent_log_and_no_task(
    tmp_path: Path, point: str, seed: int, anyio_backend: str
) -> None:
    figures = await cancelled_run(tmp_path, point, seed, anyio_backend)
    FIGURES.add("cancellation", runs=1, lost=0, **figures)
