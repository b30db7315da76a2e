"""``eventbus bench``: what a stack of callbacks costs per health-check period."""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from eventbus import Event
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay, UserCallback

from ._bench_runner import BenchResult, Workload, run_bench, synthetic_events
from ._common import CliError, check_log_tail, load_object, reading_log

__all__ = ["register"]


class NoOp(UserCallback):
    """A callback that does nothing: the runtime's own overhead, alone."""

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        pass


class NoOpHandler:
    """A plain bus handler that does nothing: the bus's dispatch alone, no gathering."""

    def __call__(self, event: Event) -> None:
        pass


BUILTINS: dict[str, Callable[[], Any]] = {
    "noop": NoOp,
    "noop-handler": NoOpHandler,
    "early-stopping": lambda: EarlyStopping(metric="metric_0", patience=5),
    "best-checkpoints": lambda: BestCheckpoints(metric="metric_0", k=3),
    "metrics-logger": lambda: MetricsLogger(logger=_SilentLogger()),
    "progress": lambda: ProgressDisplay(stream=io.StringIO(), tty=False),
}


class _SilentLogger:
    """Formats nothing: a bench measures the callback, not the terminal."""

    def info(self, event: str, **fields: Any) -> None:
        pass


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark callbacks' overhead per health-check period",
        description=(
            "Drive a synthetic workload (or a recorded log) through a real bus with the "
            "callbacks attached, and report what each callback costs per call and per "
            "health-check period, against its budget and against a plain loop."
        ),
    )
    parser.add_argument(
        "callbacks",
        nargs="*",
        metavar="CALLBACK",
        help=f"package.module:ClassOrFactory, or a built-in: {', '.join(BUILTINS)}",
    )
    parser.add_argument(
        "--callback",
        "-c",
        action="append",
        default=[],
        dest="more_callbacks",
        metavar="CALLBACK",
        help="another callback (repeatable)",
    )
    workload = parser.add_argument_group("synthetic workload")
    workload.add_argument("--world-size", type=int, default=8)
    workload.add_argument("--rate", type=float, default=10.0, help="reports per second per rank")
    workload.add_argument("--metrics", type=int, default=8, help="metrics per report")
    workload.add_argument("--checkpoint-every", type=int, default=10, help="rounds per checkpoint")
    workload.add_argument(
        "--failure-rate",
        type=float,
        default=0.0,
        help="chance that a report comes with a worker failure",
    )
    workload.add_argument(
        "--duration", type=float, default=60.0, help="seconds of (simulated) run time"
    )
    workload.add_argument("--events", type=int, default=None, help="number of reports instead")
    workload.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", type=Path, help="drive the bench from a recorded event log")
    parser.add_argument("--period", type=float, default=2.0, help="health-check period, seconds")
    parser.add_argument("--budget", type=float, default=0.05, help="share of the period")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the figures as JSON to FILE ('-' for stdout)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="plot per-period time per callback against the budget",
    )
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    specs = [*args.callbacks, *args.more_callbacks] or ["noop"]
    make_callbacks = _factory(specs)
    if args.plot is not None:
        _require_matplotlib()
    events = _events(args)
    progress = _progress_bar() if sys.stderr.isatty() else None
    try:
        result = run_bench(
            make_callbacks, events, period=args.period, budget=args.budget, progress=progress
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.json is not None:
        payload = json.dumps(msgspec.to_builtins(result), indent=2)
        if str(args.json) == "-":
            print(payload)
        else:
            args.json.write_text(payload + "\n")
    if args.json is None or str(args.json) != "-":
        print(format_table(result))
    if args.plot is not None:
        _plot(result, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _factory(specs: list[str]) -> Callable[[], list[Any]]:
    def make() -> list[Any]:
        return [BUILTINS[s]() if s in BUILTINS else load_object(s) for s in specs]

    make()  # fail early, with the CLI's one-line errors
    return make


def _events(args: argparse.Namespace) -> list[Event]:
    if args.log is not None:
        with reading_log(args.log) as reader:
            events = list(reader)
        check_log_tail(reader)
        return events
    # The workload's options are named as its fields.
    workload = Workload(**{name: getattr(args, name) for name in Workload.__struct_fields__})
    try:
        return synthetic_events(workload)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def format_table(result: BenchResult) -> str:
    us = 1e6
    lines = [
        f"{result.events} events, {result.rounds} rounds, {result.periods} periods of "
        f"{result.period:g} s ({result.timeline:.1f} s of run time), budget "
        f"{result.budget:.1%} of a period",
        "",
        f"{'callback':<40} {'calls':>7} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8} "
        f"{'max µs':>9} {'period %':>9} {'worst %':>8} {'over':>5}",
    ]
    for f in sorted(result.callbacks, key=lambda f: f.mean * f.calls, reverse=True):
        lines.append(
            f"{f.name[:40]:<40} {f.calls:>7} {f.mean * us:>9.2f} {f.p50 * us:>8.2f} "
            f"{f.p99 * us:>8.2f} {f.max * us:>9.2f} {f.period_share_mean:>8.3%} "
            f"{f.period_share_max:>7.3%} {f.periods_over_budget:>5}"
        )
    lines += [
        "",
        f"through the bus: {result.bus_seconds * 1e3:.1f} ms; the workload alone: "
        f"{result.baseline_seconds * 1e3:.1f} ms; callbacks called directly (floor): "
        f"{result.floor_seconds * 1e3:.1f} ms",
        (
            f"the runtime adds {result.overhead_per_event * 1e9:.0f} ns per event "
            f"({result.ratio:.1f}x the floor, the workload's own cost taken out)"
            if result.overhead_per_event > 0
            else "the runtime's cost is within the noise of the callbacks' own"
        ),
    ]
    return "\n".join(lines)


def _progress_bar() -> Callable[[float], None]:
    def show(fraction: float) -> None:
        filled = int(fraction * 30)
        end = "\n" if fraction >= 1.0 else ""
        print(
            f"\r[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}",
            end=end,
            file=sys.stderr,
            flush=True,
        )

    return show


def _require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CliError("--plot needs matplotlib: pip install 'train-eventbus[plot]'") from None


def _plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, series in sorted(result.per_period.items()):
        ax.plot(range(len(series)), [v * 100 for v in series], marker=".", label=name)
    ax.axhline(result.budget * 100, color="red", linestyle="--", label="budget")
    ax.set_xlabel("health-check period")
    ax.set_ylabel("share of the period (%)")
    ax.set_title("Callback time per health-check period")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
