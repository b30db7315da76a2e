"""A checkpoint's fsyncs (the state snapshot's and the log's) run in a worker thread: a
worker in the run's loop goes on meanwhile, and the log is made durable before the
snapshot that a resume would start from is written."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import anyio
import pytest

from eventbus.state import StateStore
from handlers import EarlyStopping, Reporter, open_run

pytestmark = pytest.mark.anyio

#: How long each fsync takes here: far longer than a worker's step.
SLOW_FSYNC = 0.1


class SlowFsyncs:
    """``os.fsync`` made slow, noting what happened while one was under way."""

    def __init__(self) -> None:
        self.under_way = threading.Event()
        self.calls: list[str] = []
        self._fsync = os.fsync

    def __call__(self, fd: int) -> None:
        self.calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        self.under_way.set()
        time.sleep(SLOW_FSYNC)
        self.under_way.clear()
        self._fsync(fd)


async def test_a_worker_in_the_runs_loop_trains_on_while_a_checkpoint_is_made_durable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs = SlowFsyncs()
    monkeypatch.setattr(os, "fsync", fsyncs)
    steps_during_fsyncs = 0

    async def train(reporter: Reporter) -> None:
        nonlocal steps_during_fsyncs
        folder = tmp_path / "state" / "checkpoint-0"
        folder.mkdir(parents=True)
        await reporter.report({"loss": 1.0}, checkpoint=folder)
        for step in range(1, 200):
            if fsyncs.under_way.is_set():
                steps_during_fsyncs += 1
            await reporter.report({"loss": 1.0 / step})
            await anyio.sleep(0.002)  # a training step

    async with open_run(
        world_size=1,
        callbacks=[EarlyStopping("loss", patience=10**6)],
        state_dir=tmp_path / "state",
        log=tmp_path / "run.evlog",
    ) as run:
        await run.workers(train)
    assert run.result.rounds == 200
    # The worker stepped while the checkpoint's fsyncs were under way, in their thread.
    assert steps_during_fsyncs > 0
    # The log made durable first, then the snapshot (its file, then its directory): after
    # a crash the log reaches the checkpoint a resume starts from.
    snapshot = StateStore(tmp_path / "state").path_of(str(tmp_path / "state" / "checkpoint-0"))
    at_checkpoint = fsyncs.calls[:3]
    assert at_checkpoint[0] == str(tmp_path / "run.evlog")
    assert at_checkpoint[1].startswith(str(snapshot.parent / f".{snapshot.name}."))
    assert at_checkpoint[2] == str(snapshot.parent)
