"""Faulty callbacks: randomized runs where a share of handlers raise, hang, dawdle or overspend.

Each run draws, from a fixed seed, a mix of healthy and faulty handlers
(inline and lane, sync, async and blocking sync) and publishes a stream of
probes. Afterwards every delivery is accounted for: for each handler,
calls + skipped equals the probes published, the diagnostics on the bus
match its failed and timed-out counts, it saw its probes in publish order,
the healthy ones saw every probe, and each hung call was cut off within its
deadline plus the stated tolerance.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from eventbus import BusFull, Event, EventBus, HandlerFailed, HandlerTimedOut
from eventbus._bus import BusStats

from ._figures import FIGURES

pytestmark = pytest.mark.anyio

#: Runs per backend, and probes per run.
SEEDS = range(5)
PROBES = 1500
#: The deadline of the faulty handlers, seconds. Small, so hangs cost little time.
DEADLINE = 0.15
#: The bus's tolerance is one watchdog tick (<= 50 ms); this bound adds room for a loaded machine.
CUTOFF_BOUND = DEADLINE + 0.5
#: A hung blocking handler's thread waits at most this long (or until the run ends).
THREAD_HANG = 30.0


class FaultProbe(Event, frozen=True, kw_only=True):
    """What the randomized runs publish: ``i`` is the publish index."""

    i: int


class Boom(RuntimeError):
    """The fault a raising handler injects."""


@dataclass
class Handler:
    """One subscribed handler of a run: its behaviour and what it saw."""

    kind: str
    mode: str
    faulty_at: frozenset[int]
    seen: list[int] = field(default_factory=list)
    #: (deadline, seconds from call start to cut-off) of each hung call.
    cutoffs: list[float] = field(default_factory=list)
    name: str = ""

    @property
    def healthy(self) -> bool:
        return self.kind in ("sync", "async", "blocking")


KINDS = ("sync", "async", "blocking", "raise", "hang_async", "hang_blocking", "slow", "overrun")


def make_handler(h: Handler, release: threading.Event) -> Callable[[FaultProbe], Any]:
    """The callable for ``h``: it records what it saw and injects its fault on ``faulty_at``."""
    seen = h.seen
    faulty = h.faulty_at
    if h.kind in ("sync", "overrun", "raise"):

        def sync(event: FaultProbe) -> None:
            seen.append(event.i)
            if event.i in faulty:
                if h.kind == "raise":
                    raise Boom(f"probe {event.i}")
                time.sleep(DEADLINE * 1.3)  # overrun: cannot be interrupted, only reported

        return sync
    if h.kind in ("blocking", "hang_blocking"):

        def blocking(event: FaultProbe) -> None:
            seen.append(event.i)
            if event.i in faulty:
                release.wait(THREAD_HANG)

        return blocking

    async def handler(event: FaultProbe) -> None:
        seen.append(event.i)
        if event.i not in faulty:
            if h.kind == "slow" and event.i % 50 == 0:
                await anyio.sleep(0.002)
            return
        if h.kind == "slow":
            await anyio.sleep(DEADLINE / 3)  # slow but within its deadline
            return
        start = time.monotonic()
        try:
            await anyio.sleep(THREAD_HANG)  # hang_async: only the watchdog ends it
        finally:
            h.cutoffs.append(time.monotonic() - start)

    return handler


def draw_handlers(rng: random.Random) -> list[Handler]:
    handlers = []
    # Healthy ones first, of each flavour, so "unaffected" is checked every run.
    for kind, mode in (("sync", "inline"), ("async", "lane"), ("blocking", "lane")):
        handlers.append(Handler(kind, mode, frozenset()))
    for _ in range(rng.randint(3, 6)):
        kind = rng.choice(KINDS[3:])
        mode = rng.choice(("inline", "lane"))
        if kind in ("hang_async", "hang_blocking", "overrun"):
            count = rng.randint(1, 2)  # each costs a deadline of real time
        else:
            count = rng.randint(5, 60)
        faulty = frozenset(rng.sample(range(PROBES), count))
        handlers.append(Handler(kind, mode, faulty))
    # Sometimes a healthy handler that overspends its budget and gets coalesced.
    if rng.random() < 0.6:
        handlers.append(Handler("budget", "inline", frozenset()))
    return handlers


async def one_run(seed: int) -> dict[str, int | float]:
    rng = random.Random(seed)
    handlers = draw_handlers(rng)
    release = threading.Event()
    diagnostics: list[Event] = []
    # A short period so budgets are judged (and coalescing kicks in) during the run.
    bus = EventBus(buffer=rng.choice((16, 256, 1024)), timeout=5.0, period=0.05, budget=1.0)
    bus.subscribe((HandlerFailed, HandlerTimedOut), diagnostics.append, name="diagnostics")
    for n, h in enumerate(handlers):
        h.name = f"{h.kind}-{h.mode}-{n}"
        options: dict[str, Any] = {}
        if h.kind == "budget":

            def spend(event: FaultProbe, seen: list[int] = h.seen) -> None:
                seen.append(event.i)
                end = time.perf_counter() + 0.00005
                while time.perf_counter() < end:
                    pass

            fn: Callable[[FaultProbe], Any] = spend
            options.update(budget=0.001, over_budget="coalesce")
        else:
            fn = make_handler(h, release)
            if not h.healthy:
                options.update(
                    timeout=DEADLINE,
                    on_error=rng.choice(("log", "log", "disable")),
                    max_faults=rng.randint(1, 4),
                )
        bus.subscribe(
            FaultProbe,
            fn,
            name=h.name,
            delivery=h.mode,  # type: ignore[arg-type]
            blocking=h.kind in ("blocking", "hang_blocking"),
            **options,
        )
    try:
        async with bus:
            for i in range(PROBES):
                probe = FaultProbe(i=i)
                if rng.random() < 0.3:
                    try:
                        bus.publish_nowait(probe)
                    except BusFull:
                        await bus.publish(probe)  # refused, not dropped: publish it again
                else:
                    await bus.publish(probe)
                if i % 500 == 0:
                    await anyio.lowlevel.checkpoint()
    finally:
        release.set()
    stats = bus.stats()
    return check_run(seed, handlers, stats, diagnostics)


def check_run(
    seed: int, handlers: list[Handler], stats: BusStats, diagnostics: list[Event]
) -> dict[str, int | float]:
    by_name = {s.name: s for s in stats.subscriptions}
    failed = Counter(d.handler for d in diagnostics if isinstance(d, HandlerFailed))
    timed_out = Counter(d.handler for d in diagnostics if isinstance(d, HandlerTimedOut))
    faults = 0
    late_async = late_blocking = 0.0
    for h in handlers:
        s = by_name[h.name]
        where = f"seed {seed}, {h.name}"
        assert s.queued == 0, where
        # Every probe accounted for: called (delivered, failed or timed out) or skipped.
        assert s.calls + s.skipped == PROBES, (where, s)
        # A blocking call abandoned at its deadline before its thread started never runs:
        # it is counted as a call that timed out, with a diagnostic.
        not_run = s.calls - len(h.seen)
        assert 0 <= not_run <= (s.timed_out if "blocking" in h.kind else 0), (where, s)
        # In publish order, no duplicates.
        assert all(a < b for a, b in zip(h.seen, h.seen[1:], strict=False)), where
        # Diagnostics on the bus match the counters.
        assert failed[h.name] == s.failed, where
        assert timed_out[h.name] == s.timed_out, where
        if h.healthy:
            assert h.seen == list(range(PROBES)), where
            assert (s.failed, s.timed_out, s.skipped, s.state) == (0, 0, 0, "normal"), where
        if h.kind == "raise":
            assert s.failed == len(h.faulty_at & set(h.seen)), where
        if h.kind == "hang_async":
            assert s.timed_out == len(h.faulty_at & set(h.seen)), where
        if h.kind == "hang_blocking":  # plus any call whose thread started too late (load)
            assert s.timed_out >= len(h.faulty_at & set(h.seen)), where
        if h.kind == "overrun":  # a handler timed per batch has one overrun per batch
            assert 0 < s.timed_out <= len(h.faulty_at & set(h.seen)) or not h.seen, where
        if h.kind == "budget":
            assert s.skipped == 0 or s.state in ("coalescing", "normal"), where
        faults += len(h.faulty_at & set(h.seen))
        for elapsed in h.cutoffs:
            assert elapsed < CUTOFF_BOUND, (where, elapsed)
            late_async = max(late_async, elapsed - DEADLINE)
        if h.kind == "hang_blocking":
            for d in diagnostics:
                if isinstance(d, HandlerTimedOut) and d.handler == h.name:
                    assert d.outcome == "abandoned" and d.elapsed < CUTOFF_BOUND, (where, d)
                    late_blocking = max(late_blocking, d.elapsed - DEADLINE)
    assert stats.abandoned == 0
    deliveries = len(handlers) * PROBES
    return {
        "runs": 1,
        "handlers": len(handlers),
        "faults_injected": faults,
        "deliveries_checked": deliveries,
        "skipped_counted": sum(by_name[h.name].skipped for h in handlers),
        "lost": 0,
        "max_late_async_s": round(late_async, 4),
        "max_late_blocking_s": round(late_blocking, 4),
        "runs_with_busy_inline_handler": int(any(h.kind == "budget" for h in handlers)),
    }


@pytest.mark.parametrize("seed", SEEDS)
async def test_faulty_handlers_never_lose_or_reorder_events(seed: int, anyio_backend: str) -> None:
    figures = await one_run(seed)
    FIGURES.add("faulty_callbacks", **figures)


async def publish_until_closed(bus: EventBus, count: int) -> int:
    """Publish probes until ``count`` or until the bus stops taking them; how many it took."""
    published = 0
    try:
        for i in range(count):
            await bus.publish(FaultProbe(i=i))
            published += 1
    except Exception:  # BusClosed, or the failure of an on_error="raise" handler
        pass
    return published


def accounted(stats: BusStats) -> int:
    """Deliveries made or counted as not made: called, skipped, or abandoned at close."""
    return sum(s.calls + s.skipped for s in stats.subscriptions) + stats.abandoned


async def test_forced_close_counts_every_undelivered_event(anyio_backend: str) -> None:
    """Closing without waiting for a slow lane: what it never got is reported, nothing vanishes."""
    seen: list[int] = []

    async def slow(event: FaultProbe) -> None:
        seen.append(event.i)
        await anyio.sleep(0.001)

    bus = EventBus(buffer=64, drain_timeout=0.05)
    bus.subscribe(FaultProbe, lambda e: None, name="fast")
    bus.subscribe(FaultProbe, slow, name="slow", delivery="lane")
    async with bus:
        published = await publish_until_closed(bus, 500)
        report = await bus.aclose()
    stats = bus.stats()
    assert published == 500
    assert report.abandoned > 0 and not report.drained
    assert accounted(stats) == 2 * published
    assert seen == list(range(len(seen)))
    FIGURES.add("forced_close", runs=1, deliveries_checked=2 * published, lost=0)


@pytest.mark.parametrize("mode", ["inline", "lane"])
async def test_failing_the_bus_counts_each_undelivered_event_once(
    mode: str, anyio_backend: str
) -> None:
    def fail_at_100(event: FaultProbe) -> None:
        if event.i == 100:
            raise Boom("stop the run")

    async def other(event: FaultProbe) -> None:
        await anyio.lowlevel.checkpoint()

    bus = EventBus(buffer=64)
    bus.subscribe(FaultProbe, lambda e: None, name="first")
    bus.subscribe(FaultProbe, fail_at_100, name="raiser", on_error="raise")
    bus.subscribe(FaultProbe, other, name="other", delivery=mode)  # type: ignore[arg-type]
    with pytest.raises(Boom):
        async with bus:
            published = await publish_until_closed(bus, 500)
    stats = bus.stats()
    assert accounted(stats) == 3 * published


@pytest.mark.parametrize("mode", ["inline", "lane"])
async def test_hung_async_handler_is_cut_off_within_its_deadline_plus_a_tick(
    mode: str, anyio_backend: str
) -> None:
    """With nothing else blocking the event loop, the watchdog's own tolerance is what shows."""
    hangs = Handler("hang_async", mode, frozenset(range(0, 40, 8)))
    bus = EventBus(timeout=5.0, period=3600.0)
    bus.subscribe(
        FaultProbe,
        make_handler(hangs, threading.Event()),
        name="hang",
        delivery=mode,  # type: ignore[arg-type]
        timeout=DEADLINE,
    )
    async with bus:
        for i in range(40):
            await bus.publish(FaultProbe(i=i))
    stats = bus.stats().subscriptions[0]
    assert (stats.calls, stats.timed_out) == (40, 5)
    assert len(hangs.cutoffs) == 5
    late = max(elapsed - DEADLINE for elapsed in hangs.cutoffs)
    assert late < CUTOFF_BOUND - DEADLINE, hangs.cutoffs
    FIGURES.add("hung_async_idle_loop", runs=1, hangs=5, max_late_s=round(late, 4))
