"""A handler registered on the bus, with its policy and its running figures.

Counters live as plain slot attributes on the subscription so the dispatch
loop updates them with one attribute store each, never through a dict.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import msgspec

if TYPE_CHECKING:
    from ._bus import EventBus
    from ._events import Event
    from ._lanes import Lane

__all__ = ["DeliveryMode", "ErrorPolicy", "OverBudgetPolicy", "Subscription", "SubscriptionStats"]

DeliveryMode = Literal["inline", "lane"]
ErrorPolicy = Literal["log", "raise", "disable"]
OverBudgetPolicy = Literal["warn", "coalesce", "disable"]
HandlerState = Literal["normal", "coalescing", "disabled"]


class SubscriptionStats(msgspec.Struct, frozen=True, kw_only=True):
    """Lifetime figures of one subscription."""

    name: str
    mode: DeliveryMode
    calls: int
    failed: int
    timed_out: int
    skipped: int
    queued: int
    state: HandlerState


def _is_async_callable(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 (async __call__ on objects)
    return call is not None and inspect.iscoroutinefunction(call)


def handler_name(handler: Callable[..., Any]) -> str:
    """A readable name for diagnostics: ``module.qualname`` of the function or class."""
    target = handler if hasattr(handler, "__qualname__") else type(handler)
    qualname = getattr(target, "__qualname__", repr(target))
    module = getattr(target, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


class Subscription:
    """One handler on one bus. ``cancel()`` stops deliveries from the next batch on."""

    __slots__ = (
        "_bus",
        "active",
        "barrier",
        "blocking",
        "budget",
        "calls",
        "failed",
        "faults",
        "fine_calls",
        "fine_total",
        "handler",
        "index",
        "is_async",
        "lane",
        "max_faults",
        "mode",
        "name",
        "on_error",
        "order",
        "over_budget",
        "p_calls",
        "p_faults",
        "p_max",
        "p_skipped",
        "p_timeouts",
        "p_total",
        "per_call",
        "skipped",
        "state",
        "state_reason",
        "timed_out",
        "timeout",
        "types",
    )

    def __init__(
        self,
        bus: EventBus,
        types: tuple[type[Event], ...],
        handler: Callable[..., Any],
        *,
        name: str,
        index: int,
        order: int,
        mode: DeliveryMode,
        timeout: float,
        on_error: ErrorPolicy,
        max_faults: int,
        blocking: bool,
        budget: float | None,
        over_budget: OverBudgetPolicy,
        barrier: bool = False,
    ) -> None:
        self._bus = bus
        self.types = types
        self.handler = handler
        self.name = name
        self.index = index
        self.order = order
        self.mode: DeliveryMode = mode
        self.timeout = timeout
        self.on_error: ErrorPolicy = on_error
        self.max_faults = max_faults
        self.blocking = blocking
        self.is_async = _is_async_callable(handler)
        self.budget = budget
        self.over_budget: OverBudgetPolicy = over_budget
        self.barrier = barrier
        self.lane: Lane | None = None
        self.active = True
        self.state: HandlerState = "normal"
        self.state_reason = ""
        # Lifetime counters.
        self.calls = 0
        self.failed = 0
        self.timed_out = 0
        self.skipped = 0
        self.faults = 0  # faults since the handler was last (re-)enabled
        # Current health-check period.
        self.p_calls = 0
        self.p_total = 0.0
        self.p_max = 0.0
        self.p_timeouts = 0
        self.p_faults = 0
        self.p_skipped = 0
        # Timing mode: per call (exact) until calls prove cheap, then per batch.
        self.per_call = True
        self.fine_calls = 0
        self.fine_total = 0.0

    def matches(self, event_type: type[Event]) -> bool:
        return issubclass(event_type, self.types)

    def cancel(self) -> None:
        """Stop delivering to this handler (events it is handling now still finish)."""
        if self.active:
            self.active = False
            self._bus._unsubscribe(self)

    def enable(self) -> None:
        """Resume deliveries to a handler that was disabled by faults or budget."""
        self._bus._set_state(self, "normal", "enabled by the user")

    @property
    def queued(self) -> int:
        return self.lane.queued if self.lane is not None else 0

    def stats(self) -> SubscriptionStats:
        return SubscriptionStats(
            name=self.name,
            mode=self.mode,
            calls=self.calls,
            failed=self.failed,
            timed_out=self.timed_out,
            skipped=self.skipped,
            queued=self.queued,
            state=self.state,
        )

    def __repr__(self) -> str:
        return f"<Subscription {self.name!r} {self.mode} order={self.order} {self.state}>"
