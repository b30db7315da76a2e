"""Health-check periods: each handler's time per period against its budget.

The runners add each batch's figures to the subscriptions' ``Figures``
(``p_*``, one attribute store each); once a period, ``Periods`` turns them
into a ``HealthCheckTick`` and a ``BudgetReport``, has the policy act on the
handlers over budget, and starts the next period. The accounting itself
costs nothing per event.

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
    each subscription's period figures are folded into its lifetime ones.

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
        figures = sub.figures
        budget = (sub.budget if sub.budget is not None else bus_budget) * length
        is_over = figures.p_total > budget
        if figures.p_calls or figures.p_skipped or figures.p_faults or figures.p_timeouts:
            usages.append(
                HandlerUsage(
                    handler=sub.name,
                    calls=figures.p_calls,
                    total=figures.p_total,
                    max=figures.p_max,
                    timeouts=figures.p_timeouts,
                    faults=figures.p_faults,
                    skipped=figures.p_skipped,
                    budget=budget,
                    over_budget=is_over,
                )
            )
        if is_over:
            over.add(sub)
        total += figures.p_total
        figures.close_period()
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
