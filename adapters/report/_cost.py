"""What the callbacks cost over a run, from its budget reports, in bounded memory.

The bus writes one ``BudgetReport`` per health-check period: for each
handler its calls, total time, longest call, timeouts, faults and skipped
(coalesced) deliveries. That is all a log keeps of the cost, so the
per-call percentiles here are those of each period's mean call, weighted by
its calls (on a log scale of 16 steps an octave, so within 4.5%); the
longest call is exact. ``eventbus bench`` times every call and gives exact
percentiles instead.
"""

from __future__ import annotations

import math

from eventbus import BudgetReport, HandlerStateChanged

from ._limits import MAX_HANDLERS, MAX_LABEL, MAX_SPANS, clip
from ._series import SeriesGroup

__all__ = [
    "ALL_CALLBACKS",
    "BUDGET",
    "CallbackCost",
    "CostDigest",
    "Span",
    "weighted_quantile",
]

#: The series of the cost chart that is not one handler.
ALL_CALLBACKS = "all handlers"
BUDGET = "budget"
OTHER_HANDLERS = "(other handlers)"
#: Histogram steps per octave of the mean call time (2 ** (1/16): 4.4% apart).
STEPS = 16


class CallbackCost:
    """One handler over the run: the figures of its table row."""

    __slots__ = (
        "budget_pct",
        "calls",
        "faults",
        "histogram",
        "longest",
        "name",
        "periods",
        "periods_over",
        "skipped",
        "timeouts",
        "total",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0
        self.total = 0.0
        self.longest = 0.0
        self.timeouts = 0
        self.faults = 0
        self.skipped = 0
        self.periods = 0
        self.periods_over = 0
        self.budget_pct = 0.0
        #: log-scale step of a period's mean call -> calls at that mean
        self.histogram: dict[int, int] = {}

    @property
    def mean(self) -> float:
        return self.total / self.calls if self.calls else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the call time, each period's calls at its mean."""
        return weighted_quantile(self.histogram, q)


def weighted_quantile(histogram: dict[int, int], q: float) -> float:
    """The ``q`` quantile (0..1) of a log-scale histogram: the middle of its step."""
    weight = sum(histogram.values())
    if not weight:
        return 0.0
    target = q * weight
    seen = 0
    step = 0
    for step in sorted(histogram):
        seen += histogram[step]
        if seen >= target:
            break
    return float(2.0 ** ((step + 0.5) / STEPS))


class Span:
    """Periods during which a handler was disabled or coalescing (``end`` None: to the
    end of the run)."""

    __slots__ = ("end", "handler", "reason", "start", "state")

    def __init__(self, handler: str, state: str, start: int, reason: str) -> None:
        self.handler = handler
        self.state = state
        self.start = start
        self.end: int | None = None
        self.reason = reason


class CostDigest:
    """Every budget report of a run, added up: per handler, per period, in total."""

    def __init__(self, buckets: int) -> None:
        self.handlers: dict[str, CallbackCost] = {}
        #: Each handler's share of every period (%), the total, the budget line.
        self.shares = SeriesGroup(buckets)
        self._all = self.shares.series(ALL_CALLBACKS)
        self._budget = self.shares.series(BUDGET)
        #: Timeouts, faults and skipped deliveries per period (their sums per bucket).
        self.incidents = SeriesGroup(buckets)
        self._incidents = tuple(
            self.incidents.series(kind) for kind in ("timeouts", "faults", "skipped")
        )
        self.periods = 0
        self.partial_periods = 0
        self.periods_over = 0
        self.timeline = 0.0  # seconds of periods, each judged as the bus judged it
        self.period_length = 0.0  # the recorded bus's period (a whole one's length)
        self.last_period = -1
        self.spans: list[Span] = []
        self.spans_dropped = 0
        self._open_spans: dict[str, Span] = {}

    def add_report(self, report: BudgetReport) -> None:
        length = report.end - report.start
        if not report.partial and length > 0 and not self.period_length:
            self.period_length = length
        judged = max(length, self.period_length)
        if not judged > 0 or not math.isfinite(judged):
            return  # an empty period: no time to share
        self.periods += 1
        self.partial_periods += report.partial
        self.periods_over += report.total > report.budget
        self.timeline += judged
        period = report.period
        self.last_period = max(self.last_period, period)
        shares = self.shares
        shares.add(self._all, period, report.total / judged * 100.0)
        shares.add(self._budget, period, report.budget / judged * 100.0)
        timeouts = faults = skipped = 0
        folded = -1.0  # the handlers past MAX_HANDLERS, added up as one
        for usage in report.handlers:
            cost = self._cost(clip(usage.handler))
            cost.calls += usage.calls
            cost.total += usage.total
            cost.longest = max(cost.longest, usage.max)
            cost.timeouts += usage.timeouts
            cost.faults += usage.faults
            cost.skipped += usage.skipped
            cost.periods += 1
            cost.periods_over += usage.over_budget
            cost.budget_pct = usage.budget / judged * 100.0
            if usage.calls > 0 and 0 < usage.total < math.inf:
                step = math.floor(math.log2(usage.total / usage.calls) * STEPS)
                cost.histogram[step] = cost.histogram.get(step, 0) + usage.calls
            if cost.name == OTHER_HANDLERS:
                folded = max(folded, 0.0) + usage.total
            else:
                shares.add(shares.series(cost.name), period, usage.total / judged * 100.0)
            timeouts += usage.timeouts
            faults += usage.faults
            skipped += usage.skipped
        if folded >= 0:
            shares.add(shares.series(OTHER_HANDLERS), period, folded / judged * 100.0)
        for index, count in zip(self._incidents, (timeouts, faults, skipped), strict=True):
            if count:
                self.incidents.add(index, period, float(count))

    def _cost(self, name: str) -> CallbackCost:
        cost = self.handlers.get(name)
        if cost is None:
            if len(self.handlers) >= MAX_HANDLERS:
                name = OTHER_HANDLERS
                cost = self.handlers.get(name)
            if cost is None:
                cost = self.handlers[name] = CallbackCost(name)
        return cost

    def state_changed(self, event: HandlerStateChanged) -> None:
        """A handler was disabled, started coalescing, or went back to normal: spans of
        the period it happened in (the one after the last reported)."""
        period = self.last_period + 1
        handler = clip(event.handler)
        open_span = self._open_spans.pop(handler, None)
        if open_span is not None:
            open_span.end = period
        if event.state == "normal":
            return
        if len(self.spans) >= MAX_SPANS:
            self.spans_dropped += 1
            return
        span = Span(handler, event.state, period, clip(event.reason, MAX_LABEL))
        self.spans.append(span)
        self._open_spans[handler] = span

    def ranked(self) -> list[CallbackCost]:
        """The handlers, the costliest first."""
        return sorted(self.handlers.values(), key=lambda cost: (-cost.total, cost.name))
