"""What keeps the trainer's side of the hand-off cheap, checked by counting, never by timing.

A hand-off never wakes the bus thread: it looks at its deque once per poll
interval, so over a burst of hooks lasting ``T`` seconds it wakes at most
``T / poll_interval + 1`` times (``BusThread.wakeups`` counts). Only a caller
that blocks until the bus is done (``wait_idle``, the run's end) wakes it at
once, so the end of a run, a flush and a failure are not delayed by a poll.
``benchmarks/bench_hf_handoff.py`` measures the cost itself.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import pytest
from structlog.testing import capture_logs

from adapters import AdapterOptions
from adapters._bus_thread import BusThread
from adapters._options import Backend
from adapters._threaded_run import ThreadedRun
from eventbus import (
    CheckpointSaved,
    Event,
    EventBus,
    Report,
    RunResult,
    RunStarted,
    TrainRunContext,
)
from eventbus._stages import Stage
from eventbus._subscription import ErrorPolicy
from handlers import UserCallback
from handlers._attach import attach_user_callbacks
from handlers._core import RunCore

#: Longer than any test here: a wake-up by the poll timer would not happen in time.
NEVER = 600.0


def report(index: int) -> Report:
    return Report(run_id="run", rank=0, world_size=1, index=index, metrics={"i": index})


def burst(thread: BusThread, events: list[Report]) -> tuple[int, float]:
    """Hand off ``events`` back to back: (bus-thread wake-ups meanwhile, seconds it took)."""
    t0 = time.monotonic()
    w0 = thread.wakeups
    for event in events:
        assert thread.handoff(event)
    woke = thread.wakeups - w0
    return woke, time.monotonic() - t0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@pytest.mark.parametrize("capacity", [100_000, 64], ids=["roomy", "fills-up"])
def test_a_burst_wakes_the_bus_thread_at_most_once_per_poll_interval(
    backend: Backend, capacity: int
) -> None:
    """Also when the burst fills the deque again and again: the trainer then waits for
    the bus's next look instead of waking it (the old code woke it at half full)."""
    interval = 0.02
    seen: list[int] = []
    thread = BusThread(
        lambda bus: bus.subscribe(Report, lambda e: seen.append(e.index)),
        backend=backend,
        buffer=capacity,
        poll_interval=interval,
    )
    thread.start()
    events = [report(i) for i in range(1000)]
    woke, seconds = burst(thread, events)
    assert woke <= seconds / interval + 1, (woke, seconds)
    close = thread.close()
    assert close is not None and close.drained
    assert seen == list(range(1000))  # in order, nothing lost
    assert thread.dropped == 0 and thread.handed_off == 1000


def test_only_a_waiting_caller_wakes_the_bus_and_everything_arrives_in_order() -> None:
    """With a poll interval longer than the test, hand-offs (checkpoints included) wake
    nothing; ``wait_idle`` and ``close`` wake the bus at once and find all of it."""

    class Rounds(UserCallback):
        def __init__(self) -> None:
            self.rounds = 0

        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
        ) -> None:
            self.rounds += 1

    rounds = Rounds()
    at_checkpoint: dict[str, int] = {}

    def setup(bus: EventBus) -> None:
        attach_user_callbacks(bus, [rounds], world_size=1)
        bus.subscribe(
            CheckpointSaved,
            lambda e: at_checkpoint.setdefault(e.checkpoint, rounds.rounds),
            order=Stage.OBSERVE,
        )

    thread = BusThread(setup, poll_interval=NEVER)
    thread.start()
    thread.handoff(RunStarted(run_id="run", name="run", world_size=1))
    for i in range(30):
        thread.handoff(report(i))
    thread.handoff_after_idle(CheckpointSaved(run_id="run", checkpoint="c30", index=29))
    assert thread.wakeups == 0  # nothing handed off woke it
    assert thread.wait_idle(timeout=30)  # well before the poll interval: woken by the waiter
    assert rounds.rounds == 30 and at_checkpoint == {"c30": 30}
    for i in range(30, 40):
        thread.handoff(report(i))
    thread.handoff_after_idle(CheckpointSaved(run_id="run", checkpoint="c40", index=39))
    close = thread.close([report(40)], timeout=30)
    assert close is not None and close.drained
    assert rounds.rounds == 41 and at_checkpoint == {"c30": 30, "c40": 40}
    assert thread.wakeups <= 2  # one per waiter, at most


def test_a_callback_failing_the_run_reaches_the_trainer_without_waiting_for_a_poll(
    tmp_path: Path,
) -> None:
    class FailsTheRun(UserCallback):
        on_error: ClassVar[ErrorPolicy] = "raise"

        def __init__(self) -> None:
            self.results: list[RunResult] = []

        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
        ) -> None:
            raise RuntimeError("fails the run")

        def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
            self.results.append(result)

    callback = FailsTheRun()
    run = ThreadedRun("eventbus-test", AdapterOptions(poll_interval=NEVER))
    run.start(RunCore([callback], name="run", world_size=1, run_id="run"), log=None)
    run.handoff(report(0))
    with pytest.raises(RuntimeError, match="fails the run"):
        run.finish("finished")  # wakes the bus, sees the failure, ends the run with it
    (result,) = callback.results
    assert result.status == "failed"


def test_a_recipe_is_made_in_the_bus_thread_and_one_that_fails_is_logged_and_skipped() -> None:
    made_in: list[str] = []
    seen: list[int] = []

    def make(index: int, metrics: dict[str, Any]) -> Report:
        made_in.append(threading.current_thread().name)
        if index == 1:
            raise ValueError("cannot make this one")
        return Report(run_id="run", rank=0, world_size=1, index=index, metrics=metrics)

    thread = BusThread(lambda bus: bus.subscribe(Report, lambda e: seen.append(e.index)))
    thread.start()
    with capture_logs() as logs:
        for i in range(3):
            assert thread.offer((make, i, {"i": i}))
        thread.close()
    assert seen == [0, 2]
    assert made_in == [thread.name] * 3
    assert [log["maker"] for log in logs if log["log_level"] == "error"] == ["make"]
    assert thread.handed_off == 3  # the one that could not be made was taken all the same


def test_runs_of_events_go_to_the_bus_in_batches_in_order_around_control_items() -> None:
    """The pump takes each run of events and recipes off the deque at once (up to 256)
    and publishes it with ``publish_many``; a barrier or an after-idle event between
    runs keeps its place."""
    seen: list[tuple[str, int]] = []
    batches: list[int] = []

    def setup(bus: EventBus) -> None:
        bus.subscribe(Report, lambda e: seen.append(("report", e.index)))
        bus.subscribe(RunStarted, lambda e: seen.append(("after idle", len(seen))))
        publish_many = bus.publish_many

        async def counted(events: Iterable[Event]) -> None:
            events = list(events)
            batches.append(len(events))
            await publish_many(events)

        bus.publish_many = counted  # type: ignore[method-assign]

    def make(index: int, metrics: dict[str, Any]) -> Report:
        return Report(run_id="run", rank=0, world_size=1, index=index, metrics=metrics)

    thread = BusThread(setup, poll_interval=NEVER, buffer=10_000)
    thread.start()
    for i in range(600):
        assert thread.offer(report(i) if i % 2 else (make, i, {"i": i}))
    assert thread.handoff_after_idle(RunStarted(run_id="run", name="r", world_size=1))
    for i in range(600, 610):
        assert thread.offer(report(i))
    assert thread.wait_idle()
    close = thread.close()
    assert close is not None and close.drained
    reports = [index for kind, index in seen if kind == "report"]
    assert reports == list(range(610))
    assert seen[600] == ("after idle", 600)  # after every report handed off before it
    # Nothing is looked at before wait_idle (the poll never comes): all 611 wait in the
    # deque, and the pump takes them in runs of at most 256, up to the after-idle event.
    assert batches == [256, 256, 88, 10]
    assert thread.handed_off == 611


# --- through Hugging Face's own CallbackHandler --------------------------------------------


class Steps(UserCallback):
    """The steps of the rounds it saw (module level: the callback pickles with it)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        self.steps.append(metrics[0]["step"])


def test_on_log_via_hfs_handler_wakes_the_bus_thread_at_most_once_per_poll_interval(
    tmp_path: Path,
) -> None:
    """With ``bus_runs="in_thread"`` (``test_trainer_thread_costs.py`` has the default,
    stepped in the hooks)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ.setdefault(name, "1")
    transformers = pytest.importorskip("transformers")
    from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState

    from adapters.transformers import EventBusCallback

    steps = Steps()
    interval = 0.05
    callback = EventBusCallback([steps], state=False, poll_interval=interval, bus_runs="in_thread")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    state, control = TrainerState(max_steps=3000), TrainerControl()
    handler = CallbackHandler([callback], None, None, None, None)
    handler.on_train_begin(args, state, control)
    thread = callback.bus_thread
    assert isinstance(thread, BusThread) and thread.poll_interval == interval
    t0 = time.monotonic()
    w0 = thread.wakeups
    for step in range(1, 3001):
        state.global_step = step
        handler.on_log(args, state, control, {"loss": 1.0 / step})
    woke, seconds = thread.wakeups - w0, time.monotonic() - t0
    assert woke <= seconds / interval + 1, (woke, seconds)
    assert pickle.loads(pickle.dumps(callback)).callbacks  # its report maker pickles too
    handler.on_train_end(args, state, control)
    assert steps.steps == list(range(1, 3001))
    assert callback.dropped == 0 and thread.handed_off == 3002  # RunStarted and RunFinished too


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_an_idle_bus_thread_backs_off_and_the_next_event_still_arrives(backend: Backend) -> None:
    """Each look that finds nothing doubles the pause, up to IDLE_POLL_INTERVAL: over
    a quiet second it looks about 10 times, not 1 / poll_interval = 200 times."""
    seen: list[int] = []
    thread = BusThread(
        lambda bus: bus.subscribe(Report, lambda e: seen.append(e.index)),
        backend=backend,
        poll_interval=0.005,
    )
    thread.start()
    w0 = thread.wakeups
    time.sleep(1.0)
    idle_wakeups = thread.wakeups - w0
    # 5, 10, 20, 40, 80 ms, then every 100 ms: about 13 in a second; 200 without backing off.
    assert idle_wakeups <= 25, idle_wakeups
    assert thread.handoff(report(0))
    assert thread.wait_idle()
    assert seen == [0]
    close = thread.close()
    assert close is not None and close.drained


def test_handed_off_counts_a_checkpoint_waiting_in_the_deque_as_it_counts_it_taken() -> None:
    thread = BusThread(lambda bus: None, poll_interval=NEVER)
    thread.start()
    thread.handoff(report(0))
    thread.handoff_after_idle(CheckpointSaved(run_id="run", checkpoint="c", index=0))
    assert thread.handed_off == 2  # waiting, not yet looked at
    assert thread.wait_idle()
    assert thread.handed_off == 2  # taken: the barrier wait_idle added is not counted
    thread.close()
