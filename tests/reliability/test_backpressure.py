"""Backpressure: producers far faster than a lane handler.

The bus must hold at most what its buffers allow (``publish`` waits for
room), drop nothing, and keep each handler's order; ``publish_nowait``
refuses with ``BusFull`` when the inbox is full and nothing refused is
delivered. Memory is checked two ways: ``stats().queued`` never exceeds the
bound computed from the buffer sizes, and the process's resident memory
barely grows over 200 000 events.
"""

from __future__ import annotations

import resource
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from eventbus import BusFull, Event, EventBus
from eventbus._lanes import MAX_BATCH

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

EVENTS = 200_000
PRODUCERS = 4
BUFFER = 256
LANE_BUFFER = 512
#: Resident memory may grow this much over the run (allocator slack, not events).
RSS_SLACK = 10 * 2**20


class LoadProbe(Event, frozen=True, kw_only=True):
    producer: int
    i: int
    payload: str = ""


def rss() -> int:
    """Resident set size in bytes (Linux ``/proc``)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize()


def queued_bound(inbox: int, lanes: list[int], inline: int) -> int:
    """Most events a bus can hold: the inbox, the dispatcher's batch for every
    handler, and for each lane its queue plus the batch its handler is working on."""
    batch = min(inbox, MAX_BATCH)
    held_by_dispatcher = batch * (len(lanes) + inline)
    held_by_lanes = sum(capacity + min(capacity, MAX_BATCH) for capacity in lanes)
    return inbox + held_by_dispatcher + held_by_lanes


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads /proc for memory")
async def test_fast_producers_slow_lane_bounded_memory_nothing_dropped(anyio_backend: str) -> None:
    per_producer = EVENTS // PRODUCERS
    seen: dict[int, list[int]] = {p: [] for p in range(PRODUCERS)}
    counted = 0

    async def slow_lane(event: LoadProbe) -> None:
        seen[event.producer].append(event.i)
        if event.i % 16 == 0:
            await anyio.lowlevel.checkpoint()  # slower than the producers: the lane fills up

    def inline_counter(event: LoadProbe) -> None:
        nonlocal counted
        counted += 1

    bus = EventBus(buffer=BUFFER, period=3600.0)  # no periods: no diagnostics in the counts
    bus.subscribe(LoadProbe, slow_lane, name="slow", delivery="lane", buffer=LANE_BUFFER)
    bus.subscribe(LoadProbe, inline_counter, name="count")
    others: list[Event] = []
    bus.subscribe(Event, lambda e: None if type(e) is LoadProbe else others.append(e), name="other")
    bound = queued_bound(BUFFER, [LANE_BUFFER], inline=2)
    most_queued = 0
    finished = 0
    rss_after_warmup = 0

    async def produce(p: int) -> None:
        nonlocal most_queued, finished, rss_after_warmup
        payload = "x" * 64
        for i in range(per_producer):
            before = bus.stats().queued if i % 256 == 0 else -1
            await bus.publish(LoadProbe(producer=p, i=i, payload=payload))
            if before >= 0:
                queued = bus.stats().queued
                most_queued = max(most_queued, before, queued)
                assert queued <= bound, (queued, bound)
            if p == 0 and i == per_producer // 10:
                rss_after_warmup = rss()
        finished += 1

    async with bus:
        async with anyio.create_task_group() as tg:
            for p in range(PRODUCERS):
                tg.start_soon(produce, p)
        await bus.wait_idle()
        growth = rss() - rss_after_warmup
    stats = bus.stats()
    assert finished == PRODUCERS
    assert stats.published == EVENTS + len(others), others  # and the bus's own diagnostics
    assert stats.abandoned == 0 and stats.skipped == 0
    assert counted == EVENTS
    for p in range(PRODUCERS):
        assert seen[p] == list(range(per_producer)), p  # nothing dropped, FIFO per producer
    # The producers outran the lane: the buffers were full, so publish must have waited.
    assert most_queued > BUFFER
    assert growth < RSS_SLACK, growth
    FIGURES.add(
        "backpressure",
        runs=1,
        events_checked=EVENTS * 2,
        lost=0,
        max_queued=most_queued,
        max_queued_bound=bound,
        max_rss_growth_mb=round(growth / 2**20, 2),
    )


async def test_publish_nowait_refuses_when_full_and_delivers_what_it_took(
    anyio_backend: str,
) -> None:
    got: list[int] = []
    gate = anyio.Event()

    async def held(event: LoadProbe) -> None:
        await gate.wait()
        got.append(event.i)

    bus = EventBus(buffer=8, period=3600.0)
    bus.subscribe(LoadProbe, held, name="held")
    accepted: list[int] = []
    refused = 0
    async with bus:
        for i in range(200):
            try:
                bus.publish_nowait(LoadProbe(producer=0, i=i))
            except BusFull:
                refused += 1
            else:
                accepted.append(i)
            if i % 20 == 0:
                await (
                    anyio.lowlevel.checkpoint()
                )  # let the dispatcher take a batch (and block on the gate)
        assert refused > 0
        assert bus.stats().queued <= queued_bound(8, [], inline=1)
        gate.set()
        await bus.wait_idle()
    assert got == accepted  # every accepted event, in order; no refused one
    assert len(accepted) + refused == 200
    FIGURES.add("publish_nowait", runs=1, refused=refused, events_checked=200, lost=0)
