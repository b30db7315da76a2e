"""What a bench's passes add up to: the figures ``eventbus bench`` prints and writes
(docs/guides/benchmarking.md). Every figure's name carries its unit."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from eventbus import BudgetReport, HandlerStateChanged

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


def bench_result(
    *,
    events: int,
    rounds: int,
    reports: Sequence[BudgetReport],
    start: float,
    period: float,
    budget: float,
    timings: Timings,
    per_call: dict[str, list[float]],
    faults: dict[str, int],
    first_errors: dict[str, str],
    short: dict[str, str],
    metrics: Sequence[str],
    changes: Sequence[tuple[int, HandlerStateChanged]],
    policies: Mapping[str, str],
) -> BenchResult:
    """The figures of the measured pass's budget reports and of the timed runs.

    ``short``: the callbacks the bus did not give every delivery, and why (the runtime's
    cost per event is then not measured). Mean shares are of the run's time, so a
    partial period is neither lost nor blown up."""
    reports = sorted(reports, key=lambda r: (r.partial, r.start))
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
    for holds_from, change in changes:
        states.setdefault(change.handler, []).append(
            StateChange(period=holds_from, state=change.state, reason=change.reason)
        )
    callbacks = []
    for name, durations in per_call.items():
        if not durations:
            continue
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
                faults=faults.get(name, 0),
                first_error=first_errors.get(name, ""),
                bus_faults=used.faults,
                bus_skipped=used.skipped,
                bus_note=short.get(name, ""),
                over_budget=policies.get(name, "warn"),
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
        rounds=rounds,
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
        metrics=tuple(metrics),
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
