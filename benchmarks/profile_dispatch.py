"""Where the bus's fixed cost per event goes, part by part, in one run.

The bus's cost per event at K handlers is about ``fixed + K x per-call``.
This times the parts of ``fixed`` one by one over the same warm events (ns
per event, median of ``--repeat``):

- ``await coroutine``: awaiting one trivial ``async def`` (what ``await
  bus.publish(e)`` costs before it does anything);
- ``await publish, no dispatch``: ``await bus.publish(e)`` into an inbox big
  enough for every event, so the dispatcher never runs meanwhile: the
  coroutine, the checks and the hand-over;
- ``stamped copy``: the copy of each event, with its ``seq`` and
  ``time``, that the dispatcher makes for handlers, a batch at a time;
- ``group by type``: ``itertools.groupby`` over the batch (routing);
- ``bus, no handler``: ``await publish`` of every event through a running
  bus whose events reach no handler: the whole fixed cost;
- ``floor, K=1``: a plain loop calling one trivial function, for scale.

    python benchmarks/profile_dispatch.py [--events 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from collections.abc import Callable
from itertools import groupby

import anyio
from bench_dispatch import floor_sync, make_events, make_sync, touch
from msgspec.structs import replace

from eventbus import EventBus, Report, RunStarted


async def nothing(event: Report) -> None:
    pass


def await_coroutine(events: list[Report]) -> float:
    async def run() -> float:
        start = time.perf_counter()
        for event in events:
            await nothing(event)
        return time.perf_counter() - start

    return anyio.run(run)


def publish_only(events: list[Report]) -> float:
    async def run() -> float:
        async with EventBus(buffer=len(events) + 1, budget=1.0) as bus:
            publish = bus.publish
            start = time.perf_counter()
            for event in events:
                await publish(event)
            elapsed = time.perf_counter() - start
        return elapsed

    return anyio.run(run)


def stamp(events: list[Report]) -> float:
    start = time.perf_counter()
    now = 1.0
    for seq in range(0, len(events), 1024):
        batch = events[seq : seq + 1024]
        [replace(e, seq=n, time=e.time or now) for n, e in enumerate(batch, seq)]
    return time.perf_counter() - start


def group(events: list[Report]) -> float:
    start = time.perf_counter()
    for batch_start in range(0, len(events), 1024):
        for _, members in groupby(events[batch_start : batch_start + 1024], type):
            list(members)
    return time.perf_counter() - start


def bus_without_handler(events: list[Report]) -> float:
    async def run() -> float:
        async with EventBus(budget=1.0) as bus:
            bus.subscribe(RunStarted, print)  # a handler, of events that never come
            publish = bus.publish
            start = time.perf_counter()
            for event in events:
                await publish(event)
            await bus.wait_idle()
            elapsed = time.perf_counter() - start
        return elapsed

    return anyio.run(run)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    events = make_events(args.events)
    one = make_sync(1)
    parts: dict[str, Callable[[list[Report]], float]] = {
        "await coroutine": await_coroutine,
        "await publish, no dispatch": publish_only,
        "stamped copy": stamp,
        "group by type": group,
        "bus, no handler (the fixed cost)": bus_without_handler,
        "floor, K=1": lambda evs: floor_sync(one, evs),
    }
    times: dict[str, list[float]] = {name: [] for name in parts}
    for _ in range(args.repeat):
        for name, part in parts.items():
            touch(events)
            gc.collect()
            times[name].append(part(events) / args.events * 1e9)
    print(f"Python {sys.version.split()[0]}, {args.events:,} events, median of {args.repeat}")
    for name, ns in times.items():
        print(f"  {name:<34} {statistics.median(ns):>6.0f} ns/event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
