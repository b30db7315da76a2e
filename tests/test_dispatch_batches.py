"""A batch reaches a handler exactly as its policy says, whatever the handler does.

A batch of events is handed to a handler in one loop: each call is timed,
and the watchdog learns from the runner which call of an async batch is in
progress. Whatever the handler does on each event (return, return a value,
raise, return a coroutine, raise a stray cancellation), it must get the
events its fault policy allows, in order, each failure named by its event,
and the counts must add up. ``publish_many`` must do what ``publish`` does
for each event.
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
    behaviours: list[str], *, is_async: bool, on_error: str, max_faults: int
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


def outcome(behaviours: list[str], policy: tuple[str, int], *, is_async: bool) -> dict[str, Any]:
    on_error, max_faults = policy
    return anyio.run(
        partial(deliver, behaviours, is_async=is_async, on_error=on_error, max_faults=max_faults)
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(SYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_a_sync_handler_gets_what_its_policy_allows_whatever_it_does(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    # Every coroutine returned is awaited, in order, never dropped.
    assert outcome(behaviours, policy, is_async=False) == expected(behaviours, *policy)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ASYNC_BEHAVIOURS), min_size=1, max_size=40), policies)
def test_an_async_handler_gets_what_its_policy_allows_whatever_it_does(
    behaviours: list[str], policy: tuple[str, int]
) -> None:
    assert outcome(behaviours, policy, is_async=True) == expected(behaviours, *policy)


async def test_failures_name_the_event_that_raised_in_a_batch() -> None:
    behaviours = ["ok"] * 10
    behaviours[3] = behaviours[7] = "raise"
    result = await deliver(behaviours, is_async=False, on_error="log", max_faults=3)
    assert result["seen"] == list(range(10))  # the calls go on after a failure
    assert result["failures"] == [3, 7]  # seq = index here: the first events published
    assert (result["calls"], result["failed"]) == (10, 2)


async def test_the_watchdog_sees_an_async_handler_stuck_in_a_batch() -> None:
    """The runner tells the watchdog which call is in progress: a call that hangs
    midway is cancelled at its deadline and the batch goes on with the next event."""
    seen: list[int] = []
    timeouts: list[HandlerTimedOut] = []

    async def handler(event: Report) -> None:
        if event.index == 5:
            await anyio.sleep(math.inf)
        seen.append(event.index)

    async with EventBus(budget=1.0) as bus:
        bus.subscribe(HandlerTimedOut, timeouts.append)
        sub = bus.subscribe(Report, handler, timeout=0.05)
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
