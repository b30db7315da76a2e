"""Closing wakes every publisher waiting for room: each is refused with ``BusClosed``,
none is left waiting forever (issue 23, item 11), on asyncio and trio."""

from __future__ import annotations

import anyio
import pytest

from eventbus import BusClosed, EventBus, Report

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={})


async def _stuck_bus_with_waiting_publishers(
    bus: EventBus, outcomes: list[str], tg: anyio.abc.TaskGroup
) -> anyio.Event:
    """A handler that never returns holds the dispatcher; the inbox (one event) is
    full; two publishers wait for room."""
    release = anyio.Event()

    async def stuck(event: Report) -> None:
        await release.wait()

    bus.subscribe(Report, stuck, timeout=3600)
    await bus.publish(report(0))  # taken by the dispatcher, which then waits in `stuck`
    await anyio.sleep(0.05)
    await bus.publish(report(1))  # fills the inbox

    async def waiting(index: int) -> None:
        try:
            await bus.publish(report(index))
            outcomes.append("published")
        except BusClosed:
            outcomes.append("refused")

    tg.start_soon(waiting, 2)
    tg.start_soon(waiting, 3)
    await anyio.sleep(0.05)
    assert outcomes == []  # both wait for room
    return release


@pytest.mark.parametrize("drain", [False, True])
async def test_closing_refuses_publishers_waiting_for_room(drain: bool) -> None:
    outcomes: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            bus = EventBus(buffer=1, drain_timeout=0.1)
            async with bus:
                await _stuck_bus_with_waiting_publishers(bus, outcomes, tg)
                report_ = await bus.aclose(drain=drain)
    assert outcomes == ["refused", "refused"]
    assert not report_.drained


async def test_a_cancelled_bus_refuses_them_too() -> None:
    outcomes: list[str] = []
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as scope:
                async with EventBus(buffer=1, drain_timeout=0.1) as bus:
                    await _stuck_bus_with_waiting_publishers(bus, outcomes, tg)
                    scope.cancel()
                    await anyio.sleep(1)
    assert outcomes == ["refused", "refused"]


async def test_a_failed_bus_refuses_them_too() -> None:
    outcomes: list[str] = []

    def fails(event: Report) -> None:
        raise RuntimeError("boom")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            with pytest.raises(RuntimeError, match="boom"):
                async with EventBus(buffer=1, drain_timeout=0.1) as bus:
                    release = await _stuck_bus_with_waiting_publishers(bus, outcomes, tg)
                    bus.subscribe(Report, fails, on_error="raise", order=-1)
                    release.set()  # the next batch reaches `fails`, which fails the bus
                    await anyio.sleep(1)
    assert sorted(outcomes) in (["refused", "refused"], ["published", "refused"])
