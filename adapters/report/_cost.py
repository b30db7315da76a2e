"""What the callbacks cost over a run, from its budget reports, in bounded memory. A period's
skips are put down to the one state the handler was in during it; under none or two, no cause."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from eventbus import BudgetReport, HandlerStateChanged, HealthCheckTick

from ._limits import MAX_HANDLERS, MAX_LABEL, MAX_SPANS, MAX_STATES, clip
from ._series import SeriesGroup

#: The series of the cost chart that is not one handler.
ALL_CALLBACKS = "all handlers"
LIBRARY_TOTAL = "the library's handlers together"
BUDGET = "budget"
OTHER_HANDLERS = "(other handlers)"

#: Why deliveries were skipped, as a log can tell it.
COALESCED = "coalesced"
DISABLED = "disabled"
FAULT_POLICY = "fault policy"
UNKNOWN_CAUSE = "unknown"
SKIP_CAUSES: dict[str, tuple[str, str]] = {
    COALESCED: ("skipped-coalesced", "coalesced"),
    DISABLED: ("skipped-disabled", "disabled"),
    FAULT_POLICY: ("skipped-fault-policy", "stopped by the fault policy"),
    UNKNOWN_CAUSE: ("skipped", ""),  # the log does not say: "skipped", no cause
}
#: The incidents marked on the cost chart, per period.
INCIDENTS = ("timeouts", "faults", *(kind for kind, _ in SKIP_CAUSES.values()))
#: Words of the fault policy's reasons (``3 faults (max_faults=3)``).
_FAULT_WORDS = re.compile(r"fault|on_error|the run ends")

#: Handlers the library subscribes itself, by exact name, and its packages' prefixes.
LIBRARY_NAMES = frozenset(
    {"state-store", "Reporter.sync", "bench.budget_reports", "bench.rounds", "bench.state_changes"}
)
LIBRARY_PREFIXES = ("eventbus.", "handlers.", "adapters.")


def is_library(name: str) -> bool:
    """Whether ``name`` is one of the library's own handlers, not a user's callback."""
    return name in LIBRARY_NAMES or name.startswith(LIBRARY_PREFIXES)


def skip_cause(state: str, reason: str) -> str | None:
    """The cause of the skips of a handler in ``state`` (None: normal, no skips)."""
    if state == "coalescing":
        return COALESCED
    if state == "disabled":
        if "budget" not in reason and _FAULT_WORDS.search(reason):
            return FAULT_POLICY
        return DISABLED
    return None


#: Histogram steps per octave of the mean call time.
STEPS = 16


@dataclass(slots=True)
class CallbackCost:
    """One handler over the run: the figures of its table row."""

    name: str
    calls: int = 0
    total: float = 0.0
    longest: float = 0.0
    timeouts: int = 0
    faults: int = 0
    skipped: int = 0
    skipped_by: dict[str, int] = field(default_factory=dict)
    periods: int = 0
    periods_over: int = 0
    #: Log-scale step of a period's mean call -> calls at that mean.
    histogram: dict[int, int] = field(default_factory=dict)

    @property
    def mean(self) -> float:
        return self.total / self.calls if self.calls else 0.0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the call time, each period's calls at its mean:
        the middle of its histogram step."""
        weight = sum(self.histogram.values())
        if not weight:
            return 0.0
        target = q * weight
        seen = 0
        step = 0
        for step in sorted(self.histogram):
            seen += self.histogram[step]
            if seen >= target:
                break
        return float(2.0 ** ((step + 0.5) / STEPS))


@dataclass(slots=True)
class Span:
    """Periods during which a handler was disabled or coalescing (``end`` None: to the end)."""

    handler: str
    state: str
    start: int
    reason: str
    end: int | None = None


class CostDigest:
    """Every budget report of a run, added up: per handler, per period, in total."""

    def __init__(self) -> None:
        self.handlers: dict[str, CallbackCost] = {}
        #: Each handler's share of every period (%), the total, the budget line.
        self.shares = SeriesGroup()
        self._all = self.shares.series(ALL_CALLBACKS)
        self._budget = self.shares.series(BUDGET)
        self._library = self.shares.series(LIBRARY_TOTAL)
        #: Timeouts, faults and skipped deliveries (by cause) per period.
        self.incidents = SeriesGroup()
        for kind in INCIDENTS:
            self.incidents.series(kind)
        self.periods = 0
        self.partial_periods = 0
        self.periods_over = 0
        self.timeline = 0.0  # seconds of periods, each judged as the bus judged it
        self.period_length = 0.0  # the recorded bus's period (a whole one's length)
        self.last_period = -1
        self.spans: list[Span] = []
        self.spans_dropped = 0
        self._open_spans: dict[str, Span] = {}
        #: The cause of each handler's skips now, and those of the open period.
        self._cause_now: dict[str, str] = {}
        self._causes: dict[str, set[str]] = {}
        self._followed: set[str] = set()
        #: The period whose tick came and whose report has not.
        self._closing: int | None = None

    def add_report(self, report: BudgetReport) -> None:
        length = report.end - report.start
        if not report.partial and length > 0 and not self.period_length:
            self.period_length = length
        judged = max(length, self.period_length)
        if not judged > 0 or not math.isfinite(judged):
            self._next_period()
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
        incidents = dict.fromkeys(INCIDENTS, 0)
        folded = -1.0  # the handlers past MAX_HANDLERS, added up as one
        library = 0.0
        for usage in report.handlers:
            name = clip(usage.handler)
            folded_into = name
            if name not in self.handlers and len(self.handlers) >= MAX_HANDLERS:
                folded_into = OTHER_HANDLERS  # the rest, added up as one
            cost = self.handlers.get(folded_into)
            if cost is None:
                cost = self.handlers[folded_into] = CallbackCost(folded_into)
            cost.calls += usage.calls
            cost.total += usage.total
            cost.longest = max(cost.longest, usage.max)
            cost.timeouts += usage.timeouts
            cost.faults += usage.faults
            cost.skipped += usage.skipped
            if usage.skipped:  # the one cause it was under in the period, else unknown
                causes = self._causes.get(name, ())
                cause = next(iter(causes)) if len(causes) == 1 else UNKNOWN_CAUSE
                cost.skipped_by[cause] = cost.skipped_by.get(cause, 0) + usage.skipped
                incidents[SKIP_CAUSES[cause][0]] += usage.skipped
            if is_library(name):
                library += usage.total
            cost.periods += 1
            cost.periods_over += usage.over_budget
            if usage.calls > 0 and 0 < usage.total < math.inf:
                step = math.floor(math.log2(usage.total / usage.calls) * STEPS)
                cost.histogram[step] = cost.histogram.get(step, 0) + usage.calls
            if cost.name == OTHER_HANDLERS:
                folded = max(folded, 0.0) + usage.total
            else:
                shares.add(shares.series(cost.name), period, usage.total / judged * 100.0)
            incidents["timeouts"] += usage.timeouts
            incidents["faults"] += usage.faults
        if folded >= 0:
            shares.add(shares.series(OTHER_HANDLERS), period, folded / judged * 100.0)
        if library > 0:
            shares.add(self._library, period, library / judged * 100.0)
        for kind, count in incidents.items():
            if count:
                self.incidents.add(self.incidents.series(kind), period, float(count))
        self._next_period()

    def _next_period(self) -> None:
        self._closing = None
        self._causes = {handler: {cause} for handler, cause in self._cause_now.items()}

    def new_bus(self) -> None:
        """A (resumed) process started: its handlers start normal."""
        self._cause_now.clear()
        self._next_period()

    def tick(self, event: HealthCheckTick) -> None:
        """Period ``event.period`` ended: changes until its report are its verdicts."""
        self._closing = event.period

    def state_changed(self, event: HandlerStateChanged) -> None:
        """A handler's state changed: spans from the period it holds from, and the cause
        of its skips."""
        period = self._closing + 1 if self._closing is not None else self.last_period + 1
        handler = clip(event.handler)
        cause = skip_cause(event.state, event.reason)
        if handler in self._followed or len(self._followed) < MAX_STATES:  # else: no cause
            self._followed.add(handler)
            if cause is None:
                self._cause_now.pop(handler, None)
            else:
                self._cause_now[handler] = cause
                if self._closing is None:  # not a verdict on the closed period: holds in this
                    self._causes.setdefault(handler, set()).add(cause)
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

    def ranked(self, *, library: bool | None = None) -> list[CallbackCost]:
        """The handlers, the costliest first (``library``: only the library's, or the user's)."""
        chosen = [c for c in self.handlers.values() if library in (None, is_library(c.name))]
        return sorted(chosen, key=lambda cost: (-cost.total, cost.name))
