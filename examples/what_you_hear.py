"""What a run says on the console when something goes wrong: one line each, in words.

A rank's worker fails once and the group restarts; a report that is not the run's
own is rejected; the run's end sums it all up. Run it: ``python examples/what_you_hear.py``.
"""

from __future__ import annotations

import anyio

from eventbus import Report
from handlers import Reporter, open_run


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


if __name__ == "__main__":
    anyio.run(main)
