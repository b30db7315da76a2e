"""Trainer-side cost of one Hugging Face ``on_log`` handed to a bus thread.

What the training thread pays per ``on_log`` when ``EventBusCallback`` (one
trivial ``UserCallback`` behind it, ``bus_runs="in_thread"``: the hand-off of
Ray's and trio's adapters, and of a notebook's; the default host, stepped in
the hooks, is measured by what users feel, in ``bench_trainer_overhead.py``)
hands the report to the bus thread,
against HF's own ``CallbackHandler`` calling one trivial ``TrainerCallback``
(both called through a ``CallbackHandler``, as the Trainer calls them: the
same keywords, the same loop), in the same run, interleaved, on pre-built
inputs.

- *warm* (the target, <= 1.3x HF's loop): blocks of 100 calls back to back,
  HF's and ours alternating, after the bus thread handled everything and
  went back to sleep; a block is shorter than the bus's poll interval, so it
  measures the hook, not the bus's work. Median per call and its spread.
- *spaced*: each call timed alone after that settle, as after a training
  step (HF logs every ``logging_steps``). Also shown: the hand-off done with
  an anyio blocking portal (``portal.call(bus.publish_nowait, event)``),
  which waits for the bus's loop to answer.
- *burst*: calls back to back for many poll intervals. It also pays for the
  bus thread's work (the GIL), which in a real run overlaps the GIL-free
  parts of torch's work. Counted: how often the bus thread's event loop woke
  up (every return from a blocking ``select``, whatever woke it) against
  one per poll interval, the most allowed.

    python benchmarks/bench_hf_handoff.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import selectors
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")

import anyio  # noqa: E402
import anyio.from_thread  # noqa: E402
import transformers  # noqa: E402
from _harness import CountingSelector, CountRounds, target  # noqa: E402
from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)

import adapters  # noqa: E402
from adapters.transformers import EventBusCallback  # noqa: E402
from eventbus import EventBus, Report  # noqa: E402

TARGET_US = 20.0
TARGET_RATIO = 1.3
BLOCK = 100
LOGS = {"loss": 0.25, "grad_norm": 1.5, "learning_rate": 5e-05, "epoch": 0.5}


class TrivialHF(TrainerCallback):  # type: ignore[misc]  # transformers is untyped to mypy
    def __init__(self) -> None:
        self.calls = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.calls += 1


def handler_for(callback: Any) -> Any:
    return CallbackHandler([callback], None, None, None, None)


def spread(values: list[float], scale: float = 1.0) -> dict[str, float]:
    ordered = sorted(values)
    last = len(ordered) - 1
    return {
        "median": statistics.median(ordered) * scale,
        "p10": ordered[int(0.1 * last)] * scale,
        "p90": ordered[int(0.9 * last)] * scale,
        "mean": statistics.fmean(ordered) * scale,
    }


def time_blocks(
    calls: dict[str, Callable[[Any], Any]], settle: Callable[[], Any], rounds: int
) -> dict[str, list[float]]:
    """Seconds per call of each of ``calls``, one block of ``BLOCK`` calls each per round,
    the order rotating, each after ``settle()``; inputs built before the clock starts."""
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            call, inputs = calls[name], [dict(LOGS) for _ in range(BLOCK)]
            settle()
            t0 = clock()
            for logs in inputs:
                call(logs)
            times[name].append((clock() - t0) / BLOCK)
    return times


def time_spaced(
    calls: dict[str, Callable[[Any], Any]], settle: Callable[[], Any], n: int
) -> dict[str, list[float]]:
    """Seconds per call, each call timed alone after ``settle()``, interleaved."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    clock = time.perf_counter
    for _ in range(n):
        for name, call in calls.items():
            logs = dict(LOGS)
            settle()
            t0 = clock()
            call(logs)
            times[name].append(clock() - t0)
    return times


def time_burst(call: Callable[[Any], Any], n: int) -> float:
    """Seconds for ``n`` calls back to back (each on a fresh copy of the logs, made in
    the loop: thousands made before it would not fit in the caches)."""
    logs = LOGS
    t0 = time.perf_counter()
    for _ in range(n):
        call(dict(logs))
    return time.perf_counter() - t0


def measure(quick: bool) -> dict[str, Any]:
    rounds, spaced_calls, burst = (60, 300, 8000) if quick else (300, 2000, 20000)
    selectors.DefaultSelector = CountingSelector  # type: ignore[misc]  # the loop's, from now
    output = tempfile.mkdtemp(prefix="bench_hf_handoff_")
    args = transformers.TrainingArguments(output_dir=output, use_cpu=True, report_to="none")
    state, control = TrainerState(max_steps=1), TrainerControl()
    results: dict[str, Any] = {"code": os.path.dirname(adapters.__file__ or "")}

    trivial = CountRounds()
    ours = EventBusCallback([trivial], state=False, bus_runs="in_thread", poll_interval=0.005)
    ours.on_train_begin(args, state, control)
    thread = ours.bus_thread
    assert thread is not None
    interval = float(thread.poll_interval)
    ours_handler, hf = handler_for(ours), handler_for(TrivialHF())
    calls: dict[str, Callable[[Any], Any]] = {
        "hf_callback_handler": lambda logs: hf.on_log(args, state, control, logs),
        "ours_direct": lambda logs: ours.on_log(args, state, control, logs=logs),
        "ours_via_hf": lambda logs: ours_handler.on_log(args, state, control, logs),
    }
    # Every timed call, HF's included, follows the same settle: the bus thread has just
    # handled everything and gone back to sleep (as after a training step).
    settle = ours.wait_idle

    warm = time_blocks(calls, settle, rounds)
    spaced = time_spaced(calls, settle, spaced_calls)
    for name, times in spaced.items():
        results[name] = spread(times, 1e6)
        results[name]["warm"] = spread(warm[name], 1e6)
    paired = [o / h for o, h in zip(warm["ours_via_hf"], warm["hf_callback_handler"], strict=True)]
    results["warm_ratio"] = spread(paired)

    results["hf_callback_handler"]["burst_us"] = time_burst(calls["hf_callback_handler"], burst) / (
        burst * 1e-6
    )
    settle()
    name = thread.name
    pump_before = getattr(thread, "wakeups", None)  # None: code from before the counter
    loop_before = CountingSelector.wakeups.get(name, 0)
    seconds = time_burst(calls["ours_via_hf"], burst)
    loop_woke = CountingSelector.wakeups.get(name, 0) - loop_before
    pump_woke = None if pump_before is None else thread.wakeups - pump_before
    results["ours_via_hf"]["burst_us"] = seconds / (burst * 1e-6)
    intervals = math.ceil(seconds / interval)
    results["burst"] = {
        "calls": burst,
        "seconds": seconds,
        "poll_interval": interval,
        "intervals": intervals,
        "loop_wakeups": loop_woke,
        "pump_wakeups": pump_woke,
        "wakeups_per_interval": loop_woke / intervals,
    }
    ours.on_train_end(args, state, control)
    handed = (rounds * BLOCK + spaced_calls) * 2 + burst
    results["delivered"] = {"handed_off": handed, "rounds": trivial.rounds, "dropped": ours.dropped}

    # The portal alternative: each hand-off waits for the bus's loop to run it and reply.
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(EventBus()) as bus,
    ):
        bus.subscribe(Report, lambda e: None)

        def portal_call(logs: Any) -> None:
            event = Report(run_id="bench", rank=0, world_size=1, index=0, metrics=logs)
            portal.call(bus.publish_nowait, event)

        def portal_settle() -> None:
            portal.call(bus.wait_idle)

        n = spaced_calls // 4 if quick else spaced_calls
        portal_times = time_spaced({"portal": portal_call}, portal_settle, n)["portal"]
        results["portal_call"] = spread(portal_times, 1e6)

    floor = results["hf_callback_handler"]["median"]
    for key in ("ours_direct", "ours_via_hf", "portal_call"):
        results[key]["ratio_to_hf"] = results[key]["median"] / floor
    warm_floor = results["hf_callback_handler"]["warm"]["median"]
    results["ratio"] = results["ours_via_hf"]["warm"]["median"] / warm_floor
    results["target_us"] = TARGET_US
    results["meets_target"] = results["ours_via_hf"]["median"] <= TARGET_US
    results["targets"] = [
        target(
            "HF on_log via EventBusCallback (x HF's own loop)",
            results["ratio"],
            TARGET_RATIO,
            "x",
            peer=f"portal.call {results['portal_call']['ratio_to_hf']:.1f}x (spaced)",
        ),
        target(
            "bus-thread wake-ups per poll interval, burst of on_log",
            results["burst"]["wakeups_per_interval"],
            1.0,
            "",
        ),
    ]
    return results


def print_table(results: dict[str, Any], quick: bool) -> None:
    burst = results["burst"]
    print(
        f"one on_log, trainer side (spaced: each call timed alone after the bus settled; "
        f"burst: {burst['calls']} calls back to back){' [quick]' if quick else ''}"
    )
    print(f"{'':34} {'median':>9} {'p90':>9} {'mean':>9} {'burst':>9} {'x HF':>6}")
    rows = (
        ("HF CallbackHandler, 1 callback", "hf_callback_handler"),
        ("EventBusCallback.on_log", "ours_direct"),
        ("HF handler -> EventBusCallback", "ours_via_hf"),
        ("portal.call(bus.publish_nowait)", "portal_call"),
    )
    for label, key in rows:
        row = results[key]
        burst_us = f"{row['burst_us']:8.2f}u" if "burst_us" in row else " " * 9
        ratio = f"{row.get('ratio_to_hf', 1.0):6.1f}"
        print(
            f"{label:34} {row['median']:8.2f}u {row['p90']:8.2f}u "
            f"{row['mean']:8.2f}u {burst_us} {ratio}"
        )
    delivered = results["delivered"]
    print(
        f"delivered {delivered['rounds']}/{delivered['handed_off']} rounds, "
        f"dropped {delivered['dropped']}; target <= {TARGET_US:.0f} us: "
        f"{'met' if results['meets_target'] else 'NOT met'}"
    )
    print(f"\nwarm: blocks of {BLOCK} calls back to back, interleaved; per call")
    print(f"{'':34} {'median':>9} {'p10':>9} {'p90':>9} {'x HF':>6}")
    floor = results["hf_callback_handler"]["warm"]["median"]
    for label, key in rows[:3]:
        row = results[key]["warm"]
        print(
            f"{label:34} {row['median']:8.2f}u {row['p10']:8.2f}u {row['p90']:8.2f}u "
            f"{row['median'] / floor:6.2f}"
        )
    paired = results["warm_ratio"]
    ratio, (rows_target, wake_target) = results["ratio"], results["targets"]
    print(
        f"HF handler -> EventBusCallback: {ratio:.2f}x HF's loop (block by block: "
        f"p10 {paired['p10']:.2f}x, p90 {paired['p90']:.2f}x); target <= {TARGET_RATIO}x: "
        f"{'met' if rows_target['met'] else 'NOT met'}"
    )
    pump = "" if burst["pump_wakeups"] is None else f" (its pump: {burst['pump_wakeups']})"
    print(
        f"\nburst: {burst['calls']} calls in {burst['seconds'] * 1e3:.0f} ms = "
        f"{burst['intervals']} poll intervals of {burst['poll_interval'] * 1e3:.0f} ms; "
        f"bus-thread loop woke {burst['loop_wakeups']} times{pump}: "
        f"{burst['wakeups_per_interval']:.2f} per interval; target <= 1: "
        f"{'met' if wake_target['met'] else 'NOT met'}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls: under 15 s")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    gc.collect()
    results = measure(args.quick)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    else:
        print_table(results, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
