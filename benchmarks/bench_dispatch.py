"""Per-event cost of the bus against a plain Python loop, measured in the same run.

For K = 1, 4, 16 trivial callbacks it times: the floor (a ``for`` loop
calling the K functions, or awaiting the K coroutines), and the bus in inline
and lane modes, with the default deadline armed and with deadlines off
(an infinite timeout). Prints ns/event and the ratio to the floor; ``--json``
prints the same for machines. Ratios matter, not absolutes: the floor is
measured in the same process, interleaved with the bus runs.

    python benchmarks/bench_dispatch.py [--events 100000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from _harness import time_publishing

from eventbus import EventBus, Report

Handler = Callable[[Any], Any]


def make_sync(k: int) -> list[Handler]:
    sink = [0]

    def make() -> Handler:
        def callback(event: Any) -> None:
            sink[0] += 1

        return callback

    return [make() for _ in range(k)]


def make_async(k: int) -> list[Callable[[Any], Awaitable[None]]]:
    sink = [0]

    def make() -> Callable[[Any], Awaitable[None]]:
        async def callback(event: Any) -> None:
            sink[0] += 1

        return callback

    return [make() for _ in range(k)]


def make_events(n: int) -> list[Report]:
    return [
        Report(run_id="bench", rank=0, world_size=1, index=i, metrics={"loss": 0.5})
        for i in range(n)
    ]


def floor_sync(fns: list[Handler], events: list[Report]) -> float:
    start = time.perf_counter()
    for event in events:
        for fn in fns:
            fn(event)
    return time.perf_counter() - start


async def floor_async(fns: list[Any], events: list[Report]) -> float:
    start = time.perf_counter()
    for event in events:
        for fn in fns:
            await fn(event)
    return time.perf_counter() - start


async def through_bus(
    fns: list[Any], events: list[Report], mode: str, deadline: float | None
) -> float:
    # budget=1.0: a saturating benchmark is over any real budget; no warning wanted here.
    deadline_s = math.inf if deadline is None else deadline
    async with EventBus(buffer=1024, timeout=deadline_s, budget=1.0) as bus:
        for fn in fns:
            bus.subscribe(Report, fn, mode=mode)  # type: ignore[arg-type]
        elapsed = await time_publishing(bus, events)
    return elapsed


def run_case(kind: str, k: int, n: int, repeat: int) -> dict[str, Any]:
    """Median over ``repeat`` runs of each variant, floor interleaved with the bus runs."""
    fns: list[Any] = make_sync(k) if kind == "sync" else make_async(k)
    variants: dict[str, list[float]] = {
        "floor": [],
        "inline": [],
        "inline_no_deadline": [],
        "lane": [],
    }
    for _ in range(repeat):
        events = make_events(n)
        gc.collect()
        if kind == "sync":
            variants["floor"].append(floor_sync(fns, events))
        else:
            variants["floor"].append(anyio.run(floor_async, fns, events))
        for name, mode, timeout in (
            ("inline", "inline", 30.0),
            ("inline_no_deadline", "inline", None),
            ("lane", "lane", 30.0),
        ):
            events = make_events(n)
            gc.collect()
            variants[name].append(anyio.run(through_bus, fns, events, mode, timeout))
    ns = {name: statistics.median(times) / n * 1e9 for name, times in variants.items()}
    floor = ns["floor"]
    return {
        "kind": kind,
        "k": k,
        "events": n,
        "ns_per_event": {name: round(v, 1) for name, v in ns.items()},
        "ratio": {name: round(v / floor, 2) for name, v in ns.items() if name != "floor"},
        "lane_ns_per_event_per_handler": round(ns["lane"] / k, 1),
        "deadline_overhead": round(ns["inline"] / ns["inline_no_deadline"] - 1, 3),
    }


def memory_check(n: int) -> dict[str, Any]:
    """RSS before and after ``n`` events through a bus with one handler."""

    def rss_mb() -> float:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    async def run() -> None:
        async with EventBus() as bus:
            bus.subscribe(Report, make_sync(1)[0])
            for i in range(n):
                await bus.publish(
                    Report(run_id="m", rank=0, world_size=1, index=i, metrics={"loss": 0.5})
                )
            await bus.wait_idle()

    gc.collect()
    before = rss_mb()
    anyio.run(run)
    gc.collect()
    after = rss_mb()
    return {
        "events": n,
        "rss_before_mb": round(before, 1),
        "rss_after_mb": round(after, 1),
        "growth_mb": round(after - before, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--memory-events",
        type=int,
        default=1_000_000,
        help="events for the memory check (0 to skip)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()

    results = [
        run_case(kind, k, args.events, args.repeat) for kind in ("sync", "async") for k in args.ks
    ]
    memory = memory_check(args.memory_events) if args.memory_events else None
    if args.json:
        json.dump(
            {"python": sys.version.split()[0], "cases": results, "memory": memory},
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    print(f"Python {sys.version.split()[0]}, {args.events} events, median of {args.repeat}")
    print(
        f"{'callbacks':>10} {'K':>3} {'floor ns':>9} {'inline ns':>10} {'ratio':>6} "
        f"{'no-deadline':>11} {'deadline +':>10} {'lane ns/h':>10} {'lane ratio':>10}"
    )
    for r in results:
        ns, ratio = r["ns_per_event"], r["ratio"]
        print(
            f"{r['kind']:>10} {r['k']:>3} {ns['floor']:>9.0f} {ns['inline']:>10.0f} "
            f"{ratio['inline']:>5.2f}x {ns['inline_no_deadline']:>11.0f} "
            f"{r['deadline_overhead'] * 100:>9.1f}% {r['lane_ns_per_event_per_handler']:>10.0f} "
            f"{ratio['lane']:>9.2f}x"
        )
    if memory:
        print(
            f"memory: {memory['events']} events, RSS {memory['rss_before_mb']} -> "
            f"{memory['rss_after_mb']} MB ({memory['growth_mb']:+} MB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
