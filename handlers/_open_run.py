"""``open_run``: the one call that composes a run (bus, gathering, callbacks, state, log)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from eventbus import Clock

from ._callback import UserCallback
from ._run import Run

__all__ = ["open_run"]


def open_run(
    *,
    world_size: int,
    callbacks: Iterable[UserCallback | Any] = (),
    name: str = "run",
    run_id: str | None = None,
    period: float = 2.0,
    timeout: float = 30.0,
    budget: float = 0.05,
    buffer: int = 1024,
    storage: str | Path | None = None,
    config: dict[str, Any] | None = None,
    clock: Clock | None = None,
    required_ranks: Iterable[int] | None = None,
    drain_timeout: float = 10.0,
    log: str | Path | None = None,
    state_dir: str | Path | None = None,
    resume_from: str | Path | None = None,
    strict_state: bool = False,
    allow_fresh_state: bool = False,
) -> Run:
    """Open a run: ``async with open_run(world_size=4, callbacks=[...]) as run:``.

    ``period`` is the health-check period (failures are gathered and
    callback time budgeted per period; 2 s as in Ray Train), ``timeout`` the
    default deadline of one callback call, ``budget`` the callbacks' share of
    a period. ``RunStarted``/``RunFinished`` and ``before_run``/``after_run``
    happen exactly once, also when the body fails or is cancelled.

    ``log``: record every event of the run to this file (msgpack, or JSON
    Lines for ``.jsonl``), fsynced at every checkpoint. ``state_dir``: snapshot
    every stateful callback at every checkpoint, into the checkpoint (reported
    locations are taken from the current directory, like every other path, and
    must lie under ``state_dir``), with where the run stood.

    ``resume_from``: continue the run from this checkpoint (anywhere; a
    relative path is taken from the current directory). The callbacks given
    get their saved states, in place (warnings for saved-but-missing and
    live-but-unsaved callbacks; ``strict_state=True`` raises instead); a
    checkpoint without saved states is an error unless ``allow_fresh_state``.
    The run keeps the saved run's id, continues its rounds and each rank's
    report indices, appends to its ``log`` (a ``RunResumed`` event marks what
    the crash rolled back), and workers find the checkpoint in
    ``reporter.latest_checkpoint``. A ``log`` already there is never
    overwritten: only a resumed run appends to it.
    """
    if not math.isfinite(period) or period <= 0:
        raise ValueError(f"period must be a positive number of seconds, got {period}")
    return Run(
        world_size=world_size,
        callbacks=callbacks,
        name=name,
        run_id=run_id,
        period=period,
        timeout=timeout,
        budget=budget,
        buffer=buffer,
        storage=storage,
        config=config,
        clock=clock,
        required_ranks=required_ranks,
        drain_timeout=drain_timeout,
        log=log,
        state_dir=state_dir,
        resume_from=resume_from,
        strict_state=strict_state,
        allow_fresh_state=allow_fresh_state,
    )
