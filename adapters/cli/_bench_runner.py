"""What ``eventbus bench`` measures (docs/guides/benchmarking.md), and the figures it adds up
to: every figure's name carries its unit."""

from __future__ import annotations

import functools
import inspect
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, Unpack

import anyio
import msgspec
from msgspec import Meta

from eventbus import (
    BudgetReport,
    BusOptions,
    CheckpointSaved,
    Event,
    EventBus,
    EventPlaceholder,
    HandlerStateChanged,
    HealthCheckTick,
    Report,
    RoundGathered,
    RunFinished,
    RunStarted,
    TrainRunContext,
    WorkerFailure,
)
from eventbus._clock import FastForwardClock
from eventbus._events import is_derived
from eventbus._options import BusKeywords, Options, Seconds
from eventbus._stages import Stage
from eventbus._subscription import OverBudgetPolicy
from eventbus._text import clip
from eventbus._text import describe as describe_exception
from eventbus.log._replay import BUS_DIAGNOSTICS
from eventbus.options import OptionError, checked
from handlers import WorkerError
from handlers._attach import attach_user_callbacks
from handlers._options import WorldSize
from handlers._user import implemented_hooks

from ._common import callback_name, split_callbacks

Progress = Callable[[float], None]


#: Bounds of a synthetic workload, built in memory.
MAX_REPORTS = 2_000_000
MAX_METRICS = 1000
MAX_VALUES = 20_000_000
#: What a synthetic report carries, the loss first, so that a callback reading
#: ``metrics["loss"]`` is timed doing what it does in a run.
DEFAULT_METRICS = (
    "loss",
    "accuracy",
    "learning_rate",
    "grad_norm",
    "val_loss",
    "val_accuracy",
    "throughput",
    "step_time",
)

MetricCount = Annotated[int, Meta(ge=1, le=MAX_METRICS, description="whole number of metrics")]

_METRICS_FORM = (
    f"a whole number of metrics from 1 to {MAX_METRICS:,}, or their names (loss,accuracy)"
)


class Workload(Options, frozen=True, kw_only=True):
    """A synthetic run: ``world_size`` ranks reporting ``rate`` times a second each, for
    ``duration`` seconds or ``events`` reports (``eventbus bench --help`` says each)."""

    world_size: WorldSize = 8
    rate: Annotated[float, Meta(gt=0, le=1e6, description="number of reports a second")] = 10.0
    metrics: MetricCount | tuple[str, ...] = len(DEFAULT_METRICS)
    checkpoint_every: Annotated[int, Meta(ge=0, le=MAX_REPORTS)] = 10
    failure_rate: Annotated[float, Meta(ge=0, le=1)] = 0.0
    duration: Seconds = 60.0
    events: Annotated[int, Meta(ge=1, le=MAX_REPORTS)] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        _check_metrics(self.metrics)  # first: in words a user can act on
        super().__post_init__()
        reports = self.events or self.world_size * max(1, int(self.duration * self.rate))
        if reports > MAX_REPORTS:
            raise OptionError(
                "duration",
                f"the workload would make {reports:,} reports (world_size {self.world_size} "
                f"x rate {self.rate:g}/s x duration {self.duration:g} s), more than "
                f"{MAX_REPORTS:,}: lower one of them, or give events",
            )
        values = reports * len(self.metric_names)
        if values > MAX_VALUES:
            raise OptionError(
                "metrics",
                f"the workload would hold {values:,} metric values ({reports:,} reports x "
                f"{len(self.metric_names):,} metrics), more than {MAX_VALUES:,}: fewer "
                "metrics, or a shorter workload",
            )

    @property
    def metric_names(self) -> tuple[str, ...]:
        if not isinstance(self.metrics, int):
            return tuple(self.metrics)  # a list, given from code, is checked as a tuple
        more = tuple(f"metric_{i}" for i in range(len(DEFAULT_METRICS), self.metrics))
        return (DEFAULT_METRICS + more)[: self.metrics]


def _check_metrics(metrics: object) -> None:
    """A count in range, or distinct non-empty names, none a number (a mistyped count)."""
    if isinstance(metrics, int) and not isinstance(metrics, bool):
        if not 1 <= metrics <= MAX_METRICS:
            raise OptionError("metrics", f"metrics must be {_METRICS_FORM}, got {metrics!r}")
        return
    if not isinstance(metrics, tuple | list) or not all(isinstance(n, str) for n in metrics):
        return
    shown = ",".join(metrics)
    if not any(metrics):
        raise OptionError("metrics", f"metrics must be {_METRICS_FORM}, got {shown!r}")
    if len(metrics) > MAX_METRICS:
        raise OptionError(
            "metrics", f"metrics names {len(metrics):,} metrics, more than {MAX_METRICS:,}"
        )
    seen: set[str] = set()
    for position, name in enumerate(metrics, 1):
        if not name:
            raise OptionError(
                "metrics",
                f"metrics has an empty name (name {position} of {len(metrics)} in {shown!r})",
            )
        if _is_number(name):
            raise OptionError("metrics", f"metrics must be {_METRICS_FORM}, got {shown!r}")
        if name in seen:
            raise OptionError("metrics", f"metrics names {name!r} twice (in {shown!r})")
        seen.add(name)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def report_metrics(events: Iterable[Event]) -> tuple[str, ...]:
    """The metric names the workload's reports (or rounds) carry, at most ``MAX_METRICS``."""
    seen: dict[str, None] = {}
    rounds: dict[str, None] = {}
    for event in events:
        if len(seen) >= MAX_METRICS:
            break
        if isinstance(event, Report):
            seen.update(dict.fromkeys(event.metrics))
        elif isinstance(event, RoundGathered) and len(rounds) < MAX_METRICS:
            for metrics in event.metrics:
                rounds.update(dict.fromkeys(metrics))
    return tuple(seen or rounds)[:MAX_METRICS]


def synthetic_events(workload: Workload) -> list[Event]:
    """The events of a synthetic run, in time order, with their times set."""
    rng = random.Random(workload.seed)
    run_id = f"bench-{workload.seed}"
    names = workload.metric_names
    per_rank = (
        -(-workload.events // workload.world_size)
        if workload.events is not None
        else max(1, int(workload.duration * workload.rate))
    )
    interval = 1.0 / workload.rate
    timed: list[tuple[float, int, Event]] = [
        (0.0, 0, RunStarted(run_id=run_id, name="bench", world_size=workload.world_size, time=1e-9))
    ]
    end = 0.0
    for index in range(per_rank):
        checkpoint = (
            f"checkpoint-{index}"
            if workload.checkpoint_every and (index + 1) % workload.checkpoint_every == 0
            else None
        )
        last = 0.0
        for rank in range(workload.world_size):
            at = (index + rng.uniform(0.05, 0.95)) * interval
            last = max(last, at)
            metrics = {name: rng.random() for name in names}
            report = Report(
                run_id=run_id,
                rank=rank,
                world_size=workload.world_size,
                index=index,
                metrics=metrics,
                checkpoint=checkpoint,
                time=at,
            )
            timed.append((at, 1, report))
            if workload.failure_rate and rng.random() < workload.failure_rate:
                failure = WorkerFailure(
                    run_id=run_id,
                    rank=rank,
                    error_type="RuntimeError",
                    message=f"injected at report {index}",
                    time=at,
                )
                timed.append((at, 2, failure))
        if checkpoint is not None:
            timed.append(
                (
                    last,
                    3,
                    CheckpointSaved(run_id=run_id, checkpoint=checkpoint, index=index, time=last),
                )
            )
        end = max(end, last)
    timed.append(
        (end + interval, 4, RunFinished(run_id=run_id, status="finished", time=end + interval))
    )
    timed.sort(key=lambda t: (t[0], t[1]))
    return [event for _, _, event in timed]


def run_bench(
    make_callbacks: Callable[[], list[Any]],
    events: Sequence[Event],
    *,
    start: float | None = None,
    repeats: int = 5,
    progress: Progress | None = None,
    over_budget: Sequence[OverBudgetPolicy | None] = (),
    **keywords: Unpack[BusKeywords],
) -> BenchResult:
    """Benchmark fresh callbacks from ``make_callbacks`` on ``events``, on a bus of
    ``keywords``, its first period from ``start``; ``over_budget``: each callback's policy."""
    bus_options = BusOptions.build(None, **keywords)
    repeats = checked("repeats", repeats, Annotated[int, Meta(ge=1, le=1000)])
    # What a bus makes itself is not workload: the bench bus makes its own.
    workload = [e for e in events if not isinstance(e, (*BUS_DIAGNOSTICS, EventPlaceholder))]
    if not workload:
        raise ValueError("the workload has no events")
    begin = workload[0].time if start is None else min(start, workload[0].time)
    passes = 3 * repeats + 1  # for the progress bar: the first pass, then one step each
    done = 0.0

    def step(fraction: float = 1.0) -> None:
        nonlocal done
        if progress is not None:
            progress((done + fraction) / passes)
        if fraction == 1.0:
            done += 1

    def through_bus(callbacks: list[Any], progress: Progress | None = None) -> _Pass:
        passing = functools.partial(_through_bus, over_budget=over_budget)
        return anyio.run(passing, callbacks, workload, bus_options, begin, progress)

    measured = through_bus(make_callbacks(), step if progress else None)
    workload = measured.published  # without the events this bus derives itself
    timings = Timings(bus=[measured.seconds])
    short: dict[str, str] = {}  # a handler the bus disabled or coalesced, and why
    _shortfalls(measured, short)
    for run in range(repeats):
        # Fresh callbacks for each pass: stateful ones see the run once each time.
        if run:
            again = through_bus(make_callbacks())
            timings.bus.append(again.seconds)
            _shortfalls(again, short)
            step()
        # The same workload with nothing attached: what driving it costs, to take out.
        timings.baseline.append(through_bus([]).seconds)
        step()
        timings.floor.append(anyio.run(_floor, _direct_calls(make_callbacks(), measured)))
        step()
    direct = anyio.run(_per_call, _direct_calls(make_callbacks(), measured))
    step()
    return _figures(measured, direct, timings, short, start=begin, options=bus_options)


Rounds = list[tuple[list[dict[str, Any]], str | None]]


class _Pass(NamedTuple):
    reports: list[BudgetReport]
    seconds: float
    rounds: Rounds
    published: list[Event]
    #: Each change of a handler's state, with the period it holds from.
    changes: list[tuple[int, HandlerStateChanged]]
    #: Each subscription's over-budget policy, by name.
    policies: dict[str, str]
    #: How the bus named each training callback's hooks, and each plain handler.
    hook_names: list[dict[str, str]]
    plain_names: list[str]


def _shortfalls(measured: _Pass, short: dict[str, str]) -> None:
    """Add to ``short`` the handlers that did not get every delivery in a pass, and why
    (the first pass that says so is kept)."""
    skipped: Counter[str] = Counter()
    for report in measured.reports:
        for usage in report.handlers:
            if usage.skipped:
                skipped[usage.handler] += usage.skipped
    changes: dict[str, list[HandlerStateChanged]] = {}
    for _, change in measured.changes:
        changes.setdefault(change.handler, []).append(change)
    for name, made in changes.items():
        first = next((c for c in made if c.state != "normal"), None)
        if first is not None:
            more = f"; {len(made)} changes of state" if len(made) > 1 else ""
            short.setdefault(name, f"{first.state}: {first.reason}{more}")
    for name, count in skipped.items():
        short.setdefault(name, f"{count:,} deliveries skipped")


async def _through_bus(
    callbacks: list[Any],
    events: list[Event],
    bus_options: BusOptions,
    start: float,
    progress: Progress | None,
    *,
    over_budget: Sequence[OverBudgetPolicy | None],
) -> _Pass:
    """One pass through a bus, timed from the first publish until the last event is
    handled; the bus closes at the workload's last event."""
    world_size = max((getattr(e, "world_size", 0) for e in events), default=0) or None
    chosen = {
        id(cb): policy
        for cb, policy in zip(callbacks, over_budget, strict=False)
        if policy is not None
    }
    training, plain = split_callbacks(callbacks)
    for callback in training:
        if (policy := chosen.get(id(callback))) is not None:
            try:
                callback.over_budget = policy
            except (AttributeError, TypeError) as exc:
                raise ValueError(
                    f"{callback_name(callback)}: cannot set its over_budget to {policy!r} ({exc})"
                ) from None
    clock = _StartClock(start)
    reports: list[BudgetReport] = []
    changes: list[tuple[int, HandlerStateChanged]] = []
    period = 0  # a verdict as period k closes holds from k + 1, as the run report counts

    def state_changed(event: HealthCheckTick | HandlerStateChanged) -> None:
        nonlocal period
        if isinstance(event, HealthCheckTick):
            period = event.period + 1
        else:
            changes.append((period, event))

    rounds: Rounds = []
    hook_names: list[dict[str, str]] = []
    policies: dict[str, str] = {}
    async with EventBus(bus_options, clock=clock) as bus:
        clock.go()
        bus.subscribe(
            BudgetReport, reports.append, name="bench.budget_reports", order=Stage.OBSERVE
        )
        bus.subscribe(
            (HealthCheckTick, HandlerStateChanged),
            state_changed,
            name="bench.state_changes",
            order=Stage.OBSERVE,
        )
        if training:
            attachment = attach_user_callbacks(bus, training, world_size=world_size)
            hook_names = [
                # after_report -> EarlyStopping.after_report#2
                {sub.name.split("#", 1)[0].rsplit(".", 1)[-1]: sub.name for sub in subs}
                for subs in attachment.user.subscriptions_by_callback
            ]
            policies.update(
                (sub.name, sub.over_budget)
                for subs in attachment.user.subscriptions_by_callback
                for sub in subs
            )
            # The rounds, kept to feed the same ones to the floor loop.
            bus.subscribe(
                RoundGathered,
                lambda e: rounds.append((e.metrics, e.checkpoint)),
                name="bench.rounds",
                order=Stage.OBSERVE,
            )
        # A log holds what its bus derived (rounds, say): a bus that gathers makes its own.
        derives = bus.gathering is not None
        published = [e for e in events if not (derives and is_derived(type(e)))]
        if not published:
            raise ValueError("the workload has no events but those the bus makes itself")
        workload_types = tuple({type(e) for e in published})
        plain_names: list[str] = []
        counts: Counter[str] = Counter()
        for handler in plain:  # a second one of the same name is ``name#2``
            name = callback_name(handler)
            counts[name] += 1
            name = name if counts[name] == 1 else f"{name}#{counts[name]}"
            plain_names.append(name)
            policy = chosen.get(id(handler), "warn")
            bus.subscribe(workload_types, handler, name=name, over_budget=policy)
            policies[name] = policy
        copies = [msgspec.structs.replace(e, seq=-1) for e in published]  # a bus stamps them
        started = time.perf_counter()
        await _drive(bus, clock, copies, progress)
        await bus.wait_idle()
        clock.set(max(e.time for e in published))  # the workload's timeline ends here
        await bus.wait_idle()
        seconds = time.perf_counter() - started
    return _Pass(reports, seconds, rounds, published, changes, policies, hook_names, plain_names)


class _StartClock(FastForwardClock):
    """A ``FastForwardClock`` that reads ``start`` until ``go()``, so periods fall
    exactly where the recorded run's did."""

    def __init__(self, start: float) -> None:
        super().__init__(start)
        self._held_at: float | None = start

    def now(self) -> float:
        return self._held_at if self._held_at is not None else super().now()

    def go(self) -> None:
        self._held_at = None


async def _drive(
    bus: EventBus, clock: FastForwardClock, events: list[Event], progress: Progress | None
) -> None:
    """Publish the workload cheaply: time runs for real within a period and jumps to the
    next event's period once the bus is idle, so every call counts in its period."""
    publish = bus.publish
    step = max(1, len(events) // 100)
    for i, event in enumerate(events):
        if event.time >= bus.period_end:
            await bus.wait_idle()
            clock.set(event.time)
        await publish(event)
        if progress is not None and i % step == 0:
            progress(i / len(events))
    if progress is not None:
        progress(1.0)


Call = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _direct_calls(callbacks: list[Any], measured: _Pass) -> list[Call]:
    """The calls the run made to each callback, to make again with no runtime around."""
    events, rounds = measured.published, measured.rounds
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    context = (
        TrainRunContext.from_started(started)
        if started is not None
        else TrainRunContext.from_event(events[0])
    )
    failures = [e for e in events if isinstance(e, WorkerFailure)]
    arguments: dict[str, list[tuple[Any, ...]]] = {
        "before_run": [(context,)],
        "after_report": [(context, m, c) for m, c in rounds],
        "after_exception": [(context, {f.rank: WorkerError.from_failure(f)}) for f in failures],
    }
    calls: list[Call] = []
    training, plain = split_callbacks(callbacks)
    for index, callback in enumerate(training):
        hooks = implemented_hooks(callback)
        named = measured.hook_names[index] if index < len(measured.hook_names) else {}
        for hook, args_list in arguments.items():
            if hook in hooks:
                name = named.get(hook, f"{type(callback).__name__}.{hook}")
                calls.extend((name, hooks[hook], args) for args in args_list)
    # A bus handler gets every event of the workload.
    for handler, name in zip(plain, measured.plain_names, strict=True):
        calls.extend((name, handler, (event,)) for event in events)
    return calls


async def _floor(calls: list[Call]) -> float:
    """The floor: the same calls in a plain loop, timed as a whole."""
    start = time.perf_counter()
    for _, method, args in calls:
        try:
            result = method(*args)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception:
            continue
    return time.perf_counter() - start


class _Direct(NamedTuple):
    """Each call timed on its own, by callback: durations, raises, the first error."""

    durations: dict[str, list[float]]
    faults: dict[str, int]
    first_errors: dict[str, str]


MAX_ERROR = 160


async def _per_call(calls: list[Call]) -> _Direct:
    per_call: dict[str, list[float]] = {}
    faults: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    clock = time.perf_counter
    for name, method, args in calls:
        t0 = clock()
        try:
            result = method(*args)
            if result is not None and inspect.isawaitable(result):
                await result
        except Exception as exc:
            elapsed = clock() - t0
            faults[name] = faults.get(name, 0) + 1
            if name not in first_errors:
                first_errors[name] = clip(" ".join(describe_exception(exc).split()), MAX_ERROR)
        else:
            elapsed = clock() - t0
        per_call.setdefault(name, []).append(elapsed)
    return _Direct(per_call, faults, first_errors)


#: Fewer runs than this cannot say how far a ratio may be off.
MIN_REPEATS_FOR_RATIO = 3
#: Under this much callback time, jitter dominates the floor: a ratio to it means little.
MIN_FLOOR_MS = 1.0
#: Runs whose ratios spread more than this share of their median disagree.
MAX_RATIO_SPREAD = 0.5


class Spread(msgspec.Struct, frozen=True, kw_only=True):
    """A figure taken several times: the median, and the lowest and highest."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(median=statistics.median(values), low=min(values), high=max(values))


class StateChange(msgspec.Struct, frozen=True, kw_only=True):
    """A callback's change of state through the bus, from health-check period ``period`` on."""

    period: int
    state: str
    reason: str


class CallbackFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One callback method of one callback instance (``EarlyStopping.after_report#2``):
    timed directly, through the bus, and per period (fields: docs/guides/benchmarking.md)."""

    name: str
    calls: int
    mean_us: float
    p50_us: float
    p99_us: float
    max_us: float
    bus_calls: int
    bus_total_ms: float
    period_share_mean_pct: float
    period_share_max_pct: float
    periods_over_budget: int
    budget_pct: float
    faults: int = 0
    first_error: str = ""
    bus_faults: int = 0
    bus_skipped: int = 0
    bus_note: str = ""
    over_budget: str = "warn"
    state_changes: tuple[StateChange, ...] = ()


class BenchResult(msgspec.Struct, frozen=True, kw_only=True):
    """A bench run: what ``eventbus bench --json`` writes (fields:
    docs/guides/benchmarking.md)."""

    events: int
    rounds: int
    start_s: float
    period_s: float
    periods: int
    partial_period_s: float
    timeline_s: float
    budget_pct: float
    periods_over_budget: int
    repeats: int
    bus_ms: Spread
    baseline_ms: Spread
    floor_ms: Spread
    overhead_per_event_ns: Spread
    floor_ratio: Spread | None
    floor_ratio_note: str
    callbacks: tuple[CallbackFigures, ...]
    period_lengths_s: list[float]
    per_period_pct: dict[str, list[float]]
    overhead_note: str = ""
    metrics: tuple[str, ...] = ()
    builtins_metric: str = ""
    notes: tuple[str, ...] = ()


class Timings(msgspec.Struct, kw_only=True):
    """Seconds per run: through the bus, the workload alone, and the floor."""

    bus: list[float] = msgspec.field(default_factory=list)
    baseline: list[float] = msgspec.field(default_factory=list)
    floor: list[float] = msgspec.field(default_factory=list)


@dataclass(slots=True)
class _Usage:
    """One handler's accounting over the periods (its share of each)."""

    shares: list[float]
    calls: int = 0
    total: float = 0.0
    over: int = 0
    faults: int = 0
    skipped: int = 0


def _figures(
    measured: _Pass,
    direct: _Direct,
    timings: Timings,
    short: dict[str, str],
    *,
    start: float,
    options: BusOptions,
) -> BenchResult:
    """The figures of the measured pass and the timed runs. Mean shares are of the run's
    time, so a partial period is neither lost nor blown up."""
    period, budget, events = options.period, options.budget, len(measured.published)
    per_call = direct.durations
    reports = sorted(measured.reports, key=lambda r: (r.partial, r.start))
    lengths = [r.end - r.start for r in reports]
    timeline = sum(lengths)
    usages: dict[str, _Usage] = {}
    budgets: dict[str, float] = {}
    for index, report in enumerate(reports):
        judged = max(lengths[index], period)  # as the bus judges a partial period
        for usage in report.handlers:
            figures = usages.setdefault(usage.handler, _Usage([0.0] * len(reports)))
            figures.calls += usage.calls
            figures.total += usage.total
            figures.over += usage.over_budget
            figures.faults += usage.faults
            figures.skipped += usage.skipped
            figures.shares[index] = usage.total / period
            if not report.partial or usage.handler not in budgets:
                budgets[usage.handler] = usage.budget / judged
    states: dict[str, list[StateChange]] = {}
    for holds_from, change in measured.changes:
        states.setdefault(change.handler, []).append(
            StateChange(period=holds_from, state=change.state, reason=change.reason)
        )
    callbacks = []
    for name, durations in per_call.items():
        ordered = sorted(durations)
        used = usages.get(name) or _Usage([0.0] * len(reports))
        callbacks.append(
            CallbackFigures(
                name=name,
                calls=len(ordered),
                mean_us=statistics.fmean(ordered) * 1e6,
                p50_us=_quantile(ordered, 0.50) * 1e6,
                p99_us=_quantile(ordered, 0.99) * 1e6,
                max_us=ordered[-1] * 1e6,
                bus_calls=used.calls,
                bus_total_ms=used.total * 1e3,
                period_share_mean_pct=used.total / timeline * 100 if timeline else 0.0,
                period_share_max_pct=max(used.shares, default=0.0) * 100,
                periods_over_budget=used.over,
                budget_pct=budgets.get(name, budget) * 100,
                faults=direct.faults.get(name, 0),
                first_error=direct.first_errors.get(name, ""),
                bus_faults=used.faults,
                bus_skipped=used.skipped,
                bus_note=short.get(name, ""),
                over_budget=measured.policies.get(name, "warn"),
                state_changes=tuple(states.get(name, ())),
            )
        )
    partial = [length for report, length in zip(reports, lengths, strict=True) if report.partial]
    overhead, ratio, note = runtime_cost(timings, events)
    unmeasured = not_measured(callbacks, short)
    if unmeasured:
        ratio, note = None, unmeasured
    return BenchResult(
        events=events,
        rounds=len(measured.rounds),
        start_s=start,
        period_s=period,
        periods=len(reports) - len(partial),
        partial_period_s=sum(partial),
        timeline_s=timeline,
        budget_pct=budget * 100,
        periods_over_budget=sum(1 for r in reports if r.total > r.budget),
        repeats=len(timings.bus),
        bus_ms=Spread.of([s * 1e3 for s in timings.bus]),
        baseline_ms=Spread.of([s * 1e3 for s in timings.baseline]),
        floor_ms=Spread.of([s * 1e3 for s in timings.floor]),
        overhead_per_event_ns=overhead,
        floor_ratio=ratio,
        floor_ratio_note=note,
        callbacks=tuple(callbacks),
        period_lengths_s=lengths,
        per_period_pct={
            name: [share * 100 for share in usages[name].shares]
            for name in per_call
            if name in usages
        },
        overhead_note=unmeasured,
        metrics=report_metrics(measured.published),
    )


NAMED_AT_MOST = 3


def not_measured(callbacks: Sequence[CallbackFigures], short: dict[str, str]) -> str:
    """Why the runtime's cost per event cannot be measured (the bus did not make every
    call the floor makes), or ``""``."""
    if not short:
        return ""
    made = {f.name: f for f in callbacks}
    said = []
    for name, why in short.items():
        figures = made.get(name)
        calls = f"{figures.bus_calls:,} of {figures.calls:,} calls, " if figures else ""
        said.append(f"{name} ({calls}{why.split(':', 1)[0]})")  # the state; the table says why
    more = len(said) - NAMED_AT_MOST
    listed = "; ".join(said[:NAMED_AT_MOST]) + (f"; and {more} more" if more > 0 else "")
    return f"not measured: the bus did not make every call the floor makes: {listed}"


def runtime_cost(timings: Timings, events: int) -> tuple[Spread, Spread | None, str]:
    """What the runtime adds per event (ns) and its ratio to the floor, or why none."""
    runs = list(zip(timings.bus, timings.baseline, timings.floor, strict=True))
    # Never below 0: a run that timed less is noise.
    overhead = Spread.of(
        [max(0.0, (bus - base - floor) / events * 1e9) for bus, base, floor in runs]
    )
    floor_ms = statistics.median(timings.floor) * 1e3
    if len(runs) < MIN_REPEATS_FOR_RATIO:
        why = f"{len(runs)} run(s) cannot say how sure a ratio is (--repeat 3 or more)"
        return overhead, None, why
    if floor_ms < MIN_FLOOR_MS:
        why = (
            f"the callbacks' own time, {floor_ms:.3f} ms, is too little to time a ratio "
            f"against (under {MIN_FLOOR_MS:g} ms); a longer workload (--duration, --events) "
            "gives one"
        )
        return overhead, None, why
    ratios = sorted((bus - base) / floor for bus, base, floor in runs)
    ratio = Spread.of(ratios)
    middle = ratios[1:-1] if len(ratios) >= 5 else ratios
    if ratio.median <= 0 or (middle[-1] - middle[0]) / ratio.median > MAX_RATIO_SPREAD:
        why = (
            f"the {len(runs)} runs disagree ({ratio.low:.1f}x to {ratio.high:.1f}x); "
            "a longer workload, or a quieter machine, gives a steadier figure"
        )
        return overhead, None, why
    return overhead, ratio, ""


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def state_spans(figures: CallbackFigures, periods: int) -> list[tuple[int, int, StateChange]]:
    """The stretches of periods ``[start, end)`` in which the bus disabled or coalesced
    the callback, each with the change that began it."""
    changes = figures.state_changes
    ends = [c.period for c in changes[1:]] + [periods] if changes else []
    return [(c.period, end, c) for c, end in zip(changes, ends, strict=True) if c.state != "normal"]


def states_text(figures: CallbackFigures, periods: int) -> str:
    """``coalescing in periods 1-3 and 6-9``; ``""`` if it never was."""
    stretches: dict[str, list[str]] = {}
    for start, end, change in state_spans(figures, periods):
        last = max(start, end - 1)
        stretches.setdefault(change.state, []).append(
            f"{start}" if last == start else f"{start}-{last}"
        )
    said = []
    for state, where in stretches.items():
        word = "period" if len(where) == 1 and "-" not in where[0] else "periods"
        shown = where[:STRETCHES_SHOWN]
        if len(where) > STRETCHES_SHOWN:
            shown.append(f"{len(where) - STRETCHES_SHOWN} more")
        listed = ", ".join(shown[:-1]) + " and " + shown[-1] if len(shown) > 1 else shown[0]
        said.append(f"{state} in {word} {listed}")
    return "; ".join(said)


STRETCHES_SHOWN = 8
