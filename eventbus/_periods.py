"""Health-check periods: each handler's time per period against its budget.

The runners add each batch to its subscription's ``Counters``; once a
period, ``Periods`` turns the period's counters into a ``HealthCheckTick``
and a ``BudgetReport``, has the policy act on the handlers over budget, and
starts the next period. Nothing of this is done per event.

A period ends when the bus clock passes its end: noticed by the dispatcher
when it takes a batch, by a clock listener (virtual clocks), or by the
ticker task while nothing is published.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ._clock import Clock
from ._events import BudgetReport, Event, HandlerUsage, HealthCheckTick
from ._logging import get_logger
from ._policy import Policy
from ._subscription import Subscription

__all__ = ["Periods", "close_period"]

_log = get_logger("eventbus")


class Periods:
    """The bus's health-check periods, ``length`` seconds each on ``clock``.

    ``subs`` gives the subscriptions in delivery order (the order of the
    report); ``emit`` publishes the tick and the report; ``budget`` is the
    share of a period all handlers may use together.
    """

    __slots__ = ("_clock", "_emit", "_policy", "_subs", "budget", "end", "index", "length", "start")

    def __init__(
        self,
        clock: Clock,
        length: float,
        budget: float,
        *,
        subs: Callable[[], Sequence[Subscription]],
        emit: Callable[[Event], None],
        policy: Policy,
    ) -> None:
        self._clock = clock
        self.length = length
        self.budget = budget
        self._subs = subs
        self._emit = emit
        self._policy = policy
        self.index = 0
        self.start = 0.0
        self.end = math.inf

    def begin(self, now: float) -> None:
        """The bus started: the first period starts ``now``."""
        self.start = now
        self.end = now + self.length

    async def ticker(self) -> None:
        """Ends periods while nothing is published (the dispatcher ends them otherwise)."""
        while True:
            end = self.end
            await self._clock.sleep_until(end)
            if self.end == end:
                self.roll(self._clock.now())

    def roll(self, now: float) -> None:
        """Close the period that ended by ``now``: a tick and a budget report.

        However far ``now`` is past its end (a machine suspended, a log's jump in
        time), that costs at most two reports: the whole periods after it, in which
        nothing was dispatched, are closed as one idle stretch up to the start of
        the period ``now`` falls in. So a gap never turns into work per period.
        """
        if not now >= self.end:  # also for a NaN
            return
        start = self._close(self.start, self.end)
        if now >= start + self.length:
            idle_end = start + math.floor((now - start) / self.length) * self.length
            if not start < idle_end <= now:  # times too large for the period's precision
                idle_end = now
            start = self._close(start, idle_end)
        self.start = start
        # Past 2**53 periods a sum no longer moves: the next float keeps periods ending.
        self.end = max(start + self.length, math.nextafter(start, math.inf))

    def _close(self, start: float, end: float) -> float:
        """Emit the tick and the report of ``[start, end)``; the next period's start."""
        self._emit(HealthCheckTick(period=self.index, start=start, end=end))
        self._emit(self.report(start, end))
        self.index += 1
        return end

    def cut(self, now: float) -> BudgetReport | None:
        """The bus closes: the unfinished period's report, if the period has begun."""
        if now > self.start:
            return self.report(self.start, now, partial=True)
        return None

    def report(self, start: float, end: float, *, partial: bool = False) -> BudgetReport:
        """The budget report of ``[start, end)``; the policy acts on the handlers over
        budget (unless ``partial``), and one warning names the worst of them."""
        subs = self._subs()
        report, over = close_period(
            subs, self.index, start, end, self.budget, period=self.length, partial=partial
        )
        if not partial:  # at close, a policy would change nothing
            for sub in subs:
                self._policy.budget_verdict(sub, sub in over)
        if report.over_budget or report.total > report.budget:
            worst = sorted(report.handlers, key=lambda u: u.total, reverse=True)[:3]
            _log.warning(
                "callbacks over budget",
                period=report.period,
                total=round(report.total, 6),
                budget=round(report.budget, 6),
                worst={u.handler: round(u.total, 6) for u in worst},
            )
        return report


def close_period(
    subs: Sequence[Subscription],
    index: int,
    start: float,
    end: float,
    bus_budget: float,
    *,
    period: float | None = None,
    partial: bool = False,
) -> tuple[BudgetReport, set[Subscription]]:
    """The report of period ``index`` and the subscriptions over their budget;
    each subscription's period counters are added to its lifetime ones.

    A handler's budget is its own share of the period if it has one, else
    the bus's; the bus's budget applies to all handlers together. A
    ``partial`` period (the last one, cut short when the bus closed) is
    judged against the budget of a whole ``period``: its own length may be
    microseconds, and a share of that would call any callback over budget.
    """
    length = end - start
    if partial and period is not None:
        length = max(length, period)
    usages = []
    over: set[Subscription] = set()
    total = 0.0
    for sub in subs:
        counters = sub.counters
        budget = (sub.budget if sub.budget is not None else bus_budget) * length
        is_over = counters.period_total > budget
        if (
            counters.period_calls
            or counters.period_skipped
            or counters.period_faults
            or counters.period_timeouts
        ):
            usages.append(
                HandlerUsage(
                    handler=sub.name,
                    calls=counters.period_calls,
                    total=counters.period_total,
                    max=counters.period_max,
                    timeouts=counters.period_timeouts,
                    faults=counters.period_faults,
                    skipped=counters.period_skipped,
                    budget=budget,
                    over_budget=is_over,
                )
            )
        if is_over:
            over.add(sub)
        total += counters.period_total
        counters.close_period()
    report = BudgetReport(
        period=index,
        start=start,
        end=end,
        budget=bus_budget * length,
        total=total,
        fraction=total / length if length > 0 else 0.0,
        handlers=tuple(usages),
        over_budget=tuple(u.handler for u in usages if u.over_budget),
        partial=partial,
    )
    return report, over
