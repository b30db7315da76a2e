"""OpenTelemetry for a run: a span per round, spans for slow or failed handler calls, metrics
(names and attributes: docs/operations/trackers.md).

Everything that can export runs in the tap's own ``blocking`` handler, so it is charged like
any callback and an exporter that hangs is abandoned at the tap's deadline.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics, trace
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "adapters.otel needs OpenTelemetry: pip install 'train-eventbus[otel]'"
    ) from _exc

from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    HandlerCall,
    RoundGathered,
    RunFinished,
    RunStarted,
    __version__,
)
from eventbus._logging import get_logger
from eventbus._options import WaitSeconds
from eventbus._stages import Stage
from eventbus._subscription import Subscription
from eventbus._text import describe as describe_exception
from eventbus.options import checked
from handlers import UserCallback

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span

__all__ = ["OpenTelemetryTap"]

_log = get_logger("adapters.otel")

#: The instrumentation scope of the tracer and the meter.
_SCOPE = "adapters.otel"
#: The attribute naming the handler, in every metric and span.
_HANDLER = "messaging.destination.subscription.name"
#: Handler calls, in seconds: the conventions' buckets, from 1 µs.
_DURATION_BUCKETS = (
    1e-6,
    1e-5,
    5e-5,
    1e-4,
    5e-4,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
#: A handler's share of a health-check period (its budget is one, 5% by default).
_SHARE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

_MAX_CACHED = 4096
#: Slow or failed calls waiting to become spans, at most (a stuck exporter holds no more).
_MAX_PENDING = 10_000
_ROUND = "eventbus.round"

Attributes = dict[str, Any]


def _error_type(call: HandlerCall) -> str:
    if call.outcome != "error" or call.error is None:
        return "timeout"
    kind = type(call.error)
    module = kind.__module__
    return kind.__qualname__ if module in (None, "builtins") else f"{module}.{kind.__qualname__}"


class OpenTelemetryTap(UserCallback):
    """Exports a run to OpenTelemetry: round spans, slow and failed handler calls, metrics.

    Pass it in a callback list or attach it to a bare bus with ``attach(bus)``.

    Args:
        tracer_provider: Where the spans go (default: the global provider, looked up
            when a span is made).
        meter_provider: Where the metrics go (default: the global provider).
        min_span_s: The shortest handler call that gets a span, in seconds of the
            bus's clock (failed and timed-out calls always do).
        durations: Record every handler call in ``messaging.process.duration``;
            ``False``: the bus pays nothing per call.
        timeout: The deadline of one call of the tap's handler, in seconds
            (default: the bus's ``timeout``).
    """

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        *,
        min_span_s: float = 0.001,
        durations: bool = True,
        timeout: float | None = None,
    ) -> None:
        self.min_span_s: float = checked("min_span_s", min_span_s, WaitSeconds)
        self.durations = bool(durations)
        self.export_timeout: float | None = (
            None if timeout is None else checked("timeout", timeout, WaitSeconds)
        )
        self._exporter = _Exporter(
            tracer_provider, meter_provider, min_span_s=self.min_span_s, durations=self.durations
        )

    def __repr__(self) -> str:
        return f"OpenTelemetryTap(min_span_s={self.min_span_s:g}, durations={self.durations})"

    @property
    def errors(self) -> int:
        """How many times the OpenTelemetry pipeline raised (the first is logged)."""
        return self._exporter.errors

    def attach(self, bus: EventBus) -> Callable[[], None]:
        """Export what happens on a bare ``bus``; returns a function that stops it."""
        return _Attachment(self._exporter, bus, self.export_timeout).detach

    def __eventbus_subscribe__(self, bus: EventBus) -> list[Subscription]:
        """Called with the bus by whatever attaches the callback list this tap is in."""
        return _Attachment(self._exporter, bus, self.export_timeout).subscriptions


class _Exporter:
    """A tap's tracer and instruments, and its count of errors: what its attachments share."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None,
        meter_provider: metrics.MeterProvider | None,
        *,
        min_span_s: float,
        durations: bool,
    ) -> None:
        self.min_span_s = min_span_s
        self.durations = durations
        self.errors = 0
        self.tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider)
        meter = metrics.get_meter(_SCOPE, __version__, meter_provider)
        self.duration = (
            meter.create_histogram(
                "messaging.process.duration",
                unit="s",
                description="Duration of handler calls (each the delivery of one event).",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
            if durations
            else None
        )
        self.timeouts = meter.create_counter(
            "eventbus.handler.timeouts", unit="{call}", description="Handler calls past deadline."
        )
        self.faults = meter.create_counter(
            "eventbus.handler.faults", unit="{call}", description="Handler calls that raised."
        )
        self.skipped = meter.create_counter(
            "eventbus.handler.skipped",
            unit="{event}",
            description="Deliveries not made: the handler was disabled, coalescing, or cut short.",
        )
        self.shares = meter.create_histogram(
            "eventbus.handler.period_share",
            unit="1",
            description="A handler's share of a health-check period (what its budget judges).",
            explicit_bucket_boundaries_advisory=_SHARE_BUCKETS,
        )
        self._call_attributes: dict[tuple[str, type, str | None], Attributes] = {}

    def failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.errors == 1:
            _log.error(
                "OpenTelemetry raised into the tap: it goes on, and says so only this once "
                "(OpenTelemetryTap.errors counts them)",
                error=describe_exception(exc),
            )

    def call_attributes(self, call: HandlerCall, error_type: str | None) -> Attributes:
        """The metric attributes of ``call`` (cached: every call is recorded)."""
        key = (call.handler, type(call.event), error_type)
        found = self._call_attributes.get(key)
        if found is None:
            if len(self._call_attributes) >= _MAX_CACHED:
                self._call_attributes.clear()
            found = {
                "messaging.system": "eventbus",
                "messaging.operation.name": "process",
                "messaging.destination.name": type(call.event).__name__,
                _HANDLER: call.handler,
            }
            if error_type is not None:
                found["error.type"] = error_type
            self._call_attributes[key] = found
        return found

    def record_period(self, report: BudgetReport, period: float) -> None:
        length = report.end - report.start
        if report.partial:  # cut short at close: judged as a whole period, as its budget is
            length = max(length, period)
        for usage in report.handlers:
            attributes = {_HANDLER: usage.handler}  # per period: not worth a cache
            if usage.timeouts:
                self.timeouts.add(usage.timeouts, attributes)
            if usage.faults:
                self.faults.add(usage.faults, attributes)
            if usage.skipped:
                self.skipped.add(usage.skipped, attributes)
            if usage.calls and length > 0:
                self.shares.record(usage.total / length, attributes)

    def start_span(self, name: str, parent: Context, start: int, attributes: Attributes) -> Span:
        return self.tracer.start_span(
            name,
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )


#: A call noted for a span: the call, its attributes, its parent, its end (wall clock, ns).
_Noted = tuple[HandlerCall, Attributes, "Context", int]


class _Attachment:
    """A tap on one bus. The observer only notes calls; the ``blocking`` handler exports
    them, skipping while an abandoned call still runs (``_busy``)."""

    def __init__(self, exporter: _Exporter, bus: EventBus, timeout: float | None) -> None:
        self.exporter = exporter
        self.bus = bus
        #: The span current where the tap was attached: the parent of rounds.
        self.outer: Context = otel_context.get_current()
        self.round: Span | None = None
        self.inside: Context | None = None  # the round in progress, as a parent
        self.since = time.time_ns()  # where the next round's span starts
        self.run: Attributes = {}
        self.pending: deque[_Noted] = deque(maxlen=_MAX_PENDING)
        self._busy = threading.Lock()
        self.subscriptions = [
            bus.subscribe(
                (RunStarted, RoundGathered, RunFinished, BudgetReport),
                self.handle,
                name="OpenTelemetryTap",
                order=Stage.RECORD,
                blocking=True,
                timeout=timeout,
            )
        ]
        self._own = self.subscriptions[0].name
        least = 0.0 if exporter.durations else exporter.min_span_s
        self._stop_observing = bus.observe_calls(self.observe, min_seconds=least)

    def detach(self) -> None:
        """Stop exporting this bus; noted calls become spans, the round in progress ends."""
        self._stop_observing()
        for sub in self.subscriptions:
            sub.cancel()
        self.handle(None)

    # --- the bus's calls ----------------------------------------------------------------

    def observe(self, calls: list[HandlerCall]) -> None:
        """A batch's calls into the histogram; slow and failed ones noted for spans."""
        exporter = self.exporter
        try:
            record = exporter.duration.record if exporter.duration is not None else None
            shortest = exporter.min_span_s
            for call in calls:
                error_type = None if call.outcome == "ok" else _error_type(call)
                attributes = exporter.call_attributes(call, error_type)
                if record is not None and call.calls == 1:
                    record(call.elapsed, attributes)
                if (error_type is not None or call.elapsed >= shortest) and (
                    call.handler != self._own
                ):
                    end = time.time_ns() - round((self.bus.clock.now() - call.end) * 1e9)
                    parent = self.inside if self.inside is not None else self.outer
                    self.pending.append((call, attributes, parent, end))
        except Exception as exc:
            exporter.failed(exc)

    def call_span(
        self, call: HandlerCall, attributes: Attributes, parent: Context, end: int
    ) -> None:
        """A span for ``call`` under ``parent``, ending at ``end`` (wall clock, ns)."""
        start = end - round(call.elapsed * 1e9)
        span_attributes: Attributes = {**attributes, "messaging.message.id": str(call.event.seq)}
        outcome = call.outcome
        timed_out = outcome not in ("ok", "error")
        span_attributes["eventbus.outcome"] = "timeout" if timed_out else outcome
        if timed_out:
            span_attributes["eventbus.timeout.outcome"] = outcome
        if call.calls > 1:
            span_attributes["eventbus.calls"] = call.calls
        span = self.exporter.start_span(call.handler, parent, start, span_attributes)
        if call.error is not None:
            span.record_exception(call.error, timestamp=end)
            span.set_status(trace.Status(trace.StatusCode.ERROR, describe_exception(call.error)))
        elif outcome != "ok":
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"past its deadline: {outcome}"))
        span.end(end_time=end)

    # --- the run's events -----------------------------------------------------------------

    def handle(self, event: Event | None) -> None:
        """The tap's handler: noted calls become spans, then ``event`` is exported (``None``:
        the round in progress ends)."""
        if not self._busy.acquire(blocking=False):
            self.exporter.failed(
                TimeoutError(
                    "an export abandoned at the tap's deadline has not returned: "
                    "the tap skips what comes until it does"
                )
            )
            return
        try:
            pending = self.pending
            while pending:
                self._guarded(self.call_span, *pending.popleft())
            self._guarded(self._export, event)
        finally:
            self._busy.release()

    def _guarded(self, action: Callable[..., None], *arguments: Any) -> None:
        try:
            action(*arguments)
        except Exception as exc:
            self.exporter.failed(exc)

    def _export(self, event: Event | None) -> None:
        if isinstance(event, BudgetReport):
            self.exporter.record_period(event, self.bus.period)
        elif isinstance(event, RoundGathered):
            self._gathered(event)
        elif isinstance(event, RunStarted):
            self.run = {"eventbus.run.id": event.run_id, "eventbus.run.name": event.name}
            if self.round is None:
                self._open_round(time.time_ns())
        elif event is None or isinstance(event, RunFinished):
            # The stretch since the last round, which no round ends.
            attributes: Attributes = {"eventbus.round.gathered": False}
            if event is not None:
                attributes["eventbus.run.status"] = event.status
            self._end_round(self.round, attributes)

    def _open_round(self, now: int) -> None:
        self.round = span = self.exporter.start_span(_ROUND, self.outer, now, self.run)
        self.inside = trace.set_span_in_context(span, self.outer)

    def _gathered(self, event: RoundGathered) -> None:
        context = event.context
        self.run = {"eventbus.run.id": context.run_id, "eventbus.run.name": context.name}
        span = self.round
        if span is None:  # no run start seen: the round began when the tap could know
            span = self.exporter.start_span(_ROUND, self.outer, self.since, self.run)
        attributes: Attributes = {
            **self.run,
            "eventbus.round": event.round,
            "eventbus.round.ranks": len(event.ranks),
            "eventbus.round.gathered": True,
        }
        if event.checkpoint is not None:
            attributes["eventbus.round.checkpoint"] = event.checkpoint
        try:
            self._end_round(span, attributes)
        finally:
            self._open_round(self.since)

    def _end_round(self, span: Span | None, attributes: Attributes) -> None:
        """End ``span``, the round in progress, now; the next round starts here."""
        self.round = self.inside = None
        self.since = now = time.time_ns()
        if span is not None:
            span.set_attributes(attributes)
            span.end(end_time=now)
