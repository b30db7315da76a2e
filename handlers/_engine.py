"""Where a run's workers run: the protocol an engine keeps (``open_run(engine=...)``).

Moving a job from one machine to a cluster should change one argument, not
the worker function nor the callbacks. So the run keeps everything callbacks
see (its bus, gathering, state store and log) and an engine only runs the
workers somewhere and hands back what they reported, through the run's own
reporters and failure path. The default engine is the run's own tasks;
``adapters.ray.RayEngine`` is one that runs them as a Ray Train job.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ._run import Run, WorkerFn

__all__ = ["WorkerEngine"]


class WorkerEngine(Protocol):
    """Runs a run's workers somewhere else and feeds their reports and failures back.

    ``check`` is called by ``open_run``, so that a run the engine cannot run
    is refused at the call, naming the argument; ``run_workers`` is
    ``Run.workers`` on that engine: it returns once the workers all returned,
    and raises ``WorkerGroupError`` once their failures used up
    ``max_restarts``, as the run's own tasks do. An engine that hosts the run in
    another process (``hosts_run = False`` here: torchrun's ranks but 0) makes the
    run here hollow: entering it starts nothing, ``workers`` runs this process's
    worker, whose reports go to the process that hosts it.
    """

    def check(self, run: Run) -> None: ...

    async def run_workers(self, run: Run, fn: WorkerFn, *, max_restarts: int) -> None: ...
