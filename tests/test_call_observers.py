"""Call observers (``EventBus.observe_calls``): each handler call an observer asked for.

A tap sees the events; an observer sees the calls: those that took at least its
``min_seconds``, and every call that failed or ran past its deadline, once per
batch, after the batch was accounted. On a virtual clock a call's time is the time
it advances the clock by: exact. And a training callback that needs the bus
(``__eventbus_subscribe__``) gets it wherever callbacks are attached.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from structlog.testing import capture_logs

from eventbus import (
    Event,
    EventBus,
    HandlerCall,
    Report,
    RoundGathered,
    TrainRunContext,
    VirtualClock,
)
from eventbus._subscription import Subscription
from eventbus.options import OptionError
from eventbus.testing import replay_log, report_rounds, write_log
from handlers import UserCallback, open_run

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={})


def index_of(call: HandlerCall) -> int:
    assert isinstance(call.event, Report)
    return call.event.index


class Seen:
    """An observer that keeps what it is shown, batch by batch."""

    def __init__(self) -> None:
        self.batches: list[list[HandlerCall]] = []

    def __call__(self, calls: list[HandlerCall]) -> None:
        self.batches.append(list(calls))

    @property
    def calls(self) -> list[HandlerCall]:
        return [call for batch in self.batches for call in batch]

    def of(self, handler: str) -> list[HandlerCall]:
        return [call for call in self.calls if call.handler == handler]


async def test_an_observer_sees_the_long_calls_and_every_failure_not_the_short_calls() -> None:
    clock = VirtualClock()
    seen = Seen()

    def costly(event: Report) -> None:
        clock.advance(0.01 if event.index % 2 else 0.0001)

    def fails(event: Report) -> None:
        raise ValueError(f"report {event.index}")

    async with EventBus(clock=clock) as bus:
        bus.subscribe(Report, costly, name="costly")
        bus.subscribe(Report, fails, name="fails")
        bus.observe_calls(seen, min_seconds=0.005)
        for index in range(4):
            await bus.publish(report(index))
        await bus.wait_idle()
    slow = seen.of("costly")
    assert [(index_of(c), c.elapsed, c.outcome) for c in slow] == [
        (1, 0.01, "ok"),
        (3, 0.01, "ok"),
    ]
    failed = seen.of("fails")
    assert [(index_of(c), c.outcome, str(c.error)) for c in failed] == [
        (i, "error", f"report {i}") for i in range(4)
    ]
    # One batch: the calls follow each other from the time the batch was dispatched.
    assert [c.end for c in slow] == pytest.approx([0.0101, 0.0202])
    assert all(c.calls == 1 and c.event.time == 0.0 for c in slow)


async def test_min_seconds_zero_shows_every_call_even_of_handlers_proved_cheap() -> None:
    """A handler cheaper than a clock read is timed by the batch after 256 calls; an
    observer of every call has each one timed, and sees them all."""
    count = 600
    seen = Seen()
    async with EventBus() as bus:
        sub = bus.subscribe(Report, lambda event: None, name="cheap")
        for index in range(300):  # past its calibration: now timed by the batch
            await bus.publish(report(index))
        await bus.wait_idle()
        assert not sub.counters.timed_per_call
        remove = bus.observe_calls(seen)
        for index in range(count):
            await bus.publish(report(index))
        await bus.wait_idle()
        remove()
        await bus.publish(report(0))
        await bus.wait_idle()
    calls = seen.of("cheap")
    assert len(calls) == count
    assert [index_of(c) for c in calls] == list(range(count))
    assert all(c.calls == 1 and c.outcome == "ok" for c in calls)


async def test_a_cheap_handlers_slow_batch_is_one_record_with_its_calls() -> None:
    clock = VirtualClock()
    seen = Seen()
    slow_one = [False]

    def mostly_cheap(event: Report) -> None:
        if slow_one[0] and event.index == 5:
            clock.advance(0.02)

    async with EventBus(clock=clock) as bus:
        sub = bus.subscribe(Report, mostly_cheap, name="mostly_cheap")
        for index in range(300):
            await bus.publish(report(index))
        await bus.wait_idle()
        assert not sub.counters.timed_per_call
        bus.observe_calls(seen, min_seconds=0.01)
        slow_one[0] = True
        for index in range(10):
            bus.publish_nowait(report(index))  # one batch
        await bus.wait_idle()
    [batch] = seen.of("mostly_cheap")
    assert (batch.calls, batch.elapsed, batch.outcome, index_of(batch)) == (10, 0.02, "ok", 9)


async def test_timeouts_are_shown_whatever_they_took_with_what_became_of_them() -> None:
    seen = Seen()

    def overruns(event: Report) -> None:
        time.sleep(0.03)

    async def hangs(event: Report) -> None:
        await anyio.sleep(10)

    def blocks(event: Report) -> None:
        time.sleep(0.3)

    async with EventBus(timeout=0.01) as bus:
        bus.subscribe(Report, overruns, name="overruns")
        bus.subscribe(Report, hangs, name="hangs")
        bus.subscribe(Report, blocks, name="blocks", blocking=True, timeout=0.05)
        bus.observe_calls(seen, min_seconds=60)
        await bus.publish(report(0))
        await bus.wait_idle()
    outcomes = {c.handler: (c.outcome, c.error) for c in seen.calls}
    assert outcomes == {
        "overruns": ("overrun", None),
        "hangs": ("cancelled", None),
        "blocks": ("abandoned", None),
    }
    assert all(c.elapsed >= 0.01 for c in seen.calls)


async def test_async_and_blocking_failures_and_long_calls_are_shown() -> None:
    seen = Seen()

    async def fails(event: Report) -> None:
        await anyio.lowlevel.checkpoint()
        raise KeyError(event.index)

    async def waits(event: Report) -> None:
        await anyio.sleep(0.02)

    def blocking_fails(event: Report) -> None:
        raise OSError("disk")

    async with EventBus() as bus:
        bus.subscribe(Report, fails, name="fails")
        bus.subscribe(Report, waits, name="waits")
        bus.subscribe(Report, blocking_fails, name="blocking_fails", blocking=True)
        bus.observe_calls(seen, min_seconds=0.01)
        await bus.publish(report(0))
        await bus.wait_idle()
    by_handler = {c.handler: c for c in seen.calls}
    assert by_handler["fails"].outcome == "error"
    assert isinstance(by_handler["fails"].error, KeyError)
    assert by_handler["waits"].outcome == "ok" and by_handler["waits"].elapsed >= 0.01
    assert by_handler["blocking_fails"].outcome == "error"
    assert isinstance(by_handler["blocking_fails"].error, OSError)


async def test_an_observer_costs_no_handler_anything() -> None:
    """It runs after the batch was accounted: its own time is nobody's."""
    clock = VirtualClock()

    def slow_observer(calls: list[HandlerCall]) -> None:
        clock.advance(1.0)

    def costly(event: Report) -> None:
        clock.advance(0.001)

    async with EventBus(clock=clock, period=100) as bus:
        sub = bus.subscribe(Report, costly, name="costly")
        bus.observe_calls(slow_observer)
        for index in range(3):
            await bus.publish(report(index))
            await bus.wait_idle()
        stats = sub.stats()
    assert stats.calls == 3
    assert stats.total == pytest.approx(0.003)
    assert stats.max == pytest.approx(0.001)


async def test_an_observer_that_raises_is_logged_once_and_removed() -> None:
    shown: list[int] = []

    def broken(calls: list[HandlerCall]) -> None:
        shown.append(len(calls))
        raise RuntimeError("observer bug")

    with capture_logs() as logs:
        async with EventBus() as bus:
            bus.subscribe(Report, lambda e: None, name="h")
            bus.observe_calls(broken)
            for index in range(3):
                await bus.publish(report(index))
                await bus.wait_idle()
    assert shown == [1]
    [line] = [entry for entry in logs if entry["event"].startswith("call observer failed")]
    assert "observer bug" in line["error"]


async def test_min_seconds_is_checked_like_the_other_options() -> None:
    bus = EventBus()
    with pytest.raises(OptionError, match="min_seconds"):
        bus.observe_calls(print, min_seconds=-1)
    with pytest.raises(OptionError, match="min_seconds"):
        bus.observe_calls(print, min_seconds=float("nan"))


async def test_two_observers_each_see_what_they_asked_for() -> None:
    clock = VirtualClock()
    every, long_ones = Seen(), Seen()

    def costly(event: Report) -> None:
        clock.advance(0.01 * event.index)

    async with EventBus(clock=clock) as bus:
        bus.subscribe(Report, costly, name="costly")
        bus.observe_calls(every)
        bus.observe_calls(long_ones, min_seconds=0.015)
        for index in range(4):
            await bus.publish(report(index))
        await bus.wait_idle()
    assert [index_of(c) for c in every.of("costly")] == [0, 1, 2, 3]
    assert [index_of(c) for c in long_ones.of("costly")] == [2, 3]


# --- training callbacks that need the bus --------------------------------------------------


class Watcher(UserCallback):
    """Subscribes to the bus itself: every round, raw, and what it cost."""

    def __init__(self) -> None:
        self.buses: list[EventBus] = []
        self.rounds: list[int] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        pass

    def __eventbus_subscribe__(self, bus: EventBus) -> Iterable[Subscription]:
        self.buses.append(bus)
        return [bus.subscribe(RoundGathered, self.gathered, name="Watcher.gathered")]

    def gathered(self, event: Event) -> None:
        assert isinstance(event, RoundGathered)
        self.rounds.append(event.round)


async def test_a_callback_that_subscribes_itself_gets_the_runs_bus() -> None:
    watcher = Watcher()

    async def worker(reporter: Any) -> None:
        for step in range(3):
            await reporter.report({"step": step})

    async with open_run(world_size=2, callbacks=[watcher]) as run:
        await run.workers(worker)
    assert watcher.buses == [run.bus]
    assert watcher.rounds == [0, 1, 2]
    assert run.result is not None
    costs = {cost.handler: cost.calls for cost in run.result.callbacks}
    assert costs == {"Watcher.after_report": 3, "Watcher.gathered": 3}


async def test_a_callback_that_subscribes_itself_is_replayed_as_in_a_run(tmp_path: Any) -> None:
    path = write_log(tmp_path / "run.evlog", report_rounds(4, world_size=2))
    watcher = Watcher()
    result = await replay_log(path, watcher)
    assert watcher.rounds == [0, 1, 2, 3]
    assert len(watcher.buses) == 1
    assert [type(e).__name__ for e in result.events_of(watcher)] == ["RoundGathered"] * 4
