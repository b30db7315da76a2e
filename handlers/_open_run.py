"""``open_run``: the one call that composes a run (bus, gathering, callbacks, state, log).

A trainer should need one call and one ``async with``: this checks every
argument and option at the call, so a mistake is an error there, naming the
argument, and the run itself does the rest when it is entered.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Unpack

from eventbus._clock import Clock
from eventbus._options import OptionTypeError

from ._callback import UserCallback
from ._engine import WorkerEngine
from ._options import RunKeywords, RunOptions
from ._run import Run

__all__ = ["TrainingCallback", "open_run"]


class _HasState(Protocol):
    """A callback with state only (``state()``), no hooks: the state store keeps it."""

    def state(self) -> Mapping[str, Any]: ...


#: What a run takes as a callback: a ``UserCallback``, or an object with state only.
#: (At run time any object with ``UserCallback``'s hooks is taken too.)
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
    also when the body fails or is cancelled. The call checks the arguments and options
    (out of range: an ``OptionError``, a ``ValueError``; wrong type: a ``TypeError``,
    naming it); entering the run reads and writes files, and fails there before anything
    has started if it cannot. ``options``: a ``RunOptions``, the keywords changing it.

    Args:
        world_size: how many ranks report (1 to 131,072).
        required_ranks: the ranks a round waits for (default: all).
        period: the health-check period, seconds (default 2, as Ray Train's):
            failures are gathered and callback time budgeted per period.
        timeout: the default deadline of one callback call, seconds (default 30).
        budget: the callbacks' share of a period (default 0.05).
        buffer: events the bus holds before reporters wait (default 1024).
        drain_timeout: how long the run's end waits for callbacks, seconds.
        stall_periods: a rank the others wait for (the open round lacks it while
            they reported into it; on Ray, its progress is behind theirs), silent
            this many periods, has stalled: one console line, a
            ``RankStalled`` and ``after_exception`` with ``{rank: RankStalledError}``,
            once per stall (default ``None``: not watched).
        on_stall: ``"warn"`` (default), or ``"restart"``: a stall is also a failure of
            that rank, and ``run.workers`` restarts the group (local tasks only).
        callbacks: training callbacks (``UserCallback``s, or objects with its hooks,
            or with state only): anything else is a ``TypeError`` here.
        log: record every event of the run to this file (msgpack, or JSON Lines
            for ``.jsonl``), fsynced at every checkpoint. It is created by the run,
            never overwritten: only a resumed run appends to it.
        state_dir: snapshot every stateful callback at every checkpoint, into the
            checkpoint, with where the run stood; the run's storage root
            (``run_context.storage``) unless ``storage`` says otherwise. A reported
            checkpoint inside it is used as is; one outside is copied in, to
            ``checkpoint_<index>`` (links out of it refused), and callbacks get
            the copy's path.
        resume_from: continue the run from this checkpoint, or from the latest
            complete checkpoint in this run directory. The callbacks given get
            their saved states, in place (warnings for saved-but-missing and
            live-but-unsaved callbacks; ``strict_state=True`` raises instead); a
            checkpoint without saved states is an error unless
            ``allow_fresh_state``. The run keeps the saved run's id, continues
            its rounds and each rank's report indices, appends to its ``log``,
            and workers find the checkpoint in ``reporter.latest_checkpoint``.
            The run's own folder (``state_dir``) with no complete checkpoint yet
            starts the run fresh, said in one line; an earlier log nothing can
            continue is moved aside (``run.1.evlog``), never overwritten.
        preempt_grace: how long a run told to stop by SIGTERM takes to end in order,
            seconds (default 25): workers see ``reporter.should_checkpoint``, then
            ``should_stop``; what has not ended then is abandoned in order. The run
            takes SIGTERM in the main thread where no handler of the user's is
            installed, and raises ``handlers.Preempted`` (exit code 143).
        engine: where ``run.workers(train)`` runs the workers: by default this
            process's tasks; ``adapters.ray.RayEngine()`` runs them as a Ray Train
            job (it needs ``state_dir``), with the same worker function and callbacks.

    Relative paths are taken from the current directory.
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
