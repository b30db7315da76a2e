"""What ``eventbus bench`` measures: a stack of callbacks' overhead, per health-check period.

A workload (synthetic, or events read from a recorded log) is driven through
a real bus with the callbacks attached as in a run, under a
``FastForwardClock``: idle gaps between events are skipped, so periods follow
the workload's timeline while every call costs what it really costs. The
budget reports of that run give each callback's share of each period.
The same rounds are then fed to the callbacks directly, in a plain loop,
timing each call: that is the floor (what the callbacks cost with no runtime
around them) and the source of the per-call distribution (mean, p50, p99).
"""

from __future__ import annotations

import inspect
import random
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from eventbus import (
    BudgetReport,
    CheckpointSaved,
    Event,
    EventBus,
    FastForwardClock,
    Report,
    RunFinished,
    RunStarted,
    Stage,
    WorkerFailure,
)
from handlers import TrainRunContext, WorkerError
from handlers.wiring import attach_user_callbacks, implemented_hooks

from ._common import callback_name, split_callbacks

__all__ = [
    "BenchResult",
    "CallbackFigures",
    "Workload",
    "run_bench",
    "synthetic_events",
]

Progress = Callable[[float], None]


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """A synthetic run: ``world_size`` ranks reporting ``rate`` times a second each."""

    world_size: int = 8
    rate: float = 10.0
    metrics: int = 8
    checkpoint_every: int = 10
    failure_rate: float = 0.0
    duration: float = 20.0
    events: int | None = None
    seed: int = 0


class CallbackFigures(msgspec.Struct, frozen=True, kw_only=True):
    """One callback method's cost: per call (direct) and per period (through the bus)."""

    name: str
    calls: int
    mean: float
    p50: float
    p99: float
    max: float
    period_share_mean: float
    period_share_max: float
    periods_over_budget: int
    budget: float


class BenchResult(msgspec.Struct, frozen=True, kw_only=True):
    """A bench run. ``bus_seconds``: the workload through the bus with the
    callbacks; ``baseline_seconds``: the same with nothing attached (driving
    the workload); ``floor_seconds``: the callbacks called directly.
    ``overhead_per_event`` is what the runtime adds per event: bus - baseline -
    floor; ``ratio`` is (bus - baseline) / floor."""

    events: int
    rounds: int
    periods: int
    period: float
    budget: float
    timeline: float
    bus_seconds: float
    baseline_seconds: float
    floor_seconds: float
    ratio: float
    overhead_per_event: float
    callbacks: tuple[CallbackFigures, ...]
    per_period: dict[str, list[float]]


def synthetic_events(workload: Workload) -> list[Event]:
    """The events of a synthetic run, in time order, with their times set."""
    if workload.world_size < 1 or workload.rate <= 0:
        raise ValueError("world size must be >= 1 and rate > 0")
    rng = random.Random(workload.seed)
    run_id = f"bench-{workload.seed}"
    names = [f"metric_{i}" for i in range(workload.metrics)]
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
    period: float = 2.0,
    budget: float = 0.05,
    timeout: float = 30.0,
    progress: Progress | None = None,
) -> BenchResult:
    """Benchmark fresh callbacks from ``make_callbacks`` on ``events`` (see the module doc)."""
    events = list(events)
    if not events:
        raise ValueError("the workload has no events")
    bus_options = {"period": period, "budget": budget, "timeout": timeout}
    reports, bus_seconds, rounds = anyio.run(
        _through_bus, make_callbacks(), events, bus_options, progress
    )
    # The same workload with nothing attached: what driving it costs, to take out.
    _, baseline_seconds, _ = anyio.run(_through_bus, [], events, bus_options, None)
    # Fresh callbacks for each pass: stateful ones see the run once each time.
    floor_seconds = anyio.run(_floor, _direct_calls(make_callbacks(), rounds, events))
    per_call = anyio.run(_per_call, _direct_calls(make_callbacks(), rounds, events))
    return _figures(
        events,
        reports=reports,
        rounds=rounds,
        bus_seconds=bus_seconds,
        baseline_seconds=baseline_seconds,
        floor_seconds=floor_seconds,
        per_call=per_call,
        period=period,
        budget=budget,
    )


async def _through_bus(
    callbacks: list[Any],
    events: list[Event],
    bus_options: dict[str, Any],
    progress: Progress | None,
) -> tuple[list[BudgetReport], float, list[tuple[list[dict[str, Any]], str | None]]]:
    world_size = max((getattr(e, "world_size", 0) for e in events), default=0) or None
    training, plain = split_callbacks(callbacks)
    clock = FastForwardClock(start=events[0].time)
    reports: list[BudgetReport] = []
    rounds: list[tuple[list[dict[str, Any]], str | None]] = []
    copies = [msgspec.structs.replace(e, seq=-1) for e in events]  # a bus stamps what it gets
    started = time.perf_counter()
    async with EventBus(clock=clock, **bus_options) as bus:
        bus.subscribe(
            BudgetReport, reports.append, name="bench.budget_reports", order=Stage.OBSERVE
        )
        if training:
            attach_user_callbacks(
                bus, training, world_size=world_size, report_callbacks=[_RoundRecorder(rounds)]
            )
        workload_types = tuple({type(e) for e in events})
        for handler in plain:
            bus.subscribe(workload_types, handler, name=callback_name(handler))
        await _drive(bus, clock, copies, progress)
        clock.set(clock.now() + bus.period)  # close the last period
        await bus.wait_idle()
    return reports, time.perf_counter() - started, rounds


async def _drive(
    bus: EventBus, clock: FastForwardClock, events: list[Event], progress: Progress | None
) -> None:
    """Publish the workload at as little cost as possible (unlike ``replay``, which
    moves the clock to every event): time runs for real within a period and jumps
    only to the period the next event belongs to, once the bus is idle, so every
    call is accounted to its period and the figures are the runtime's, not ours."""
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


class _RoundRecorder:
    """Keeps the rounds the bus gathered, to feed the same ones to the floor loop."""

    def __init__(self, rounds: list[tuple[list[dict[str, Any]], str | None]]) -> None:
        self.rounds = rounds

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        self.rounds.append((metrics, checkpoint))


Call = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _direct_calls(
    callbacks: list[Any],
    rounds: list[tuple[list[dict[str, Any]], str | None]],
    events: list[Event],
) -> list[Call]:
    """The calls the run made to each callback, to make again with no runtime around."""
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
    for callback in training:
        hooks = implemented_hooks(callback)
        for hook, args_list in arguments.items():
            if hook in hooks:
                name = f"{callback_name(callback)}.{hook}"
                calls.extend((name, hooks[hook], args) for args in args_list)
    for handler in plain:  # a bus handler gets every event of the workload
        calls.extend((callback_name(handler), handler, (event,)) for event in events)
    return calls


async def _floor(calls: list[Call]) -> float:
    """The floor: the same calls in a plain loop, timed as a whole."""
    start = time.perf_counter()
    for _, method, args in calls:
        result = method(*args)
        if result is not None and inspect.isawaitable(result):
            await result
    return time.perf_counter() - start


async def _per_call(calls: list[Call]) -> dict[str, list[float]]:
    """Each call timed on its own: the distribution (mean, p50, p99) per callback."""
    per_call: dict[str, list[float]] = {}
    clock = time.perf_counter
    for name, method, args in calls:
        t0 = clock()
        result = method(*args)
        if result is not None and inspect.isawaitable(result):
            await result
        per_call.setdefault(name, []).append(clock() - t0)
    return per_call


def _figures(
    events: list[Event],
    *,
    reports: list[BudgetReport],
    rounds: list[tuple[list[dict[str, Any]], str | None]],
    bus_seconds: float,
    baseline_seconds: float,
    floor_seconds: float,
    per_call: dict[str, list[float]],
    period: float,
    budget: float,
) -> BenchResult:
    per_period: dict[str, list[float]] = {}
    over: dict[str, int] = {}
    budgets: dict[str, float] = {}
    for index, report in enumerate(reports):
        length = report.end - report.start
        for usage in report.handlers:
            series = per_period.setdefault(usage.handler, [0.0] * len(reports))
            series[index] = usage.total / length if length else 0.0
            over[usage.handler] = over.get(usage.handler, 0) + usage.over_budget
            budgets[usage.handler] = usage.budget / length if length else budget
    figures = []
    for name, durations in per_call.items():
        if not durations:
            continue
        ordered = sorted(durations)
        shares = per_period.get(name, [0.0])
        figures.append(
            CallbackFigures(
                name=name,
                calls=len(ordered),
                mean=statistics.fmean(ordered),
                p50=_quantile(ordered, 0.50),
                p99=_quantile(ordered, 0.99),
                max=ordered[-1],
                period_share_mean=statistics.fmean(shares),
                period_share_max=max(shares),
                periods_over_budget=over.get(name, 0),
                budget=budgets.get(name, budget),
            )
        )
    timeline = events[-1].time - events[0].time
    return BenchResult(
        events=len(events),
        rounds=len(rounds),
        periods=len(reports),
        period=period,
        budget=budget,
        timeline=timeline,
        bus_seconds=bus_seconds,
        floor_seconds=floor_seconds,
        ratio=(bus_seconds - baseline_seconds) / floor_seconds if floor_seconds else float("inf"),
        baseline_seconds=baseline_seconds,
        overhead_per_event=max(0.0, bus_seconds - baseline_seconds - floor_seconds) / len(events),
        callbacks=tuple(figures),
        per_period={name: series for name, series in per_period.items() if name in per_call},
    )


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
