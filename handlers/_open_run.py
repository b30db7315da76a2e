"""``open_run``: the one call that composes a run (bus, gathering, callbacks, state, log),
checking every argument at the call so a mistake is an error there, naming it."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Unpack

from eventbus._clock import Clock
from eventbus._options import OptionTypeError

from ._callback import UserCallback
from ._options import RunKeywords, RunOptions
from ._run import Run, WorkerEngine

__all__ = ["TrainingCallback", "open_run"]


class _HasState(Protocol):
    """A callback with state only (``state()``), no hooks: the state store keeps it."""

    def state(self) -> Mapping[str, Any]: ...


#: What a run takes as a callback: a ``UserCallback`` (or its hooks), or state only.
TrainingCallback = UserCallback | _HasState


def open_run(
    *,
    callbacks: Iterable[TrainingCallback] = (),
    name: str = "run",
    run_id: str | None = None,
    storage: str | os.PathLike[str] | None = None,
    config: dict[str, Any] | None = None,
    clock: Clock | None = None,
    log: str | os.PathLike[str] | None = None,
    state_dir: str | os.PathLike[str] | None = None,
    resume_from: str | os.PathLike[str] | None = None,
    strict_state: bool = False,
    allow_fresh_state: bool = False,
    options: RunOptions | None = None,
    engine: WorkerEngine | None = None,
    **keywords: Unpack[RunKeywords],
) -> Run:
    """Open a run: ``async with open_run(world_size=4, callbacks=[...]) as run:``.

    ``RunStarted``/``RunFinished`` and ``before_run``/``after_run`` happen exactly once,
    also when the body fails or is cancelled. Bad arguments raise here (``OptionError``,
    ``ValueError``, ``TypeError``, naming them); entering the run fails before anything
    starts if its files cannot be read or written. ``options``: a ``RunOptions``, the
    keywords changing it. Relative paths are taken from the current directory.

    Args:
        world_size: how many ranks report (1 to 131,072).
        required_ranks: the ranks a round waits for (default: all).
        period: the health-check period, seconds (default 2, as Ray Train's).
        timeout: the default deadline of one callback call, seconds (default 30).
        budget: the callbacks' share of a period (default 0.05).
        buffer: events the bus holds before reporters wait (default 1024).
        drain_timeout: how long the run's end waits for callbacks, seconds.
        stall_periods: periods of silence after which a rank the others wait for has
            stalled: a ``RankStalled`` and ``after_exception`` with
            ``{rank: RankStalledError}`` (default ``None``: not watched).
        on_stall: ``"warn"`` (default), or ``"restart"`` the group (local tasks only).
        callbacks: training callbacks (``UserCallback``s, objects with its hooks, or
            with state only).
        log: record every event of the run to this file (msgpack, or JSON Lines for
            ``.jsonl``); never overwritten: only a resumed run appends to it.
        state_dir: snapshot every stateful callback at every checkpoint, into it; the
            run's storage root. A reported checkpoint outside it is copied in, to
            ``checkpoint_<index>``, and callbacks get the copy's path.
        resume_from: continue the run from this checkpoint, or the latest complete
            one in this run directory: callbacks get their saved states in place
            (mismatches are warnings; ``strict_state=True`` raises), and the run
            keeps its id, rounds and report indices. A checkpoint without saved
            states is an error unless ``allow_fresh_state``.
        preempt_grace: how long a run told to stop by SIGTERM takes to end in order,
            seconds (default 25); then it raises ``handlers.Preempted`` (exit 143).
        engine: where ``run.workers(train)`` runs the workers: this process's tasks by
            default, or ``adapters.ray.RayEngine()`` (needs ``state_dir``).
    """
    ranks = keywords.get("required_ranks")
    if ranks is not None and not isinstance(ranks, list | tuple):
        try:
            keywords["required_ranks"] = tuple(ranks)
        except TypeError:
            raise OptionTypeError(
                "required_ranks", f"required_ranks must be ranks (ints), got {ranks!r}"
            ) from None
    return Run(
        options=RunOptions.build(options, **keywords),
        callbacks=callbacks,
        name=name,
        run_id=run_id,
        storage=storage,
        config=config,
        clock=clock,
        log=log,
        state_dir=state_dir,
        resume_from=resume_from,
        strict_state=strict_state,
        allow_fresh_state=allow_fresh_state,
        engine=engine,
    )
