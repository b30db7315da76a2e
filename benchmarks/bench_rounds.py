"""Cost of one gathered report round, against calling the callbacks directly.

For world sizes 8, 64 and 512 it times, per report:

- ``floor``: the callbacks' ``after_report`` called directly with a prebuilt
  list of per-rank metrics, once per round (what a round costs at least);
- ``gather``: ``ReportCallbackHandler.handle`` called directly for each
  report (the gathering rules alone, no bus);
- ``bus``: every report published on an ``EventBus`` with
  ``attach_user_callbacks`` (gathering, validation, one derived
  ``RoundGathered`` per round, each callback its own subscription).

Target: ``bus`` <= 2 us per report at world size 512. Ratios are against the
floor measured in the same run.

    python benchmarks/bench_rounds.py [--reports 60000] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from typing import Any

import anyio
from _harness import CountRounds, time_publishing

from eventbus import EventBus, Report
from handlers import ReportCallbackHandler, TrainRunContext
from handlers.wiring import attach_user_callbacks

CALLBACKS = 2
TARGET_US = 2.0


def make_reports(world_size: int, rounds: int) -> list[Report]:
    """Rank-interleaved reports; odd ranks run one round behind, so rounds complete late."""
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
                    metrics={"loss": 0.5, "step": index},
                )
            )
    for rank in range(1, world_size, 2):  # the laggards' last round
        events.append(
            Report(
                run_id="bench",
                rank=rank,
                world_size=world_size,
                index=rounds - 1,
                metrics={"loss": 0.5, "step": rounds - 1},
            )
        )
    return events


def floor(world_size: int, rounds: int) -> float:
    callbacks = [CountRounds() for _ in range(CALLBACKS)]
    context = TrainRunContext(run_id="bench", name="bench", world_size=world_size)
    metrics = [{"loss": 0.5, "step": 0} for _ in range(world_size)]
    start = time.perf_counter()
    for _ in range(rounds):
        for cb in callbacks:
            cb.after_report(context, metrics, None)
    return time.perf_counter() - start


def gather_only(world_size: int, events: list[Report]) -> float:
    callbacks = [CountRounds() for _ in range(CALLBACKS)]
    handler = ReportCallbackHandler(callbacks, world_size=world_size)
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


def run_case(world_size: int, reports: int, repeat: int) -> dict[str, Any]:
    rounds = max(2, reports // world_size)
    n = rounds * world_size
    times: dict[str, list[float]] = {"floor": [], "gather": [], "bus": []}
    for _ in range(repeat):
        gc.collect()
        times["floor"].append(floor(world_size, rounds))
        events = make_reports(world_size, rounds)
        gc.collect()
        times["gather"].append(gather_only(world_size, events))
        events = make_reports(world_size, rounds)
        gc.collect()
        times["bus"].append(anyio.run(through_bus, world_size, events))
    us = {k: statistics.median(v) / n * 1e6 for k, v in times.items()}
    return {
        "world_size": world_size,
        "rounds": rounds,
        "reports": n,
        "callbacks": CALLBACKS,
        "us_per_report": {k: round(v, 4) for k, v in us.items()},
        "us_per_round": {k: round(v * world_size, 2) for k, v in us.items()},
        "ratio_to_floor": {k: round(us[k] / us["floor"], 1) for k in ("gather", "bus")},
        "target_us_per_report": TARGET_US,
        "meets_target": us["bus"] <= TARGET_US,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reports", type=int, default=60_000, help="reports per case")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = [run_case(w, args.reports, args.repeat) for w in args.world_sizes]
    if args.json:
        json.dump({"python": sys.version.split()[0], "cases": results}, sys.stdout, indent=2)
        print()
        return 0
    print(f"Python {sys.version.split()[0]}, {CALLBACKS} callbacks, median of {args.repeat}")
    print(
        f"{'world':>6} {'reports':>8} {'floor us/rep':>13} {'gather us/rep':>14} "
        f"{'bus us/rep':>11} {'bus/floor':>10} {'<= 2 us':>8}"
    )
    for r in results:
        us = r["us_per_report"]
        print(
            f"{r['world_size']:>6} {r['reports']:>8} {us['floor']:>13.4f} {us['gather']:>14.3f} "
            f"{us['bus']:>11.3f} {r['ratio_to_floor']['bus']:>9.0f}x "
            f"{'yes' if r['meets_target'] else 'NO':>8}"
        )
    return 0 if all(math.isfinite(r["us_per_report"]["bus"]) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
