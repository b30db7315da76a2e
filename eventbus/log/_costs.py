"""Charging handlers a cost in a replay, so that a budget policy can be tested
(docs/guides/testing.md): a charged call advances the virtual clock by its cost, as a live
call of that length would take."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import anyio
import anyio.from_thread

from .._clock import VirtualClock
from .._events import Event
from .._options import MAX_SECONDS, OptionTypeError, WaitSeconds
from .._subscription import Subscription
from ..options import OptionError, checked

__all__ = ["Charges", "Costs"]

#: What handlers cost in a replay: seconds per call by handler name, a function of
#: (handler name, event), or ``"measured"`` (each call its own wall time).
Costs = Mapping[str, float] | Callable[[str, Event], float] | Literal["measured"]


class Charges:
    """Handlers' costs charged to a replay's virtual clock as each call ends.

    A cost function that raises cannot fail the handler it costs (the bus would blame
    the handler): the call is charged nothing, and ``error`` keeps it for the replay.
    """

    def __init__(self, costs: Costs, subs: Iterable[Subscription], clock: VirtualClock) -> None:
        """The charges ``costs`` asks for on ``subs``; ``OptionError`` before any event."""
        self.clock = clock
        self.error: BaseException | None = None
        self.wrapped: list[tuple[Subscription, Callable[[Any], Any], Callable[[Any], Any]]] = []
        self.cost_of: Callable[[Subscription, Event], float] = lambda sub, event: 0.0
        subs = tuple(subs)
        measured = isinstance(costs, str)
        if measured and costs != "measured":
            raise OptionError(
                "costs",
                f"costs must be seconds by handler name, a function of (handler name, "
                f"event) or 'measured', got {costs!r}",
            )
        if isinstance(costs, Mapping):
            fixed = _checked_costs(costs, subs)
            subs = tuple(sub for sub in subs if fixed.get(sub.name))
            for sub in subs:
                _check_deadline(sub, fixed[sub.name])
            self.cost_of = lambda sub, event: fixed.get(sub.name, 0.0)
        elif not measured:
            if not callable(costs):
                raise OptionTypeError(
                    "costs",
                    "costs must be seconds by handler name, a function of (handler name, "
                    f"event) or 'measured', got {costs!r} ({type(costs).__name__})",
                )
            function = costs

            def cost_of(sub: Subscription, event: Event) -> float:
                cost = _checked_cost(sub.name, function(sub.name, event))
                if cost:
                    _check_deadline(sub, cost)
                return cost

            self.cost_of = cost_of
        for sub in subs:
            self.wrap(sub, measured=measured)

    def wrap(self, sub: Subscription, *, measured: bool = False) -> None:
        """Charge ``sub``'s calls from now on."""
        handler = sub.handler
        clock = self.clock
        advance: Callable[[float], None] = clock.advance
        if sub.blocking:  # called in a worker thread: the event loop moves the clock

            def advance(seconds: float) -> None:
                anyio.from_thread.run_sync(clock.advance, seconds)

        elif not sub.is_async:  # a plain sync call: the loop is blocked while it runs
            advance = functools.partial(clock.advance, blocked=True)
        # Measured: the call's wall time; else what ``cost`` says before the call.
        wall = time.perf_counter
        begin: Callable[[Event], float] = (
            (lambda event: wall()) if measured else functools.partial(self.cost, sub)
        )
        wrapper: Callable[[Any], Any]
        if sub.is_async:

            async def charged_async(event: Event) -> Any:
                begun = begin(event)
                try:
                    return await handler(event)
                finally:
                    seconds = wall() - begun if measured else begun
                    if seconds:
                        advance(seconds)

            wrapper = charged_async
        else:

            def charged_sync(event: Event) -> Any:
                begun = begin(event)
                try:
                    return handler(event)
                finally:
                    seconds = wall() - begun if measured else begun
                    if seconds:
                        advance(seconds)

            wrapper = charged_sync
        sub.handler = wrapper
        self.wrapped.append((sub, handler, wrapper))

    @property
    def hold_the_trainer(self) -> bool:
        """Whether a charged handler is plain sync and inline: live, it would block the
        trainer's loop until it returns."""
        return any(
            not (sub.is_async or sub.blocking) and sub.delivery == "inline"
            for sub, _, _ in self.wrapped
        )

    def cost(self, sub: Subscription, event: Event) -> float:
        """What this call of ``sub`` costs; 0, keeping the error, if the costs cannot say."""
        if self.error is not None:
            return 0.0
        try:
            return self.cost_of(sub, event)
        except Exception as exc:
            exc.add_note(f"costing {sub.name} for {type(event).__name__} seq {event.seq}")
            self.error = exc
            return 0.0

    def remove(self) -> None:
        """Put the handlers back (those the bus has not replaced meanwhile)."""
        for sub, handler, wrapper in self.wrapped:
            if sub.handler is wrapper:
                sub.handler = handler
        self.wrapped.clear()


def _checked_cost(name: str, value: Any) -> float:
    if (type(value) is float or type(value) is int) and 0 <= value <= MAX_SECONDS:
        return float(value)  # the usual case, without msgspec's conversion
    cost: float = checked(f"costs[{name!r}]", value, WaitSeconds)
    return cost


def _checked_costs(costs: Mapping[Any, Any], subs: tuple[Subscription, ...]) -> dict[str, float]:
    """Seconds by handler name, each named handler on the bus and each cost in range."""
    names = {sub.name for sub in subs}
    unknown = [name for name in costs if name not in names]
    if unknown:
        listed = ", ".join(sorted(map(repr, names))) or "none"
        raise OptionError(
            "costs",
            f"costs: no handler named {', '.join(map(repr, unknown))} on the replay bus; "
            f"its handlers: {listed}",
        )
    return {name: _checked_cost(name, value) for name, value in costs.items()}


def _check_deadline(sub: Subscription, cost: float) -> None:
    """Refuse a cost that reaches an async or blocking call's deadline (live, it is
    cancelled there)."""
    if (sub.is_async or sub.blocking) and cost >= sub.timeout:
        kind = "blocking" if sub.blocking else "async"
        raise OptionError(
            f"costs[{sub.name!r}]",
            f"costs[{sub.name!r}]: {cost:g} s reaches the deadline of {sub.name} "
            f"({sub.timeout:g} s), where a live run cancels a call of this {kind} handler; "
            "charge less than its timeout",
        )
