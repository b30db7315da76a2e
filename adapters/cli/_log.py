"""``eventbus show | replay | convert | stats``. A user's bad file is one line naming it,
exit 2; an output that cannot be written is the output's error, never the log's. Events a
resume rolled back: ``show`` marks them, ``stats`` counts them, ``replay`` leaves them out."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import msgspec

from eventbus import (
    BudgetReport,
    BusOptions,
    Event,
    EventBus,
    EventFilter,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    Report,
    WorkerFailure,
)
from eventbus._codec import encode_json
from eventbus._events import CallbackCost
from eventbus._options import OptionTypeError, WaitSeconds
from eventbus.log import LogError, LogReader, LogRecorder, ReplaySummary, replay_file
from eventbus.log._history import Rollbacks, rollbacks
from eventbus.log._replay import Speed
from eventbus.options import OptionError, checked
from handlers._attach import attach_user_callbacks

from ._common import (
    STDOUT,
    CliError,
    as_cli_error,
    cannot_write,
    check_log_tail,
    check_output,
    given,
    is_training_callback,
    load_object,
    local_log,
    reading_log,
    write_to,
    writing,
)

_SUMMARY_WIDTH = 80
_COMMON_FIELDS = frozenset({"seq", "time", "rank", "type"})
_ROLLED_BACK_JSON = b',"rolled_back":true}'


def register(subparsers: Any) -> None:
    show = subparsers.add_parser(
        "show",
        help="print the events of a log",
        description="Print the events of a log.",
        epilog="docs: docs/operations/cli.md#show",
    )
    show.add_argument("log", type=Path, help="event log (.evlog msgpack or .jsonl)")
    show.add_argument("--json", action="store_true", help="one JSON object per line")
    show.add_argument("--limit", type=_count, metavar="N", help="print at most N events")
    _add_filters(show)
    show.set_defaults(func=_show)

    replay = subparsers.add_parser(
        "replay",
        help="replay a log against callbacks",
        description="Replay a log into a fresh bus against callbacks, and print what each one "
        "cost; exit code 1 if any failed or timed out.",
        epilog="docs: docs/operations/cli.md#replay",
    )
    replay.add_argument("log", type=Path, help="event log (.evlog msgpack or .jsonl)")
    replay.add_argument(
        "--callbacks",
        nargs="+",
        default=[],
        metavar="MODULE:NAME",
        help="handler callables (every event) or training callbacks; classes and "
        "zero-argument factories are called first",
    )
    replay.add_argument("--speed", type=float, help="real time at this pace (1 = as recorded)")
    replay.add_argument("--period", type=float, help="health-check period (s)")
    replay.add_argument("--timeout", type=float, help="deadline per call, seconds (default 30)")
    replay.add_argument(
        "--cost",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="charge each call of handler NAME (EarlyStopping.after_report) SECONDS of "
        "virtual time, to see what its budget policy does (repeatable)",
    )
    _add_filters(replay)
    replay.set_defaults(func=_replay)

    convert = subparsers.add_parser(
        "convert",
        help="convert a log between msgpack and JSON Lines",
        description="Convert a log; the output encoding follows its extension (.jsonl) or --to.",
        epilog="docs: docs/operations/cli.md#convert",
    )
    convert.add_argument("input", type=Path)
    convert.add_argument("output", type=Path)
    convert.add_argument("--to", choices=("msgpack", "jsonl"))
    convert.add_argument(
        "--skip-corrupt", action="store_true", help="leave corrupt records out (counted)"
    )
    convert.set_defaults(func=_convert)

    stats = subparsers.add_parser(
        "stats",
        help="counts, time span, rounds and failures of a log",
        epilog="docs: docs/operations/cli.md#stats",
    )
    stats.add_argument("log", type=Path)
    stats.add_argument("--json", action="store_true", help="print one JSON object")
    stats.add_argument("--skip-corrupt", action="store_true", help="count corrupt records")
    stats.set_defaults(func=_stats)


def _count(text: str) -> int:
    """A count of events: a whole number, 0 or more (argparse says so in one line)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, got {text!r}")
    return value


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", action="append", default=[], help="event type (repeatable)")
    parser.add_argument("--rank", action="append", type=int, default=[], help="rank (repeatable)")
    parser.add_argument("--from-seq", type=int, help="first sequence number")
    parser.add_argument("--to-seq", type=int, help="last sequence number")
    parser.add_argument(
        "--skip-corrupt", action="store_true", help="skip corrupt records (counted)"
    )


def _filter(args: argparse.Namespace) -> EventFilter:
    try:
        return EventFilter.of(
            types=args.type, ranks=args.rank, from_seq=args.from_seq, to_seq=args.to_seq
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None


# --- show ----------------------------------------------------------------------------------


def _summary(event: Event) -> str:
    """``field=value`` of the fields that say what happened, cut to one line."""
    parts = []
    # The names alone: ``msgspec.structs.fields`` is slow (docs/operations/cli.md#show).
    for name in event.__struct_fields__:
        if name in _COMMON_FIELDS:
            continue
        value = getattr(event, name)
        if value in (None, "", (), {}) or name == "traceback":
            continue
        text = value if isinstance(value, str) else _json_value(value)
        parts.append(f"{name}={text}")
    line = " ".join(parts).replace("\n", " ")
    return line if len(line) <= _SUMMARY_WIDTH else line[: _SUMMARY_WIDTH - 1] + "…"


_summary_json = json.JSONEncoder(ensure_ascii=False, allow_nan=True, separators=(",", ":"))


def _json_value(value: object) -> str:
    """A field as JSON, NaN and ±inf as in JSON Lines logs (``NaN``, ``Infinity``)."""
    try:
        return _summary_json.encode(msgspec.to_builtins(value, str_keys=True))
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _show(args: argparse.Namespace) -> int:
    keep = _filter(args)
    shown = 0
    write = functools.partial(write_to, STDOUT, sys.stdout.write)  # stdout's errors, not the log's
    # A closed stdout (`| head`) raises BrokenPipeError through here: `main` ends quietly.
    with (
        local_log(args.log) as log,
        reading_log(log, skip_corrupt=args.skip_corrupt) as reader,
    ):
        plan = rollbacks(log)
        if not args.json:
            write(f"{'seq':>8}  {'time':>14}  {'type':<20} {'rank':>4}  summary\n")
        for event in reader:
            if args.limit is not None and shown >= args.limit:
                break
            if not keep(event):
                continue
            shown += 1
            rolled_back = plan is not None and plan.is_rolled_back(event)
            if args.json:
                line = encode_json(event)  # NaN and ±inf kept, as in a JSON Lines log
                if rolled_back:  # one more key on the event's object
                    line = line[:-1] + _ROLLED_BACK_JSON
                write(f"{line.decode()}\n")
            else:
                rank = getattr(event, "rank", None)
                write(
                    f"{event.seq:>8}  {event.time:>14.6f}  {type(event).__name__:<20} "
                    f"{'-' if rank is None else rank:>4}  {_summary(event)}"
                    f"{' (rolled back)' if rolled_back else ''}\n"
                )
        with writing(STDOUT):
            sys.stdout.flush()
        check_log_tail(reader, args.log)
    return 0


# --- convert --------------------------------------------------------------------------------


def _convert(args: argparse.Namespace) -> int:
    # The same file by any name (a hard link, /dev/stdout onto it): it would be truncated.
    # Its directories are made as needed (the recorder makes them).
    check_output(args.output, inputs=(args.input,), option="output", make_parents=True)
    written = 0
    with reading_log(args.input, skip_corrupt=args.skip_corrupt) as reader:
        try:
            recorder = LogRecorder(
                args.output,
                run_id=reader.header.run_id,
                created=reader.header.created,
                format=args.to,
                fsync="never",
                event_types=reader.header.event_types,
            )
        except OSError as exc:
            raise cannot_write(args.output, exc) from None
        write = recorder.write
        try:
            for event in reader:
                write_to(args.output, write, event)  # apart from the input's (read by the loop)
                written += 1
        except BaseException:
            with contextlib.suppress(OSError):  # what failed is being reported
                recorder.close()
            raise
        with writing(args.output):
            recorder.close()
    unencodable = (
        f", {recorder.placeholders} not encodable as {recorder.format} (written as placeholders)"
        if recorder.placeholders
        else ""
    )
    print(f"{args.output}: {written} events ({recorder.format}){unencodable}")
    check_log_tail(reader)
    return 0


# --- stats ----------------------------------------------------------------------------------


class ResumeStats(msgspec.Struct, kw_only=True):
    """One ``RunResumed`` of the log: where, and the checkpoint it resumed from."""

    seq: int
    time: float
    checkpoint: str
    checkpoint_seq: int
    rounds: int


#: How a run names a training callback's hook (``EarlyStopping.after_report``, ``...#2``):
#: the handlers a user wrote or chose, apart from the library's own and plain handlers.
_CALLBACK_HOOK = re.compile(
    r"[^.\s]+\.(?:before_run|after_report|after_exception|after_run|on_event)(?:#\d+)?"
)


class LogStats(msgspec.Struct, kw_only=True):
    events: int = 0
    run_id: str = ""
    schema_version: int = 0
    first_time: float | None = None
    last_time: float | None = None
    span: float = 0.0
    by_type: dict[str, int] = msgspec.field(default_factory=dict)
    by_rank: dict[int, int] = msgspec.field(default_factory=dict)
    reports_per_rank: dict[int, int] = msgspec.field(default_factory=dict)
    complete_rounds: int = 0
    world_size: int = 0
    worker_failures: dict[int, int] = msgspec.field(default_factory=dict)
    handler_failures: int = 0
    handler_timeouts: int = 0
    truncated_at: int | None = None
    skipped_corrupt: int = 0
    #: Events the resumes rolled back (counted in the figures above too: they are in the log).
    rolled_back: int = 0
    resumes: list[ResumeStats] = msgspec.field(default_factory=list)
    #: The log's budget reports (one a health-check period), and the seconds they cover.
    periods: int = 0
    periods_span: float = 0.0
    #: What each training callback's hook cost, summed over the budget reports.
    callbacks: list[CallbackCost] = msgspec.field(default_factory=list)
    #: The same for every other handler: the library's own, and plain handlers.
    other_handlers: list[CallbackCost] = msgspec.field(default_factory=list)


def _collect_stats(reader: LogReader, plan: Rollbacks | None = None) -> LogStats:
    stats = LogStats(run_id=reader.header.run_id, schema_version=reader.header.schema_version)
    by_type: Counter[str] = Counter()
    by_rank: Counter[int] = Counter()
    reports: Counter[int] = Counter()
    failures: Counter[int] = Counter()
    round_ranks: dict[tuple[str, int], set[int]] = {}
    costs: dict[str, CallbackCost] = {}  # each handler's, summed over the budget reports
    for event in reader:
        by_type[type(event).__name__] += 1
        if plan is not None and plan.is_rolled_back(event):
            stats.rolled_back += 1
        if stats.first_time is None:
            stats.first_time = event.time
        stats.last_time = event.time
        rank = getattr(event, "rank", None)
        if rank is not None:
            by_rank[rank] += 1
        if isinstance(event, Report):
            reports[event.rank] += 1
            stats.world_size = max(stats.world_size, event.world_size)
            round_ranks.setdefault((event.run_id, event.index), set()).add(event.rank)
        elif isinstance(event, WorkerFailure):
            failures[event.rank] += 1
        elif isinstance(event, HandlerFailed):
            stats.handler_failures += 1
        elif isinstance(event, HandlerTimedOut):
            stats.handler_timeouts += 1
        elif isinstance(event, BudgetReport):
            stats.periods += 1
            stats.periods_span += max(0.0, event.end - event.start)
            for usage in event.handlers:
                was = costs.get(usage.handler) or CallbackCost(handler=usage.handler)
                costs[usage.handler] = msgspec.structs.replace(
                    was,
                    calls=was.calls + usage.calls,
                    total=was.total + usage.total,
                    max=max(was.max, usage.max),
                    periods_over_budget=was.periods_over_budget + int(usage.over_budget),
                    faults=was.faults + usage.faults,
                    timeouts=was.timeouts + usage.timeouts,
                    skipped=was.skipped + usage.skipped,
                )

    def ranked(callbacks: bool) -> list[CallbackCost]:
        """The training callbacks' hooks (or every other handler), costliest first."""
        chosen = [
            msgspec.structs.replace(cost, mean=cost.total / cost.calls if cost.calls else 0.0)
            for name, cost in costs.items()
            if bool(_CALLBACK_HOOK.fullmatch(name)) == callbacks
        ]
        return sorted(chosen, key=lambda cost: cost.total, reverse=True)

    first, last = stats.first_time, stats.last_time
    stats.events = sum(by_type.values())
    stats.span = (last - first) if first is not None and last is not None else 0.0
    stats.by_type = dict(by_type.most_common())
    stats.by_rank = dict(sorted(by_rank.items()))
    stats.reports_per_rank = dict(sorted(reports.items()))
    stats.complete_rounds = sum(1 for r in round_ranks.values() if len(r) >= stats.world_size)
    stats.worker_failures = dict(sorted(failures.items()))
    stats.truncated_at = reader.truncated.offset if reader.truncated else None
    stats.skipped_corrupt = reader.skipped
    stats.resumes = [
        ResumeStats(
            seq=r.seq,
            time=r.time,
            checkpoint=r.checkpoint,
            checkpoint_seq=r.position.checkpoint_seq,
            rounds=r.position.rounds,
        )
        for r in (plan.resumes if plan is not None else ())
    ]
    stats.callbacks, stats.other_handlers = ranked(True), ranked(False)
    return stats


def _stats(args: argparse.Namespace) -> int:
    with local_log(args.log) as log:
        with reading_log(log, skip_corrupt=args.skip_corrupt) as reader:
            stats = _collect_stats(reader, rollbacks(log))
        _print_stats(stats, args)  # a failing stdout: `main` names it
        check_log_tail(reader, args.log)
    return 0


def _print_stats(stats: LogStats, args: argparse.Namespace) -> None:
    if args.json:
        print(msgspec.json.encode(stats).decode())
    else:
        span = (
            f"{stats.first_time:.6f} .. {stats.last_time:.6f} ({stats.span:.3f} s)"
            if stats.first_time is not None and stats.last_time is not None
            else "-"
        )
        print(f"log:       {args.log} (run {stats.run_id or '-'}, schema {stats.schema_version})")
        print(f"events:    {stats.events}")
        print(f"time span: {span}")
        print(
            f"rounds:    {stats.complete_rounds} complete across {stats.world_size} rank(s); "
            f"reports per rank: {_pairs(stats.reports_per_rank)}"
        )
        print(
            f"failures:  workers {_pairs(stats.worker_failures)}; handlers failed "
            f"{stats.handler_failures}, timed out {stats.handler_timeouts}"
        )
        if stats.resumes:
            print(
                f"resumes:   {len(stats.resumes)}; {stats.rolled_back} event(s) rolled back "
                "(kept in the log, left out of replays)"
            )
            for r in stats.resumes:
                saved = f"saved at seq {r.checkpoint_seq}" if r.checkpoint_seq >= 0 else "saved -"
                print(
                    f"  seq {r.seq}: from checkpoint {r.checkpoint} "
                    f"({saved}; {r.rounds} round(s) kept)"
                )
        print("by type:")
        for name, count in stats.by_type.items():
            print(f"  {name:<22} {count:>10}")
        if stats.by_rank:
            print("by rank:")
            for rank, count in stats.by_rank.items():
                print(f"  {rank:<22} {count:>10}")
        _print_costs(stats)


def _print_costs(stats: LogStats) -> None:
    """Each handler's cost from the budget reports: the training callbacks' hooks,
    then every other handler (the library's own, and plain handlers)."""
    if not stats.periods:
        print("callback costs: none recorded (the log holds no budget reports)")
        return
    print(
        f"callback costs: {stats.periods} health-check period(s) over "
        f"{stats.periods_span:.3f} s; share: % of that time"
    )
    header = (
        f"{'calls':>8} {'failed':>6} {'t/o':>4} {'skipped':>7} {'total ms':>10} "
        f"{'mean µs':>9} {'max ms':>9} {'share':>8}  over budget"
    )
    for title, costs in (
        ("callbacks", stats.callbacks),
        ("library and plain handlers", stats.other_handlers),
    ):
        if not costs:
            print(f"  {title}: none")
            continue
        print(f"  {title[:40]:<40} {header}")
        for c in costs:
            share = c.total / stats.periods_span * 100 if stats.periods_span > 0 else 0.0
            print(
                f"  {c.handler[:40]:<40} {c.calls:>8} {c.faults:>6} {c.timeouts:>4} "
                f"{c.skipped:>7} {c.total * 1e3:>10.3f} {c.mean * 1e6:>9.2f} "
                f"{c.max * 1e3:>9.3f} {share:>7.2f}%  "
                f"{c.periods_over_budget} of {stats.periods} period(s)"
            )


def _pairs(counts: dict[int, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in counts.items()) or "none"


# --- replay ---------------------------------------------------------------------------------


def _cost_flags(specs: list[str]) -> dict[str, float]:
    """``--cost NAME=SECONDS`` flags as seconds by handler name; a bad one is one line
    naming the flag."""
    costs: dict[str, float] = {}
    for spec in specs:
        name, equals, text = spec.rpartition("=")
        name = name.strip()
        try:
            seconds = float(text)
        except ValueError:
            equals = ""
        if not (name and equals):
            raise CliError(
                f"--cost must be NAME=SECONDS (seconds per call of handler NAME), got {spec!r}"
            )
        if name in costs:
            raise CliError(f"--cost {name} is given twice")
        try:
            costs[name] = checked(f"--cost {name}", seconds, WaitSeconds)
        except (OptionError, OptionTypeError) as exc:
            raise CliError(str(exc)) from None
    return costs


def _replay(args: argparse.Namespace) -> int:
    if not args.callbacks:
        raise CliError("nothing to replay against: give --callbacks MODULE:NAME ...")
    # Every number checked before the log is read (each named as its flag).
    options = BusOptions.build(None, **given(args, "period", "timeout"))
    if args.speed is not None:
        checked("speed", args.speed, Speed)
    costs = _cost_flags(args.cost)
    if costs and args.speed is not None:
        raise CliError("--cost charges virtual time: it needs an instant replay, without --speed")
    keep = _filter(args)
    training: list[Any] = []  # every --callbacks object loaded now, before the replay starts
    plain: list[tuple[str, Callable[[Any], Any]]] = []
    for spec in args.callbacks:
        obj = load_object(spec)
        try:
            if is_training_callback(obj):
                training.append(obj)
            else:
                plain.append((spec, obj))
        except ValueError as exc:
            raise CliError(f"{spec!r}: {exc}") from None
    # What the budgets said (printed when --cost charged some): periods over budget per
    # handler, and the handlers' state changes; a tap, not a handler: no row in the table.
    periods = 0
    over: Counter[str] = Counter()
    changes: list[HandlerStateChanged] = []

    def verdicts(batch: list[Event]) -> None:
        nonlocal periods
        for event in batch:
            if isinstance(event, BudgetReport):
                periods += not event.partial
                over.update(event.over_budget)
            elif isinstance(event, HandlerStateChanged):
                changes.append(event)

    def setup(bus: EventBus) -> None:
        for spec, handler in plain:
            bus.subscribe(Event, handler, name=spec)
        if training:
            attach_user_callbacks(bus, training)
        if costs:
            bus.add_tap(verdicts)

    with local_log(args.log) as log:  # read three times: a pipe is copied first
        with reading_log(log, skip_corrupt=args.skip_corrupt):
            pass  # a bad file is reported before any bus starts
        try:
            summary = anyio.run(
                lambda: replay_file(
                    log,
                    setup,
                    speed=args.speed,
                    period=args.period,
                    filter=keep,
                    skip_corrupt=args.skip_corrupt,
                    real_time=not costs,  # charged costs: virtual time, deterministic
                    costs=costs or None,
                    timeout=options.timeout,
                )
            )
        except (LogError, OptionError) as exc:
            if isinstance(exc, OptionError) and exc.option.startswith("costs"):
                raise CliError("--cost" + str(exc)[len("costs") :]) from None
            raise as_cli_error(exc) from None
    _print_replay(summary)
    if costs:
        for name, count in over.items():
            print(f"over budget: {name} in {count} of {periods} periods")
        for change in changes:
            print(f"{change.handler}: {change.state} ({change.reason})")
    if summary.truncated is not None:
        raise CliError(summary.truncated.describe(args.log))
    return 1 if summary.failed or summary.timed_out else 0


def _print_replay(summary: ReplaySummary) -> None:
    span = (
        summary.last_time - summary.first_time
        if summary.first_time is not None and summary.last_time is not None
        else 0.0
    )
    print(
        f"replayed {summary.replayed} events ({summary.filtered} filtered out) over "
        f"{span:.3f} s of recorded time; delivered {summary.bus.delivered}, "
        f"failed {summary.failed}, timed out {summary.timed_out}"
        + (f", {summary.skipped_corrupt} corrupt skipped" if summary.skipped_corrupt else "")
        + (f", {summary.placeholders} placeholders skipped" if summary.placeholders else "")
        + (f", {summary.rolled_back} rolled back skipped" if summary.rolled_back else "")
        + f"; took {summary.wall_time:.3f} s"
    )
    print(
        f"{'handler':<40} {'calls':>8} {'failed':>6} {'t/o':>4} {'skipped':>7} "
        f"{'total ms':>9} {'mean µs':>8} {'max ms':>8}  state"
    )
    for h in summary.handlers:
        mean = h.total / h.calls * 1e6 if h.calls else 0.0
        print(
            f"{h.name[:40]:<40} {h.calls:>8} {h.failed:>6} {h.timed_out:>4} {h.skipped:>7} "
            f"{h.total * 1e3:>9.3f} {mean:>8.2f} {h.max * 1e3:>8.3f}  {h.state}"
        )
