"""The OpenTelemetry tap against the real SDK, read back with its in-memory exporters.

Every way in: ``open_run``'s callback list, a bare bus (``tap.attach``), a replay's
callbacks and a framework adapter's (Lightning). Spans: a round each, a slow call's,
a failed or timed-out call's, never a fast one's. Metrics: every call's duration,
faults, timeouts and skipped events from the budget reports, each handler's share of
its periods.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

pytest.importorskip("opentelemetry.sdk", reason="pip install 'train-eventbus[otel]'")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from adapters.otel import OpenTelemetryTap
from eventbus import (
    CheckpointSaved,
    EventBus,
    Report,
    RoundGathered,
    RunFinished,
    RunStarted,
    TrainRunContext,
    VirtualClock,
)
from eventbus.log import replay_file
from eventbus.testing import replay_log, report_rounds, write_log
from handlers import Reporter, UserCallback, open_run
from handlers._attach import attach_user_callbacks

HANDLER = "messaging.destination.subscription.name"
DURATION = "messaging.process.duration"


@dataclass
class Otel:
    """An SDK set up with in-memory exporters, and what they hold."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    def tap(self, **options: Any) -> OpenTelemetryTap:
        return OpenTelemetryTap(self.tracer_provider, self.meter_provider, **options)

    @property
    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans if span.name == name]

    def rounds(self) -> list[ReadableSpan]:
        return [
            s
            for s in self.named("eventbus.round")
            if (s.attributes or {})["eventbus.round.gathered"]
        ]

    def metrics(self) -> dict[str, list[Any]]:
        """Each metric's data points, by name."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def by_handler(self, name: str, field: str = "value") -> dict[str, Any]:
        """A metric's points by handler (summed over their other attributes)."""
        points: dict[str, Any] = {}
        for point in self.metrics().get(name, []):
            handler = point.attributes[HANDLER]
            points[handler] = points.get(handler, 0) + getattr(point, field)
        return points


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(tracer_provider, meter_provider, exporter, reader)
    tracer_provider.shutdown()
    meter_provider.shutdown()


class Slow(UserCallback):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        time.sleep(0.003)


class Fast(UserCallback):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        pass


class Raises(UserCallback):
    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        raise ValueError(f"round of {len(metrics)} ranks")


async def three_rounds(reporter: Reporter) -> None:
    for step in range(3):
        await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint="ck-2" if step == 2 else None)
        await anyio.sleep(0.01)  # rounds apart: one round per batch


# --- through open_run ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_run_exports_its_rounds_its_slow_and_failed_calls_and_their_metrics(
    otel: Otel,
) -> None:
    tap = otel.tap()
    async with open_run(
        world_size=2, callbacks=[Slow(), Fast(), Raises(), tap], name="traced", period=30
    ) as run:
        await run.workers(three_rounds)

    rounds = otel.rounds()
    assert [(s.attributes or {})["eventbus.round"] for s in rounds] == [0, 1, 2]
    for span in rounds:
        attributes = span.attributes or {}
        assert attributes["eventbus.round.ranks"] == 2
        assert attributes["eventbus.run.id"] == run.run_id
        assert attributes["eventbus.run.name"] == "traced"
        assert span.parent is None
    assert (rounds[2].attributes or {})["eventbus.round.checkpoint"] == "ck-2"
    assert "eventbus.round.checkpoint" not in (rounds[0].attributes or {})
    # Each round starts where the previous one was gathered.
    assert [s.start_time for s in rounds[1:]] == [s.end_time for s in rounds[:-1]]
    [tail] = [s for s in otel.named("eventbus.round") if s not in rounds]
    assert (tail.attributes or {})["eventbus.round.gathered"] is False
    assert (tail.attributes or {})["eventbus.run.status"] == "finished"
    assert tail.start_time == rounds[-1].end_time

    slow = otel.named("Slow.after_report")
    assert len(slow) == 3
    for span in slow:
        attributes = span.attributes or {}
        assert attributes["eventbus.outcome"] == "ok"
        assert attributes[HANDLER] == "Slow.after_report"
        assert attributes["messaging.destination.name"] == "RoundGathered"
        assert "error.type" not in attributes
        assert span.end_time is not None and span.start_time is not None
        assert span.end_time - span.start_time >= 3_000_000
    assert otel.named("Fast.after_report") == []  # under min_span_s: no span

    failed = otel.named("Raises.after_report")
    assert len(failed) == 3
    for span in failed:
        attributes = span.attributes or {}
        assert attributes["eventbus.outcome"] == "error"
        assert attributes["error.type"] == "ValueError"
        assert span.status.status_code is StatusCode.ERROR
        assert [event.name for event in span.events] == ["exception"]

    # A call is a child of the round in progress when it ended: after_report of
    # round n runs once round n is gathered, in round n + 1 (the last, in the tail).
    round_ids = {s.context.span_id for s in [*rounds, tail] if s.context is not None}
    for span in slow + failed:
        assert span.parent is not None and span.parent.span_id in round_ids
    parents = [s.parent.span_id for s in slow if s.parent is not None]
    expected = [s.context.span_id for s in [*rounds[1:], tail] if s.context is not None]
    assert parents == expected

    calls = otel.by_handler(DURATION, "count")
    assert {name: calls[name] for name in ("Slow.after_report", "Fast.after_report")} == {
        "Slow.after_report": 3,
        "Fast.after_report": 3,
    }
    assert calls["Raises.after_report"] == 3
    assert calls["handlers.ReportCallbackHandler"] == 6  # every report, through the gathering
    errors = [
        p.attributes.get("error.type")
        for p in otel.metrics()[DURATION]
        if p.attributes[HANDLER] == "Raises.after_report"
    ]
    assert errors == ["ValueError"]
    assert otel.by_handler("eventbus.handler.faults") == {"Raises.after_report": 3}
    shares = otel.by_handler("eventbus.handler.period_share", "sum")
    assert 0 < shares["Fast.after_report"] < shares["Slow.after_report"] <= 1
    assert run.result is not None
    assert "OpenTelemetryTap" in [cost.handler for cost in run.result.callbacks]
    assert tap.errors == 0


# --- on a bare bus ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_bare_bus_exports_slow_failed_and_timed_out_calls(otel: Otel) -> None:
    def slow(event: Report) -> None:
        time.sleep(0.003)

    def fast(event: Report) -> None:
        pass

    def raises(event: Report) -> None:
        raise KeyError(event.index)

    async def hangs(event: Report) -> None:
        await anyio.sleep(10)

    tap = otel.tap(min_span_s=0.002)
    async with EventBus(timeout=0.05, period=30) as bus:
        for handler in (slow, fast, raises):
            bus.subscribe(Report, handler, name=handler.__name__)
        bus.subscribe(Report, hangs, name="hangs", on_error="disable", max_faults=1)
        detach = tap.attach(bus)
        for index in range(4):
            await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
        await bus.wait_idle()
    detach()

    assert otel.named("eventbus.round") == []  # no run on this bus
    assert len(otel.named("slow")) == 4 and otel.named("fast") == []
    assert {(s.attributes or {})["error.type"] for s in otel.named("raises")} == {"KeyError"}
    [timed_out] = otel.named("hangs")
    attributes = timed_out.attributes or {}
    assert attributes["eventbus.outcome"] == "timeout"
    assert attributes["eventbus.timeout.outcome"] == "cancelled"
    assert attributes["error.type"] == "timeout"
    assert timed_out.status.status_code is StatusCode.ERROR
    assert all(span.parent is None for span in otel.spans)

    calls = otel.by_handler(DURATION, "count")
    # The tap's own handler too: it got the budget report of the bus's last period.
    assert calls == {"slow": 4, "fast": 4, "raises": 4, "hangs": 1, "OpenTelemetryTap": 1}
    assert otel.by_handler("eventbus.handler.timeouts") == {"hangs": 1}
    assert otel.by_handler("eventbus.handler.faults") == {"raises": 4}
    assert otel.by_handler("eventbus.handler.skipped") == {"hangs": 3}  # disabled after one


@pytest.mark.anyio
async def test_a_round_with_no_run_start_begins_when_the_tap_was_attached(otel: Otel) -> None:
    context = TrainRunContext(run_id="r", name="bare", world_size=1)
    tap = otel.tap()
    async with EventBus() as bus:
        tap.attach(bus)
        attached = time.time_ns()
        await bus.publish(
            RoundGathered(context=context, round=0, ranks=(0,), metrics=[{}], checkpoint="c")
        )
        await bus.wait_idle()
        await bus.publish(RunFinished(run_id="r", status="failed"))
    [gathered] = otel.rounds()
    assert gathered.start_time is not None and gathered.start_time <= attached
    assert (gathered.attributes or {})["eventbus.round.checkpoint"] == "c"
    [tail] = [s for s in otel.named("eventbus.round") if s is not gathered]
    assert (tail.attributes or {})["eventbus.run.status"] == "failed"


@pytest.mark.anyio
async def test_detaching_ends_the_round_in_progress_and_stops_exporting(otel: Otel) -> None:
    tap = otel.tap(min_span_s=0)
    async with EventBus() as bus:
        detach = tap.attach(bus)
        bus.subscribe(Report, lambda e: None, name="h")
        await bus.publish(RunStarted(run_id="r", name="n", world_size=1))
        await bus.wait_idle()
        detach()
        await bus.publish(Report(run_id="r", rank=0, world_size=1, index=0, metrics={}))
        await bus.wait_idle()
    [open_round] = otel.named("eventbus.round")
    assert (open_round.attributes or {})["eventbus.round.gathered"] is False
    assert otel.named("h") == []


# --- budgets: skipped events, period shares ------------------------------------------------------


@pytest.mark.anyio
async def test_a_coalescing_handlers_skipped_events_are_counted(otel: Otel) -> None:
    clock = VirtualClock()

    def heavy(event: Report | CheckpointSaved) -> None:
        clock.advance(0.1)

    tap = otel.tap()
    async with EventBus(clock=clock, period=1.0, budget=0.05) as bus:
        tap.attach(bus)
        bus.subscribe((Report, CheckpointSaved), heavy, name="heavy", over_budget="coalesce")
        await bus.publish(Report(run_id="r", rank=0, world_size=1, index=0, metrics={}))
        await bus.wait_idle()
        clock.set(1.0)  # period 0: 0.1 s used of 0.05 -> coalescing
        await bus.wait_idle()
        for index in range(1, 6):
            await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
        await bus.wait_idle()
        clock.set(2.0)
        await bus.wait_idle()
    assert otel.by_handler("eventbus.handler.skipped") == {"heavy": 4}
    # Coalesced, each of its calls is still timed and recorded: 0.1 s each.
    [point] = [p for p in otel.metrics()[DURATION] if p.attributes[HANDLER] == "heavy"]
    assert (point.count, point.sum) == (2, pytest.approx(0.2))
    assert [s.name for s in otel.spans] == ["heavy", "heavy"]  # 100 ms each


@pytest.mark.anyio
async def test_each_handlers_share_of_each_period_is_recorded(otel: Otel) -> None:
    """On a virtual clock a call costs what it advances the clock by: shares are exact."""
    clock = VirtualClock()
    costs = {"a": 0.02, "b": 0.05}

    def costing(name: str) -> Any:
        def handler(event: Report) -> None:
            clock.advance(costs[name])

        return handler

    tap = otel.tap()
    async with EventBus(clock=clock, period=1.0, budget=1.0) as bus:
        tap.attach(bus)
        for name in costs:
            bus.subscribe(Report, costing(name), name=name)
        for period in range(3):
            for index in range(period + 1):  # 1, 2 and 3 calls in periods 0, 1 and 2
                await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
            await bus.wait_idle()
            clock.set(period + 1.0)
            await bus.wait_idle()
    points = {
        p.attributes[HANDLER]: p
        for p in otel.metrics()["eventbus.handler.period_share"]
        if p.attributes[HANDLER] in costs
    }
    for name, cost in costs.items():
        assert points[name].count == 3
        assert points[name].sum == pytest.approx(cost * (1 + 2 + 3))
        assert points[name].max == pytest.approx(cost * 3)


# --- replays, adapters -------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_replay_with_the_tap_in_its_callbacks_exports_the_recorded_rounds(
    otel: Otel, tmp_path: Path
) -> None:
    events = [RunStarted(run_id="run", name="replayed", world_size=2), *report_rounds(4)]
    path = write_log(tmp_path / "run.evlog", events)
    slow, tap = Fast(), otel.tap()
    result = await replay_log(path, slow, tap, costs={"Fast.after_report": 0.05})
    assert len(result.events_of(slow)) == 4
    rounds = otel.rounds()
    assert [(s.attributes or {})["eventbus.round"] for s in rounds] == [0, 1, 2, 3]
    assert {(s.attributes or {})["eventbus.run.name"] for s in rounds} == {"replayed"}
    charged = otel.named("Fast.after_report")  # 50 ms of the replay's clock each
    assert len(charged) == 4
    assert all(s.end_time - s.start_time == 50_000_000 for s in charged)  # type: ignore[operator]
    assert otel.by_handler(DURATION, "count")["Fast.after_report"] == 4


@pytest.mark.anyio
async def test_replay_file_attaching_the_tap_with_the_callbacks(otel: Otel, tmp_path: Path) -> None:
    path = write_log(tmp_path / "run.evlog", report_rounds(3, world_size=4))
    tap = otel.tap()
    await replay_file(path, lambda bus: attach_user_callbacks(bus, [Fast(), tap]))
    assert [(s.attributes or {})["eventbus.round.ranks"] for s in otel.rounds()] == [4, 4, 4]
    assert otel.by_handler(DURATION, "count")["Fast.after_report"] == 3


def test_the_tap_in_a_lightning_trainers_callbacks(otel: Otel, tmp_path: Path) -> None:
    pytest.importorskip("lightning", reason="pip install 'train-eventbus[lightning]'")
    model = importlib.import_module("_lightning_model")  # beside this file, as its tests'
    from adapters.lightning import EventBusCallback

    tap = otel.tap()
    counter = model.NthRoundCounter()
    callback = EventBusCallback([counter, tap])
    model.make_trainer(tmp_path, [callback]).fit(model.Regression())
    rounds = otel.rounds()
    assert len(rounds) == counter.seen == 6
    checkpoints = [(s.attributes or {}).get("eventbus.round.checkpoint") for s in rounds]
    assert [c is not None for c in checkpoints] == [False, False, True, False, False, True]
    calls = otel.by_handler(DURATION, "count")
    assert calls["NthRoundCounter.after_report"] == 6
    assert tap.errors == 0


# --- never silent, never in the run's way ------------------------------------------------------


class Broken(SpanProcessor):
    """A span processor that raises into whoever ends a span (an exporter that raises,
    called synchronously)."""

    def on_end(self, span: ReadableSpan) -> None:
        raise ConnectionError("collector unreachable")


@pytest.mark.anyio
async def test_an_exporter_that_raises_is_logged_once_and_the_run_goes_on(otel: Otel) -> None:
    otel.tracer_provider.add_span_processor(Broken())
    tap = otel.tap()
    with capture_logs() as logs:
        async with open_run(world_size=2, callbacks=[Slow(), tap]) as run:
            await run.workers(three_rounds)
    assert run.result is not None and run.result.status == "finished"
    assert run.result.rounds == 3
    assert tap.errors >= 4  # three rounds and their slow calls, at least
    lines = [entry for entry in logs if "OpenTelemetry" in entry["event"]]
    assert len(lines) == 1
    assert lines[0]["log_level"] == "error"
    assert "collector unreachable" in lines[0]["error"]
    assert not [entry for entry in logs if entry["event"].startswith("handler failed")]
    # The metrics are the meter's: they went on.
    assert otel.by_handler(DURATION, "count")["Slow.after_report"] == 3


@pytest.mark.anyio
async def test_without_durations_the_bus_times_cheap_handlers_by_the_batch(otel: Otel) -> None:
    tap = otel.tap(durations=False)
    async with EventBus() as bus:
        sub = bus.subscribe(Report, lambda e: None, name="cheap")
        tap.attach(bus)
        for index in range(600):
            await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
        await bus.wait_idle()
        assert not sub.counters.timed_per_call
    assert DURATION not in otel.metrics()
    assert otel.named("cheap") == []


@pytest.mark.anyio
async def test_with_durations_every_call_is_timed(otel: Otel) -> None:
    tap = otel.tap()
    async with EventBus() as bus:
        sub = bus.subscribe(Report, lambda e: None, name="cheap")
        tap.attach(bus)
        for index in range(600):
            await bus.publish(Report(run_id="r", rank=0, world_size=1, index=index, metrics={}))
        await bus.wait_idle()
    assert otel.by_handler(DURATION, "count")["cheap"] == 600
    assert sub.stats().calls == 600


# --- charged, and cut at a deadline ---------------------------------------------------------


class SlowExporter(SpanExporter):
    """Takes ``delay`` seconds per export (a collector far away), or, with ``hold``, until
    it is released (a collector that never answers)."""

    def __init__(self, delay: float = 0.0, *, hold: bool = False) -> None:
        self.delay = delay
        self.release = threading.Event()
        self.hold = hold
        self.exports = 0

    def export(self, spans: Any) -> SpanExportResult:
        if self.hold:
            self.release.wait(30)
        time.sleep(self.delay)
        self.exports += 1
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def tap_cost(run: Any) -> Any:
    [cost] = [c for c in run.result.callbacks if c.handler == "OpenTelemetryTap"]
    return cost


@pytest.mark.anyio
async def test_the_exports_time_is_charged_to_the_taps_own_handler(otel: Otel) -> None:
    """Every export (round spans and the slow calls' spans) runs in the tap's handler:
    what the run waited for its exporter is in ``RunResult.callbacks``, by name."""
    exporter = SlowExporter(0.1)
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tap = otel.tap()
    started = time.monotonic()
    async with open_run(world_size=2, callbacks=[Slow(), tap], period=30) as run:
        await run.workers(three_rounds)
    stalled = time.monotonic() - started
    # The three rounds, the stretch after the last and the three slow calls.
    assert exporter.exports == len(otel.spans) == 7
    cost = tap_cost(run)
    assert cost.total >= 0.1 * exporter.exports
    charged = sum(c.total for c in run.result.callbacks)
    assert stalled - charged < 0.35  # (before: 4 of 7 exports were charged to nobody)
    assert otel.named("OpenTelemetryTap") == []  # its own cost is its budget's, no span


@pytest.mark.anyio
async def test_an_exporter_that_hangs_is_cut_at_the_taps_deadline(otel: Otel) -> None:
    exporter = SlowExporter(hold=True)
    otel.tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    tap = otel.tap(timeout=0.2)
    started = time.monotonic()
    try:
        with capture_logs() as logs:
            async with open_run(world_size=2, callbacks=[Slow(), tap], period=30) as run:
                await run.workers(three_rounds)
        elapsed = time.monotonic() - started
    finally:
        exporter.release.set()
    assert run.result.status == "finished" and run.result.rounds == 3
    assert elapsed < 3.0  # one deadline, not one per export (nor 30 s)
    cost = tap_cost(run)
    assert cost.timeouts == 1 and 0.2 <= cost.max < 1.0
    # The bus says the tap timed out, as of any callback; while the abandoned export
    # runs, what comes is skipped: counted, and said once.
    [timed_out] = [entry for entry in logs if entry["event"].startswith("handler timed out")]
    assert timed_out["handler"] == "OpenTelemetryTap"
    assert tap.errors >= 1
    said = [entry for entry in logs if entry["event"].startswith("OpenTelemetry raised")]
    assert len(said) == 1 and "abandoned" in said[0]["error"]


def test_min_span_s_and_timeout_are_checked(otel: Otel) -> None:
    from eventbus.options import OptionError

    with pytest.raises(OptionError, match="min_span_s"):
        otel.tap(min_span_s=-0.001)
    with pytest.raises(OptionError, match="timeout"):
        otel.tap(timeout=-1)


def test_the_global_providers_are_the_default() -> None:
    tap = OpenTelemetryTap()
    assert repr(tap) == "OpenTelemetryTap(min_span_s=0.001, durations=True)"
    assert tap.errors == 0


def test_importing_without_opentelemetry_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("opentelemetry", "opentelemetry.trace", "opentelemetry.metrics"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "adapters.otel", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'train-eventbus\[otel\]'") as caught:
        importlib.import_module("adapters.otel")
    assert "\n" not in str(caught.value)
