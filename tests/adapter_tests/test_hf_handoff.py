"""The hand-off under the HF and Ray adapters: a bus in its own thread, fed from this one.

No Trainer here (``test_hf.py`` has those): the bus thread, its bounds, a
callback's failure of the run reaching the trainer's thread (a fake trainer
loop), the ``trainer_state.json`` merge and the one-line import error.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

from adapters import AdapterOptions
from adapters._bus_thread import BusThread
from adapters._hf_state import merge_stateful_callbacks
from adapters._options import Backend
from adapters._threaded_run import ThreadedRun
from eventbus import (
    BusClosed,
    CheckpointSaved,
    Event,
    EventBus,
    Report,
    RunFinished,
    RunResult,
    RunStarted,
    TrainRunContext,
)
from eventbus._stages import Stage
from eventbus._subscription import ErrorPolicy
from eventbus.log import read_log
from eventbus.state._model import CallbackState, Snapshot, StateFormatError
from handlers import UserCallback
from handlers._attach import attach_user_callbacks
from handlers._core import RunCore

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
        buffer=64,
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
        lambda bus: bus.subscribe(Report, gate), backend=backend, buffer=4, handoff_timeout=0.05
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


def test_a_handler_that_fails_the_run_is_kept_for_the_trainer_and_the_bus_goes_on() -> None:
    seen: list[int] = []

    def fail(event: Report) -> None:
        raise RuntimeError("fails the run")

    def setup(bus: EventBus) -> None:
        bus.subscribe(Report, fail, on_error="raise")
        bus.subscribe(Report, lambda e: seen.append(e.index))

    thread = BusThread(setup)
    thread.start()
    thread.handoff(report(0))
    assert thread.wait_idle(10)
    assert isinstance(thread.failure, RuntimeError) and thread.error is None
    assert thread.handoff(report(1))  # still running: the run's end can be delivered
    close = thread.close()
    assert close is not None and close.drained
    assert seen == [0, 1]


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
            order=Stage.OBSERVE,
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
    with pytest.raises(ValueError, match="buffer"):
        BusThread(lambda bus: None, buffer=0)


# --- a callback's failure of the run reaches the trainer's thread ---------------------------


class Results(UserCallback):
    """What the run's callbacks saw: rounds, and every ``after_run``."""

    def __init__(self) -> None:
        self.rounds = 0
        self.results: list[RunResult] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        self.rounds += 1

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


class FailsTheRun(UserCallback):
    """Raises ``exc`` at round ``at``; ``on_error="raise"``: that fails the run."""

    on_error: ClassVar[ErrorPolicy] = "raise"

    def __init__(self, exc: BaseException, at: int) -> None:
        self.exc, self.at, self.rounds = exc, at, 0

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        self.rounds += 1
        if self.rounds == self.at:
            raise self.exc


def start_run(callbacks: list[Any], log: Path, backend: Backend = "asyncio") -> ThreadedRun:
    run = ThreadedRun("eventbus-test", AdapterOptions(backend=backend, period=0.5))
    run.start(RunCore(callbacks, name="run", world_size=1, run_id="run"), log=log)
    return run


def fake_trainer(run: ThreadedRun, steps: int) -> list[int]:
    """A trainer's loop as the adapters see it: a report per step, handed off from this
    thread; each step lasts until the bus has handled it (so the test is deterministic)."""
    done: list[int] = []
    for step in range(steps):
        run.handoff(report(step))
        done.append(step)
        assert run.thread is not None and run.thread.wait_idle(10)
    run.finish("finished")
    return done


@pytest.mark.parametrize(
    ("exc", "status", "backend"),
    [
        (RuntimeError("a callback failed the run"), "failed", "asyncio"),
        (RuntimeError("a callback failed the run"), "failed", "trio"),
        (KeyboardInterrupt(), "cancelled", "asyncio"),
        (SystemExit(3), "failed", "asyncio"),
    ],
    ids=["raise-asyncio", "raise-trio", "interrupt", "exit"],
)
def test_a_callback_failing_the_run_ends_it_then_raises_in_the_trainer(
    tmp_path: Path, exc: BaseException, status: str, backend: Backend
) -> None:
    results = Results()
    run = start_run([FailsTheRun(exc, at=3), results], tmp_path / "run.evlog", backend)
    steps: list[int] = []
    with pytest.raises(type(exc)) as raised:
        steps = fake_trainer(run, 10)
    assert raised.value is exc  # as itself, in the trainer's thread
    assert steps == []  # the loop stopped at the hand-off after round 3 (index 2)
    assert results.rounds == 3  # the others still got the round that failed the run
    (result,) = results.results  # after_run once, before the trainer saw the exception
    assert result.status == status and result.rounds == 3
    # Raised once: what the trainer does next is a no-op.
    run.handoff(report(99))
    run.finish("finished")
    assert len(results.results) == 1
    finished = [e for e in read_log(tmp_path / "run.evlog").events if isinstance(e, RunFinished)]
    assert [(e.status, e.error is not None) for e in finished] == [(status, True)]


def test_a_failure_while_the_run_ends_is_raised_by_finish(tmp_path: Path) -> None:
    exc = RuntimeError("failed the last round")
    results = Results()
    run = start_run([FailsTheRun(exc, at=2), results], tmp_path / "run.evlog")
    run.handoff(report(0))
    run.handoff(report(1))  # fails the run in the bus's thread, maybe after finish began
    with pytest.raises(RuntimeError) as raised:
        run.finish("finished")
    assert raised.value is exc
    (result,) = results.results
    assert (result.status, result.error) == ("failed", "RuntimeError: failed the last round")


def test_a_failing_after_run_is_raised_by_finish_and_runs_once(tmp_path: Path) -> None:
    class FailsAfterRun(UserCallback):
        on_error: ClassVar[ErrorPolicy] = "raise"
        calls = 0

        def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
            FailsAfterRun.calls += 1
            raise KeyboardInterrupt

    run = start_run([FailsAfterRun()], tmp_path / "run.evlog")
    run.handoff(report(0))
    with pytest.raises(KeyboardInterrupt):
        run.finish("finished")
    assert FailsAfterRun.calls == 1
    run.finish("finished")  # nothing more to raise
    assert FailsAfterRun.calls == 1


# --- the trainer_state.json merge ---------------------------------------------------------


def hf_trainer_state(path: Path, section: dict[str, Any]) -> Path:
    document = {"global_step": 5, "log_history": [{"loss": 1.5, "step": 5}]}
    document["stateful_callbacks"] = section
    path.write_text(json.dumps(document, indent=2, sort_keys=True))
    return path


def test_merge_keeps_hf_entries_and_replaces_stale_ones(tmp_path: Path) -> None:
    control = {"args": {"should_save": True}, "attributes": {}}
    stale = {"args": {}, "attributes": {"rounds": 1}}
    path = hf_trainer_state(
        tmp_path / "trainer_state.json", {"TrainerControl": control, "Counter": stale}
    )
    fresh: CallbackState = {"args": {}, "attributes": {"rounds": 7}}
    snapshot = Snapshot(checkpoint=str(tmp_path), states={"pkg.mod.Counter": fresh})
    merge_stateful_callbacks(path, snapshot)
    document = json.loads(path.read_text())
    assert document["stateful_callbacks"] == {"TrainerControl": control, "Counter": fresh}
    assert document["global_step"] == 5 and document["log_history"][0]["loss"] == 1.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trainer_state.json"]  # no temp left


def test_merge_rewrites_only_the_sections_text_byte_for_byte_as_a_full_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF's ``log_history`` grows by an entry per log; re-encoding it at every save
    cost the trainer milliseconds. Only the section is encoded now, and the file is
    the one a full rewrite (HF's formatting) would give, NaN included."""
    history = [{"loss": float("nan") if i == 3 else 1.0 / (i + 1), "step": i} for i in range(300)]
    document: dict[str, Any] = {"global_step": 300, "log_history": history, "zeta": {"a": 1}}
    document["stateful_callbacks"] = {"TrainerControl": {"args": {}, "attributes": {}}}
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    fresh: CallbackState = {"args": {"k": [1, 2]}, "attributes": {"rounds": 7, "best": None}}
    encoded: list[Any] = []
    dumps = json.dumps

    def spied(obj: Any, **keywords: Any) -> str:
        encoded.append(obj)
        return dumps(obj, **keywords)

    monkeypatch.setattr(json, "dumps", spied)
    merge_stateful_callbacks(path, Snapshot(checkpoint=str(tmp_path), states={"m.Counter": fresh}))
    monkeypatch.undo()
    document["stateful_callbacks"]["Counter"] = fresh
    assert path.read_text() == json.dumps(document, indent=2, sort_keys=True) + "\n"
    assert all("log_history" not in obj for obj in encoded)  # HF's part was not re-encoded

    # Laid out otherwise (compact, or cut short): the whole file is parsed, as before.
    path.write_text(json.dumps(document))
    merge_stateful_callbacks(path, Snapshot(checkpoint=str(tmp_path), states={"m.Counter": fresh}))
    assert json.loads(path.read_text())["stateful_callbacks"]["Counter"] == fresh
    text = json.dumps(document, indent=2, sort_keys=True)
    path.write_text(text[: text.index('"zeta"')])  # a file HF was killed writing
    with pytest.raises(StateFormatError, match="not JSON"):
        merge_stateful_callbacks(path, Snapshot())


def test_merge_refuses_a_file_that_is_not_hf_state(tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        merge_stateful_callbacks(path, Snapshot())
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        merge_stateful_callbacks(path, Snapshot())
    path.write_text('{"stateful_callbacks": [1]}')
    with pytest.raises(ValueError, match="stateful_callbacks is not a mapping"):
        merge_stateful_callbacks(path, Snapshot())


def test_merge_reads_a_bounded_regular_file(tmp_path: Path) -> None:
    """HF's file is read like our own snapshots: never more than ``max_bytes``, and a
    FIFO or directory in its place is refused before anything is read."""
    path = hf_trainer_state(tmp_path / "trainer_state.json", {})
    before = path.read_bytes()
    with pytest.raises(StateFormatError, match="refused unread"):
        merge_stateful_callbacks(path, Snapshot(), max_bytes=len(before) - 1)
    assert path.read_bytes() == before  # refused, not rewritten
    merge_stateful_callbacks(path, Snapshot(), max_bytes=len(before))
    fifo = tmp_path / "fifo" / "trainer_state.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(StateFormatError):
        merge_stateful_callbacks(fifo, Snapshot())  # would block forever if opened plainly


def test_the_hf_format_needs_no_transformers_the_callback_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    for name in ("adapters.transformers", "adapters._hf_callback", "adapters._hf_state"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    adapter = importlib.import_module("adapters.transformers")
    hf_state = importlib.import_module("adapters._hf_state")
    state = {"args": {}, "attributes": {"rounds": 2}}
    path = hf_trainer_state(tmp_path / "trainer_state.json", {"Counter": state})
    assert hf_state.read_hf_trainer_state(path).states == {"Counter": state}
    for name in ("EventBusCallback", "run_with_failures"):
        with pytest.raises(ImportError, match=r"pip install 'train-eventbus\[transformers\]'"):
            getattr(adapter, name)
    with pytest.raises(ImportError, match=r"train-eventbus\[transformers\]") as caught:
        exec("from adapters.transformers import EventBusCallback", {})
    assert "\n" not in str(caught.value)
