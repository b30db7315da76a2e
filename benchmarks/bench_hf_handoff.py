"""Trainer-side cost of one Hugging Face ``on_log`` with our adapter attached.

What the training thread pays per ``on_log`` when ``EventBusCallback`` (one
trivial ``UserCallback`` behind it) hands the report to the bus thread,
against HF's own ``CallbackHandler`` calling one trivial ``TrainerCallback``,
measured in the same run. Also shown: the same hand-off done with an anyio
blocking portal (``portal.call(bus.publish_nowait, event)``), which waits for
the bus's loop to answer.

Two patterns. *spaced* (the headline): before each timed call, HF's
included, the bus thread has just handled everything and gone back to
sleep, as after a training step (HF logs every ``logging_steps`` steps);
each call is timed alone. *burst*: calls back to back. With the GIL, a burst
also pays for the bus thread's work (the callbacks' own cost), which in a
real run overlaps the GIL-free parts of torch's work. The target is <= 20 us
per ``on_log`` through HF's handler (spaced median).

    python benchmarks/bench_hf_handoff.py [--calls 2000] [--burst 20000] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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
from _harness import CountRounds  # noqa: E402
from transformers.trainer_callback import (  # noqa: E402
    CallbackHandler,
    TrainerCallback,
    TrainerControl,
    TrainerState,
)

from adapters.transformers import EventBusCallback  # noqa: E402
from eventbus import EventBus, Report  # noqa: E402

TARGET_US = 20.0
LOGS = {"loss": 0.25, "grad_norm": 1.5, "learning_rate": 5e-05, "epoch": 0.5}


class TrivialHF(TrainerCallback):  # type: ignore[misc]  # transformers is untyped to mypy
    def __init__(self) -> None:
        self.calls = 0

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
        self.calls += 1


def handler_for(callback: Any) -> Any:
    return CallbackHandler([callback], None, None, None, None)


def time_spaced(call: Callable[[], Any], settle: Callable[[], Any], n: int) -> list[float]:
    """Seconds per call, each timed alone after ``settle()`` (not timed)."""
    clock = time.perf_counter
    times = []
    for _ in range(n):
        settle()
        t0 = clock()
        call()
        times.append(clock() - t0)
    return times


def time_burst(call: Callable[[], Any], n: int) -> float:
    """Mean seconds per call over ``n`` calls back to back."""
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "median_us": statistics.median(ordered) * 1e6,
        "p90_us": ordered[int(0.9 * (len(ordered) - 1))] * 1e6,
        "mean_us": statistics.fmean(ordered) * 1e6,
    }


def measure(calls: int, burst: int) -> dict[str, Any]:
    output = tempfile.mkdtemp(prefix="bench_hf_handoff_")
    args = transformers.TrainingArguments(output_dir=output, use_cpu=True, report_to="none")
    state, control = TrainerState(max_steps=1), TrainerControl()
    results: dict[str, Any] = {}

    # Ours: EventBusCallback with one trivial UserCallback behind it.
    trivial = CountRounds()
    ours = EventBusCallback([trivial], state=False)
    ours.on_train_begin(args, state, control)
    ours_handler = handler_for(ours)
    # Every spaced call, HF's included, follows the same settle: the bus thread has
    # just handled everything and gone back to sleep (as after a training step).
    settle = ours.wait_idle

    # HF's own loop with one trivial callback: the floor.
    hf = handler_for(TrivialHF())

    def hf_call() -> None:
        hf.on_log(args, state, control, dict(LOGS))

    def ours_direct() -> None:
        ours.on_log(args, state, control, logs=dict(LOGS))

    def ours_via_hf() -> None:
        ours_handler.on_log(args, state, control, dict(LOGS))

    results["hf_callback_handler"] = summary(time_spaced(hf_call, settle, calls))
    results["ours_direct"] = summary(time_spaced(ours_direct, settle, calls))
    results["ours_via_hf"] = summary(time_spaced(ours_via_hf, settle, calls))
    results["hf_callback_handler"]["burst_us"] = time_burst(hf_call, burst) * 1e6
    results["ours_via_hf"]["burst_us"] = time_burst(ours_via_hf, burst) * 1e6
    ours.on_train_end(args, state, control)
    handed = 2 * calls + burst
    results["delivered"] = {"handed_off": handed, "rounds": trivial.rounds, "dropped": ours.dropped}

    # The portal alternative: each hand-off waits for the bus's loop to run it and reply.
    with (
        anyio.from_thread.start_blocking_portal() as portal,
        portal.wrap_async_context_manager(EventBus()) as bus,
    ):
        bus.subscribe(Report, lambda e: None)

        def portal_call() -> None:
            event = Report(run_id="bench", rank=0, world_size=1, index=0, metrics=dict(LOGS))
            portal.call(bus.publish_nowait, event)

        def portal_settle() -> None:
            portal.call(bus.wait_idle)

        results["portal_call"] = summary(time_spaced(portal_call, portal_settle, calls))
    floor = results["hf_callback_handler"]["median_us"]
    for name in ("ours_direct", "ours_via_hf", "portal_call"):
        results[name]["ratio_to_hf"] = results[name]["median_us"] / floor
    results["target_us"] = TARGET_US
    results["meets_target"] = results["ours_via_hf"]["median_us"] <= TARGET_US
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="spaced calls timed one by one")
    parser.add_argument("--burst", type=int, default=20000, help="calls back to back")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    gc.collect()
    results = measure(args.calls, args.burst)
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print(f"one on_log, trainer side (spaced: {args.calls} calls; burst: {args.burst} calls)")
    print(f"{'':34} {'median':>9} {'p90':>9} {'mean':>9} {'burst':>9} {'x HF':>6}")
    rows = (
        ("HF CallbackHandler, 1 callback", "hf_callback_handler"),
        ("EventBusCallback.on_log", "ours_direct"),
        ("HF handler -> EventBusCallback", "ours_via_hf"),
        ("portal.call(bus.publish_nowait)", "portal_call"),
    )
    for label, key in rows:
        row = results[key]
        burst = f"{row['burst_us']:8.2f}u" if "burst_us" in row else " " * 9
        ratio = f"{row['ratio_to_hf']:6.1f}" if "ratio_to_hf" in row else f"{1.0:6.1f}"
        print(
            f"{label:34} {row['median_us']:8.2f}u {row['p90_us']:8.2f}u "
            f"{row['mean_us']:8.2f}u {burst} {ratio}"
        )
    delivered = results["delivered"]
    print(
        f"delivered {delivered['rounds']}/{delivered['handed_off']} rounds, "
        f"dropped {delivered['dropped']}; target <= {TARGET_US:.0f} us: "
        f"{'met' if results['meets_target'] else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
