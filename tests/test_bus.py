"""The bus: ordering, modes, deadlines, faults, backpressure, close."""

from __future__ import annotations

import threading
from typing import Any

import anyio
import pytest

from eventbus import (
    BudgetReport,
    BusClosed,
    BusFull,
    CheckpointSaved,
    Event,
    EventBus,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HealthCheckTick,
    Report,
    VirtualClock,
)

pytestmark = pytest.mark.anyio


def report(index: int, rank: int = 0) -> Report:
    return Report(run_id="r", rank=rank, world_size=4, index=index, metrics={"i": index})


async def test_each_handler_sees_publish_order_and_handlers_run_by_order() -> None:
    calls: list[tuple[str, int]] = []
    async with EventBus() as bus:
        bus.subscribe(Report, lambda e: calls.append(("late", e.index)), order=5)
        bus.subscribe(Report, lambda e: calls.append(("first", e.index)), order=-1)

        async def middle(e: Report) -> None:
            await anyio.lowlevel.checkpoint()
            calls.append(("middle", e.index))

        bus.subscribe(Report, middle)
        bus.subscribe(Report, lambda e: calls.append(("middle2", e.index)))
        for i in range(50):
            await bus.publish(report(i))
    for name in ("first", "middle", "middle2", "late"):
        assert [i for n, i in calls if n == name] == list(range(50))
    position = {(n, i): p for p, (n, i) in enumerate(calls)}
    for i in range(50):
        order = [position[(n, i)] for n in ("first", "middle", "middle2", "late")]
        assert order == sorted(order)


async def test_seq_and_time_are_stamped_in_publish_order() -> None:
    clock = VirtualClock(start=100.0)
    seen: list[Report] = []
    async with EventBus(clock=clock) as bus:
        bus.subscribe(Report, seen.append)
        for i in range(5):
            await bus.publish(report(i))
        await bus.wait_idle()
        clock.advance(0.5)
        await bus.publish(report(5))
    assert [e.seq for e in seen] == list(range(6))
    assert [e.time for e in seen] == [100.0] * 5 + [100.5]


async def test_a_publisher_may_bring_its_own_time() -> None:
    seen: list[Report] = []
    async with EventBus(clock=VirtualClock()) as bus:
        bus.subscribe(Report, seen.append)
        await bus.publish(Report(run_id="r", rank=0, world_size=1, index=0, metrics={}, time=42.0))
    assert seen[0].time == 42.0


async def test_base_class_subscription_receives_subclasses() -> None:
    seen: list[Event] = []
    async with EventBus() as bus:
        bus.subscribe(Event, seen.append)
        await bus.publish(report(0))
        await bus.publish(CheckpointSaved(run_id="r", checkpoint="c", index=0))
    assert [type(e) for e in seen if not isinstance(e, (HealthCheckTick, BudgetReport))] == [
        Report,
        CheckpointSaved,
    ]


async def test_subscription_to_other_types_sees_nothing() -> None:
    seen: list[Event] = []
    async with EventBus() as bus:
        bus.subscribe(CheckpointSaved, seen.append)
        await bus.publish(report(0))
    assert seen == []


async def test_lane_handler_delays_only_itself() -> None:
    release = anyio.Event()
    fast: list[int] = []
    slow: list[int] = []

    async def blocked(e: Report) -> None:
        await release.wait()
        slow.append(e.index)

    async with EventBus(buffer=64) as bus:
        bus.subscribe(Report, blocked, delivery="lane")
        bus.subscribe(Report, lambda e: fast.append(e.index))
        for i in range(20):
            await bus.publish(report(i))
        with anyio.move_on_after(0.1) as waited:
            await bus.wait_idle()  # cannot return while the lane is blocked
        assert waited.cancelled_caught
        assert fast == list(range(20))
        assert slow == []
        assert bus.stats().queued == 20
        release.set()
    assert slow == list(range(20))


async def test_async_handler_past_its_deadline_is_cancelled_and_reported() -> None:
    timed_out: list[HandlerTimedOut] = []
    after: list[int] = []

    async def hangs(e: Report) -> None:
        if e.index == 1:
            await anyio.sleep_forever()

    async with EventBus(timeout=5) as bus:
        bus.subscribe(Report, hangs, name="hangs", timeout=0.05)
        bus.subscribe(Report, lambda e: after.append(e.index), order=1)
        bus.subscribe(HandlerTimedOut, timed_out.append)
        for i in range(3):
            await bus.publish(report(i))
    assert after == [0, 1, 2]
    assert len(timed_out) == 1
    event = timed_out[0]
    assert (event.handler, event.outcome, event.event_type) == ("hangs", "cancelled", "Report")
    assert event.elapsed >= 0.05
    stats = {s.name: s for s in bus.stats().subscriptions}
    assert stats["hangs"].timed_out == 1 and stats["hangs"].calls == 3


async def test_blocking_sync_handler_is_abandoned_at_its_deadline() -> None:
    stop = threading.Event()
    timed_out: list[HandlerTimedOut] = []

    def stuck(e: Report) -> None:
        stop.wait(10)

    async with EventBus() as bus:
        bus.subscribe(Report, stuck, name="stuck", blocking=True, timeout=0.05)
        bus.subscribe(HandlerTimedOut, timed_out.append)
        await bus.publish(report(0))
    stop.set()
    assert [(t.handler, t.outcome) for t in timed_out] == [("stuck", "abandoned")]


async def test_sync_overrun_is_reported_with_advice() -> None:
    clock = VirtualClock()
    timed_out: list[HandlerTimedOut] = []

    def slow(e: Report) -> None:
        clock.advance(2.0)  # takes two (virtual) seconds

    async with EventBus(clock=clock, period=1000) as bus:
        bus.subscribe(Report, slow, name="slow", timeout=1.0)
        bus.subscribe(HandlerTimedOut, timed_out.append)
        await bus.publish(report(0))
    assert [(t.handler, t.outcome, t.elapsed) for t in timed_out] == [("slow", "overrun", 2.0)]
    assert "blocking=True" in timed_out[0].advice


async def test_raising_handler_is_isolated_and_reported() -> None:
    failures: list[HandlerFailed] = []
    ok: list[int] = []

    def boom(e: Report) -> None:
        if e.index % 2:
            raise ValueError(f"bad {e.index}")

    async with EventBus() as bus:
        bus.subscribe(Report, boom, name="boom")
        bus.subscribe(Report, lambda e: ok.append(e.index))
        bus.subscribe(HandlerFailed, failures.append)
        for i in range(4):
            await bus.publish(report(i))
    assert ok == [0, 1, 2, 3]
    assert [(f.handler, f.error_type, f.message) for f in failures] == [
        ("boom", "ValueError", "bad 1"),
        ("boom", "ValueError", "bad 3"),
    ]
    assert "raise ValueError" in failures[0].traceback
    assert bus.stats().failed == 2


async def test_on_error_raise_fails_the_bus_with_the_original_exception() -> None:
    def boom(e: Report) -> None:
        raise KeyError("fatal")

    reached_end = False
    with pytest.raises(KeyError, match="fatal"):
        async with EventBus() as bus:
            bus.subscribe(Report, boom, on_error="raise")
            await bus.publish(report(0))
            await anyio.sleep(5)
            reached_end = True
    assert not reached_end


async def test_on_error_disable_stops_deliveries_after_max_faults() -> None:
    calls: list[int] = []
    changes: list[HandlerStateChanged] = []

    def flaky(e: Report) -> None:
        calls.append(e.index)
        raise RuntimeError("always")

    async with EventBus() as bus:
        sub = bus.subscribe(Report, flaky, name="flaky", on_error="disable", max_faults=2)
        bus.subscribe(HandlerStateChanged, changes.append)
        for i in range(5):
            await bus.publish(report(i))
        await bus.wait_idle()
        assert sub.state == "disabled"
        sub.enable()
        await bus.publish(report(5))
    assert calls == [0, 1, 5]
    assert sub.stats().skipped == 3
    assert [c.state for c in changes] == ["disabled", "normal"]


async def test_failing_diagnostic_handler_does_not_loop() -> None:
    def broken(e: HandlerFailed) -> None:
        raise RuntimeError("diagnostic handler broken")

    def boom(e: Report) -> None:
        raise RuntimeError("boom")

    async with EventBus() as bus:
        bus.subscribe(Report, boom)
        sub = bus.subscribe(HandlerFailed, broken)
        await bus.publish(report(0))
        await bus.wait_idle()
    assert sub.stats().failed == 1
    assert sub.stats().calls == 1  # its own failure made no second HandlerFailed


async def test_publish_nowait_raises_when_full_and_drops_nothing() -> None:
    seen: list[int] = []
    async with EventBus(buffer=3) as bus:
        bus.subscribe(Report, lambda e: seen.append(e.index))
        for i in range(3):
            bus.publish_nowait(report(i))
        with pytest.raises(BusFull):
            bus.publish_nowait(report(3))
        await bus.wait_idle()
        bus.publish_nowait(report(3))
    assert seen == [0, 1, 2, 3]


async def test_publish_waits_when_buffers_are_full() -> None:
    release = anyio.Event()
    published = 0
    seen: list[int] = []

    async def gate(e: Report) -> None:
        await release.wait()
        seen.append(e.index)

    async with EventBus(buffer=4) as bus:
        bus.subscribe(Report, gate, delivery="lane", buffer=2)

        async def producer() -> None:
            nonlocal published
            for i in range(20):
                await bus.publish(report(i))
                published += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(producer)
            await anyio.sleep(0.05)
            # Bounded by: the lane (2) + the batch in its hands (2) + the
            # dispatcher's batch waiting for room in the lane (4) + the inbox (4).
            assert published == 12
            assert bus.stats().queued == 12
            release.set()
    assert seen == list(range(20))


async def test_wait_idle_means_everything_was_handled() -> None:
    seen: list[int] = []

    async def slow(e: Report) -> None:
        await anyio.sleep(0.001)
        seen.append(e.index)

    async with EventBus() as bus:
        bus.subscribe(Report, slow, delivery="lane")
        bus.subscribe(Report, slow)
        for i in range(10):
            await bus.publish(report(i))
        await bus.wait_idle()
        assert len(seen) == 20


async def test_close_drains_and_forced_close_counts_what_was_abandoned() -> None:
    release = anyio.Event()

    async def gate(e: Report) -> None:
        await release.wait()

    async with EventBus(timeout=60) as bus:
        bus.subscribe(Report, gate, delivery="lane")
        bus.subscribe(Report, lambda e: None)
        for i in range(5):
            await bus.publish(report(i))
        await anyio.sleep(0.01)
        result = await bus.aclose(drain_timeout=0.05)
        assert not result.drained
        # The call in progress counts as made (it was interrupted by the close);
        # the four events behind it in the lane were never delivered.
        assert result.abandoned == 4
        assert bus.stats().abandoned == 4
        with pytest.raises(BusClosed):
            await bus.publish(report(9))


async def test_publishing_outside_the_bus_context_is_an_error() -> None:
    bus = EventBus()
    with pytest.raises(BusClosed, match="async with"):
        await bus.publish(report(0))


async def test_publishing_a_non_event_is_an_error() -> None:
    async with EventBus() as bus:
        with pytest.raises(TypeError, match="Event"):
            await bus.publish({"not": "an event"})  # type: ignore[arg-type]


async def test_handlers_get_a_stamped_copy_and_the_event_published_stays_as_it_was() -> None:
    """Publishing the same object again, or an event a handler got (forwarding it),
    is another delivery: each copy has its own ``seq``."""
    seen: list[Report] = []
    async with EventBus(clock=VirtualClock(start=7.0)) as bus:
        bus.subscribe(Report, seen.append)
        event = report(0)
        await bus.publish(event)
        await bus.wait_idle()
        await bus.publish(event)
        await bus.publish(seen[0])
        await bus.wait_idle()
    assert (event.seq, event.time) == (-1, 0.0)
    assert [(e.seq, e.time) for e in seen] == [(0, 7.0), (1, 7.0), (2, 7.0)]
    assert all(e is not event and e.metrics is event.metrics for e in seen)


async def test_cancelled_subscription_gets_nothing_more() -> None:
    seen: list[int] = []
    async with EventBus() as bus:
        sub = bus.subscribe(Report, lambda e: seen.append(e.index))
        await bus.publish(report(0))
        await bus.wait_idle()
        sub.cancel()
        await bus.publish(report(1))
    assert seen == [0]


async def test_handler_with_async_call_method_is_awaited() -> None:
    class Counter:
        def __init__(self) -> None:
            self.n = 0

        async def __call__(self, e: Report) -> None:
            await anyio.lowlevel.checkpoint()
            self.n += 1

    counter = Counter()
    async with EventBus() as bus:
        bus.subscribe(Report, counter)
        await bus.publish(report(0))
    assert counter.n == 1


def test_subscribe_rejects_bad_arguments() -> None:
    bus = EventBus()
    with pytest.raises(TypeError, match="Event subclasses"):
        bus.subscribe(int, print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="delivery"):
        bus.subscribe(Report, print, delivery="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="blocking"):

        async def handler(e: Any) -> None: ...

        bus.subscribe(Report, handler, blocking=True)
    with pytest.raises(ValueError, match="budget"):
        EventBus(budget=2.0)


async def test_bus_body_exception_propagates_unwrapped() -> None:
    with pytest.raises(ZeroDivisionError):
        async with EventBus() as bus:
            await bus.publish(report(0))
            1 / 0  # noqa: B018


async def test_barrier_subscription_sees_each_event_before_the_next_one_is_handled() -> None:
    latest: list[int] = []
    snapshots: list[tuple[int, int]] = []

    async with EventBus() as bus:
        bus.subscribe(CheckpointSaved, lambda e: latest.append(e.index))
        bus.subscribe(
            CheckpointSaved,
            lambda e: snapshots.append((e.index, latest[-1])),
            order=1,
            barrier=True,
        )
        for i in range(3):
            bus.publish_nowait(CheckpointSaved(run_id="r", checkpoint=f"c{i}", index=i))
    assert snapshots == [(0, 0), (1, 1), (2, 2)]


async def test_without_a_barrier_handlers_take_a_batch_each() -> None:
    latest: list[int] = []
    seen: list[tuple[int, int]] = []

    async with EventBus() as bus:
        bus.subscribe(CheckpointSaved, lambda e: latest.append(e.index))
        bus.subscribe(CheckpointSaved, lambda e: seen.append((e.index, latest[-1])), order=1)
        for i in range(3):
            bus.publish_nowait(CheckpointSaved(run_id="r", checkpoint=f"c{i}", index=i))
    assert seen == [(0, 2), (1, 2), (2, 2)]


async def test_closing_from_a_handler_is_a_clear_error() -> None:
    failures: list[HandlerFailed] = []

    async def closes(e: Report) -> None:
        await bus.aclose()

    async with EventBus() as bus:
        bus.subscribe(Report, closes, name="closes")
        bus.subscribe(HandlerFailed, failures.append)
        await bus.publish(report(0))
        await bus.wait_idle()
    assert [(f.handler, f.error_type) for f in failures] == [("closes", "RuntimeError")]
    assert "would wait for itself" in failures[0].message


def test_a_blocking_call_abandoned_before_its_thread_started_never_runs() -> None:
    from eventbus._runners import ThreadCall

    ran: list[int] = []
    late = ThreadCall(lambda e: ran.append(e.index), report(1))
    late.abandon()
    late.run()  # the worker thread picks it up after the deadline
    on_time = ThreadCall(lambda e: ran.append(e.index), report(2))
    on_time.run()
    on_time.abandon()  # abandoned while running: it already ran (and would run on)
    assert ran == [2]
