"""What ``eventbus bench`` measures: a stack of callbacks' overhead, per health-check period.

A workload (synthetic, or events read from a recorded log) is driven through
a real bus with the callbacks attached as in a run, under a
``FastForwardClock``: idle gaps between events are skipped, so periods follow
the workload's timeline while every call costs what it really costs. The
budget reports of that run give each callback's share of each period.
The same rounds are then fed to the callbacks directly, in a plain loop,
timing each call: that is the floor (what the callbacks cost with no runtime
around them) and the source of the per-call distribution (mean, p50, p99).
The timings (through the bus, with nothing attached, the floor) are taken
``repeats`` times, interleaved, so that the figures say how sure they are;
``_bench_figures`` turns it all into a ``BenchResult``.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable, Sequence
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
    FastForwardClock,
    Report,
    RoundGathered,
    RunFinished,
    RunStarted,
    Stage,
    TrainRunContext,
    WorkerFailure,
    is_derived,
)
from eventbus.log import BUS_DIAGNOSTICS
from eventbus.options import BusKeywords, OptionError, Options, Seconds, checked
from handlers import WorkerError
from handlers.options import WorldSize
from handlers.wiring import attach_user_callbacks, implemented_hooks

from ._bench_figures import BenchResult, Timings, bench_result
from ._common import callback_name, split_callbacks

__all__ = ["Workload", "run_bench", "synthetic_events"]

Progress = Callable[[float], None]


#: The most reports a synthetic workload makes: its events are built in memory.
MAX_REPORTS = 2_000_000


class Workload(Options, frozen=True, kw_only=True):
    """A synthetic run: ``world_size`` ranks reporting ``rate`` times a second each,
    each field checked against its range when made (as every option is).

    Attributes:
        world_size: ranks reporting.
        rate: reports per second of each rank.
        metrics: metrics per report.
        checkpoint_every: rounds between checkpoints (0: none).
        failure_rate: the chance that a report comes with a worker failure.
        duration: seconds of the run (``events`` instead: that many reports).
        seed: of the random metrics and times.
    """

    world_size: WorldSize = 8
    rate: Annotated[float, Meta(gt=0, le=1e6, description="number of reports a second")] = 10.0
    metrics: Annotated[int, Meta(ge=0, le=1000, description="whole number of metrics")] = 8
    checkpoint_every: Annotated[int, Meta(ge=0, le=MAX_REPORTS)] = 10
    failure_rate: Annotated[float, Meta(ge=0, le=1)] = 0.0
    duration: Seconds = 60.0
    events: Annotated[int, Meta(ge=1, le=MAX_REPORTS)] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        reports = self.events or self.world_size * max(1, int(self.duration * self.rate))
        if reports > MAX_REPORTS:
            raise OptionError(
                "duration",
                f"the workload would make {reports:,} reports (world_size {self.world_size} "
                f"x rate {self.rate:g}/s x duration {self.duration:g} s), more than "
                f"{MAX_REPORTS:,}: lower one of them, or give events",
            )


def synthetic_events(workload: Workload) -> list[Event]:
    """The events of a synthetic run, in time order, with their times set."""
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
    options: BusOptions | None = None,
    start: float | None = None,
    repeats: int = 5,
    progress: Progress | None = None,
    **keywords: Unpack[BusKeywords],
) -> BenchResult:
    """Benchmark fresh callbacks from ``make_callbacks`` on ``events`` (see the module doc).

    ``options`` (or its keywords: ``period``, ``budget``, ``timeout``, ...) are the
    bench bus's, checked before anything runs.
    ``start``: when the first period starts (a recorded log's bus start, so that
    periods fall where the run's did); the first event's time by default.
    ``repeats``: how many times each timing is taken, interleaved.
    """
    bus_options = BusOptions.build(options, **keywords)
    repeats = checked("repeats", repeats, Annotated[int, Meta(ge=1, le=1000)])
    # What a bus makes itself (ticks, budget reports, faults) is not workload: the
    # bench bus makes its own, and a recorded one would be counted as ours.
    workload = [e for e in events if not isinstance(e, (*BUS_DIAGNOSTICS, EventPlaceholder))]
    if not workload:
        raise ValueError("the workload has no events")
    begin = workload[0].time if start is None else min(start, workload[0].time)
    passes = 3 * repeats + 1  # for the progress bar: the first pass, then one step each
    done = 1

    def first(fraction: float) -> None:
        if progress is not None:
            progress(fraction / passes)

    def step() -> None:
        nonlocal done
        done += 1
        first(done)

    measured = anyio.run(
        _through_bus, make_callbacks(), workload, bus_options, begin, first if progress else None
    )
    workload = measured.published  # without the events this bus derives itself
    timings = Timings(bus=[measured.seconds])
    for run in range(repeats):
        # Fresh callbacks for each pass: stateful ones see the run once each time.
        if run:
            again = anyio.run(_through_bus, make_callbacks(), workload, bus_options, begin, None)
            timings.bus.append(again.seconds)
            step()
        # The same workload with nothing attached: what driving it costs, to take out.
        alone = anyio.run(_through_bus, [], workload, bus_options, begin, None)
        timings.baseline.append(alone.seconds)
        step()
        calls = _direct_calls(make_callbacks(), measured.rounds, workload)
        timings.floor.append(anyio.run(_floor, calls))
        step()
    per_call = anyio.run(_per_call, _direct_calls(make_callbacks(), measured.rounds, workload))
    step()
    return bench_result(
        events=len(workload),
        rounds=len(measured.rounds),
        reports=measured.reports,
        start=begin,
        period=bus_options.period,
        budget=bus_options.budget,
        timings=timings,
        per_call=per_call,
    )


Rounds = list[tuple[list[dict[str, Any]], str | None]]


class _Pass(NamedTuple):
    reports: list[BudgetReport]
    seconds: float
    rounds: Rounds
    published: list[Event]


async def _through_bus(
    callbacks: list[Any],
    events: list[Event],
    bus_options: BusOptions,
    start: float,
    progress: Progress | None,
) -> _Pass:
    """One pass through a bus, timed from the first publish until the last event is
    handled (starting and closing the bus are not the workload's cost). The bus
    closes at the workload's last event: its last period is partial, cut there,
    and no empty period follows the workload."""
    world_size = max((getattr(e, "world_size", 0) for e in events), default=0) or None
    training, plain = split_callbacks(callbacks)
    clock = _StartClock(start)
    reports: list[BudgetReport] = []
    rounds: Rounds = []
    async with EventBus(bus_options, clock=clock) as bus:
        clock.go()
        bus.subscribe(
            BudgetReport, reports.append, name="bench.budget_reports", order=Stage.OBSERVE
        )
        if training:
            attach_user_callbacks(bus, training, world_size=world_size)
            # The rounds, kept to feed the same ones to the floor loop: a subscriber
            # of the rounds like the callbacks, after them.
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
        for handler in plain:
            bus.subscribe(workload_types, handler, name=callback_name(handler))
        copies = [msgspec.structs.replace(e, seq=-1) for e in published]  # a bus stamps them
        started = time.perf_counter()
        await _drive(bus, clock, copies, progress)
        await bus.wait_idle()
        clock.set(max(e.time for e in published))  # the workload's timeline ends here
        await bus.wait_idle()
        seconds = time.perf_counter() - started
    return _Pass(reports, seconds, rounds, published)


class _StartClock(FastForwardClock):
    """A ``FastForwardClock`` that reads ``start`` until ``go()``: the bus begins its
    first period exactly there, not the microseconds later that real time would
    make it, so periods fall where the recorded run's did (events on a boundary
    included) and a synthetic workload's fall on round numbers."""

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


Call = tuple[str, Callable[..., Any], tuple[Any, ...]]


def _direct_calls(callbacks: list[Any], rounds: Rounds, events: list[Event]) -> list[Call]:
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
