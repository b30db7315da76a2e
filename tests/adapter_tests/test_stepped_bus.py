"""The bus stepped in the trainer's own thread (``adapters._stepped_bus``), without a Trainer.

It must keep every promise of the bus thread it replaces by default (order,
checkpoints after the reports before them, a callback's failure of the run
reaching the trainer, bounded ends) while never starting a thread, and say
clearly where it cannot run.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, ClassVar

import anyio
import pytest
from structlog.testing import capture_logs

from adapters import AdapterOptions
from adapters._bus_thread import BusThread
from adapters._stepped_bus import SteppedBus
from adapters._threaded_run import ThreadedRun
from eventbus import CheckpointSaved, EventBus, Report, RunResult, RunStarted, TrainRunContext
from eventbus._stages import Stage
from eventbus._subscription import ErrorPolicy
from handlers import UserCallback
from handlers._attach import attach_user_callbacks
from handlers._core import RunCore

#: Longer than any test here: a step by the poll timer would not come in time.
NEVER = 600.0


def report(index: int) -> Report:
    return Report(run_id="run", rank=0, world_size=1, index=index, metrics={"i": index})


class Rounds(UserCallback):
    def __init__(self) -> None:
        self.rounds = 0
        self.threads: set[str] = set()
        self.results: list[RunResult] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        self.rounds += 1
        self.threads.add(threading.current_thread().name)

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.results.append(result)


def test_the_bus_runs_in_the_callers_thread_and_starts_none() -> None:
    rounds = Rounds()
    before = threading.active_count()
    bus = SteppedBus(lambda b: attach_user_callbacks(b, [rounds], world_size=1), poll_interval=0.05)
    bus.start()
    assert bus.running and threading.active_count() == before
    bus.handoff(RunStarted(run_id="run", name="run", world_size=1))
    for i in range(5):
        assert bus.offer(report(i))
    assert rounds.rounds == 0  # handed off, not yet stepped: a hand-off is an append
    assert bus.wait_idle()
    assert rounds.rounds == 5 and rounds.threads == {threading.current_thread().name}
    close = bus.close()
    assert close is not None and close.drained and not bus.running
    assert threading.active_count() == before


def test_poll_steps_at_most_once_per_poll_interval() -> None:
    seen: list[int] = []
    bus = SteppedBus(lambda b: b.subscribe(Report, lambda e: seen.append(e.index)))
    bus.poll_interval = NEVER
    bus.start()
    steps = bus.wakeups
    for i in range(100):
        bus.offer(report(i))
        bus.poll(handed_off=True)
        bus.poll()
    assert bus.wakeups == steps and seen == []  # within the interval: no step
    bus._next_take = 0.0  # the interval has passed since a hand-off's poll last stepped
    bus.poll(handed_off=True)
    assert bus.wakeups == steps + 1 and seen == list(range(100))  # one step took them all
    bus.poll()
    assert bus.wakeups == steps + 1  # nothing handed off, and its timers are not due
    bus._next_look = 0.0
    bus.poll()
    assert bus.wakeups == steps + 2  # a step for its timers alone
    bus.close()


def test_a_step_another_hook_took_does_not_hold_back_the_next_report() -> None:
    """A step's end takes what was left waiting a poll interval; the report handed off
    right after is still taken in its own hook. (With one clock for both, the step's
    end reset it, and every report waited for the next step's end, step after step.)"""
    seen: list[int] = []
    bus = SteppedBus(lambda b: b.subscribe(Report, lambda e: seen.append(e.index)))
    bus.poll_interval = NEVER
    bus.start()
    bus._next_take = 0.0  # a poll interval since a hand-off's poll last stepped
    bus.offer(report(0))
    bus.poll()
    assert seen == []  # another hook does not take what was just handed off
    bus._waiting_since = time.monotonic() - NEVER  # ... until it has waited a poll interval
    bus.poll()
    assert seen == [0]
    bus.offer(report(1))
    bus.poll(handed_off=True)
    assert seen == [0, 1]  # taken in its own hook, not at the next step's end
    bus.close()


def test_a_checkpoint_is_published_after_the_reports_before_it_in_its_own_hook() -> None:
    rounds = Rounds()
    at_checkpoint: dict[str, int] = {}

    def setup(bus: EventBus) -> None:
        attach_user_callbacks(bus, [rounds], world_size=1)
        bus.subscribe(
            CheckpointSaved,
            lambda e: at_checkpoint.setdefault(e.checkpoint, rounds.rounds),
            order=Stage.OBSERVE,
        )

    bus = SteppedBus(setup, poll_interval=NEVER)
    bus.start()
    bus.handoff(RunStarted(run_id="run", name="run", world_size=1))
    for i in range(30):
        bus.handoff(report(i))
    bus.handoff_after_idle(CheckpointSaved(run_id="run", checkpoint="c30", index=29))
    assert at_checkpoint == {"c30": 30}  # taken in the hook that saved it
    bus.close()


def test_a_full_hand_off_steps_the_bus_instead_of_dropping() -> None:
    seen: list[int] = []
    bus = SteppedBus(lambda b: b.subscribe(Report, lambda e: seen.append(e.index)), buffer=8)
    bus.poll_interval = NEVER
    bus.start()
    for i in range(100):
        assert bus.handoff(report(i))
    bus.close()
    assert seen == list(range(100)) and bus.dropped == 0


class Sleeps(UserCallback):
    """Awaits ``seconds`` a round; counts the rounds it finished."""

    timeout: ClassVar[float | None] = 5.0

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.done = 0

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
    ) -> None:
        await anyio.sleep(self.seconds)
        self.done += 1


def stepped(callback: UserCallback, reports: int) -> SteppedBus:
    """A started stepped bus with ``callback`` attached, the run begun, ``reports``
    handed off and not yet taken (no step by the poll timer comes in a test)."""
    bus = SteppedBus(lambda b: attach_user_callbacks(b, [callback], world_size=1))
    bus.poll_interval = NEVER
    bus.start()
    bus.handoff(RunStarted(run_id="run", name="run", world_size=1))
    for i in range(reports):
        bus.handoff(report(i))
    return bus


def test_a_step_runs_until_the_calls_it_started_end() -> None:
    """An async callback's await ends in the step that began it (issue 39): a call never
    spans two hooks, so it is charged its own time, not the trainer's between them."""
    sleeps = Sleeps(0.01)
    bus = stepped(sleeps, 3)
    started = bus.wakeups
    assert bus._step()  # idle once it returns: every call it began has ended
    assert sleeps.done == 3 and bus.wakeups == started + 1
    assert bus.bus is not None
    (sub,) = [s for s in bus.bus.stats().subscriptions if s.name == "Sleeps.after_report"]
    assert sub.calls == 3 and sub.timed_out == 0
    bus.close()


def test_a_call_past_its_deadline_is_cancelled_inside_the_step() -> None:
    """The watchdog runs in the step's loop: the deadline holds within the hook."""

    class PastItsDeadline(Sleeps):
        timeout: ClassVar[float | None] = 0.05

    sleeps = PastItsDeadline(3600)
    bus = stepped(sleeps, 2)
    assert bus._step()
    assert sleeps.done == 0
    assert bus.bus is not None
    (sub,) = [s for s in bus.bus.stats().subscriptions if s.name.endswith(".after_report")]
    assert sub.calls == 2 and sub.timed_out == 2
    bus.close()


def test_a_step_past_its_limit_leaves_the_rest_to_the_next_steps() -> None:
    """A bus that is not idle by the step's limit (``handoff_timeout``) gives the trainer
    back its thread; what is under way goes on at the next step."""
    sleeps = Sleeps(0.05)
    bus = stepped(sleeps, 1)
    assert not bus._step(0.001)  # the limit came before the callback's await ended
    assert sleeps.done == 0
    assert bus.wait_idle(timeout=5.0)
    assert sleeps.done == 1
    bus.close()


def test_a_callback_failing_the_run_reaches_the_trainer_and_after_run_runs_once() -> None:
    class FailsTheRun(Rounds):
        on_error: ClassVar[ErrorPolicy] = "raise"

        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
        ) -> None:
            raise KeyboardInterrupt  # as a Ctrl-C inside a callback

    callback = FailsTheRun()
    run = ThreadedRun("eventbus-test", AdapterOptions(poll_interval=NEVER))
    run.start(RunCore([callback], name="run", world_size=1, run_id="run"), log=None)
    assert isinstance(run.thread, SteppedBus)
    run.handoff(report(0))
    with pytest.raises(KeyboardInterrupt):
        run.finish("finished")
    (result,) = callback.results
    assert result.status == "cancelled"
    assert not run.running


def test_a_bus_still_busy_at_close_is_abandoned_with_a_warning_and_its_loop_closed() -> None:
    class Hangs(UserCallback):
        async def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], ckpt: str | None
        ) -> None:
            await anyio.sleep(3600)

    bus = SteppedBus(lambda b: attach_user_callbacks(b, [Hangs()], world_size=1))
    bus.start()
    bus.handoff(RunStarted(run_id="run", name="run", world_size=1))
    bus.handoff(report(0))
    with capture_logs() as logs:
        assert bus.close(timeout=0.2) is None
    assert any("abandoned" in log["event"] for log in logs)
    assert bus._loop is not None and bus._loop.is_closed()


def test_setup_that_fails_fails_start_with_its_cause() -> None:
    def setup(bus: EventBus) -> None:
        raise ValueError("bad wiring")

    bus = SteppedBus(setup)
    with pytest.raises(RuntimeError, match="failed to start") as caught:
        bus.start()
    assert isinstance(caught.value.__cause__, ValueError)


def test_trio_and_a_running_loop_are_refused_in_words_and_auto_picks_a_thread() -> None:
    with pytest.raises(ValueError, match="asyncio, not trio; use bus_runs='in_thread'"):
        SteppedBus(lambda b: None, backend="trio")
    trio_run = ThreadedRun("t", AdapterOptions(backend="trio"))
    assert trio_run._host_class() is BusThread
    assert ThreadedRun("t", AdapterOptions())._host_class() is SteppedBus
    assert ThreadedRun("t", AdapterOptions(bus_runs="in_thread"))._host_class() is BusThread
    assert ThreadedRun("t", AdapterOptions(), steps_in_hooks=False)._host_class() is BusThread
    with pytest.raises(ValueError, match="bus_runs='in_hooks' is not possible here"):
        ThreadedRun("t", AdapterOptions(bus_runs="in_hooks"), steps_in_hooks=False)

    async def in_a_notebook() -> None:  # a loop runs in this thread, as in Jupyter
        assert ThreadedRun("t", AdapterOptions())._host_class() is BusThread
        with pytest.raises(RuntimeError, match="an event loop already runs in this thread"):
            SteppedBus(lambda b: None).start()

    asyncio.run(in_a_notebook())
