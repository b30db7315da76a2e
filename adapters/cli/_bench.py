"""``eventbus bench``: what a stack of callbacks costs per health-check period."""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any

import msgspec
import structlog

from adapters.report._page import Chart, Document, facts, table
from adapters.report._series import SeriesGroup
from eventbus import BusOptions, Event, configure_logging
from eventbus._subscription import OverBudgetPolicy
from eventbus.log import LogError
from eventbus.log._replay import log_timing
from handlers import BestCheckpoints, EarlyStopping, MetricsLogger, ProgressDisplay, UserCallback

from ._bench_runner import (
    DEFAULT_METRICS,
    BenchResult,
    CallbackFigures,
    Spread,
    Workload,
    report_metrics,
    run_bench,
    state_spans,
    states_text,
    synthetic_events,
)
from ._common import (
    STDOUT,
    CliError,
    as_cli_error,
    cannot_write,
    check_log_tail,
    check_output,
    flag,
    given,
    load_object,
    local_log,
    reading_log,
    writing,
)
from ._report import write_page


class NoOp(UserCallback):
    """A callback that does nothing: the runtime's own overhead, alone."""

    def after_report(self, run_context: Any, metrics: Any, checkpoint: Any) -> None:
        pass


class NoOpHandler:
    """A plain bus handler that does nothing: the bus's dispatch alone, no gathering."""

    def __call__(self, event: Event) -> None:
        pass


#: The built-in callbacks, each made given the metric the watching ones watch.
BUILTINS: dict[str, Callable[[str], Any]] = {
    "noop": lambda metric: NoOp(),
    "noop-handler": lambda metric: NoOpHandler(),
    "early-stopping": lambda metric: EarlyStopping(metric=metric, patience=5),
    "best-checkpoints": lambda metric: BestCheckpoints(metric=metric, k=3),
    # A logger that formats and writes nothing: a bench measures the callback, not the terminal.
    "metrics-logger": lambda metric: MetricsLogger(logger=structlog.ReturnLogger()),
    "progress": lambda metric: ProgressDisplay(stream=io.StringIO(), tty=False),
}
#: The built-ins that watch one metric (``--metric``).
WATCHING = ("early-stopping", "best-checkpoints")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark callbacks' overhead per health-check period",
        description="Drive a synthetic workload (or a recorded log) through a real bus with the "
        "callbacks attached: what each costs per call and per health-check period, against "
        "its budget and against a plain loop.",
        epilog="docs: docs/guides/benchmarking.md",
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
    workload.add_argument("--world-size", type=int, help="ranks (default 8)")
    workload.add_argument("--rate", type=float, help="reports per second per rank (default 10)")
    workload.add_argument(
        "--metrics",
        type=metrics_option,
        metavar="N|NAMES",
        help="what each report carries: names, comma-separated (--metrics loss,accuracy), "
        f"or how many (the first N of the default names, then metric_{len(DEFAULT_METRICS)}, "
        f"...); each a random number (default: {', '.join(DEFAULT_METRICS)})",
    )
    workload.add_argument("--checkpoint-every", type=int, help="rounds per checkpoint (default 10)")
    workload.add_argument(
        "--failure-rate",
        type=float,
        help="chance that a report comes with a worker failure (default 0)",
    )
    workload.add_argument("--duration", type=float, help="seconds of simulated run (default 60)")
    workload.add_argument("--events", type=int, help="number of reports instead")
    workload.add_argument("--seed", type=int)
    parser.add_argument(
        "--log",
        type=Path,
        help="drive the bench from a recorded event log (its periods, unless --period, and "
        "its reports' metrics; the synthetic workload's options are refused with it)",
    )
    parser.add_argument(
        "--metric",
        metavar="NAME",
        help=f"the metric {' and '.join(WATCHING)} watch (default: loss if the reports "
        "carry it, else their first metric)",
    )
    parser.add_argument(
        "--period",
        type=float,
        help="health-check period, seconds (default: the log's, else 2)",
    )
    parser.add_argument("--budget", type=float, help="share of the period (default 0.05)")
    parser.add_argument("--timeout", type=float, help="deadline per call, seconds (default 30)")
    parser.add_argument(
        "--over-budget",
        action="append",
        default=[],
        metavar="[NAME=]POLICY",
        help="warn, coalesce or disable a callback over budget: POLICY for every callback, "
        "NAME=POLICY for one (as given, or its class name; repeatable; default: its own)",
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
        help="write the figures as one self-contained HTML page",
    )
    parser.set_defaults(func=_run)


def metrics_option(text: str) -> int | tuple[str, ...]:
    """``--metrics``: a whole number (how many), else names, comma-separated, each
    stripped of spaces; ``Workload`` checks either (one line naming the flag)."""
    try:
        return int(text)
    except ValueError:
        return tuple(name.strip() for name in text.split(","))


#: The bus's warning, once per period over budget; the bench sums them up once instead.
BUS_BUDGET_WARNING = "callbacks over budget"
#: The bus's warnings the bench says once itself, in the table.
BUS_FAULT_WARNINGS = ("handler failed", "handler state changed")


def _run(args: argparse.Namespace) -> int:
    outputs = _outputs(args)  # checked now: a missing directory is said before the bench

    configure_logging("WARNING", quiet=[BUS_BUDGET_WARNING, *BUS_FAULT_WARNINGS])
    specs = [*args.callbacks, *args.more_callbacks] or ["noop"]
    workload = _workload(args)  # checked before any callback is imported
    if args.metric is not None and not args.metric.strip():
        raise CliError(f"--metric must name a metric, got {args.metric!r}")
    chosen = args.metric.strip() if args.metric is not None else None
    for spec in specs:  # each loaded once now: a typo is said before the workload is built
        if spec not in BUILTINS:
            load_object(spec)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'train-eventbus[plot]'") from None
    events, start, period = _events(args, workload)
    metrics = workload.metric_names if workload is not None else report_metrics(events)
    metric, note = builtin_metric(specs, chosen, metrics, source="the log" if args.log else "")

    def make_callbacks() -> list[Any]:  # fresh ones for each pass
        return [BUILTINS[s](metric) if s in BUILTINS else load_object(s) for s in specs]

    policies = over_budget_policies(args.over_budget, specs, make_callbacks())
    progress = _show_progress if sys.stderr.isatty() else None
    try:
        result = run_bench(
            make_callbacks,
            events,
            period=period,
            **given(args, "budget", "timeout"),
            start=start,
            repeats=args.repeat,
            progress=progress,
            over_budget=policies,
        )
    except ValueError as exc:
        raise as_cli_error(exc) from None
    watched = metric if any(spec in WATCHING for spec in specs) else ""
    notes = (*result.notes, note) if note else result.notes
    result = msgspec.structs.replace(result, builtins_metric=watched, notes=notes)
    _write_outputs(args, result, specs, outputs)
    if not any(f.calls for f in result.callbacks):
        print(
            "eventbus bench: error: nothing measured: no callback was called by this workload "
            "(the bench times before_run, after_report and after_exception, which needs worker "
            "failures: --failure-rate)",
            file=sys.stderr,
        )
        return 1
    return 0


POLICIES: tuple[OverBudgetPolicy, ...] = ("warn", "coalesce", "disable")


def over_budget_policies(
    given: list[str], specs: list[str], callbacks: list[Any]
) -> list[OverBudgetPolicy | None]:
    """``--over-budget``, per callback: the policy given for it by name, else the one given
    for all, else ``None`` (its own). A bad one is one line naming it."""
    named: dict[str, OverBudgetPolicy] = {}  # "" for every callback
    for text in given:
        name, is_named, word = (part.strip() for part in text.rpartition("="))
        policy = next((p for p in POLICIES if p == word), None)
        if policy is None:
            raise CliError(
                f"--over-budget {text!r}: {word!r} is not a policy (warn, coalesce or disable)"
            )
        if is_named and not name:
            raise CliError(f"--over-budget {text!r}: no callback named before '='")
        before = named.setdefault(name, policy)
        if before != policy:
            whose = f"{name!r}" if is_named else "every callback"
            raise CliError(f"--over-budget gives {whose} two policies: {before} and {policy}")
    for_all = named.pop("", None)
    names = [
        {spec, spec.rpartition(":")[2], type(cb).__name__}
        for spec, cb in zip(specs, callbacks, strict=True)
    ]
    unknown = [name for name in named if not any(name in known for known in names)]
    if unknown:
        benched = ", ".join(dict.fromkeys(specs))
        raise CliError(
            f"--over-budget: no benched callback is named {unknown[0]!r} (benched: {benched}; "
            "a callback is named as given, or by its class name)"
        )
    return [next((named[name] for name in named if name in known), for_all) for known in names]


def _workload(args: argparse.Namespace) -> Workload | None:
    """The synthetic workload the options say, or ``None`` with ``--log`` (a workload
    option with it is refused, not ignored)."""
    names = Workload.__struct_fields__
    if args.log is not None:
        shaping = [flag(name) for name in given(args, *names)]
        if shaping:
            raise CliError(
                f"{', '.join(shaping)}: not with --log (they shape the synthetic workload; "
                "the log's events are the workload)"
            )
        return None
    return Workload(**given(args, *names))


def builtin_metric(
    specs: list[str], chosen: str | None, metrics: tuple[str, ...], *, source: str = ""
) -> tuple[str, str]:
    """The metric the watching built-ins watch (``chosen``, else ``loss``, else the first),
    and one line when the reports do not carry it or no built-in watches it."""
    metric = chosen or ("loss" if "loss" in metrics or not metrics else metrics[0])
    watching = [spec for spec in dict.fromkeys(specs) if spec in WATCHING]
    if not watching:
        if chosen is None:
            return metric, ""
        return metric, (
            f"--metric is for the built-ins {' and '.join(WATCHING)}, and neither is benched: "
            "ignored"
        )
    if metric in metrics:
        return metric, ""
    whose = f"{source}'s reports" if source else "the workload's reports"
    carried = ", ".join(metrics[:8]) + (", ..." if len(metrics) > 8 else "")
    carry = f"they carry {carried}" if metrics else "they carry no metrics"
    them = " and ".join(watching)
    watch, their = ("watches", "its") if len(watching) == 1 else ("watch", "their")
    return metric, (
        f"{them} {watch} {metric!r}, which {whose} do not carry ({carry}): what is timed is "
        f"{their} path for a round without it, not what a run would do (--metric NAME "
        "picks another)"
    )


def _outputs(args: argparse.Namespace) -> dict[str, Path]:
    """The files the bench writes, by option, each refused now if it cannot be written
    or is the log read."""
    inputs = () if args.log is None else (args.log,)
    outputs = {
        option: path
        for option, path in (("--json", args.json), ("--plot", args.plot), ("--html", args.html))
        if path is not None
    }
    for option, path in outputs.items():
        check_output(path, inputs=inputs, option=option)
    return outputs


WRITTEN = {"--plot": "plot", "--html": "page"}


def _write_outputs(
    args: argparse.Namespace, result: BenchResult, specs: list[str], outputs: dict[str, Path]
) -> None:
    """Each file, then stdout; a failure is said at the end, after everything else was
    written, so results are never lost to one bad destination."""
    failed: list[str] = []
    inputs = () if args.log is None else (args.log,)
    as_json = json.dumps(msgspec.to_builtins(result), indent=2)
    for option, path in outputs.items():
        if str(path) == "-":
            continue
        try:
            check_output(path, inputs=inputs, option=option)  # again: the bench took a while
            if option == "--plot":
                try:
                    plot_figure(result).savefig(path, dpi=100)
                except (OSError, ValueError) as exc:  # ValueError: a format it cannot write
                    raise cannot_write(path, exc) from None
            else:  # whole or not at all
                text = as_json + "\n" if option == "--json" else html_page(result, specs)
                write_page(text, path, inputs=inputs, option=option)
        except CliError as exc:
            failed.append(str(exc))
            continue
        if option in WRITTEN:
            print(f"{WRITTEN[option]} written to {path}", file=sys.stderr)
    try:
        with writing(STDOUT):
            print(as_json if str(outputs.get("--json")) == "-" else format_table(result))
    except CliError as exc:
        failed.append(str(exc))
    for note in result.notes:
        print(f"eventbus bench: note: {note}", file=sys.stderr)
    warning = over_budget_warning(result)
    if warning:
        print(f"eventbus bench: warning: {warning}", file=sys.stderr)
    if failed:
        raise CliError("; ".join(failed))


def html_page(result: BenchResult, specs: list[str]) -> str:
    """The bench's figures as the report's page: facts, the cost chart, the exact table."""
    runs = f"{result.repeats} run{'s' if result.repeats > 1 else ''}"
    overhead = result.overhead_per_event_ns
    periods = all_periods(result)
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
        (
            "runtime per event",
            "not measured" if result.overhead_note else f"{overhead.median:.0f} ns",
            "",
        ),
    ]
    if result.metrics:
        summary.insert(1, ("metrics", carried_metrics(result.metrics), ""))
    faults = sum(f.faults for f in result.callbacks)
    if faults:
        summary.append(("callback faults", f"{faults:,}", "bad"))
    if result.floor_ratio is not None:
        summary.append(("ratio to the floor", f"{result.floor_ratio.median:.1f}x", ""))
    rows = [
        [cell(f, periods) for _, cell in PAGE_COLUMNS]
        for f in sorted(result.callbacks, key=lambda f: -f.bus_total_ms)
    ]
    # The bench times every call, so its table has exact percentiles (a log keeps only
    # each period's figures: the run report's are of each period's mean call).
    group = SeriesGroup()
    for name, shares in result.per_period_pct.items():
        index = group.series(name)
        for period, share in enumerate(shares):
            group.add(index, period, share)
    chart = Chart.of_shares(
        "chart-cost",
        "Each callback's share of every period",
        "log scale; the dashed line is the budget",
    )
    lines = group.lines()
    chart.x = lines.x
    for label, column in zip(lines.names, lines.columns, strict=True):
        chart.line(label, column)  # each its own colour, in turn
    chart.budget(result.budget_pct)
    for f in result.callbacks:  # shaded as the run report shades them
        for start, end, change in state_spans(f, periods):
            chart.span(start, end, change.state, f"{f.name} {change.state}: {change.reason}")
    notes = [
        f"Per call: timed directly, without the runtime, over {runs} (exact percentiles).",
        *callback_notes(result),
        *result.notes,
        _cost_line(result, runs),
    ]
    document = Document(
        "Bench: " + ", ".join(specs),
        f"{result.events:,} events over {result.timeline_s:.1f} s of run time",
    )
    document.section(
        "summary",
        "Summary",
        facts(summary) + "".join(f'<p class="note">{escape(note)}</p>' for note in notes),
    )
    headers = [header for header, _ in PAGE_COLUMNS]
    numeric = range(1, headers.index("over budget policy"))
    document.section(
        "cost", "Callback cost", document.add_chart(chart) + table(headers, rows, numeric=numeric)
    )
    return document.render()


#: The page's table: each column's header and its cell for a callback of ``periods``.
PAGE_COLUMNS: list[tuple[str, Callable[[CallbackFigures, int], str]]] = [
    ("callback", lambda f, periods: f.name),
    ("calls", lambda f, periods: f"{f.calls:,}"),
    ("mean µs", lambda f, periods: f"{f.mean_us:.2f}"),
    ("p50 µs", lambda f, periods: f"{f.p50_us:.2f}"),
    ("p99 µs", lambda f, periods: f"{f.p99_us:.2f}"),
    ("max µs", lambda f, periods: f"{f.max_us:.2f}"),
    ("bus calls", lambda f, periods: f"{f.bus_calls:,}"),
    ("bus total ms", lambda f, periods: f"{f.bus_total_ms:.3f}"),
    ("share of run", lambda f, periods: f"{f.period_share_mean_pct:.3f}%"),
    ("worst period", lambda f, periods: f"{f.period_share_max_pct:.3f}%"),
    ("periods over budget", lambda f, periods: str(f.periods_over_budget)),
    ("bus skipped", lambda f, periods: f"{f.bus_skipped:,}"),
    ("over budget policy", lambda f, periods: f.over_budget),
    ("disabled or coalescing", lambda f, periods: states_text(f, periods) or "-"),
]


def _events(
    args: argparse.Namespace, workload: Workload | None
) -> tuple[list[Event], float | None, float]:
    """The workload's events, when its first period starts, and the period (a log's own,
    unless ``--period``)."""
    if workload is None:
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
    ]
    if result.metrics:
        lines.append(carried_metrics(result.metrics))
    if result.builtins_metric:
        lines.append(f"the built-ins watch {result.builtins_metric!r} (--metric NAME)")
    # Faults and policy columns only when they say something.
    faulted = any(f.faults for f in result.callbacks)
    policed = any(f.over_budget != "warn" for f in result.callbacks)
    lines += [
        "",
        f"{'callback':<40} {'calls':>7} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8} "
        f"{'max µs':>9} {'period %':>9} {'worst %':>8} {'over':>5}"
        + (f" {'faults':>7}" if faulted else "")
        + (" policy" if policed else ""),
    ]
    for f in sorted(result.callbacks, key=lambda f: f.mean_us * f.calls, reverse=True):
        lines.append(
            f"{f.name[:40]:<40} {f.calls:>7} {f.mean_us:>9.2f} {f.p50_us:>8.2f} "
            f"{f.p99_us:>8.2f} {f.max_us:>9.2f} {f.period_share_mean_pct:>8.3f}% "
            f"{f.period_share_max_pct:>7.3f}% {f.periods_over_budget:>5}"
            + (f" {f.faults:>7}" if faulted else "")
            + (f" {f.over_budget}" if policed else "")
        )
    said = callback_notes(result)
    if said:
        lines += ["", *said]
    runs = f"{result.repeats} run{'s' if result.repeats > 1 else ''}"
    lines += [
        "",
        f"through the bus: {result.bus_ms.median:.1f} ms; the workload alone: "
        f"{result.baseline_ms.median:.1f} ms; callbacks called directly (floor): "
        f"{result.floor_ms.median:.1f} ms (medians of {runs})",
        _cost_line(result, runs),
    ]
    return "\n".join(lines)


METRICS_SHOWN = 8


def carried_metrics(metrics: tuple[str, ...]) -> str:
    """One line: what each report carries, as ``--metrics`` would name it."""
    shown = ", ".join(metrics[:METRICS_SHOWN])
    more = f", ... ({len(metrics)} in all)" if len(metrics) > METRICS_SHOWN else ""
    count = f"{len(metrics)} metric{'s' if len(metrics) != 1 else ''}"
    return f"reports carry {count}: {shown}{more}"


def callback_notes(result: BenchResult) -> list[str]:
    """One line per callback that raised or that the bus did not give every call."""
    lines = []
    periods = all_periods(result)
    for f in result.callbacks:
        if f.faults:
            lines.append(
                f"{f.name}: {f.faults:,} of {f.calls:,} calls raised; first: {f.first_error}"
                + _missing_metric_hint(f, result.metrics)
            )
        if f.bus_note:
            lines.append(
                f"{f.name}: through the bus, {f.bus_calls:,} calls ({f.bus_note}); its "
                f"per-call figures are of all {f.calls:,}, called directly"
            )
        states = states_text(f, periods)
        if states:
            lines.append(
                f"{f.name} (over_budget={f.over_budget}): {states} (periods 0 to "
                f"{periods - 1}); {f.bus_skipped:,} of {f.calls:,} deliveries skipped"
            )
    return lines


def all_periods(result: BenchResult) -> int:
    """The bench's periods, a partial last one included."""
    return result.periods + (1 if result.partial_period_s else 0)


def _missing_metric_hint(figures: CallbackFigures, metrics: tuple[str, ...]) -> str:
    """For a ``KeyError`` on a metric the reports do not carry: how to make them."""
    prefix = "KeyError: "
    if not figures.first_error.startswith(prefix):
        return ""
    try:
        key = ast.literal_eval(figures.first_error[len(prefix) :])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ""
    if not isinstance(key, str) or key in metrics:
        return ""
    return f" ({key!r} is not among the reports' metrics: --metrics names them)"


def _cost_line(result: BenchResult, runs: str) -> str:
    if result.overhead_note:
        return f"the runtime's cost per event: {result.overhead_note}"
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
    """One line for the whole bench: which callbacks went over budget, how often, how far."""
    periods = all_periods(result)
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


def _show_progress(fraction: float) -> None:
    filled = int(fraction * 30)
    bar = f"\r[{'#' * filled}{'.' * (30 - filled)}] {fraction:4.0%}"
    print(bar, end="\n" if fraction >= 1.0 else "", file=sys.stderr, flush=True)


def plot_figure(result: BenchResult) -> Any:
    """Each callback's share of every period, on a log scale so cheap ones show; a partial
    last period hollow. A ``matplotlib.figure.Figure``, made without pyplot's state."""
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
