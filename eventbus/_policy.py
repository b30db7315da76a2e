"""What happens to a handler that fails, overruns its deadline, or its budget: one place
counts, emits the diagnostic, logs, and changes the handler's state or fails the run."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import anyio

from ._events import Event, HandlerFailed, HandlerStateChanged, HandlerTimedOut, HandlerUsage
from ._faults import FATAL, forgive_foreign_cancel, is_requested_cancel
from ._logging import get_logger
from ._subscription import HandlerState, Subscription
from ._text import describe, format_traceback, safe_str

__all__ = ["Policy", "cost_text", "duration_text", "share_text"]

_log = get_logger("eventbus")

_DIAGNOSTICS = (HandlerFailed, HandlerTimedOut)
_OVERRUN_ADVICE = (
    "a plain sync handler cannot be interrupted; declare it blocking=True to run it "
    "in a worker thread that is abandoned at the deadline, or make it async"
)
#: Workers' time in the loop during a timed-out call worth naming as its cause (seconds).
_HELD_WORTH_SAYING = 0.001


#: What became of a call past its deadline, as the timeout line says it.
_OUTCOMES = {
    "cancelled": "the call was cancelled",
    "abandoned": "its thread was abandoned",
    "overrun": "it could not be interrupted",
}


def _figures(value: float, significant: int) -> str:
    """``value`` to ``significant`` figures, without an exponent: ``205``, ``4.1``."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, significant - 1 - math.floor(math.log10(abs(value))))
    if decimals == 0:
        return f"{value:,.0f}"
    return f"{value:.{decimals}f}".rstrip("0").rstrip(".")


def duration_text(seconds: float) -> str:
    """``seconds`` in the unit that reads best, to three figures: ``205 ms``, ``40 µs``."""
    if abs(seconds) < 1:
        seconds = float(f"{seconds:.3g}")
    size = abs(seconds)
    if size >= 1 or size == 0 or not math.isfinite(size):
        return f"{_figures(seconds, 3)} s"
    for unit, scale in (("ms", 1e3), ("µs", 1e6)):
        if size * scale >= 1:
            return f"{_figures(seconds * scale, 3)} {unit}"
    return f"{_figures(seconds * 1e9, 3)} ns"


def share_text(fraction: float) -> str:
    """A share as a percentage, to two figures: ``4.1%``, ``0.5%``, ``100%``."""
    return f"{_figures(fraction * 100, 2)}%"


def cost_text(used: float, budget: float, length: float) -> str:
    """What a handler (or all of them) took of a period, against its budget, in words:
    ``205 ms of a 5 s period (4.1%), budget 25 ms (0.5%)``."""
    if length > 0:
        return (
            f"{duration_text(used)} of a {duration_text(length)} period "
            f"({share_text(used / length)}), budget {duration_text(budget)} "
            f"({share_text(budget / length)})"
        )
    return f"{duration_text(used)}, budget {duration_text(budget)}"


def _periods_text(count: int) -> str:
    return f"{count} whole period{'' if count == 1 else 's'}"


class Policy:
    """Applies the handlers' error and budget policies for one bus. ``owner_ends_run``:
    the owner ends the run itself, so the handler that failed it is disabled."""

    __slots__ = ("_emit", "_end_run", "_owner_ends_run")

    def __init__(
        self,
        emit: Callable[[Event], None],
        end_run: Callable[[BaseException], None],
        *,
        owner_ends_run: bool,
    ) -> None:
        self._emit = emit
        self._end_run = end_run
        self._owner_ends_run = owner_ends_run

    def handler_raised(
        self, sub: Subscription, event: Event, exc: BaseException, events: list[Event], index: int
    ) -> bool:
        """A handler call raised ``exc``. A cancellation the bus asked for is re-raised;
        ``KeyboardInterrupt`` and ``SystemExit`` end the run; anything else is the
        handler's fault. True when the handler must get no more of ``events``."""
        if is_requested_cancel(exc):
            raise exc
        if isinstance(exc, FATAL):
            self._record_failure(sub, event, exc, events, index, policy=False)
            self.skip_rest(sub, len(events) - index - 1)
            self.set_state(sub, "disabled", f"raised {type(exc).__name__}: the run ends")
            self._end_run(exc)
            return True
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            forgive_foreign_cancel()
        return self._record_failure(sub, event, exc, events, index)

    def _record_failure(
        self,
        sub: Subscription,
        event: Event,
        exc: BaseException,
        events: list[Event],
        index: int,
        *,
        policy: bool = True,
    ) -> bool:
        """Record a handler failure; True when the handler must get no more of ``events``."""
        if sub.counters.add_failure() == 1:  # once per period: the report has the count
            _log.warning(
                "handler failed",
                handler=sub.name,
                event_type=type(event).__name__,
                event_seq=event.seq,
                error=describe(exc),
            )
        if not isinstance(event, _DIAGNOSTICS):  # a failing diagnostic handler must not loop
            self._emit(
                HandlerFailed(
                    handler=sub.name,
                    event_seq=event.seq,
                    event_type=type(event).__name__,
                    error_type=type(exc).__qualname__,
                    message=safe_str(exc),
                    traceback=format_traceback(exc),
                )
            )
        if not policy:
            return True
        stop = self._apply_error_policy(sub, exc)
        if stop:
            self.skip_rest(sub, len(events) - index - 1)
        return stop

    def _apply_error_policy(self, sub: Subscription, exc: BaseException) -> bool:
        sub.counters.faults_since_enabled += 1  # towards ``max_faults``
        faults = sub.counters.faults_since_enabled
        if sub.on_error == "raise":
            if self._owner_ends_run:  # the run fails; the others still get their events
                self.set_state(sub, "disabled", "on_error='raise': it failed the run")
            self._end_run(exc)
            return True
        if sub.on_error == "disable" and faults >= sub.max_faults:
            self.set_state(sub, "disabled", f"{faults} faults (max_faults={sub.max_faults})")
            return True
        return False

    def timed_out(
        self,
        sub: Subscription,
        event: Event,
        elapsed: float,
        outcome: Literal["cancelled", "abandoned", "overrun"],
        calls: int = 1,
        *,
        held: float = 0.0,
    ) -> bool:
        """Record a call past its deadline; True when the handler must get no more events.
        ``held``: how long of it workers' steps held the loop (the call could not run)."""
        advice = _OVERRUN_ADVICE if outcome == "overrun" else ""
        if held >= _HELD_WORTH_SAYING:
            advice = (
                f"workers' steps held the event loop for {duration_text(held)} of it: run a "
                "step that computes with anyio.to_thread.run_sync"
            )
        if sub.counters.add_timeout() == 1:  # once per period: the report has the count
            _log.warning(
                f"handler timed out: {sub.name} took {duration_text(elapsed)}, its deadline "
                f"is {duration_text(sub.timeout)}; {_OUTCOMES[outcome]}"
                + (f" ({advice})" if held >= _HELD_WORTH_SAYING else ""),
                handler=sub.name,
                event_seq=event.seq,
                timeout=sub.timeout,
                elapsed=round(elapsed, 6),
                outcome=outcome,
                calls=calls,
            )
        if not isinstance(event, _DIAGNOSTICS):
            self._emit(
                HandlerTimedOut(
                    handler=sub.name,
                    event_seq=event.seq,
                    event_type=type(event).__name__,
                    timeout=sub.timeout,
                    elapsed=elapsed,
                    outcome=outcome,
                    calls=calls,
                    advice=advice,
                )
            )
        return self._apply_error_policy(
            sub,
            TimeoutError(
                f"{sub.name} took {duration_text(elapsed)}, deadline {duration_text(sub.timeout)}"
            ),
        )

    def skip_rest(self, sub: Subscription, count: int) -> None:
        """The handler gets none of the ``count`` events left in its batch."""
        if count > 0:
            sub.counters.skip(count)

    def set_state(
        self, sub: Subscription, state: HandlerState, reason: str, *, by_budget: bool = False
    ) -> None:
        """Move ``sub`` to ``state`` for ``reason``; ``by_budget``: the budget policy's doing."""
        if sub.change_state(state, reason, by_budget=by_budget):
            _log.warning(
                f"handler state changed: {sub.name} "
                f"{'enabled' if state == 'normal' else state}: {reason}",
                handler=sub.name,
                state=state,
                reason=reason,
            )
            self._emit(HandlerStateChanged(handler=sub.name, state=state, reason=reason))

    def budget_verdict(self, sub: Subscription, usage: HandlerUsage, length: float) -> None:
        """A period of ``length`` seconds closed with ``sub`` over (or within) its budget:
        ``"coalesce"`` lasts while over it, ``"disable"`` for ``probation`` periods."""
        if sub.state == "normal":
            if usage.over_budget and sub.over_budget != "warn":
                cost = cost_text(usage.total, usage.budget, length)
                if sub.over_budget == "coalesce":
                    why = "only the newest pending event of each type is delivered"
                    state: HandlerState = "coalescing"
                else:
                    probation = _periods_text(sub.probation)
                    why = f"disabled for {probation} (probation), then tried again"
                    state = "disabled"
                self.set_state(sub, state, f"over budget: took {cost}; {why}", by_budget=True)
            return
        if not sub.state_by_budget:
            return  # disabled for its faults, or by the run: not the budget's to lift
        if sub.state == "coalescing":
            if not usage.over_budget:
                cost = cost_text(usage.total, usage.budget, length)
                self.set_state(sub, "normal", f"back under budget: took {cost}")
        elif (periods := sub.counters.periods_in_state) >= sub.probation:
            self.set_state(
                sub,
                "normal",
                f"probation over: after {_periods_text(periods)} disabled, it is tried "
                "again (a disabled handler costs nothing: only its calls can say whether "
                "it is back under budget)",
            )
