"""Lightning hands the run each round whole (issue 39, item 4): the ranks' metrics it
gathered go to the run as one round, never split into reports gathered again; the log
still holds each rank's report, and a replay gathers the same rounds from them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install '.[lightning]')")
pytest.importorskip("lightning", reason="lightning is not installed (pip install '.[lightning]')")

from _callbacks import Inputs
from _lightning_model import Regression, make_trainer

from adapters._bus_thread import BusThread
from adapters._stepped_bus import SteppedBus
from adapters._threaded_run import ThreadedRun
from adapters.lightning import EventBusCallback
from eventbus import Report
from eventbus.log import read_log, replay_file
from handlers._attach import attach_user_callbacks
from handlers._reports import ReportCallbackHandler


@pytest.fixture(params=["in_hooks", "in_thread"])
def bus_runs(request: pytest.FixtureRequest) -> Iterator[str]:
    host = SteppedBus if request.param == "in_hooks" else BusThread
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ThreadedRun, "_host_class", lambda self: host)
        yield request.param


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Counts the calls of the gatherer's method ``name`` while it wraps it."""
    calls = [0]
    original = getattr(ReportCallbackHandler, name)

    def counted(handler: ReportCallbackHandler, *args: Any) -> Any:
        calls[0] += 1
        return original(handler, *args)

    monkeypatch.setattr(ReportCallbackHandler, name, counted)
    return calls


def test_each_round_is_taken_whole_and_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bus_runs: str
) -> None:
    taken, admitted = counting(monkeypatch, "take_round"), counting(monkeypatch, "_admit")
    inputs = Inputs()
    callback = EventBusCallback([inputs], log=True)
    make_trainer(tmp_path, [callback]).fit(Regression())
    # 10 steps, a log every 2, and the save at step 5 (no log): 6 rounds, each taken once.
    assert [metrics[0]["step"] for metrics in inputs.rounds] == [2, 4, 5, 6, 8, 10]
    assert (taken, admitted) == ([6], [0])  # the per-report path: never
    assert callback.log_path is not None
    events = read_log(callback.log_path).events
    assert [(r.rank, r.index) for r in events if isinstance(r, Report)] == [
        (0, i) for i in range(6)
    ]
    monkeypatch.undo()
    replayed = Inputs()
    anyio.run(replay_file, callback.log_path, lambda bus: attach_user_callbacks(bus, [replayed]))
    assert replayed.rounds == inputs.rounds and replayed.checkpoints == inputs.checkpoints
