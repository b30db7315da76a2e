"""A fit resumed through a trainer adapter continues the run, as ``open_run``'s resume does.

Issue 39, item 2: one training run, one history. The first fit crashes after
its first checkpoint; the second resumes from it. Both fits must be the same
run (its id in ``after_run``'s context and result), recorded in one log, the
second appended to the first and numbered after it (``RunStarted`` then
``RunResumed``, as ``open_run`` writes a resume), its rounds continuing; and
the resumed fit must deliver nothing to a callback before its ``before_run``
(a tracker that gets an event first fails with "got an event before the run
began", a ``HandlerFailed`` in the log).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

pytest.importorskip("torch", reason="torch is not installed (pip install '.[transformers]')")
pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install '.[transformers]')"
)
pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")

import _lightning_model  # noqa: E402
import test_hf  # noqa: E402
from _callbacks import Inputs, RoundCounter  # noqa: E402

from adapters import lightning as pl_adapter  # noqa: E402
from adapters import transformers as hf_adapter  # noqa: E402
from adapters._bus_thread import BusThread  # noqa: E402
from adapters._stepped_bus import SteppedBus  # noqa: E402
from adapters._threaded_run import ThreadedRun  # noqa: E402
from adapters.tensorboard import TensorBoardLogger  # noqa: E402
from eventbus import (  # noqa: E402
    BudgetReport,
    CheckpointSaved,
    Event,
    HandlerFailed,
    RoundGathered,
    RunFinished,
    RunResult,
    RunResumed,
    RunStarted,
    StateRestored,
    TrainRunContext,
)
from eventbus.log import read_log  # noqa: E402
from handlers import UserCallback  # noqa: E402

#: What a callback may be handed around a run's start: each must come after before_run.
_EARLY = (RunResumed, StateRestored, BudgetReport, CheckpointSaved)


class Hooks(UserCallback):
    """Every hook it is called with, in order, and the run id each run context names."""

    event_types: ClassVar[tuple[type[Event], ...]] = _EARLY

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.run_ids: set[str] = set()

    def _saw(self, hook: str, run_context: TrainRunContext) -> None:
        self.calls.append(hook)
        self.run_ids.add(run_context.run_id)

    def before_run(self, run_context: TrainRunContext) -> None:
        self._saw("before_run", run_context)

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self._saw("after_report", run_context)

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self._saw("after_exception", run_context)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self._saw("after_run", run_context)

    def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        self._saw(type(event).__name__, run_context)


class AsyncHooks(Hooks):
    """The same, as coroutines: they run in a lane of their own, not inline."""

    async def before_run(self, run_context: TrainRunContext) -> None:  # type: ignore[override]
        self._saw("before_run", run_context)

    async def after_report(  # type: ignore[override]
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self._saw("after_report", run_context)

    async def after_exception(  # type: ignore[override]
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        self._saw("after_exception", run_context)

    async def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:  # type: ignore[override]
        self._saw("after_run", run_context)

    async def on_event(self, run_context: TrainRunContext, event: Event) -> None:  # type: ignore[override]
        self._saw(type(event).__name__, run_context)


@dataclass
class Fit:
    """One fit's callbacks and what it left."""

    inputs: Inputs
    hooks: tuple[Hooks, Hooks]
    run_id: str


def callbacks(root: Path) -> list[Any]:
    """Our callbacks for one fit: what they saw, a stateful one, and a tracker of the library's
    own (the one that said "got an event before the run began" on a resume)."""
    return [Inputs(), Hooks(), AsyncHooks(), RoundCounter(), TensorBoardLogger(root / "tb")]


def fit_hf(root: Path, *, resume: bool) -> Fit:
    """10 steps, a log every 2, a save every 5: the first fit fails at step 8, the second
    resumes from the latest checkpoint (``checkpoint-5``)."""
    ours = callbacks(root)
    callback = hf_adapter.EventBusCallback(ours, log=True)
    model = test_hf.TinyModel(fail_at_call=None if resume else 8)
    trainer = test_hf.make_trainer(root, callback, model=model)
    if resume:
        hf_adapter.run_with_failures(trainer, resume_from_checkpoint=True)
    else:
        with pytest.raises(RuntimeError, match="failed at call 8"):
            hf_adapter.run_with_failures(trainer)
    return Fit(ours[0], (ours[1], ours[2]), callback.run_id)


def fit_lightning(root: Path, *, resume: bool, ckpt_path: str) -> Fit:
    """The same with Lightning: a failure at step 8, then ``fit(ckpt_path=...)``."""
    ours = callbacks(root)
    callback = pl_adapter.EventBusCallback(ours, log=True)
    trainer = _lightning_model.make_trainer(root, [callback])
    if resume:
        trainer.fit(_lightning_model.Regression(), ckpt_path=ckpt_path)
    else:
        with pytest.raises(RuntimeError, match="failed at step 8"):
            trainer.fit(_lightning_model.Regression(fail_at_step=8))
    return Fit(ours[0], (ours[1], ours[2]), callback.run_id)


@pytest.fixture(params=["in_hooks", "in_thread"])
def bus_runs(request: pytest.FixtureRequest) -> Iterator[str]:
    """Through both hosts of an adapter's bus: stepped in the trainer's hooks, and a thread."""
    host = SteppedBus if request.param == "in_hooks" else BusThread
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ThreadedRun, "_host_class", lambda self: host)
        yield request.param


@pytest.mark.parametrize(
    "resumed_from",
    [
        "hf:checkpoint-5",
        "lightning:last",
        "lightning:epoch=0-step=5.ckpt",
    ],
)
def test_a_resumed_fit_continues_the_same_run_in_the_same_log(
    tmp_path: Path, bus_runs: str, resumed_from: str
) -> None:
    framework, where = resumed_from.split(":")
    if framework == "hf":
        first = fit_hf(tmp_path, resume=False)
        second = fit_hf(tmp_path, resume=True)
    else:
        ckpt = where if where == "last" else str(tmp_path / "checkpoints" / where)
        first = fit_lightning(tmp_path, resume=False, ckpt_path=ckpt)
        second = fit_lightning(tmp_path, resume=True, ckpt_path=ckpt)

    # One run: the same id in both fits' results and in every run context.
    (failed,), (finished,) = first.inputs.results, second.inputs.results
    assert (failed.status, finished.status) == ("failed", "finished")
    run_id = failed.run_id
    assert finished.run_id == run_id == first.run_id == second.run_id
    for hooks in (*first.hooks, *second.hooks):
        assert hooks.run_ids == {run_id}

    # One log, the resumed fit's events appended after the first's and numbered after them.
    logs = sorted(tmp_path.glob("eventbus-*.msgpack"))
    assert [log.name for log in logs] == [f"eventbus-{run_id}.msgpack"]
    recorded = read_log(logs[0])
    assert recorded.header.run_id == run_id
    events = recorded.events
    assert {e.run_id for e in events if hasattr(e, "run_id")} == {run_id}
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    edges = [
        type(e).__name__ for e in events if isinstance(e, RunStarted | RunResumed | RunFinished)
    ]
    assert edges == ["RunStarted", "RunFinished", "RunStarted", "RunResumed", "RunFinished"]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["failed", "finished"]
    # The rounds continue from the checkpoint's (rounds 0-2, the save at step 5 the third):
    # the crash's round 3 (step 6) is redone, as open_run redoes what a crash lost.
    rounds = [e.round for e in events if isinstance(e, RoundGathered)]
    assert rounds == [0, 1, 2, 3, 3, 4, 5]
    assert finished.rounds == 6

    # Nothing failed in our callbacks, the tracker included.
    assert [e for e in events if isinstance(e, HandlerFailed)] == []

    # In the resumed fit each callback's first hook is before_run (inline and in a lane).
    for hooks in second.hooks:
        assert hooks.calls[0] == "before_run", hooks.calls
        assert (hooks.calls.count("before_run"), hooks.calls.count("after_run")) == (1, 1)
        assert {"RunResumed", "StateRestored"} <= set(hooks.calls)  # they came, after it


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_fresh_lightning_fit_moves_an_earlier_log_aside_never_over_it(tmp_path: Path) -> None:
    """A run's folder always starts (issue 40, item 4): a fit that does not resume, given
    the log of an earlier one, moves that log aside (``run.1.evlog``) and records its own."""
    log = tmp_path / "run.evlog"
    for _ in range(2):
        callback = pl_adapter.EventBusCallback([RoundCounter()], log=log)
        _lightning_model.make_trainer(tmp_path, [callback]).fit(_lightning_model.Regression())
    first, second = read_log(tmp_path / "run.1.evlog"), read_log(log)
    started = [e for e in first.events + second.events if isinstance(e, RunStarted)]
    assert len(started) == 2 and started[0].run_id != started[1].run_id
