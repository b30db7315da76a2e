"""Per-event cost of the bus against a plain Python loop and against its peers, in one run.

For K = 1, 4, 16 trivial callbacks it times, per event:

- the floors: a ``for`` loop calling the K functions (sync), or awaiting the
  K coroutine functions (async);
- the bus: ``await bus.publish(event)`` per event, handlers ``inline`` and in
  a ``lane``, with the default deadline armed and accounting on, as shipped
  (``--no-deadline`` rows show what the deadline costs); and ``await
  bus.publish_many(events)`` 64 at a time (a drained hand-off, a replay);
- the peers, doing the same work: ``asyncio.Queue(1024)`` feeding one
  consumer task that awaits the K callbacks (the bare async hand-off), pyee's
  ``EventEmitter.emit``, blinker's ``Signal.send`` and Hugging Face's
  ``CallbackHandler.on_log`` (each only when installed: ``pip install -e
  '.[bench]'``).

Honest floors: every variant runs over the same events, built before any
timing and touched once before each run (a floor over freshly allocated
events runs slower and flatters the ratios); the variants run interleaved,
in a rotating order, and each figure is the median of ``--repeat`` runs,
with the range beside it. Ratios matter, not absolutes.

    python benchmarks/bench_dispatch.py [--events 100000] [--repeat 5] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
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
from _harness import target, time_publishing

from eventbus import EventBus, Report

Handler = Callable[[Any], Any]
Variant = Callable[[list[Any], list[Report]], float]

#: Targets, as ratios to the matching floor at K = 1, 4, 16.
SYNC_TARGETS = {1: 3.5, 4: 1.8, 16: 1.25}
ASYNC_TARGETS = {1: 3.0, 4: 2.0, 16: 1.5}
LANE_TARGET_NS = 350.0  # per event per handler, at K = 16


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


def touch(events: list[Report]) -> None:
    """Touch each event once before a timed run; the bus leaves them as they were."""
    for event in events:
        if event.seq != -1:
            raise AssertionError("a published event was changed: handlers get stamped copies")


# --- floors ---------------------------------------------------------------------


def floor_sync(fns: list[Handler], events: list[Report]) -> float:
    start = time.perf_counter()
    for event in events:
        for fn in fns:
            fn(event)
    return time.perf_counter() - start


def floor_async(fns: list[Any], events: list[Report]) -> float:
    async def run() -> float:
        start = time.perf_counter()
        for event in events:
            for fn in fns:
                await fn(event)
        return time.perf_counter() - start

    return anyio.run(run)


# --- ours -----------------------------------------------------------------------


def through_bus(mode: str, deadline: bool, chunk: int = 0) -> Variant:
    """``await bus.publish(event)`` per event, or ``publish_many`` of ``chunk`` at a time."""

    def variant(fns: list[Any], events: list[Report]) -> float:
        chunks = [events[i : i + chunk] for i in range(0, len(events), chunk)] if chunk else []

        async def run() -> float:
            # budget=1.0: a saturating benchmark is over any real budget; no warning wanted.
            timeout = 30.0 if deadline else math.inf
            async with EventBus(buffer=1024, timeout=timeout, budget=1.0) as bus:
                for fn in fns:
                    bus.subscribe(Report, fn, delivery=mode)  # type: ignore[arg-type]
                if not chunk:
                    elapsed = await time_publishing(bus, events)
                else:
                    publish_many = bus.publish_many
                    start = time.perf_counter()
                    for some in chunks:
                        await publish_many(some)
                    await bus.wait_idle()
                    elapsed = time.perf_counter() - start
            return elapsed

        return anyio.run(run)

    return variant


# --- peers ----------------------------------------------------------------------


def asyncio_queue(fns: list[Any], events: list[Report]) -> float:
    """The bare async hand-off: a bounded queue and one consumer awaiting the callbacks."""

    async def run() -> float:
        queue: asyncio.Queue[Report | None] = asyncio.Queue(1024)  # the bus's buffer

        async def consume() -> None:
            while (event := await queue.get()) is not None:
                for fn in fns:
                    await fn(event)

        consumer = asyncio.create_task(consume())
        start = time.perf_counter()
        for event in events:
            await queue.put(event)
        await queue.put(None)
        await consumer
        return time.perf_counter() - start

    return asyncio.run(run())


def pyee_emit(fns: list[Handler], events: list[Report]) -> float:
    from pyee import EventEmitter

    emitter = EventEmitter()
    for fn in fns:
        emitter.on("report", fn)
    emit = emitter.emit
    start = time.perf_counter()
    for event in events:
        emit("report", event)
    return time.perf_counter() - start


def blinker_send(fns: list[Handler], events: list[Report]) -> float:
    from blinker import Signal

    signal = Signal()
    receivers = [lambda sender, fn=fn: fn(sender) for fn in fns]  # blinker passes the sender
    for receiver in receivers:
        signal.connect(receiver, weak=False)
    send = signal.send
    start = time.perf_counter()
    for event in events:
        send(event)
    return time.perf_counter() - start


def hf_on_log(fns: list[Handler], events: list[Report]) -> float:
    """Hugging Face's own callback loop: K trivial ``TrainerCallback``, one ``on_log`` per event."""
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import CallbackHandler
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # it warns that no DefaultFlowCallback is in the list

    def callback_class(fn: Handler) -> type:
        def on_log(
            self: Any, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any
        ) -> None:
            fn(logs)

        return type(f"Trivial{id(fn)}", (TrainerCallback,), {"on_log": on_log})

    handler = CallbackHandler([callback_class(fn)() for fn in fns], None, None, None, None)
    args = hf_arguments(TrainingArguments)
    state, control = TrainerState(), TrainerControl()
    on_log = handler.on_log
    start = time.perf_counter()
    for event in events:
        on_log(args, state, control, event)
    return time.perf_counter() - start


_hf_args: list[Any] = []


def hf_arguments(training_arguments: type) -> Any:
    """One ``TrainingArguments`` per process (building it takes a while; it is not timed)."""
    if not _hf_args:
        import tempfile

        _hf_args.append(training_arguments(output_dir=tempfile.mkdtemp(), report_to=[]))
    return _hf_args[0]


def installed(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


# --- running -------------------------------------------------------------------


def variants_for(kind: str, deadline_rows: bool) -> dict[str, Variant]:
    variants: dict[str, Variant] = {}
    if kind == "sync":
        variants["floor"] = floor_sync
    else:
        variants["floor"] = floor_async
    variants["inline"] = through_bus("inline", deadline=True)
    variants["inline, publish_many(64)"] = through_bus("inline", deadline=True, chunk=64)
    variants["lane"] = through_bus("lane", deadline=True)
    if deadline_rows:
        variants["inline, no deadline"] = through_bus("inline", deadline=False)
    if kind == "async":
        variants["asyncio.Queue"] = asyncio_queue
    else:
        if installed("pyee"):
            variants["pyee"] = pyee_emit
        if installed("blinker"):
            variants["blinker"] = blinker_send
        if installed("transformers"):
            variants["HF CallbackHandler"] = hf_on_log
    return variants


def run_case(kind: str, k: int, n: int, repeat: int, deadline_rows: bool) -> dict[str, Any]:
    """Every variant over the same warm events, ``repeat`` times, in a rotating order."""
    fns: list[Any] = make_sync(k) if kind == "sync" else make_async(k)
    events = make_events(n)
    variants = variants_for(kind, deadline_rows)
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeat):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            touch(events)
            gc.collect()
            times[name].append(variants[name](fns, events))
    ns = {name: [t / n * 1e9 for t in ts] for name, ts in times.items()}
    median = {name: statistics.median(v) for name, v in ns.items()}
    floor = median["floor"]
    return {
        "kind": kind,
        "k": k,
        "events": n,
        "ns_per_event": {name: round(v, 1) for name, v in median.items()},
        "ns_range": {name: [round(min(v), 1), round(max(v), 1)] for name, v in ns.items()},
        "ratio": {name: round(v / floor, 2) for name, v in median.items() if name != "floor"},
        "lane_ns_per_event_per_handler": round(median["lane"] / k, 1),
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
    return {"events": n, "rss_before_mb": round(before, 1), "growth_mb": round(after - before, 1)}


def best_peer(case: dict[str, Any]) -> str | None:
    peers = {
        name: ratio
        for name, ratio in case["ratio"].items()
        if not name.startswith(("inline", "lane"))
    }
    if not peers:
        return None
    name = min(peers, key=peers.__getitem__)
    return f"{name} {peers[name]:.2f}x"


def targets_of(results: list[dict[str, Any]], memory: dict[str, Any] | None) -> list[Any]:
    rows = []
    for case in results:
        k, kind, ratio = case["k"], case["kind"], case["ratio"]
        limits = SYNC_TARGETS if kind == "sync" else ASYNC_TARGETS
        if k in limits:
            rows.append(
                target(
                    f"bus inline, {kind} handlers, K={k} (x {kind} floor)",
                    ratio["inline"],
                    limits[k],
                    "x",
                    peer=best_peer(case),
                )
            )
        if kind == "async":
            rows.append(
                target(
                    f"bus inline, async handlers, K={k} (x asyncio.Queue consumer)",
                    ratio["inline"] / ratio["asyncio.Queue"],
                    1.0,
                    "x",
                )
            )
            if k == 16:
                rows.append(
                    target(
                        "bus lane, async handlers, K=16 (ns per event per handler)",
                        case["lane_ns_per_event_per_handler"],
                        LANE_TARGET_NS,
                        "ns",
                    )
                )
    if memory is not None:
        rows.append(
            target(
                f"RSS growth over {memory['events']:,} events (MB)",
                memory["growth_mb"],
                10.0,
                "MB",
            )
        )
    return rows


def print_table(results: list[dict[str, Any]], memory: dict[str, Any] | None, args: Any) -> None:
    print(
        f"Python {sys.version.split()[0]}, {args.events:,} events, median of {args.repeat} "
        "(range); ratio to the floor of the same kind, same run"
    )
    for case in results:
        print(f"\n{case['kind']} callbacks, K={case['k']}")
        for name, ns in case["ns_per_event"].items():
            low, high = case["ns_range"][name]
            ratio = "" if name == "floor" else f"{case['ratio'][name]:>6.2f}x"
            print(f"  {name:<22} {ns:>8.0f} ns/event ({low:.0f}-{high:.0f}) {ratio}")
        print(f"  lane: {case['lane_ns_per_event_per_handler']:.0f} ns per event per handler")
    if memory:
        print(
            f"\nmemory: {memory['events']:,} events through the bus, RSS {memory['growth_mb']:+} MB"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--memory-events", type=int, default=1_000_000, help="events for the memory check (0: skip)"
    )
    parser.add_argument(
        "--no-deadline", action="store_true", help="also time inline with deadlines off"
    )
    parser.add_argument(
        "--quick", action="store_true", help="20,000 events, 3 repeats, a smaller memory check"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.quick:
        args.events, args.repeat, args.memory_events = 20_000, 3, 200_000

    results = [
        run_case(kind, k, args.events, args.repeat, args.no_deadline)
        for kind in ("sync", "async")
        for k in args.ks
    ]
    memory = memory_check(args.memory_events) if args.memory_events else None
    if args.json:
        document = {
            "python": sys.version.split()[0],
            "cases": results,
            "memory": memory,
            "targets": targets_of(results, memory),
        }
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print_table(results, memory, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
