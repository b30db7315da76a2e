"""The hand-off under the HF and Ray adapters: a bus in its own thread, fed from this one.

No Trainer here (``test_hf.py`` has those): the bus thread, its bounds, the
``trainer_state.json`` merge and the one-line import error.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from adapters._bus_thread import Backend, BusThread
from eventbus import (
    BusClosed,
    CallbackState,
    CheckpointSaved,
    Event,
    EventBus,
    Report,
    RunStarted,
    Snapshot,
)
from handlers import TrainRunContext, UserCallback, attach_user_callbacks

BACKENDS: list[Backend] = ["asyncio", "trio"]


def report(index: int, rank: int = 0, world_size: int = 1) -> Report:
    return Report(run_id="run", rank=rank, world_size=world_size, index=index, metrics={"i": index})


class Gate:
    """A sync handler that holds the bus's loop until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.seen: list[int] = []

    def __call__(self, event: Report) -> None:
        self.seen.append(event.index)
        if len(self.seen) == 1:
            self.entered.set()
            self.release.wait(30)


@pytest.mark.parametrize("backend", BACKENDS)
def test_events_arrive_in_order_and_close_drains(backend: Backend) -> None:
    seen: list[int] = []
    thread = BusThread(
        lambda bus: bus.subscribe(Report, lambda e: seen.append(e.index)),
        backend=backend,
        capacity=64,
    )
    thread.start()
    accepted = [thread.handoff(report(i)) for i in range(500)]
    close = thread.close()
    assert all(accepted) and thread.handed_off == 500 and thread.dropped == 0
    assert seen == list(range(500))
    assert close is not None and close.drained and close.delivered == 500


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_full_hand_off_waits_a_bounded_time_then_counts_and_warns(backend: Backend) -> None:
    gate = Gate()
    thread = BusThread(
        lambda bus: bus.subscribe(Report, gate), backend=backend, capacity=4, handoff_timeout=0.05
    )
    thread.start()
    try:
        thread.handoff(report(0))
        assert gate.entered.wait(10)  # the loop is now stuck in the handler
        assert [thread.handoff(report(i)) for i in range(1, 5)] == [True] * 4  # fills the deque
        with capture_logs() as logs:
            assert thread.handoff(report(5)) is False  # waited 0.05 s for room, then dropped
            assert thread.handoff(report(6)) is False  # still stuck: dropped without waiting
    finally:
        gate.release.set()
    assert thread.dropped == 2
    assert [log["dropped"] for log in logs if log["event"] == "bus hand-off full: event dropped"]
    assert thread.wait_idle(10)
    assert thread.handoff(report(7)) is True  # room again
    thread.close()
    assert gate.seen == [0, 1, 2, 3, 4, 7]


def test_close_abandons_a_stuck_bus_after_its_deadline() -> None:
    gate = Gate()
    thread = BusThread(lambda bus: bus.subscribe(Report, gate))
    thread.start()
    thread.handoff(report(0))
    assert gate.entered.wait(10)
    with capture_logs() as logs:
        assert thread.close(timeout=0.05) is None
    assert [log["event"] for log in logs] == ["bus thread still busy at close; abandoned"]
    with pytest.raises(BusClosed):
        thread.handoff(report(1))
    gate.release.set()
    assert thread.wait_idle(10)  # the thread ends on its own once released


def test_a_bus_failed_by_its_handler_refuses_hand_offs_without_hanging() -> None:
    def fail(event: Report) -> None:
        raise RuntimeError("fails the bus")

    thread = BusThread(lambda bus: bus.subscribe(Report, fail, on_error="raise"))
    thread.start()
    thread.handoff(report(0))
    assert thread.wait_idle(10)
    assert isinstance(thread.error, RuntimeError)
    with pytest.raises(BusClosed):
        thread.handoff(report(1))
    assert thread.close() is None


def test_handoff_after_idle_publishes_once_derived_events_were_handled() -> None:
    """A checkpoint's snapshot must see the rounds the reports before it produced."""

    class Rounds(UserCallback):
        count = 0

        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
        ) -> None:
            Rounds.count += 1

    seen_at_checkpoint: dict[str, int] = {}

    def setup(bus: EventBus) -> None:
        attach_user_callbacks(bus, [Rounds()], world_size=1)
        bus.subscribe(
            CheckpointSaved,
            lambda e: seen_at_checkpoint.setdefault(e.checkpoint, Rounds.count),
            order=10**9,
        )

    thread = BusThread(setup)
    thread.start()
    thread.handoff(RunStarted(run_id="run", name="run", world_size=1))
    for i in range(50):
        thread.handoff(report(i))
    thread.handoff(CheckpointSaved(run_id="run", checkpoint="plain", index=49))
    thread.handoff_after_idle(CheckpointSaved(run_id="run", checkpoint="after-idle", index=49))
    thread.close()
    # Plainly handed off, the checkpoint overtakes rounds derived from the reports before it.
    assert seen_at_checkpoint["plain"] < 50
    assert seen_at_checkpoint["after-idle"] == 50


def test_handoff_needs_a_running_bus() -> None:
    thread = BusThread(lambda bus: None)
    event: Event = report(0)
    with pytest.raises(BusClosed):
        thread.handoff(event)
    assert thread.close() is None
    with pytest.raises(ValueError, match="capacity"):
        BusThread(lambda bus: None, capacity=0)


# --- the trainer_state.json merge ---------------------------------------------------------


def hf_trainer_state(path: Path, section: dict[str, Any]) -> Path:
    document = {"global_step": 5, "log_history": [{"loss": 1.5, "step": 5}]}
    document["stateful_callbacks"] = section
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    return path


def test_merge_keeps_hf_entries_and_replaces_stale_ones(tmp_path: Path) -> None:
    transformers_adapter = pytest.importorskip("adapters.transformers")
    control = {"args": {"should_save": True}, "attributes": {}}
    stale = {"args": {}, "attributes": {"rounds": 1}}
    path = hf_trainer_state(
        tmp_path / "trainer_state.json", {"TrainerControl": control, "Counter": stale}
    )
    fresh: CallbackState = {"args": {}, "attributes": {"rounds": 7}}
    snapshot = Snapshot(checkpoint=str(tmp_path), states={"pkg.mod.Counter": fresh})
    transformers_adapter.merge_stateful_callbacks(path, snapshot)
    document = json.loads(path.read_text())
    assert document["stateful_callbacks"] == {"TrainerControl": control, "Counter": fresh}
    assert document["global_step"] == 5 and document["log_history"][0]["loss"] == 1.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer_state.json"]  # no temp left


def test_merge_refuses_a_file_that_is_not_hf_state(tmp_path: Path) -> None:
    transformers_adapter = pytest.importorskip("adapters.transformers")
    path = tmp_path / "trainer_state.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        transformers_adapter.merge_stateful_callbacks(path, Snapshot())
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        transformers_adapter.merge_stateful_callbacks(path, Snapshot())


def test_importing_without_transformers_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.delitem(sys.modules, "adapters.transformers", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'train-eventbus\[transformers\]'"):
        importlib.import_module("adapters.transformers")
