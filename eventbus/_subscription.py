"""A handler registered on the bus: what it asked for, and what it has cost (``Counters``,
added to once per batch). It reaches the bus only through its ``Owner``."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, Protocol

import msgspec

from ._events import Event
from ._options import DEFAULT_PROBATION, Faults, Probation, Seconds, Share
from .options import checked

__all__ = [
    "Counters",
    "DeliveryMode",
    "ErrorPolicy",
    "HandlerState",
    "OverBudgetPolicy",
    "Owner",
    "Subscription",
    "SubscriptionStats",
    "attacher_of",
    "handler_name",
    "is_async_callable",
]

DeliveryMode = Literal["inline", "lane"]
ErrorPolicy = Literal["log", "raise", "disable"]
OverBudgetPolicy = Literal["warn", "coalesce", "disable"]
HandlerState = Literal["normal", "coalescing", "disabled"]


class SubscriptionStats(msgspec.Struct, frozen=True, kw_only=True):
    """What one subscription did since it was made (``Subscription.stats()``).

    Attributes:
        name: The handler's name.
        delivery: ``"inline"`` or ``"lane"``.
        calls: Calls made, failed and timed-out ones included.
        failed: Calls that raised.
        timed_out: Calls past their deadline.
        skipped: Deliveries not made (disabled, coalescing, or cut short by faults).
        queued: Deliveries waiting in its lane.
        state: ``"normal"``, ``"coalescing"`` or ``"disabled"``.
        total: Seconds spent in the handler.
        max: Its longest call, in seconds.
    """

    name: str
    delivery: DeliveryMode
    calls: int
    failed: int
    timed_out: int
    skipped: int
    queued: int
    state: HandlerState
    total: float = 0.0
    max: float = 0.0


#: Calls a handler is timed one by one before it may be timed per batch.
CALIBRATION_CALLS = 256
#: A mean call under this (seconds) is cheap: a clock read costs a good part of it.
CHEAP_CALL = 2e-6


class Counters:
    """What one handler has cost: over its life, and in the current health-check period
    (``period_*``). A period's time joins the lifetime figures when it closes."""

    __slots__ = (
        "calls",
        "failed",
        "faults_since_enabled",
        "past_max",
        "past_total",
        "period_calls",
        "period_faults",
        "period_max",
        "period_skipped",
        "period_timeouts",
        "period_total",
        "periods_in_state",
        "skipped",
        "timed_out",
        "timed_per_call",
    )

    def __init__(self) -> None:
        #: Whether each call is timed (else each batch).
        self.timed_per_call = True
        # Lifetime.
        self.calls = 0
        self.failed = 0
        self.timed_out = 0
        self.skipped = 0
        self.faults_since_enabled = 0  # towards ``max_faults``
        self.periods_in_state = 0  # periods closed since the state changed: ``probation``
        self.past_total = 0.0  # time in the handler in the periods closed so far
        self.past_max = 0.0
        # Current health-check period.
        self.period_calls = 0
        self.period_total = 0.0
        self.period_max = 0.0
        self.period_timeouts = 0
        self.period_faults = 0
        self.period_skipped = 0

    @property
    def total(self) -> float:
        return self.past_total + self.period_total

    @property
    def max(self) -> float:
        return max(self.past_max, self.period_max)

    def add_batch(self, calls: int, total: float, longest: float) -> None:
        """Add a batch: ``calls`` calls that took ``total`` seconds, the longest ``longest``.

        After calibration, a handler cheaper than ``CHEAP_CALL`` a call has its next batch
        timed as a whole: a clock read per call would cost more (docs/performance.md).
        """
        self.calls += calls
        self.period_calls += calls
        self.period_total += total
        if longest > self.period_max:
            self.period_max = longest
        self.timed_per_call = self.calls < CALIBRATION_CALLS or total >= CHEAP_CALL * calls

    def add_failure(self) -> int:
        """A call raised; returns the period's count (the policy logs the first)."""
        self.failed += 1
        self.period_faults += 1
        return self.period_faults

    def add_timeout(self) -> int:
        """A call overran its deadline; returns the period's count."""
        self.timed_out += 1
        self.period_timeouts += 1
        return self.period_timeouts

    def skip(self, count: int) -> None:
        """``count`` deliveries were not made (disabled, coalesced, or cut short)."""
        self.skipped += count
        self.period_skipped += count

    def close_period(self) -> None:
        """Add the period's time to the lifetime figures and start a new period."""
        self.periods_in_state += 1
        self.past_total += self.period_total
        self.past_max = max(self.past_max, self.period_max)
        self.period_calls = self.period_timeouts = self.period_faults = self.period_skipped = 0
        self.period_total = self.period_max = 0.0


class Owner(Protocol):
    """What a subscription asks of whoever keeps it (the bus's registry)."""

    def cancel(self, sub: Subscription) -> None: ...

    def enable(self, sub: Subscription) -> None: ...

    def queued(self, sub: Subscription) -> int: ...


def is_async_callable(handler: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 (async __call__ on objects)
    return call is not None and inspect.iscoroutinefunction(call)


def handler_name(handler: Callable[..., Any]) -> str:
    """``module.qualname`` of the function or class, for diagnostics."""
    target = handler if hasattr(handler, "__qualname__") else type(handler)
    qualname = getattr(target, "__qualname__", repr(target))
    module = getattr(target, "__module__", None)
    return f"{module}.{qualname}" if module else qualname


def attacher_of(obj: object) -> Callable[[Any, list[Any]], Any] | None:
    """The class's ``__eventbus_attach__(bus, callbacks)``, if it has one: how training
    callbacks attach through a gathering without the bus knowing the training layer."""
    attach: Callable[[Any, list[Any]], Any] | None = getattr(type(obj), "__eventbus_attach__", None)
    return attach


class Subscription:
    """One handler on one bus. ``cancel()`` stops deliveries from the next batch on."""

    __slots__ = (
        "_owner",
        "active",
        "barrier",
        "blocking",
        "budget",
        "counters",
        "delivery",
        "handler",
        "index",
        "is_async",
        "max_faults",
        "name",
        "on_error",
        "order",
        "over_budget",
        "probation",
        "state",
        "state_by_budget",
        "state_reason",
        "timeout",
        "types",
    )

    def __init__(
        self,
        owner: Owner,
        event_types: type[Event] | Iterable[type[Event]],
        handler: Callable[..., Any],
        *,
        name: str | None,
        index: int,
        order: int,
        delivery: DeliveryMode,
        timeout: float,
        on_error: ErrorPolicy,
        max_faults: int,
        blocking: bool,
        budget: float | None,
        over_budget: OverBudgetPolicy,
        barrier: bool = False,
        probation: int = DEFAULT_PROBATION,
    ) -> None:
        types = (event_types,) if isinstance(event_types, type) else tuple(event_types)
        if not types or not all(isinstance(t, type) and issubclass(t, Event) for t in types):
            raise TypeError(f"event_types must be Event subclasses, got {event_types!r}")
        self.types = types
        if attacher_of(handler) is not None:
            raise TypeError(
                f"{handler!r} is a training callback, not a bus handler: attach it as a run does, "
                "with handlers.attach_user_callbacks(bus, [callback]) "
                "(open_run and eventbus.testing.replay_log do it for you)"
            )
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {handler!r}")
        if delivery not in ("inline", "lane"):
            raise ValueError(f"delivery must be 'inline' or 'lane', got {delivery!r}")
        if on_error not in ("log", "raise", "disable"):
            raise ValueError(f"on_error must be 'log', 'raise' or 'disable', got {on_error!r}")
        if over_budget not in ("warn", "coalesce", "disable"):
            raise ValueError(
                f"over_budget must be 'warn', 'coalesce' or 'disable', got {over_budget!r}"
            )
        checked("timeout", timeout, Seconds)
        checked("budget", budget, Share | None)
        checked("max_faults", max_faults, Faults)
        checked("probation", probation, Probation)
        self._owner = owner
        self.handler = handler
        self.name = name = name or handler_name(handler)
        self.index = index
        self.order = order
        self.delivery: DeliveryMode = delivery
        self.timeout = timeout
        self.on_error: ErrorPolicy = on_error
        self.max_faults = max_faults
        self.blocking = blocking
        self.is_async = is_async_callable(handler)
        if blocking and self.is_async:
            raise ValueError(f"{name}: blocking=True is for sync handlers; this one is async")
        self.budget = budget
        self.over_budget: OverBudgetPolicy = over_budget
        self.probation = probation
        self.barrier = barrier
        self.active = True
        self.state: HandlerState = "normal"
        self.state_reason = ""
        #: Whether the budget policy set the state (it alone lifts it).
        self.state_by_budget = False
        self.counters = Counters()

    def cancel(self) -> None:
        """Stop delivering to this handler (events it is handling now still finish)."""
        if self.active:
            self.active = False
            self._owner.cancel(self)

    def enable(self) -> None:
        """Resume deliveries to a handler that was disabled by faults or budget."""
        self._owner.enable(self)

    def make_async(self, handler: Callable[[Any], Awaitable[Any]]) -> None:
        """From now on call ``handler``, an async wrapper of the handler."""
        self.handler = handler
        self.is_async = True

    def change_state(self, state: HandlerState, reason: str, *, by_budget: bool = False) -> bool:
        """Move to ``state``; False if already there. Re-enabling forgives faults."""
        if self.state == state:
            return False
        self.state = state
        self.state_reason = reason
        self.state_by_budget = by_budget
        self.counters.periods_in_state = 0
        if state == "normal":
            self.counters.faults_since_enabled = 0  # re-enabled: its past faults are forgiven
        return True

    @property
    def queued(self) -> int:
        return self._owner.queued(self)

    def stats(self) -> SubscriptionStats:
        counters = self.counters
        return SubscriptionStats(
            name=self.name,
            delivery=self.delivery,
            calls=counters.calls,
            failed=counters.failed,
            timed_out=counters.timed_out,
            skipped=counters.skipped,
            queued=self.queued,
            state=self.state,
            total=counters.total,
            max=counters.max,
        )

    def __repr__(self) -> str:
        return f"<Subscription {self.name!r} {self.delivery} order={self.order} {self.state}>"
