"""What a run says on the console when something goes wrong: one line each, in words.

A rank's worker fails once and the group restarts; a report that is not the run's
own is rejected; the run's end sums it all up. Then a run the cluster preempts
(SIGTERM, as Slurm or Kubernetes sends it): its workers stop at the same step and
it ends in order. Run it: ``python examples/what_you_hear.py``.
"""

from __future__ import annotations

import os
import signal

import anyio

from eventbus import Report
from handlers import Preempted, Reporter, open_run


async def worker(reporter: Reporter) -> None:
    for step in range(4):
        if reporter.rank == 1 and step == 2 and reporter.attempt == 0:
            raise RuntimeError("lost its device")
        await reporter.report({"loss": 1.0 / (step + 1)})
        await reporter.sync()


async def main() -> None:
    async with open_run(world_size=2, run_id="shaky") as run:
        stray = Report(run_id="shaky", rank=7, world_size=2, index=0, metrics={})
        await run.bus.publish(stray)  # a rank the run does not have
        await run.workers(worker, max_restarts=1)


async def until_stopped(reporter: Reporter) -> None:
    step = 0
    while not reporter.should_stop:
        if reporter.rank == 0 and step == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # what the cluster sends
        await reporter.report({"loss": 1.0 / (step + 1)})
        await reporter.sync()
        step += 1


async def preempted() -> None:
    run = open_run(world_size=2, run_id="spot")
    try:
        async with run:
            await run.workers(until_stopped)
    except Preempted:
        pass  # uncaught, it would end the process with exit code 143


if __name__ == "__main__":
    anyio.run(main)
    anyio.run(preempted)
