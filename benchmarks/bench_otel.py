"""What the OpenTelemetry tap costs, per event and per round, beside the bus without it.

The tap (``adapters.otel.OpenTelemetryTap``) exports through the real SDK here:
a ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter``, and a ``MeterProvider`` with an
``InMemoryMetricReader`` (the cheapest exporters there are: what is left is the
tap's own cost and the SDK's recording). Two cases:

- per event: K = 1 and 4 trivial sync handlers on ``Report``, ``await
  bus.publish(event)`` per event (as ``bench_dispatch.py``), for the floor (a
  plain loop calling the K functions), the bus alone, the bus with the tap
  (``durations=True``, the default: every call timed and recorded in the
  duration histogram) and with ``OpenTelemetryTap(durations=False)`` (only
  slow, failed and timed-out calls reach the tap);
- per round: reports of world size 8 gathered into rounds for 2 callbacks
  (``attach_user_callbacks``, as ``bench_rounds.py``), the bus alone and with
  the tap (a round span ended and the next begun per round, and every call of
  the gathering and the callbacks recorded).

Every variant runs over the same events, built before any timing; the variants
run interleaved, in a rotating order, and each figure is the median of
``--repeat`` runs with the range beside it. Ratios matter, not absolutes.

    python benchmarks/bench_otel.py [--events 100000] [--repeat 5] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import anyio
from _harness import CountRounds, target, time_publishing

from eventbus import EventBus, Report
from handlers._attach import attach_user_callbacks

try:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from adapters.otel import OpenTelemetryTap
except ImportError:
    sys.exit("bench_otel.py needs OpenTelemetry: pip install -e '.[otel]'")

Variant = Callable[[int, list[Report]], float]

#: Targets. Without the duration histogram the tap is off the hot path: the bus pays
#: nothing per call (a ratio to the bus alone, in the same run). With it, each call
#: costs about what the SDK's ``Histogram.record`` costs: 7-8 µs here.
TARGET_OFF_RATIO = 1.15
TARGET_CALL_US = 10.0
TARGET_ROUND_US = 150.0
WORLD_SIZE = 8
CALLBACKS = 2


def make_handlers(k: int) -> list[Callable[[Any], None]]:
    sink = [0]

    def make() -> Callable[[Any], None]:
        def callback(event: Any) -> None:
            sink[0] += 1

        return callback

    return [make() for _ in range(k)]


def make_events(n: int) -> list[Report]:
    return [
        Report(run_id="bench", rank=0, world_size=1, index=i, metrics={"loss": 0.5})
        for i in range(n)
    ]


def make_reports(world_size: int, rounds: int) -> list[Report]:
    return [
        Report(run_id="bench", rank=rank, world_size=world_size, index=r, metrics={"loss": 0.5})
        for r in range(rounds)
        for rank in range(world_size)
    ]


def sdk_tap(**options: Any) -> tuple[OpenTelemetryTap, Callable[[], None]]:
    """A tap exporting into the SDK's in-memory exporters, and what shuts them down."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])

    def shutdown() -> None:
        tracer_provider.shutdown()
        meter_provider.shutdown()

    return OpenTelemetryTap(tracer_provider, meter_provider, **options), shutdown


# --- per event --------------------------------------------------------------------------


def floor(k: int, events: list[Report]) -> float:
    fns = make_handlers(k)
    start = time.perf_counter()
    for event in events:
        for fn in fns:
            fn(event)
    return time.perf_counter() - start


def through_bus(tap_options: dict[str, Any] | None) -> Variant:
    """``await bus.publish(event)`` per event; with ``tap_options``, a tap attached."""

    def variant(k: int, events: list[Report]) -> float:
        async def run() -> float:
            tap, shutdown = sdk_tap(**tap_options) if tap_options is not None else (None, None)
            # budget=1.0: a saturating benchmark is over any real budget; no warning wanted.
            async with EventBus(buffer=1024, timeout=30.0, budget=1.0, period=3600.0) as bus:
                for fn in make_handlers(k):
                    bus.subscribe(Report, fn)
                if tap is not None:
                    tap.attach(bus)
                elapsed = await time_publishing(bus, events)
            if shutdown is not None:
                shutdown()
            return elapsed

        return anyio.run(run)

    return variant


PER_EVENT: dict[str, Variant] = {
    "floor": floor,
    "bus": through_bus(None),
    "bus + tap": through_bus({}),
    "bus + tap, durations=False": through_bus({"durations": False}),
}


def run_events(k: int, n: int, repeat: int) -> dict[str, Any]:
    events = make_events(n)
    names = list(PER_EVENT)
    times: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(repeat):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            gc.collect()
            times[name].append(PER_EVENT[name](k, events))
    ns = {name: [t / n * 1e9 for t in ts] for name, ts in times.items()}
    median = {name: statistics.median(v) for name, v in ns.items()}
    return {
        "k": k,
        "events": n,
        "ns_per_event": {name: round(v, 1) for name, v in median.items()},
        "ns_range": {name: [round(min(v), 1), round(max(v), 1)] for name, v in ns.items()},
        "ratio_to_floor": {
            name: round(v / median["floor"], 2) for name, v in median.items() if name != "floor"
        },
        "tap_over_bus": round(median["bus + tap"] / median["bus"], 2),
        "tap_off_over_bus": round(median["bus + tap, durations=False"] / median["bus"], 2),
        "tap_us_per_call": round((median["bus + tap"] - median["bus"]) / k / 1000, 2),
    }


# --- per round ----------------------------------------------------------------------------


async def rounds_through_bus(events: list[Report], with_tap: bool) -> float:
    callbacks: list[Any] = [CountRounds() for _ in range(CALLBACKS)]
    tap, shutdown = sdk_tap() if with_tap else (None, None)
    if tap is not None:
        callbacks.append(tap)
    async with EventBus(timeout=30.0, period=3600.0, budget=1.0) as bus:
        attach_user_callbacks(bus, callbacks, world_size=WORLD_SIZE)
        elapsed = await time_publishing(bus, events)
    if shutdown is not None:
        shutdown()
    assert callbacks[0].rounds == len(events) // WORLD_SIZE
    return elapsed


def run_rounds(rounds: int, repeat: int) -> dict[str, Any]:
    events = make_reports(WORLD_SIZE, rounds)
    times: dict[str, list[float]] = {"bus": [], "bus + tap": []}
    for turn in range(repeat):
        for name in ("bus", "bus + tap") if turn % 2 == 0 else ("bus + tap", "bus"):
            gc.collect()
            times[name].append(anyio.run(rounds_through_bus, events, name == "bus + tap"))
    us = {name: [t / rounds * 1e6 for t in ts] for name, ts in times.items()}
    median = {name: statistics.median(v) for name, v in us.items()}
    return {
        "world_size": WORLD_SIZE,
        "callbacks": CALLBACKS,
        "rounds": rounds,
        "us_per_round": {name: round(v, 2) for name, v in median.items()},
        "us_range": {name: [round(min(v), 2), round(max(v), 2)] for name, v in us.items()},
        "tap_us_per_round": round(median["bus + tap"] - median["bus"], 2),
    }


# --- reporting ------------------------------------------------------------------------------


def targets_of(events: list[dict[str, Any]], rounds: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for case in events:
        k = case["k"]
        rows.append(
            target(
                f"otel tap, durations=False, K={k} (x bus without the tap)",
                case["tap_off_over_bus"],
                TARGET_OFF_RATIO,
                "x",
            )
        )
        rows.append(
            target(
                f"otel tap, K={k} (µs added per handler call)",
                case["tap_us_per_call"],
                TARGET_CALL_US,
                "µs",
            )
        )
    rows.append(
        target(
            f"otel tap, world size {WORLD_SIZE}, {CALLBACKS} callbacks (µs added per round)",
            rounds["tap_us_per_round"],
            TARGET_ROUND_US,
            "µs",
        )
    )
    return rows


def print_table(events: list[dict[str, Any]], rounds: dict[str, Any], args: Any) -> None:
    print(
        f"Python {sys.version.split()[0]}, median of {args.repeat} (range), variants interleaved; "
        "the tap exports into the SDK's in-memory exporters"
    )
    for case in events:
        print(f"\n{case['events']:,} events, K={case['k']} trivial sync handlers")
        for name, ns in case["ns_per_event"].items():
            low, high = case["ns_range"][name]
            ratio = "" if name == "floor" else f"{case['ratio_to_floor'][name]:>6.2f}x floor"
            print(f"  {name:<28} {ns:>8.0f} ns/event ({low:.0f}-{high:.0f}) {ratio}")
        print(
            f"  tap: {case['tap_over_bus']:.2f}x the bus alone, "
            f"{case['tap_us_per_call']:.2f} µs per handler call; "
            f"durations=False: {case['tap_off_over_bus']:.2f}x"
        )
    print(
        f"\n{rounds['rounds']:,} rounds of world size {rounds['world_size']}, "
        f"{rounds['callbacks']} callbacks"
    )
    for name, us in rounds["us_per_round"].items():
        low, high = rounds["us_range"][name]
        print(f"  {name:<28} {us:>8.1f} µs/round ({low:.1f}-{high:.1f})")
    print(f"  tap: {rounds['tap_us_per_round']:.1f} µs per round")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 4])
    parser.add_argument(
        "--quick", action="store_true", help="20,000 events, 1,000 rounds, 3 repeats"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.quick:
        args.events, args.rounds, args.repeat = 20_000, 1_000, 3
    events = [run_events(k, args.events, args.repeat) for k in args.ks]
    rounds = run_rounds(args.rounds, args.repeat)
    if args.json:
        document = {
            "python": sys.version.split()[0],
            "quick": args.quick,
            "cases": events,
            "rounds": rounds,
            "targets": targets_of(events, rounds),
        }
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print_table(events, rounds, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
