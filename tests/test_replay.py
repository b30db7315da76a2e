"""Replay: virtual-time determinism, filters, summaries, real-time pace, testing helpers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest
from _builders import EventCapture

from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    EventFilter,
    EventPlaceholder,
    HandlerFailed,
    HandlerTimedOut,
    HealthCheckTick,
    Report,
    VirtualClock,
)
from eventbus._events import is_derived
from eventbus.log import LogRecorder, read_log, replay
from eventbus.testing import assert_rounds, replay_log, report_rounds, write_log

pytest_plugins = ["pytester"]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_replay_example.py"


def flaky(event: Event) -> None:
    if isinstance(event, Report) and event.index % 3 == 2:
        raise ValueError(f"no round {event.index}")


async def record_run(path: Path) -> None:
    """A small 'real' run: 2 ranks, reports spread over several 1 s periods."""
    clock = VirtualClock(1000.0)
    with LogRecorder(path, run_id="run") as recorder:
        async with EventBus(clock=clock, period=1.0) as bus:
            recorder.attach(bus)
            bus.subscribe(Report, flaky)
            for event in report_rounds(8, world_size=2):
                await bus.publish(event)
                await bus.wait_idle()
                clock.advance(0.35)


def without_durations(event: Event) -> Event:
    """Everything a handler gets, minus the fields that measure real time."""
    replace = msgspec.structs.replace
    if isinstance(event, BudgetReport):
        usages = tuple(replace(u, total=0.0, max=0.0, over_budget=False) for u in event.handlers)
        return replace(event, total=0.0, fraction=0.0, handlers=usages, over_budget=())
    if isinstance(event, HandlerTimedOut):
        return replace(event, elapsed=0.0)
    return event


def outline(events: list[Event]) -> list[tuple[str, int]]:
    return [
        (type(e).__name__, e.index if isinstance(e, Report) else e.period)
        for e in events
        if isinstance(e, Report | HealthCheckTick)
    ]


@pytest.mark.anyio
async def test_instant_replay_is_deterministic_and_follows_recorded_time(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    await record_run(log)
    recorded = read_log(log).events

    runs = []
    for _ in range(2):
        capture = EventCapture()
        result = await replay_log(log, capture, flaky)
        runs.append([without_durations(e) for e in result.events_of(capture)])
    assert runs[0] == runs[1]
    assert len(runs[0]) > 16

    # Periods roll between the same reports as in the recorded run, at the same times.
    assert outline(runs[0]) == outline(recorded)
    ticks = [e for e in runs[0] if isinstance(e, HealthCheckTick)]
    assert [(t.period, t.start, t.end) for t in ticks] == [
        (t.period, t.start, t.end) for t in recorded if isinstance(t, HealthCheckTick)
    ]
    assert [e.time for e in runs[0] if isinstance(e, Report)] == [
        e.time for e in recorded if isinstance(e, Report)
    ]
    budget = [e for e in runs[0] if isinstance(e, BudgetReport)]
    assert len(budget) == len(ticks) + 1  # one per period, and the unfinished one at close
    assert [b.partial for b in budget] == [False] * len(ticks) + [True]
    assert {u.handler for b in budget for u in b.handlers} >= {f"{__name__}.flaky"}
    assert sum(isinstance(e, HandlerFailed) for e in runs[0]) == 4  # rounds 2 and 5, both ranks


@pytest.mark.anyio
async def test_summary_counts_calls_and_failures(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.jsonl", report_rounds(6, world_size=1))
    result = await replay_log(log, flaky, types=Report)
    summary = result.summary
    assert summary.replayed == 6 and summary.filtered == 0
    flaky_figures = summary.handler(f"{__name__}.flaky")
    assert (flaky_figures.calls, flaky_figures.failed) == (6, 2)
    assert flaky_figures.total >= 0.0
    assert summary.failed == 2 and summary.timed_out == 0
    assert summary.truncated is None
    with pytest.raises(KeyError):
        summary.handler("nobody")


@pytest.mark.anyio
async def test_filters_by_type_rank_and_seq(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    await record_run(log)
    capture = EventCapture()
    result = await replay_log(
        log, capture, filter=EventFilter.of(types=[Report], ranks=[1], from_seq=4, to_seq=20)
    )
    reports = capture.of_type(Report)
    assert reports and all(r.rank == 1 for r in reports)
    originals = {(e.rank, e.index): e.seq for e in read_log(log).events if isinstance(e, Report)}
    assert all(4 <= originals[(1, r.index)] <= 20 for r in reports)
    assert result.summary.replayed == len(reports)
    assert result.summary.filtered > 0


@pytest.mark.anyio
async def test_recorded_diagnostics_are_left_out_unless_asked(tmp_path: Path) -> None:
    log = tmp_path / "run.evlog"
    await record_run(log)
    recorded_ticks = sum(isinstance(e, HealthCheckTick) for e in read_log(log).events)
    capture = EventCapture()
    await replay_log(log, capture, include_diagnostics=True)
    # The replay bus's own ticks plus the recorded ones.
    assert len(capture.of_type(HealthCheckTick)) == 2 * recorded_ticks


class Pong(Event, frozen=True, kw_only=True):
    derived: ClassVar[bool] = True  # made by a handler from reports

    n: int


@pytest.mark.anyio
async def test_events_a_handler_derives_are_left_out_of_a_replay_and_counted(
    tmp_path: Path,
) -> None:
    """What the replay bus's gathering makes again (``EventBus.gathering``) is not also
    taken from the log; a bus without a gathering gets the recorded ones."""
    log = write_log(tmp_path / "pong.evlog", [*report_rounds(2), Pong(n=-1)])
    pongs: list[int] = []

    def setup(bus: EventBus) -> None:
        bus.gathering = bus.subscribe(Report, lambda e: bus.emit(Pong(n=e.index)))
        bus.subscribe(Pong, lambda e: pongs.append(e.n))

    result = await replay_log(log, subscribe=setup)
    assert sorted(pongs) == [0, 0, 1, 1]  # made again from the reports; the recorded -1 left out
    assert result.summary.filtered == 1
    recorded: list[int] = []
    await replay_log(log, subscribe=lambda bus: bus.subscribe(Pong, lambda e: recorded.append(e.n)))
    assert recorded == [-1]
    assert is_derived(Pong) and not is_derived(Report) and not is_derived(int)


@pytest.mark.anyio
async def test_instant_replay_needs_a_virtual_clock(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.evlog", report_rounds(1))
    async with EventBus() as bus:
        with pytest.raises(ValueError, match="VirtualClock"):
            await replay(bus, log)
        with pytest.raises(ValueError, match="speed"):
            await replay(bus, log, speed=0.0)


@pytest.mark.anyio
async def test_replay_at_recorded_speed_on_the_real_clock(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.evlog", report_rounds(3), interval=0.01)
    capture = EventCapture()
    result = await replay_log(log, capture, types=Report, speed=10.0)
    assert [e.index for e in capture.of_type(Report)] == [0, 0, 1, 1, 2, 2]
    # The real-time bus stamps its own times and sequence numbers.
    assert [e.seq for e in capture.events] == sorted(e.seq for e in capture.events)
    assert result.summary.replayed == 6


@pytest.mark.anyio
async def test_replay_from_events_in_memory() -> None:
    capture = EventCapture()
    events = [msgspec.structs.replace(e, time=5.0 + i) for i, e in enumerate(report_rounds(2))]
    async with EventBus(clock=VirtualClock(5.0), period=10.0) as bus:
        bus.subscribe(Report, capture)
        summary = await replay(bus, events)
    assert summary.replayed == 4 and summary.truncated is None
    assert [e.time for e in capture.events] == [5.0, 6.0, 7.0, 8.0]


@pytest.mark.anyio
async def test_truncated_log_replays_what_is_intact(tmp_path: Path) -> None:
    log = write_log(tmp_path / "log.evlog", report_rounds(3))
    log.write_bytes(log.read_bytes()[:-3])
    capture = EventCapture()
    result = await replay_log(log, capture)
    assert len(capture.of_type(Report)) == 5
    assert result.summary.truncated is not None and result.summary.truncated.index == 5


def test_assert_rounds_names_what_is_wrong() -> None:
    events: list[Any] = report_rounds(3, world_size=2)
    assert_rounds(events, range(3))
    assert_rounds(events, [0, 1, 2], ranks=[0, 1])
    with pytest.raises(AssertionError, match=r"rank 1: saw rounds \[0, 1, 2\], unexpected \[2\]"):
        assert_rounds(events, range(2), ranks=[1])
    with pytest.raises(AssertionError, match=r"rank 2: saw rounds \[\], missing \[0, 1, 2\]"):
        assert_rounds(events, range(3), ranks=[0, 2])
    with pytest.raises(AssertionError, match="no Report events"):
        assert_rounds([], range(1))


def test_the_plugin_from_a_user_test(pytester: pytest.Pytester) -> None:
    """The shipped example, run as a user's test module with the installed plugin."""
    pytester.makepyfile(test_user=EXAMPLE.read_text())
    result = pytester.runpytest_subprocess("-q", "-p", "anyio")
    result.assert_outcomes(passed=4)


def test_plugin_fixtures_fail_a_wrong_expectation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_wrong="""
        import pytest
        from eventbus.testing import assert_rounds, report_rounds

        @pytest.fixture
        def anyio_backend():
            return "asyncio"

        @pytest.mark.anyio
        async def test_wrong(event_log_factory, replay_log):
            seen = []
            await replay_log(event_log_factory(report_rounds(2)), seen.append)
            assert_rounds(seen, range(3))
        """
    )
    result = pytester.runpytest_subprocess("-q")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*missing [[]2[]]*"])


@pytest.mark.anyio
async def test_placeholders_are_never_delivered_and_are_counted(tmp_path: Path) -> None:
    """Recorded (unencodable) and read (not decodable) placeholders alike, with or
    without recorded diagnostics; their unknown times do not move the clock."""
    log = tmp_path / "odd.evlog"
    events = [
        msgspec.structs.replace(e, seq=i, time=5.0 + i)
        for i, e in enumerate(report_rounds(2, world_size=1))
    ]
    with LogRecorder(log) as recorder:
        recorder.write(events[0])
        recorder.write(msgspec.structs.replace(events[1], metrics={"p": Path("/x")}, time=0.0))
        recorder.write(msgspec.structs.replace(events[1], metrics=None, seq=2, time=7.0))
        recorder.write(HealthCheckTick(period=0, start=5.0, end=6.0, seq=3, time=8.0))
    for include in (False, True):
        capture = EventCapture()
        result = await replay_log(log, capture, include_diagnostics=include)
        assert not capture.of_type(EventPlaceholder)
        assert [e.index for e in capture.of_type(Report)] == [0]
        assert result.summary.placeholders == 2
        assert (result.summary.first_time, result.summary.last_time) == (5.0, 8.0)
