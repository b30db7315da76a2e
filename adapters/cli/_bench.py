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

from adapters.report import bench_report
from eventbus import BusOptions, Event, configure_logging
from eventbus.log import LogError, log_timing
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay, UserCallback

from ._bench_figures import BenchResult, Spread
from ._bench_runner import Workload, run_bench, synthetic_events
from ._common import (
    STDOUT,
    CliError,
    as_cli_error,
    check_log_tail,
    check_output,
    given,
    load_object,
    local_log,
    reading_log,
    writing,
)
from ._report import write_page

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
    workload.add_argument("--world-size", type=int, default=None, help="ranks (default 8)")
    workload.add_argument(
        "--rate", type=float, default=None, help="reports per second per rank (default 10)"
    )
    workload.add_argument(
        "--metrics", type=int, default=None, help="metrics per report (default 8)"
    )
    workload.add_argument(
        "--checkpoint-every", type=int, default=None, help="rounds per checkpoint (default 10)"
    )
    workload.add_argument(
        "--failure-rate",
        type=float,
        default=None,
        help="chance that a report comes with a worker failure (default 0)",
    )
    workload.add_argument(
        "--duration", type=float, default=None, help="seconds of simulated run (default 60)"
    )
    workload.add_argument("--events", type=int, default=None, help="number of reports instead")
    workload.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--log",
        type=Path,
        help="drive the bench from a recorded event log (its periods, unless --period)",
    )
    parser.add_argument(
        "--period",
        type=float,
        default=None,
        help="health-check period, seconds (default: the log's, else 2)",
    )
    parser.add_argument(
        "--budget", type=float, default=None, help="share of the period (default 0.05)"
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="deadline per call, seconds (default 30)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=5,
        metavar="N",
        help="take each timing N times, interleaved, for a median and its range (default 5)",
    )
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
        help="plot each callback's share of every period against the budget (log scale)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE.html",
        help="write the figures as one self-contained HTML page (what `eventbus report` "
        "writes for a run)",
    )
    parser.set_defaults(func=_run)


#: The bus's warning, once per period over budget; the bench sums them up once instead.
BUS_BUDGET_WARNING = "callbacks over budget"


def _run(args: argparse.Namespace) -> int:
    outputs = _outputs(args)  # checked now: a missing directory is said before the bench
    # Warnings and errors only: a callback's info lines would repeat at every pass.
    configure_logging("WARNING", quiet=[BUS_BUDGET_WARNING])
    specs = [*args.callbacks, *args.more_callbacks] or ["noop"]
    make_callbacks = _factory(specs)
    if args.plot is not None:
        _require_matplotlib()
    events, start, period = _events(args)
    options = BusOptions.build(None, period=period, **given(args, "budget", "timeout"))
    progress = _progress_bar() if sys.stderr.isatty() else None
    try:
        result = run_bench(
            make_callbacks,
            events,
            options=options,
            start=start,
            repeats=args.repeat,
            progress=progress,
        )
    except ValueError as exc:
        raise as_cli_error(exc) from None
    _write_outputs(args, result, specs, outputs)
    return 0


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    """The files the bench writes, by option, each refused now if it cannot be written
    or is the log the bench reads (by identity: a hard link is the log)."""
    inputs = () if args.log is None else (args.log,)
    outputs = {
        option: path
        for option, path in (("--json", args.json), ("--plot", args.plot), ("--html", args.html))
        if path is not None
    }
    for option, path in outputs.items():
        check_output(path, inputs=inputs, option=option)
    return outputs


#: What each file option writes, as its note on stderr says.
WRITTEN = {"--plot": "plot", "--html": "page"}


def _write_outputs(
    args: argparse.Namespace, result: BenchResult, specs: list[str], outputs: dict[str, Path]
) -> None:
    """Each file, then stdout (the table, or the JSON for ``--json -``). What fails is
    said in one line at the end, after everything else was written: a bench's results
    are never lost to one bad destination."""
    failed: list[str] = []
    inputs = () if args.log is None else (args.log,)
    for option, path in outputs.items():
        if str(path) == "-":
            continue
        try:
            check_output(path, inputs=inputs, option=option)  # again: the bench took a while
            if option == "--json":
                with writing(path):
                    path.write_text(json.dumps(msgspec.to_builtins(result), indent=2) + "\n")
            elif option == "--plot":
                try:
                    _plot(result, path)
                except (OSError, ValueError) as exc:  # ValueError: a format it cannot write
                    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                    raise CliError(f"{path}: cannot write: {reason}") from None
            else:
                write_page(html_page(result, specs), path, inputs=inputs, option=option)
        except CliError as exc:
            failed.append(str(exc))
            continue
        if option in WRITTEN:
            print(f"{WRITTEN[option]} written to {path}", file=sys.stderr)
    as_json = str(outputs.get("--json")) == "-"
    try:
        with writing(STDOUT):
            print(
                json.dumps(msgspec.to_builtins(result), indent=2)
                if as_json
                else format_table(result)
            )
    except CliError as exc:
        failed.append(str(exc))
    warning = over_budget_warning(result)
    if warning:
        print(f"eventbus bench: warning: {warning}", file=sys.stderr)
    if failed:
        raise CliError("; ".join(failed))


def html_page(result: BenchResult, specs: list[str]) -> str:
    """The bench's figures as the report's page: facts, the cost chart, the exact table."""
    runs = f"{result.repeats} run{'s' if result.repeats > 1 else ''}"
    overhead = result.overhead_per_event_ns
    summary = [
        ("callbacks", ", ".join(specs), ""),
        ("events", f"{result.events:,}", ""),
        ("rounds", f"{result.rounds:,}", ""),
        (
            "periods",
            f"{result.periods} of {result.period_s:g} s"
            + (f" + {result.partial_period_s:.3g} s" if result.partial_period_s else ""),
            "",
        ),
        ("budget", f"{result.budget_pct:.1f}% of a period", ""),
        (
            "periods over budget",
            str(result.periods_over_budget),
            "bad" if result.periods_over_budget else "good",
        ),
        ("through the bus", f"{result.bus_ms.median:.1f} ms", ""),
        ("callbacks alone (floor)", f"{result.floor_ms.median:.1f} ms", ""),
        ("runtime per event", f"{overhead.median:.0f} ns", ""),
    ]
    if result.floor_ratio is not None:
        summary.append(("ratio to the floor", f"{result.floor_ratio.median:.1f}x", ""))
    rows = [
        [
            f.name,
            f"{f.calls:,}",
            f"{f.mean_us:.2f}",
            f"{f.p50_us:.2f}",
            f"{f.p99_us:.2f}",
            f"{f.max_us:.2f}",
            f"{f.bus_calls:,}",
            f"{f.bus_total_ms:.3f}",
            f"{f.period_share_mean_pct:.3f}%",
            f"{f.period_share_max_pct:.3f}%",
            str(f.periods_over_budget),
        ]
        for f in sorted(result.callbacks, key=lambda f: -f.bus_total_ms)
    ]
    return bench_report(
        title="Bench: " + ", ".join(specs),
        subtitle=f"{result.events:,} events over {result.timeline_s:.1f} s of run time",
        summary=summary,
        per_period_pct=result.per_period_pct,
        budget_pct=result.budget_pct,
        rows=rows,
        notes=[
            f"Per call: timed directly, without the runtime, over {runs} (exact percentiles).",
            _cost_line(result, runs),
        ],
    )


def _factory(specs: list[str]) -> Callable[[], list[Any]]:
    def make() -> list[Any]:
        return [BUILTINS[s]() if s in BUILTINS else load_object(s) for s in specs]

    make()  # fail early, with the CLI's one-line errors
    return make


def _events(args: argparse.Namespace) -> tuple[list[Event], float | None, float]:
    """The workload, when its first period starts, and the period: a log's own
    (where and how long its recorded bus's periods were), unless ``--period``."""
    if args.log is not None:
        with local_log(args.log) as log:  # read twice: a pipe is copied first
            with reading_log(log) as reader:
                events = list(reader)
            check_log_tail(reader, args.log)
            try:
                timing = log_timing(log)
            except (LogError, OSError) as exc:
                raise CliError(f"{args.log}: {exc}") from None
        period = timing.period or BusOptions().period
        return events, timing.start, args.period if args.period is not None else period
    # The workload's options are named as its fields; those not given keep its defaults.
    workload = Workload(**given(args, *Workload.__struct_fields__))
    period = args.period if args.period is not None else BusOptions().period
    return synthetic_events(workload), None, period


def format_table(result: BenchResult) -> str:
    partial = (
        f" and a partial one of {result.partial_period_s:.3g} s" if result.partial_period_s else ""
    )
    lines = [
        f"{result.events} events, {result.rounds} rounds, {result.periods} periods of "
        f"{result.period_s:g} s{partial} ({result.timeline_s:.1f} s of run time), budget "
        f"{result.budget_pct:.1f}% of a period",
        "",
        f"{'callback':<40} {'calls':>7} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8} "
        f"{'max µs':>9} {'period %':>9} {'worst %':>8} {'over':>5}",
    ]
    for f in sorted(result.callbacks, key=lambda f: f.mean_us * f.calls, reverse=True):
        lines.append(
            f"{f.name[:40]:<40} {f.calls:>7} {f.mean_us:>9.2f} {f.p50_us:>8.2f} "
            f"{f.p99_us:>8.2f} {f.max_us:>9.2f} {f.period_share_mean_pct:>8.3f}% "
            f"{f.period_share_max_pct:>7.3f}% {f.periods_over_budget:>5}"
        )
    runs = f"{result.repeats} run{'s' if result.repeats > 1 else ''}"
    lines += [
        "",
        f"through the bus: {result.bus_ms.median:.1f} ms; the workload alone: "
        f"{result.baseline_ms.median:.1f} ms; callbacks called directly (floor): "
        f"{result.floor_ms.median:.1f} ms (medians of {runs})",
        _cost_line(result, runs),
    ]
    return "\n".join(lines)


def _cost_line(result: BenchResult, runs: str) -> str:
    overhead = result.overhead_per_event_ns
    if overhead.median <= 0:
        return (
            f"the runtime's cost is within the noise of the callbacks' own "
            f"({_range(overhead, '.0f', ' ns')} per event over {runs})"
        )
    adds = (
        f"the runtime adds {overhead.median:.0f} ns per event "
        f"({_range(overhead, '.0f', '')} over {runs})"
    )
    if result.floor_ratio is None:
        return f"{adds}; no ratio to the floor: {result.floor_ratio_note}"
    ratio = result.floor_ratio
    return (
        f"{adds}: {ratio.median:.1f}x the floor ({_range(ratio, '.1f', 'x')}), "
        "the workload's own cost taken out"
    )


def _range(spread: Spread, fmt: str, unit: str) -> str:
    return f"{spread.low:{fmt}}{unit} to {spread.high:{fmt}}{unit}"


def over_budget_warning(result: BenchResult) -> str:
    """One line for the whole bench (the bus warns once per period): which callbacks
    went over budget, in how many periods, and how far at worst."""
    periods = result.periods + (1 if result.partial_period_s else 0)
    over = [
        f"{f.name} in {f.periods_over_budget} of {periods} periods "
        f"(worst {f.period_share_max_pct:.1f}% of a period, budget {f.budget_pct:.1f}%)"
        for f in sorted(result.callbacks, key=lambda f: -f.periods_over_budget)
        if f.periods_over_budget
    ]
    if result.periods_over_budget:
        over.append(
            f"all together over {result.budget_pct:.1f}% in {result.periods_over_budget} "
            f"of {periods} periods"
        )
    return "callbacks over budget: " + "; ".join(over) if over else ""


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
    plot_figure(result).savefig(path, dpi=100)


def plot_figure(result: BenchResult) -> Any:
    """Each callback's share of every period, on a log scale: a callback at 0.01% and
    one at 10% both show (on a linear scale the cheap ones lay flat on zero). A
    period where a callback was not called has no point. A partial last period
    is drawn hollow. A ``matplotlib.figure.Figure``, made without pyplot's state."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), layout="tight")
    ax = fig.add_subplot()
    partial = bool(result.partial_period_s)
    positive = [v for series in result.per_period_pct.values() for v in series if v > 0]
    for name, series in sorted(result.per_period_pct.items()):
        shown = [v if v > 0 else float("nan") for v in series]
        (line,) = ax.plot(range(len(shown)), shown, marker=".", label=name)
        if partial and shown:
            ax.plot(
                [len(shown) - 1], shown[-1:], marker="o", fillstyle="none", color=line.get_color()
            )
    ax.axhline(result.budget_pct, color="red", linestyle="--", label="budget")
    ax.set_yscale("log")
    ax.set_ylim(bottom=min([*positive, result.budget_pct]) / 2)
    last = f" (the last, hollow, is partial: {result.partial_period_s:.3g} s)" if partial else ""
    ax.set_xlabel(f"health-check period of {result.period_s:g} s{last}")
    ax.set_ylabel("share of the period (%, log scale)")
    ax.set_title("Callback time per health-check period")
    ax.legend(fontsize="small")
    return fig
