"""A batch reaches a handler exactly as its policy says, whatever the handler does.

A batch of events is handed to a handler in one loop: each call is timed, or,
once the handler has proved cheaper than a clock read, the batch is (no clock
read per call); the watchdog learns from the runner which call of an async
batch is in progress. Whatever the handler does on each event (return, return
a value, raise, return a coroutine, raise a stray cancellation), it must get
the events its fault policy allows, in order, each failure named by its
event, and the counts must add up, timed either way. ``publish_many`` must do
what ``publish`` does for each event.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import BusClosed, EventBus, HandlerFailed, HandlerTimedOut, Report, VirtualClock
from eventbus._subscription import CALIBRATION_CALLS, CHEAP_CALL

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={"loss": 0.5})


SYNC_BEHAVIOURS = ("ok", "value", "raise", "coroutine")
ASYNC_BEHAVIOURS = ("ok", "raise", "stray-cancel")


async def deliver(
    behaviours: list[str], *, is_async: bool, on_error: str, max_faults: int, per_call: bool = True
) -> dict[str, Any]:
    """Publish one event per behaviour, all in one batch, to a handler that acts them out."""
    seen: list[int] = []
    awaited: list[int] = []

    async def later(index: int) -> None:
        await anyio.lowlevel.checkpoint()
        awaited.append(index)

    def sync_handler(event: Report) -> Any:
        seen.append(event.index)
        what = behaviours[event.index]
        if what == "raise":
            raise ValueError(f"no {event.index}")
        if what == "value":
            return event.index
        if what == "coroutine":
            return later(event.index)
        return None

    async def async_handler(event: Report) -> None:
        seen.append(event.index)
        what = behaviours[event.index]
        if what == "raise":
            raise ValueError(f"no {event.index}")
        if what == "stray-cancel":
            raise anyio.get_cancelled_exc_class()()

    failures: list[int] = []
    async with EventBus(buffer=4096, budget=1.0) as bus:
        bus.subscribe(HandlerFailed, lambda e: failures.append(e.event_seq))
        sub = bus.subscribe(
            Report,
            async_handler if is_async else sync_handler,
            on_error=on_error,  # type: ignore[arg-type]
            max_faults=max_faults,
        )
        sub.counters.timed_per_call = per_call  # the batch is timed this way
        for i in range(len(behaviours)):
            bus.publish_nowait(report(i))  # no await between: one batch
        await bus.wait_idle()
        stats = sub.stats()
    return {
        "seen": seen,
        "awaited": awaited,
        "failures": failures,
        "calls": stats.calls,
        "failed": stats.failed,
        "skipped": stats.skipped,
        "state": sub.state,
    }


def expected(behaviours: list[str], on_error: str, max_faults: int) -> dict[str, Any]:
    """What the fault policy lets through: every event until ``disable`` acts."""
    seen: list[int] = []
    failures: list[int] = []
    for index, what in enumerate(behaviours):
        if on_error == "disable" and len(failures) >= max_faults:
            break
        seen.append(index)
        if what in ("raise", "stray-cancel"):
            failures.append(index)  # seq = index: the events are the first published
    disabled = on_error == "disable" and len(failures) >= max_faults
    return {
        "seen": seen,
        "awaited": [i for i in seen if behaviours[i] == "coroutine"],
        "failures": failures,
        "calls": len(seen),
        "failed": len(failures),
        "skipped": len(behaviours) - len(seen),
        "state": "disabled" if disabled else "normal",
    }


policies = st.sampled_from([("log", 3), ("disable", 1), ("disable", 3)])


def outcomes(
    behaviours: list[str], policy: tuple[str, int], *, is_async: bool
) -> list[dict[str, Any]]:
    """The outcome of the same batch timed per call, then per batch."""
    on_error, max_faults = policy
    return [
        anyio.run(
            partial(
                deliver,
                behaviours,
                is_async=is_async,
                on_error=on_error,
                max_faults=max_faults,
                per_call=per_call,
            )
        )
        for per_call in (True, False)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_a_sync_handler_gets_what_its_policy_allows_whatever_it_does(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    # Every coroutine returned is awaited, in order, never dropped.
    assert outcomes(behaviours, policy, is_async=False) == [expected(behaviours, *policy)] * 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ASYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_an_async_handler_gets_what_its_policy_allows_whatever_it_does(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    assert outcomes(behaviours, policy, is_async=True) == [expected(behaviours, *policy)] * 2


async def test_failures_name_the_event_that_raised_in_a_batch() -> None:
    behaviours = ["ok"] * 10
    behaviours[3] = behaviours[7] = "raise"
    result = await deliver(behaviours, is_async=False, on_error="log", max_faults=3)
    assert result["seen"] == list(range(10))  # the calls go on after a failure
    assert result["failures"] == [3, 7]  # seq = index here: the first events published
    assert (result["calls"], result["failed"]) == (10, 2)


@pytest.mark.parametrize("per_call", [True, False])
async def test_the_watchdog_sees_an_async_handler_stuck_in_a_batch(per_call: bool) -> None:
    """The runner tells the watchdog which call is in progress: a call that hangs
    midway is cancelled at its deadline and the batch goes on with the next event,
    however the batch is timed."""
    seen: list[int] = []
    timeouts: list[HandlerTimedOut] = []

    async def handler(event: Report) -> None:
        if event.index == 5:
            await anyio.sleep(math.inf)
        seen.append(event.index)

    async with EventBus(budget=1.0) as bus:
        bus.subscribe(HandlerTimedOut, timeouts.append)
        sub = bus.subscribe(Report, handler, timeout=0.05)
        sub.counters.timed_per_call = per_call
        for i in range(10):
            bus.publish_nowait(report(i))
        with anyio.fail_after(5):
            await bus.wait_idle()
        stats = sub.stats()
    assert seen == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert [t.event_seq for t in timeouts] == [5]
    assert (stats.calls, stats.timed_out) == (10, 1)
    assert stats.total >= 0.05  # the stuck call's time is counted
    assert stats.max >= 0.05  # and it is the longest


async def test_a_handler_cheaper_than_a_clock_read_is_timed_per_batch_until_it_is_not() -> None:
    """Calibration: timed per call for its first ``CALIBRATION_CALLS`` calls, then per
    batch while its batches' mean call is under ``CHEAP_CALL``; one batch over it
    brings back timing per call, so the longest call is exact again."""
    clock = VirtualClock()
    cost = 0.0  # virtual seconds each call takes

    def handler(event: Report) -> None:
        if cost:
            clock.advance(cost)

    async with EventBus(clock=clock, buffer=4096, budget=1.0, timeout=60.0) as bus:
        sub = bus.subscribe(Report, handler)

        async def batch(size: int) -> None:
            for i in range(size):
                bus.publish_nowait(report(i))
            await bus.wait_idle()

        await batch(CALIBRATION_CALLS - 1)
        assert sub.counters.timed_per_call  # not proven cheap yet
        await batch(1)
        assert not sub.counters.timed_per_call
        cost = 10 * CHEAP_CALL
        await batch(4)  # timed as a whole: the mean stands in for the longest call
        assert sub.counters.timed_per_call
        assert sub.stats().max == pytest.approx(cost)
        cost = 0.0
        await batch(1)
        assert not sub.counters.timed_per_call
        stats = sub.stats()
    assert stats.calls == CALIBRATION_CALLS + 5
    assert stats.total == pytest.approx(4 * 10 * CHEAP_CALL)


# --- publish_many: what publish does, per inbox-full ------------------------------------------


async def test_publish_many_delivers_in_order_through_a_small_inbox() -> None:
    seen: list[int] = []
    async with EventBus(buffer=7) as bus:
        bus.subscribe(Report, lambda e: seen.append(e.index))
        await bus.publish_many(report(i) for i in range(50))  # any iterable
        await bus.publish_many([report(i) for i in range(50, 60)])
        await bus.wait_idle()
        stats = bus.stats()
    assert seen == list(range(60))
    assert stats.published == 60


async def test_publish_many_refuses_what_is_no_event_after_accepting_those_before() -> None:
    seen: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(Report, lambda e: seen.append(e.index))
        events: list[Any] = [report(0), report(1), {"index": 3}, report(3)]
        with pytest.raises(TypeError, match="only Event instances"):
            await bus.publish_many(events)
        await bus.wait_idle()
    assert seen == [0, 1]


async def test_publish_many_on_a_closed_bus_is_refused() -> None:
    bus = EventBus()
    with pytest.raises(BusClosed, match="not running"):
        await bus.publish_many([report(0)])
    async with bus:
        pass
    with pytest.raises(BusClosed, match="closed"):
        await bus.publish_many([report(1)])


class SeqIsText:
    """Not an event, and its ``seq`` is no number: refused the same way everywhere."""

    seq = "-1"


@pytest.mark.parametrize("how", ["publish", "publish_nowait", "publish_many", "emit"])
@pytest.mark.parametrize(
    "thing", [SeqIsText(), {"seq": -1}, None, 42], ids=["SeqIsText()", "{seq: -1}", "None", "42"]
)
async def test_every_way_in_refuses_what_is_no_event_with_one_clear_error(
    how: str, thing: Any
) -> None:
    async with EventBus() as bus:
        with pytest.raises(TypeError, match="only Event instances can be published"):
            if how == "publish":
                await bus.publish(thing)
            elif how == "publish_many":
                await bus.publish_many([thing])
            elif how == "publish_nowait":
                bus.publish_nowait(thing)
            else:
                bus.emit(thing)
        assert bus.stats().published == 0
