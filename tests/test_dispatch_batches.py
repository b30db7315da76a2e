"""The fast paths deliver exactly what the careful ones do.

A handler that has proved cheap is timed once per batch, with no clock read
per call (sync and async alike), and the watchdog reads an async batch's
progress off the iterator the loop takes its events from. Whatever the
handler does on each event (return, return a value, raise, return a
coroutine, raise a stray cancellation), both timings must give the same
deliveries, in the same order, the same failures and the same counts.
``publish_many`` must do what ``publish`` does for each event.
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

from eventbus import BusClosed, EventBus, HandlerFailed, HandlerTimedOut, Report

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={"loss": 0.5})


SYNC_BEHAVIOURS = ("ok", "value", "raise", "coroutine")
ASYNC_BEHAVIOURS = ("ok", "raise", "stray-cancel")


async def deliver(
    behaviours: list[str], *, is_async: bool, per_call: bool, on_error: str, max_faults: int
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
        sub.figures.per_call = per_call
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


policies = st.sampled_from([("log", 3), ("disable", 1), ("disable", 3)])


def both_timings(behaviours: list[str], policy: tuple[str, int], *, is_async: bool) -> list[Any]:
    """The outcomes of the same events timed per call, then per batch."""
    on_error, max_faults = policy
    return [
        anyio.run(
            partial(
                deliver,
                behaviours,
                is_async=is_async,
                per_call=per_call,
                on_error=on_error,
                max_faults=max_faults,
            )
        )
        for per_call in (True, False)
    ]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_a_cheap_sync_handler_timed_per_batch_gets_what_a_timed_one_gets(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    per_call, per_batch = both_timings(behaviours, policy, is_async=False)
    assert per_call == per_batch
    coroutines = [i for i, b in enumerate(behaviours) if b == "coroutine"]
    # Every coroutine returned is awaited, in order, never dropped.
    assert per_batch["awaited"] == [i for i in coroutines if i in per_batch["seen"]]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ASYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_a_cheap_async_handler_timed_per_batch_gets_what_a_timed_one_gets(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    per_call, per_batch = both_timings(behaviours, policy, is_async=True)
    assert per_call == per_batch


async def test_failures_name_the_event_that_raised_in_a_batch_timed_once() -> None:
    behaviours = ["ok"] * 10
    behaviours[3] = behaviours[7] = "raise"
    outcome = await deliver(
        behaviours, is_async=False, per_call=False, on_error="log", max_faults=3
    )
    assert outcome["seen"] == list(range(10))  # the calls go on after a failure
    assert outcome["failures"] == [3, 7]  # seq = index here: the first events published
    assert (outcome["calls"], outcome["failed"]) == (10, 2)


@pytest.mark.parametrize("per_call", [True, False])
async def test_the_watchdog_sees_a_cheap_async_handler_stuck_in_a_batch(per_call: bool) -> None:
    """Progress is read off the batch's iterator: a call that hangs midway is cancelled
    at its deadline and the batch goes on with the next event."""
    seen: list[int] = []
    timeouts: list[HandlerTimedOut] = []

    async def handler(event: Report) -> None:
        if event.index == 5:
            await anyio.sleep(math.inf)
        seen.append(event.index)

    async with EventBus(budget=1.0) as bus:
        bus.subscribe(HandlerTimedOut, timeouts.append)
        sub = bus.subscribe(Report, handler, timeout=0.05)
        sub.figures.per_call = per_call
        for i in range(10):
            bus.publish_nowait(report(i))
        with anyio.fail_after(5):
            await bus.wait_idle()
        stats = sub.stats()
    assert seen == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    assert [t.event_seq for t in timeouts] == [5]
    assert (stats.calls, stats.timed_out) == (10, 1)
    assert stats.total >= 0.05  # the stuck call's time is counted, in either timing


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


@pytest.mark.parametrize(
    "bad, error",
    [("published", ValueError), ("not an event", TypeError)],
)
async def test_publish_many_refuses_what_publish_refuses_after_accepting_those_before(
    bad: str, error: type[Exception]
) -> None:
    seen: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(Report, lambda e: seen.append(e.index))
        old = report(99)
        await bus.publish(old)
        await bus.wait_idle()
        culprit: Any = old if bad == "published" else {"index": 3}
        events: list[Any] = [report(0), report(1), culprit, report(3)]
        with pytest.raises(error):
            await bus.publish_many(events)
        await bus.wait_idle()
    assert seen == [99, 0, 1]


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
@pytest.mark.parametrize("thing", [SeqIsText(), {"seq": -1}, None, 42], ids=repr)
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
