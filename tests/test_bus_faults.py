"""What handlers can do to the bus, beyond raising an ``Exception``: nothing stops it silently.

Stray cancellations, ``BaseException`` subclasses, interrupts, coroutines
returned by sync handlers, feedback loops of emitted events, handlers waiting
for the bus they run in, and the budget of a period cut short.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    HandlerFailed,
    HandlerStateChanged,
    Report,
    VirtualClock,
)
from eventbus._bus import EMIT_HEADROOM
from eventbus._lanes import MAX_BATCH

pytestmark = pytest.mark.anyio


def report(index: int) -> Report:
    return Report(run_id="r", rank=0, world_size=1, index=index, metrics={"i": index})


class Ping(Event, frozen=True, kw_only=True):
    n: int


async def outcome(body: Callable[[], Awaitable[Any]]) -> BaseException | None:
    """Run ``body``; return what it raised, whatever it is (so that no interrupt a
    test provokes can escape into pytest itself)."""
    try:
        await body()
    except BaseException as exc:
        return exc
    return None


async def deliveries_after(raiser: Callable[[Report], Awaitable[None]]) -> list[int]:
    """Publish 5 reports to ``raiser`` (which misbehaves on index 1) and a well-behaved
    handler registered after it; return what the well-behaved one got."""
    seen: list[int] = []
    failures: list[HandlerFailed] = []
    async with EventBus() as bus:
        bus.subscribe(HandlerFailed, failures.append)
        bus.subscribe(Report, raiser, name="raiser")
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(5):
            await bus.publish(report(i))
            await bus.wait_idle()
        stats = bus.stats()
    assert [f.handler for f in failures] == ["raiser"]
    assert stats.failed == 1
    return seen


# --- 1. cancellations nobody on the bus asked for ------------------------------------------


async def test_a_cancellation_captured_from_the_handlers_own_scope_is_its_fault() -> None:
    async def raiser(event: Report) -> None:
        caught: BaseException | None = None
        with anyio.CancelScope() as scope:
            scope.cancel()
            try:
                await anyio.sleep(1)
            except anyio.get_cancelled_exc_class() as exc:
                caught = exc
        if event.index == 1 and caught is not None:
            raise caught  # re-raised outside the scope that cancelled it

    assert await deliveries_after(raiser) == [0, 1, 2, 3, 4]


async def test_awaiting_a_cancelled_future_is_the_handlers_fault(anyio_backend: str) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("asyncio futures")

    async def raiser(event: Report) -> None:
        if event.index == 1:
            future = asyncio.get_running_loop().create_future()
            future.cancel()
            await future

    assert await deliveries_after(raiser) == [0, 1, 2, 3, 4]


async def test_a_handler_cancelling_its_own_task_does_not_stop_the_bus(
    anyio_backend: str,
) -> None:
    if anyio_backend != "asyncio":
        pytest.skip("asyncio's Task.cancel()")
    seen: list[int] = []
    async with EventBus() as bus:

        def cancel_my_task(event: Report) -> None:
            if event.index == 1:
                task = asyncio.current_task()
                assert task is not None
                task.cancel()  # lands at the dispatcher's next await, outside any handler

        bus.subscribe(Report, cancel_my_task)
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(5):
            await bus.publish(report(i))
            await bus.wait_idle()
    assert seen == [0, 1, 2, 3, 4]


async def test_a_stray_task_cancel_leaves_later_deadlines_working(anyio_backend: str) -> None:
    """A handler that cancels its own task natively fails that call; a later call of
    the same batch that hangs is still cancelled at its deadline, and the batch goes
    on (the stray request is withdrawn: see ``forgive_foreign_cancel``)."""
    if anyio_backend != "asyncio":
        pytest.skip("asyncio's Task.cancel()")
    seen: list[int] = []
    failed: list[HandlerFailed] = []

    async def handler(event: Report) -> None:
        if event.index == 1:
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await anyio.lowlevel.checkpoint()
        if event.index == 3:
            await anyio.sleep_forever()
        seen.append(event.index)

    with anyio.fail_after(5):
        async with EventBus(timeout=0.05) as bus:
            bus.subscribe(HandlerFailed, failed.append)
            sub = bus.subscribe(Report, handler)
            for i in range(5):
                bus.publish_nowait(report(i))  # one batch
            await bus.wait_idle()
    assert seen == [0, 2, 4]
    assert len(failed) == 1 and failed[0].error_type == "CancelledError"
    assert (sub.stats().calls, sub.stats().timed_out) == (5, 1)


async def test_a_requested_deadline_still_cancels_a_hung_handler() -> None:
    """The classification must not swallow the bus's own cancellations."""
    seen: list[int] = []
    async with EventBus(timeout=0.05) as bus:

        async def hangs(event: Report) -> None:
            if event.index == 1:
                await anyio.sleep_forever()

        sub = bus.subscribe(Report, hangs)
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(3):
            await bus.publish(report(i))
        await bus.wait_idle()
    assert sub.stats().timed_out == 1
    assert seen == [0, 1, 2]


# --- 2. BaseException subclasses and interrupts -----------------------------------------------


class Custom(BaseException):
    pass


@pytest.mark.parametrize("kind", [GeneratorExit, Custom])
@pytest.mark.parametrize("sync", [True, False])
async def test_base_exceptions_other_than_interrupts_are_the_handlers_fault(
    kind: type[BaseException], sync: bool
) -> None:
    def raise_sync(event: Report) -> None:
        if event.index == 1:
            raise kind("from a handler")

    async def raise_async(event: Report) -> None:
        raise_sync(event)

    seen: list[int] = []
    failures: list[HandlerFailed] = []
    async with EventBus() as bus:
        bus.subscribe(HandlerFailed, failures.append)
        bus.subscribe(Report, raise_sync if sync else raise_async)
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(5):
            await bus.publish(report(i))
    assert seen == [0, 1, 2, 3, 4]
    assert [f.error_type for f in failures] == [kind.__qualname__]


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("sync", [True, False])
async def test_an_interrupt_in_a_handler_leaves_a_bare_bus_as_itself(
    kind: type[BaseException], sync: bool
) -> None:
    """A bus with no owner stops, and ``async with`` re-raises the interrupt unwrapped."""
    seen: list[int] = []

    def raise_sync(event: Report) -> None:
        if event.index == 1:
            raise kind()

    async def raise_async(event: Report) -> None:
        raise_sync(event)

    async def body() -> None:
        async with EventBus() as bus:
            bus.subscribe(Report, raise_sync if sync else raise_async)
            bus.subscribe(Report, lambda e: seen.append(e.index))
            for i in range(3):
                await bus.publish(report(i))
                await bus.wait_idle()

    raised = await outcome(body)
    assert type(raised) is kind
    assert 0 in seen and 2 not in seen


async def test_an_owner_is_told_of_an_interrupt_once_and_the_bus_goes_on() -> None:
    told: list[BaseException] = []
    seen: list[int] = []
    states: list[HandlerStateChanged] = []
    async with EventBus(on_failure=told.append) as bus:

        def interrupts(event: Report) -> None:
            raise KeyboardInterrupt

        bus.subscribe(HandlerStateChanged, states.append)
        bus.subscribe(Report, interrupts, name="interrupts")
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(3):
            await bus.publish(report(i))
    assert [type(e) for e in told] == [KeyboardInterrupt]
    assert seen == [0, 1, 2]
    assert [(s.handler, s.state) for s in states] == [("interrupts", "disabled")]


async def test_a_hostile_exception_str_cannot_break_the_fault_path() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    async def raiser(event: Report) -> None:
        if event.index == 1:
            raise Hostile

    assert await deliveries_after(raiser) == [0, 1, 2, 3, 4]


# --- 3. sync handlers that return coroutines --------------------------------------------------


@pytest.mark.parametrize("per_call", [True, False])
async def test_a_coroutine_returned_by_a_sync_handler_is_awaited(per_call: bool) -> None:
    uploaded: list[int] = []

    async def upload(event: Report) -> None:
        await anyio.lowlevel.checkpoint()
        uploaded.append(event.index)

    with capture_logs() as logs:
        async with EventBus() as bus:
            sub = bus.subscribe(Report, lambda e: upload(e))  # noqa: PLW0108 (sync, on purpose)
            sub.counters.timed_per_call = per_call  # both ways a sync handler is timed
            for i in range(5):
                await bus.publish(report(i))
            await bus.wait_idle()
            stats = sub.stats()
    assert uploaded == [0, 1, 2, 3, 4]
    assert stats.calls == 5 and stats.failed == 0
    warnings = [e for e in logs if "returned a coroutine" in e["event"]]
    assert len(warnings) == 1


async def test_a_blocking_handler_returning_a_coroutine_fails_and_says_what_to_do() -> None:
    async def upload(event: Report) -> None:
        pass

    failures: list[HandlerFailed] = []
    async with EventBus() as bus:
        bus.subscribe(HandlerFailed, failures.append)
        bus.subscribe(Report, lambda e: upload(e), blocking=True)  # noqa: PLW0108
        await bus.publish(report(0))
    assert len(failures) == 1
    assert "async def" in failures[0].message


# --- 4. feedback loops of emitted events ---------------------------------------------------------


async def test_a_handler_emitting_two_events_per_event_is_bounded_and_fails_visibly() -> None:
    failures: list[HandlerFailed] = []
    most_queued = 0
    async with EventBus(buffer=64) as bus:

        def doubles(event: Ping) -> None:
            nonlocal most_queued
            most_queued = max(most_queued, bus.stats().queued)
            bus.emit(Ping(n=event.n + 1))
            bus.emit(Ping(n=event.n + 1))

        bus.subscribe(HandlerFailed, failures.append)
        sub = bus.subscribe(Ping, doubles, name="doubles")
        await bus.publish(Ping(n=0))
        with anyio.fail_after(60):  # a hang guard, not a timing assertion
            while len(failures) < 100:  # noqa: ASYNC110 (bounded, but endless: it goes on failing)
                await anyio.sleep(0.001)
        sub.cancel()
    # The inbox stops at its limit for emits, plus the batch in hand and one diagnostic
    # (HandlerFailed) per failing call of it.
    assert most_queued <= 64 + EMIT_HEADROOM + 2 * MAX_BATCH
    assert failures and {f.error_type for f in failures} == {"BusFull"}
    assert "emit" in failures[0].message


async def test_a_chain_of_emitted_events_does_not_starve_other_tasks() -> None:
    emitted = 0
    async with EventBus() as bus:

        def chain(event: Ping) -> None:
            nonlocal emitted
            emitted += 1
            bus.emit(Ping(n=event.n + 1))  # one per event, forever

        sub = bus.subscribe(Ping, chain)
        await bus.publish(Ping(n=0))
        with anyio.fail_after(60):  # starving, this sleep would never end
            await anyio.sleep(0.01)
        sub.cancel()
    assert emitted > 0


# --- 5. handlers that wait for the bus they run in -----------------------------------------------


async def test_wait_idle_from_a_handler_fails_at_once() -> None:
    failures: list[HandlerFailed] = []
    async with EventBus(timeout=30) as bus:

        async def waits(event: Report) -> None:
            await bus.wait_idle()

        bus.subscribe(HandlerFailed, failures.append)
        bus.subscribe(Report, waits, delivery="lane")
        bus.subscribe(Report, waits)
        with anyio.fail_after(10):  # the handlers' deadline is 30 s
            await bus.publish(report(0))
            await bus.wait_idle()
    assert len(failures) == 2
    assert all(f.error_type == "RuntimeError" and "emit" in f.message for f in failures)


async def test_a_task_a_handler_starts_elsewhere_may_wait_for_the_bus() -> None:
    """It inherits the handler's context, but it is not the handler: once the handler
    returned, its wait is an ordinary one (a worker a callback starts may ``sync()``)."""
    waited = anyio.Event()
    async with anyio.create_task_group() as outer, EventBus(timeout=30) as bus:

        async def waits_later() -> None:
            await bus.publish(report(1))  # the bus is busy with it while this waits
            await bus.wait_idle()
            waited.set()

        async def handles(event: Report) -> None:
            if event.index == 0:
                outer.start_soon(waits_later)
            else:
                await anyio.sleep(0.05)

        bus.subscribe(Report, handles, delivery="lane")
        with anyio.fail_after(10):
            await bus.publish(report(0))
            await waited.wait()


async def test_a_publish_that_must_wait_from_a_handler_fails_at_once() -> None:
    failures: list[HandlerFailed] = []
    async with EventBus(buffer=1, timeout=30) as bus:

        async def publishes(event: Report) -> None:
            if event.index == 0:  # only the first: what it publishes must not publish again
                for i in range(3):
                    await bus.publish(report(100 + i))

        bus.subscribe(HandlerFailed, failures.append)
        bus.subscribe(Report, publishes)
        with anyio.fail_after(10):
            await bus.publish(report(0))
            await bus.wait_idle()
    assert failures and failures[0].error_type == "RuntimeError"


async def test_emit_from_a_handler_never_waits() -> None:
    got: list[int] = []
    async with EventBus(buffer=1) as bus:

        def fans_out(event: Report) -> None:
            for i in range(10):
                bus.emit(Ping(n=i))

        bus.subscribe(Report, fans_out)
        bus.subscribe(Ping, lambda e: got.append(e.n))
        await bus.publish(report(0))
    assert got == list(range(10))


# --- 24. the budget of a period cut short ------------------------------------------------------


async def test_a_run_shorter_than_a_period_is_not_called_over_budget() -> None:
    clock = VirtualClock()
    reports: list[BudgetReport] = []
    with capture_logs() as logs:
        async with EventBus(clock=clock, period=2.0, budget=0.05) as bus:

            def costs_1ms(event: Report) -> None:
                clock.advance(0.001)  # 1 ms of a 2 s period: 0.05% of it

            bus.subscribe(BudgetReport, reports.append)
            bus.subscribe(Report, costs_1ms)
            await bus.publish(report(0))
            await bus.wait_idle()
            clock.advance(0.0001)
    assert [r.partial for r in reports] == [True]
    assert reports[0].over_budget == ()
    assert reports[0].budget == pytest.approx(0.1)  # 5% of the whole period
    assert not [e for e in logs if e["event"].startswith("callbacks over budget")]


async def test_a_partial_period_really_over_budget_is_still_reported() -> None:
    clock = VirtualClock()
    reports: list[BudgetReport] = []
    async with EventBus(clock=clock, period=2.0, budget=0.05) as bus:

        def costs_half_a_second(event: Report) -> None:
            clock.advance(0.5)

        bus.subscribe(BudgetReport, reports.append)
        bus.subscribe(Report, costs_half_a_second, name="slow")
        await bus.publish(report(0))
    assert reports[-1].partial and reports[-1].over_budget == ("slow",)
    assert not math.isclose(reports[-1].total, 0.0)


# --- the same event published twice ------------------------------------------------------------


async def test_the_same_event_published_twice_is_two_deliveries_in_order() -> None:
    """Each publish, or ``emit``, is a delivery of its own, numbered in order, even
    when the same object is handed over twice before the dispatcher runs."""
    seen: list[int] = []
    async with EventBus() as bus:
        bus.subscribe(Report, lambda e: seen.append(e.seq))
        event = report(0)
        bus.publish_nowait(event)
        await bus.publish(event)
        await bus.wait_idle()

        def emit_twice(e: Ping) -> None:
            again = report(1)
            bus.emit(again)
            bus.emit(again)

        bus.subscribe(Ping, emit_twice)
        await bus.publish(Ping(n=0))
        await bus.wait_idle()
        stats = bus.stats()
    assert seen == [0, 1, 3, 4]  # the Ping took seq 2
    assert stats.published == 5
