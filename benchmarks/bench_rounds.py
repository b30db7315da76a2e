"""Cost of gathering reports into rounds, per report, from world size 8 to 32,768.

For each world size it times, per report, on one list of reports built
before any timing (odd ranks one round behind, so rounds complete late and
half the ranks are always a report ahead):

- ``floor``: a plain loop over the same reports that files each one's
  metrics by rank and calls the callbacks' ``after_report`` once per
  ``world_size`` reports (no rules, no copies: what a round costs at least);
- ``gather``: ``ReportCallbackHandler.handle`` called directly for each
  report, each ``RoundGathered`` it emits handed to the callbacks (the
  gathering rules alone, no bus);
- ``bus``: every report published on an ``EventBus`` with
  ``attach_user_callbacks`` (gathering, one derived ``RoundGathered`` per
  round, each callback its own subscription). The bus stamps what it
  publishes, so this pass comes last in each repeat.

The three passes are interleaved, repeat by repeat; figures are the median
over repeats, with the range (min-max). Target: ``bus`` <= 1.0 us per report
at every world size. The metrics are plain dicts (as a replay or an adapter
publishes them), so each report's are checked and copied once; a live run's
``Reporter`` has done that already. At large world sizes the copies of the
waiting reports' metrics outlive young garbage collections, and the full
collection they end up triggering walks every prebuilt report too: part of
the figure, as in any process with a large heap. ``--frozen-metrics`` times
reports as a live run's ``Reporter`` publishes them instead: nothing to copy.

    python benchmarks/bench_rounds.py [--world-sizes 8 512 4096 32768]
        [--reports 131072] [--repeat 5] [--frozen-metrics] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Any

import anyio
from _harness import CountRounds, target, time_publishing

from eventbus import Event, EventBus, Report, RoundGathered, TrainRunContext
from handlers._attach import attach_user_callbacks
from handlers._metric_values import freeze_metrics  # what a Reporter does to metrics
from handlers._reports import ReportCallbackHandler

CALLBACKS = 2
TARGET_US = 1.0
PASSES = ("floor", "gather", "bus")


def make_reports(world_size: int, rounds: int, frozen: bool = False) -> list[Report]:
    """Rank-interleaved reports; odd ranks run one round behind, so rounds complete late."""
    metrics_of: Any = freeze_metrics if frozen else dict
    events = []
    for r in range(rounds):
        for rank in range(world_size):
            index = r - 1 if rank % 2 and r > 0 else r
            if rank % 2 and r == 0:
                continue
            events.append(
                Report(
                    run_id="bench",
                    rank=rank,
                    world_size=world_size,
                    index=index,
                    metrics=metrics_of({"loss": 0.5, "step": index}),
                )
            )
    for rank in range(1, world_size, 2):  # the laggards' last round
        events.append(
            Report(
                run_id="bench",
                rank=rank,
                world_size=world_size,
                index=rounds - 1,
                metrics=metrics_of({"loss": 0.5, "step": rounds - 1}),
            )
        )
    return events


def floor(world_size: int, events: list[Report]) -> float:
    callbacks = [CountRounds() for _ in range(CALLBACKS)]
    context = TrainRunContext(run_id="bench", name="bench", world_size=world_size)
    start = time.perf_counter()
    slots: list[Any] = [None] * world_size
    filled = 0
    for event in events:
        slots[event.rank] = event.metrics
        filled += 1
        if filled == world_size:
            for callback in callbacks:
                callback.after_report(context, slots, None)
            slots = [None] * world_size
            filled = 0
    elapsed = time.perf_counter() - start
    assert callbacks[0].rounds == len(events) // world_size
    return elapsed


def gather_only(world_size: int, events: list[Report]) -> float:
    callbacks = [CountRounds() for _ in range(CALLBACKS)]

    def deliver(event: Event) -> None:  # what the bus does with a round, without the bus
        if type(event) is RoundGathered:
            for callback in callbacks:
                callback.after_report(event.context, event.metrics, event.checkpoint)

    handler = ReportCallbackHandler(world_size=world_size, emit=deliver)
    handle = handler.handle  # what the bus calls
    start = time.perf_counter()
    for event in events:
        handle(event)
    elapsed = time.perf_counter() - start
    assert callbacks[0].rounds == len(events) // world_size
    return elapsed


async def through_bus(world_size: int, events: list[Report]) -> float:
    callbacks = [CountRounds() for _ in range(CALLBACKS)]
    async with EventBus(timeout=30.0, period=3600.0, budget=1.0) as bus:  # no budget warnings
        attach_user_callbacks(bus, callbacks, world_size=world_size)
        elapsed = await time_publishing(bus, events)
    assert callbacks[0].rounds == len(events) // world_size
    return elapsed


def run_case(world_size: int, reports: int, repeat: int, frozen: bool) -> dict[str, Any]:
    rounds = max(2, reports // world_size)
    times: dict[str, list[float]] = {name: [] for name in PASSES}
    n = 0
    for turn in range(repeat):
        events = make_reports(world_size, rounds, frozen)  # the bus stamps them: fresh each repeat
        n = len(events)
        # floor and gather take turns going first; the bus, which stamps, goes last
        order = ("floor", "gather") if turn % 2 == 0 else ("gather", "floor")
        for name in order:
            gc.collect()
            timed = floor if name == "floor" else gather_only
            times[name].append(timed(world_size, events))
        gc.collect()
        times["bus"].append(anyio.run(through_bus, world_size, events))
        del events
    us = {k: [t / n * 1e6 for t in v] for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in us.items()}
    return {
        "world_size": world_size,
        "rounds": rounds,
        "reports": n,
        "callbacks": CALLBACKS,
        "repeat": repeat,
        "frozen_metrics": frozen,
        "us_per_report": {k: round(v, 4) for k, v in median.items()},
        "us_per_report_range": {k: [round(min(v), 4), round(max(v), 4)] for k, v in us.items()},
        "bus_over_gather_us": round(median["bus"] - median["gather"], 4),
        "target_us_per_report": TARGET_US,
        "meets_target": median["bus"] <= TARGET_US,
    }


def targets_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        target(
            f"round through the bus, world size {case['world_size']} (µs per report)"
            + (", metrics frozen" if case["frozen_metrics"] else ""),
            case["us_per_report"]["bus"],
            TARGET_US,
            "µs",
        )
        for case in results
    ]


def print_table(results: list[dict[str, Any]], repeat: int, frozen: bool) -> None:
    metrics = "metrics already frozen" if frozen else "metrics as plain dicts"
    print(
        f"Python {sys.version.split()[0]}, {CALLBACKS} callbacks, {metrics}, µs per report: "
        f"median of {repeat} (min-max), passes interleaved"
    )
    print(
        f"{'world':>6} {'reports':>8} {'floor':>20} {'gather':>20} {'bus':>20} "
        f"{f'<= {TARGET_US} us':>9}"
    )
    for case in results:
        us, spread = case["us_per_report"], case["us_per_report_range"]
        cells = [f"{us[k]:.3f} ({spread[k][0]:.3f}-{spread[k][1]:.3f})" for k in PASSES]
        print(
            f"{case['world_size']:>6} {case['reports']:>8} {cells[0]:>20} {cells[1]:>20} "
            f"{cells[2]:>20} {'yes' if case['meets_target'] else 'NO':>9}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reports", type=int, default=131_072, help="reports per world size")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 512, 4096, 32768])
    parser.add_argument(
        "--frozen-metrics", action="store_true", help="metrics already frozen, as a Reporter's"
    )
    parser.add_argument(
        "--quick", action="store_true", help="world sizes 8 and 4096, 32,768 reports, 3 repeats"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    if args.quick:
        args.world_sizes, args.reports, args.repeat = [8, 4096], 32_768, 3
    results = [
        run_case(w, args.reports, args.repeat, args.frozen_metrics) for w in args.world_sizes
    ]
    if args.json:
        document = {
            "python": sys.version.split()[0],
            "quick": args.quick,
            "cases": results,
            "targets": targets_of(results),
        }
        json.dump(document, sys.stdout, indent=2)
        print()
    else:
        print_table(results, args.repeat, args.frozen_metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
