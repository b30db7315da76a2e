"""Health-check periods: once a period, each handler's ``Counters`` become a tick and a
``BudgetReport``, and the policy acts on those over budget (nothing is done per event)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ._clock import Clock
from ._events import BudgetReport, Event, HandlerUsage, HealthCheckTick
from ._logging import get_logger
from ._policy import Policy, cost_text, duration_text
from ._subscription import Subscription

__all__ = ["Periods", "close_period"]

_log = get_logger("eventbus")


class Periods:
    """The bus's health-check periods, ``length`` seconds each on ``clock``."""

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
        """Close the period that ended by ``now``: a tick and a budget report. A gap of
        many periods (a suspended machine) is closed as one idle stretch, not per period."""
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
        """The bus closes: the unfinished period's report, if it has begun (periods that
        ended meanwhile are closed first)."""
        self.roll(now)
        if now > self.start:
            return self.report(self.start, now, partial=True)
        return None

    def report(self, start: float, end: float, *, partial: bool = False) -> BudgetReport:
        """The budget report of ``[start, end)``; the policy acts (unless ``partial``), and
        one warning names the worst over budget."""
        subs = self._subs()
        report, usages = close_period(
            subs, self.index, start, end, self.budget, period=self.length, partial=partial
        )
        length = judged_length(start, end, self.length, partial=partial)
        if not partial:  # at close, a policy would change nothing
            for sub, usage in zip(subs, usages, strict=True):
                self._policy.budget_verdict(sub, usage, length)
        if report.over_budget or report.total > report.budget:
            worst = sorted(report.handlers, key=lambda u: u.total, reverse=True)[:3]
            _log.warning(
                f"callbacks over budget: {over_budget_text(report, length)}",
                period=report.period,
                total=round(report.total, 6),
                budget=round(report.budget, 6),
                worst={u.handler: round(u.total, 6) for u in worst},
            )
        return report


_NAMED = 3


def over_budget_text(report: BudgetReport, length: float) -> str:
    """The warning's words: the handlers over budget, costliest first, with what each
    took and its budget; and all together, if only that was over."""
    over = sorted(
        (u for u in report.handlers if u.over_budget), key=lambda u: u.total, reverse=True
    )
    parts = [f"{u.handler} took {cost_text(u.total, u.budget, length)}" for u in over[:_NAMED]]
    if len(over) > _NAMED:
        parts.append(f"and {len(over) - _NAMED} more (see the period's BudgetReport)")
    named = math.fsum(u.total for u in over[:_NAMED])
    if report.total > report.budget >= named:  # the named alone do not explain it
        together = f"all together {cost_text(report.total, report.budget, length)}"
        if not over:  # none over its own budget: name who spent most of it
            costliest = sorted(report.handlers, key=lambda u: u.total, reverse=True)[:_NAMED]
            together += ", most by " + ", ".join(
                f"{u.handler} ({duration_text(u.total)})" for u in costliest
            )
        parts.append(together)
    where = f"period {report.period}"
    if report.partial:
        where += f", the last, cut short after {duration_text(report.end - report.start)}"
    return f"{'; '.join(parts)} ({where})"


def judged_length(start: float, end: float, period: float, *, partial: bool) -> float:
    """The length a period's budget is a share of: a whole period's for a ``partial`` one."""
    length = end - start
    return max(length, period) if partial else length


def close_period(
    subs: Sequence[Subscription],
    index: int,
    start: float,
    end: float,
    bus_budget: float,
    *,
    period: float,
    partial: bool = False,
) -> tuple[BudgetReport, list[HandlerUsage]]:
    """The report of period ``index`` and each subscription's usage in it; period counters
    join the lifetime ones. A handler's time past the period's length is carried into the
    next, so no report has a handler busy longer than the period."""
    span = end - start
    length = judged_length(start, end, period, partial=partial)
    usages = []
    reported = []
    total = 0.0
    for sub in subs:
        counters = sub.counters
        carried = counters.period_total - span if counters.period_total > span else 0.0
        counters.period_total -= carried
        budget = (sub.budget if sub.budget is not None else bus_budget) * length
        usage = HandlerUsage(
            handler=sub.name,
            calls=counters.period_calls,
            total=counters.period_total,
            max=counters.period_max,
            timeouts=counters.period_timeouts,
            faults=counters.period_faults,
            skipped=counters.period_skipped,
            budget=budget,
            over_budget=counters.period_total > budget,
        )
        usages.append(usage)
        if usage.calls or usage.total or usage.skipped or usage.faults or usage.timeouts:
            reported.append(usage)
        total += counters.period_total
        counters.close_period()
        counters.period_total = carried
    report = BudgetReport(
        period=index,
        start=start,
        end=end,
        budget=bus_budget * length,
        total=total,
        fraction=total / length if length > 0 else 0.0,
        handlers=tuple(reported),
        over_budget=tuple(u.handler for u in reported if u.over_budget),
        partial=partial,
    )
    return report, usages
