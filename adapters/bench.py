"""Benchmark the overhead of a stack of callbacks, per health-check period.

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
from collections.abc import Callable, Iterator, Sequence
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
    WorkerFailure,
    replay,
)
from handlers import TrainRunContext, WorkerError, attach_user_callbacks, implemented_hooks

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
    events: int
    rounds: int
    periods: int
    period: float
    budget: float
    timeline: float
    bus_seconds: float
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
    floor_seconds, per_call = anyio.run(_direct, make_callbacks(), rounds, events)
    return _figures(
        events,
        reports=reports,
        rounds=rounds,
        bus_seconds=bus_seconds,
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
    clock = FastForwardClock(start=events[0].time)
    reports: list[BudgetReport] = []
    rounds: list[tuple[list[dict[str, Any]], str | None]] = []
    started = time.perf_counter()
    async with EventBus(clock=clock, **bus_options) as bus:
        bus.subscribe(BudgetReport, reports.append, name="bench.budget_reports", order=10**9)
        attach_user_callbacks(
            bus, callbacks, world_size=world_size, report_callbacks=[_RoundRecorder(rounds)]
        )
        await replay(bus, _reporting(events, progress))
        clock.set(clock.now() + bus.period)  # close the last period
        await bus.wait_idle()
    return reports, time.perf_counter() - started, rounds


def _reporting(events: list[Event], progress: Progress | None) -> Iterator[Event]:
    step = max(1, len(events) // 100)
    for i, event in enumerate(events):
        if progress is not None and i % step == 0:
            progress(i / len(events))
        yield event
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


async def _direct(
    callbacks: list[Any],
    rounds: list[tuple[list[dict[str, Any]], str | None]],
    events: list[Event],
) -> tuple[float, dict[str, list[float]]]:
    """The floor: each callback method called in a plain loop, each call timed."""
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    context = (
        TrainRunContext.from_started(started)
        if started is not None
        else TrainRunContext.from_event(events[0])
    )
    failures = [e for e in events if isinstance(e, WorkerFailure)]
    calls: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = []
    for callback in callbacks:
        cls = type(callback).__qualname__
        hooks = implemented_hooks(callback)
        for hook, args_list in (
            ("before_run", [(context,)]),
            ("after_report", [(context, m, c) for m, c in rounds]),
            (
                "after_exception",
                [(context, {f.rank: WorkerError.from_failure(f)}) for f in failures],
            ),
        ):
            if hook in hooks:
                calls.extend((f"{cls}.{hook}", hooks[hook], args) for args in args_list)
    per_call: dict[str, list[float]] = {}
    clock = time.perf_counter
    total = 0.0
    for name, method, args in calls:
        t0 = clock()
        result = method(*args)
        if inspect.isawaitable(result):
            await result
        elapsed = clock() - t0
        total += elapsed
        per_call.setdefault(name, []).append(elapsed)
    return total, per_call


def _figures(
    events: list[Event],
    *,
    reports: list[BudgetReport],
    rounds: list[tuple[list[dict[str, Any]], str | None]],
    bus_seconds: float,
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
        ratio=bus_seconds / floor_seconds if floor_seconds else float("inf"),
        overhead_per_event=max(0.0, bus_seconds - floor_seconds) / len(events),
        callbacks=tuple(figures),
        per_period={name: series for name, series in per_period.items() if name in per_call},
    )


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
