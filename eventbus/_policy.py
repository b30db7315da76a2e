"""What happens to a handler that fails, overruns its deadline, or its budget.

The runners report a raised exception or an overrun, the period accounting
reports a budget verdict, the user calls ``enable()``: one place counts it,
emits the diagnostic event, logs (once per period: the budget report has the
counts), and changes the handler's state or fails the run, so that every
path applies the same policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import anyio

from ._events import Event, HandlerFailed, HandlerStateChanged, HandlerTimedOut
from ._faults import FATAL, forgive_foreign_cancel, is_requested_cancel
from ._logging import get_logger
from ._subscription import HandlerState, Subscription
from ._text import describe, format_traceback, safe_str

__all__ = ["Policy"]

_log = get_logger("eventbus")

_DIAGNOSTICS = (HandlerFailed, HandlerTimedOut)
_OVERRUN_ADVICE = (
    "a plain sync handler cannot be interrupted; declare it blocking=True to run it "
    "in a worker thread that is abandoned at the deadline, or make it async"
)


class Policy:
    """Applies the handlers' error and budget policies for one bus.

    ``emit`` publishes a diagnostic event (never refused); ``end_run`` tells the
    bus that the run must end with an exception; ``owner_ends_run`` says
    whether the bus's owner ends the run itself (``on_failure`` given), in
    which case the handler that failed it is disabled so the others go on.
    """

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
        """A handler call raised ``exc``: whose is it?

        A cancellation the bus asked for (a deadline, the bus stopping) is
        re-raised, for the scope that asked. ``KeyboardInterrupt`` and
        ``SystemExit`` end the run: the call is recorded as failed, the handler
        is disabled and the bus's owner is told. Anything else, a stray
        cancellation included, is the handler's fault. True when the handler
        must get no more of ``events``.
        """
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
        faults = sub.counters.add_fault()
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
    ) -> bool:
        """Record a call past its deadline; True when the handler must get no more events."""
        if sub.counters.add_timeout() == 1:  # once per period: the report has the count
            _log.warning(
                "handler timed out",
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
                    advice=_OVERRUN_ADVICE if outcome == "overrun" else "",
                )
            )
        return self._apply_error_policy(
            sub, TimeoutError(f"{sub.name} took {elapsed:.3f}s, deadline {sub.timeout}s")
        )

    def skip_rest(self, sub: Subscription, count: int) -> None:
        """The handler gets none of the ``count`` events left in its batch."""
        if count > 0:
            sub.counters.skip(count)

    def set_state(self, sub: Subscription, state: HandlerState, reason: str) -> None:
        if sub.change_state(state, reason):
            _log.warning("handler state changed", handler=sub.name, state=state, reason=reason)
            self._emit(HandlerStateChanged(handler=sub.name, state=state, reason=reason))

    def budget_verdict(self, sub: Subscription, over: bool) -> None:
        """A period closed with ``sub`` over (or within) its budget."""
        if over and sub.over_budget != "warn" and sub.state == "normal":
            state: HandlerState = "coalescing" if sub.over_budget == "coalesce" else "disabled"
            self.set_state(sub, state, "over budget")
        elif not over and sub.state != "normal" and sub.state_reason == "over budget":
            self.set_state(sub, "normal", "back under budget")
