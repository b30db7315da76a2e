"""Closing a health-check period: each handler's figures against its budget.

The counters live on the subscriptions (``p_*``), updated by the dispatch
loop with one attribute store each; this module turns them into a
``BudgetReport`` once a period and resets them.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._events import BudgetReport, Event, HandlerUsage
from ._subscription import Subscription

__all__ = ["close_period", "newest_per_type"]


def close_period(
    subs: Iterable[Subscription],
    index: int,
    start: float,
    end: float,
    bus_budget: float,
    *,
    period: float | None = None,
    partial: bool = False,
) -> tuple[BudgetReport, set[Subscription]]:
    """The report of period ``index`` and the subscriptions over their budget.

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
        budget = (sub.budget if sub.budget is not None else bus_budget) * length
        is_over = sub.p_total > budget
        if sub.p_calls or sub.p_skipped or sub.p_faults or sub.p_timeouts:
            usages.append(
                HandlerUsage(
                    handler=sub.name,
                    calls=sub.p_calls,
                    total=sub.p_total,
                    max=sub.p_max,
                    timeouts=sub.p_timeouts,
                    faults=sub.p_faults,
                    skipped=sub.p_skipped,
                    budget=budget,
                    over_budget=is_over,
                )
            )
        if is_over:
            over.add(sub)
        total += sub.p_total
        sub.p_calls = sub.p_timeouts = sub.p_faults = sub.p_skipped = 0
        sub.p_total = sub.p_max = 0.0
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


def newest_per_type(events: list[Event], sub: Subscription) -> list[Event]:
    """Coalescing: keep only the newest event of each type, counting the rest as skipped."""
    newest: dict[type[Event], Event] = {}
    for event in events:
        newest[type(event)] = event
    kept = sorted(newest.values(), key=lambda e: e.seq)
    skipped = len(events) - len(kept)
    sub.skipped += skipped
    sub.p_skipped += skipped
    return kept
