"""Replays that charge callbacks a cost (issue 28, items 4 and 5): on virtual time, a
callback given a cost is over budget as a live one of that length would be, its policy
acts, the same way on every replay and as the live run with a callback that takes
that long did; and a replay never sleeps in real time."""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import (
    BudgetReport,
    Event,
    EventBus,
    HandlerStateChanged,
    HandlerTimedOut,
    Report,
    RoundGathered,
    RunStarted,
    TrainRunContext,
    VirtualClock,
)
from eventbus._options import OptionTypeError
from eventbus._subscription import OverBudgetPolicy
from eventbus.log import LogRecorder, replay_file
from eventbus.options import OptionError
from eventbus.testing import attach, replay_log, report_rounds, write_log
from handlers import UserCallback

pytestmark = pytest.mark.anyio

#: The diagnostics two runs are compared by: what the budgets said and what the policies did.
Verdicts = list[BudgetReport | HandlerStateChanged]


class Slow(UserCallback):
    """A training callback whose ``after_report`` takes ``costs[round]`` seconds of the
    ``clock`` given (a live run's callback that is slow); without a clock it takes no
    time at all (a replay charges it instead). It keeps the rounds it saw."""

    def __init__(self, costs: Sequence[float] = (), clock: VirtualClock | None = None) -> None:
        self.costs = costs
        self.clock = clock
        self.rounds: list[int] = []

    def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        index = int(metrics[0]["round"])
        self.rounds.append(index)
        if self.clock is not None:
            self.clock.advance(self.costs[index], blocked=True)  # a sync call blocks the loop


def slow_with(policy: OverBudgetPolicy) -> type[Slow]:
    """``Slow`` with an over-budget policy; named ``Slow`` whatever the policy, so that
    its hook is ``Slow.after_report`` everywhere."""
    cls: type[Slow] = type("Slow", (Slow,), {"over_budget": policy})
    return cls


def rounds_log(path: Path, rounds: int, *, interval: float = 0.1) -> Path:
    """A log of ``rounds`` rounds of two ranks, an event every ``interval`` s."""
    events = report_rounds(rounds, world_size=2, metrics=lambda rank, i: {"round": i})
    return write_log(path, events, start=100.0, interval=interval)


def verdicts_of(events: Sequence[Event]) -> Verdicts:
    return [e for e in events if isinstance(e, BudgetReport | HandlerStateChanged)]


def unstamped(verdicts: Verdicts) -> list[Any]:
    """The verdicts without the bus's stamps (``seq``: the two buses number alike only
    when they carry the same events) and without the usage of a live run's recorder (its
    flush handler: a replay bus records nothing), as plain data for a readable diff."""
    plain = []
    for verdict in verdicts:
        compared: BudgetReport | HandlerStateChanged = msgspec.structs.replace(verdict, seq=0)
        if isinstance(compared, BudgetReport):
            usages = tuple(u for u in compared.handlers if not u.handler.startswith(RECORDER))
            compared = msgspec.structs.replace(compared, handlers=usages)
        plain.append(msgspec.to_builtins(compared))
    return plain


#: The prefix of the names of a log recorder's own handlers.
RECORDER = "eventbus.recorder."


async def replayed_verdicts(
    path: Path, callback: Slow, costs: Any, **options: Any
) -> tuple[Verdicts, Slow]:
    seen: list[Event] = []
    await replay_log(
        path,
        callback,
        subscribe=lambda bus: bus.subscribe(
            (BudgetReport, HandlerStateChanged), seen.append, name="seen"
        ),
        costs=costs,
        **options,
    )
    return verdicts_of(seen), callback


# --- a callback over budget in a replay -----------------------------------------------------


@pytest.mark.parametrize("policy", ["warn", "coalesce", "disable"])
async def test_an_injected_cost_puts_a_callback_over_budget_and_its_policy_acts(
    tmp_path: Path, policy: OverBudgetPolicy
) -> None:
    # 20 rounds, one every 0.2 s: 5 a period of 1 s, 0.25 s of callback a period at 50 ms
    # a call, five times the budget (5% of 1 s).
    log = rounds_log(tmp_path / "run.evlog", 20)
    cls = slow_with(policy)
    costs = {"Slow.after_report": 0.05}
    first, slow = await replayed_verdicts(log, cls(), costs, period=1.0)
    again, _ = await replayed_verdicts(log, cls(), costs, period=1.0)
    assert first == again  # deterministic: every figure, every state change, in order

    reports = [v for v in first if isinstance(v, BudgetReport)]
    usage = {r.period: {u.handler: u for u in r.handlers} for r in reports if not r.partial}
    assert usage[0]["Slow.after_report"].calls == 5
    assert usage[0]["Slow.after_report"].total == pytest.approx(0.25)
    assert usage[0]["Slow.after_report"].max == pytest.approx(0.05)
    assert reports[0].over_budget == ("Slow.after_report",)
    changes = [(c.handler, c.state) for c in first if isinstance(c, HandlerStateChanged)]
    if policy == "warn":
        assert changes == []
        assert slow.rounds == list(range(20))  # warned, never skipped
        assert all(r.over_budget == ("Slow.after_report",) for r in reports if not r.partial)
    elif policy == "coalesce":
        assert changes[0] == ("Slow.after_report", "coalescing")
    else:
        assert changes[0] == ("Slow.after_report", "disabled")
        missed = sorted(set(range(20)) - set(slow.rounds))
        assert missed and missed[0] == 5  # from the first round after period 0 closed

    # Without the cost, the same replay is never over budget: the cost is what did it.
    free, _ = await replayed_verdicts(log, cls(), None, period=1.0)
    assert not any(v.over_budget for v in free if isinstance(v, BudgetReport))
    assert not any(isinstance(v, HandlerStateChanged) for v in free)


async def test_a_coalescing_lane_behind_its_events_gets_the_newest_of_each_batch(
    tmp_path: Path,
) -> None:
    """A lane callback that takes 50 ms a round, when rounds come every 20 ms, falls
    behind: over budget, it coalesces, and the rounds that waited in its lane are
    skipped but the newest, the same ones on every replay."""
    log = rounds_log(tmp_path / "run.evlog", 100, interval=0.01)
    cls = type("Slow", (Slow,), {"over_budget": "coalesce", "delivery": "lane"})
    costs = {"Slow.after_report": 0.05}
    first, slow = await replayed_verdicts(log, cls(), costs, period=1.0)
    again, slow_again = await replayed_verdicts(log, cls(), costs, period=1.0)
    assert first == again and slow.rounds == slow_again.rounds
    assert ("Slow.after_report", "coalescing") in [
        (c.handler, c.state) for c in first if isinstance(c, HandlerStateChanged)
    ]
    skipped = sum(u.skipped for r in first if isinstance(r, BudgetReport) for u in r.handlers)
    assert skipped == 100 - len(slow.rounds) > 0
    assert slow.rounds == sorted(slow.rounds) and slow.rounds[-1] == 99  # the newest, in order


async def test_a_cost_function_of_the_event_charges_some_rounds_only(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 20)

    def cost(name: str, event: Event) -> float:
        # Rounds 10 and on are slow: the periods before them are within budget.
        if name == "Slow.after_report" and isinstance(event, RoundGathered):
            return 0.05 if event.round >= 10 else 0.0
        return 0.0

    verdicts, slow = await replayed_verdicts(log, slow_with("warn")(), cost, period=1.0)
    reports = [v for v in verdicts if isinstance(v, BudgetReport) and not v.partial]
    over = [r.period for r in reports if r.over_budget]
    assert over and min(over) == 2  # rounds 10-14 fall in period 2
    assert all(not r.over_budget for r in reports if r.period < 2)
    assert slow.rounds == list(range(20))


async def test_the_summary_shows_what_was_charged(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 10)
    result = await replay_log(log, Slow(), costs={"Slow.after_report": 0.002})
    figures = result.summary.handler("Slow.after_report")
    assert figures.calls == 10
    assert figures.total == pytest.approx(0.02)
    assert figures.max == pytest.approx(0.002)
    # The handlers not named cost nothing, as on any virtual-time replay.
    assert all(h.total == 0.0 for h in result.summary.handlers if h.name != "Slow.after_report")


async def test_a_second_instance_is_charged_by_its_own_name(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 4)
    result = await replay_log(log, Slow(), Slow(), costs={"Slow.after_report#2": 0.01})
    assert result.summary.handler("Slow.after_report").total == 0.0
    assert result.summary.handler("Slow.after_report#2").total == pytest.approx(0.04)


async def test_a_sync_callback_charged_past_its_deadline_is_an_overrun_as_live(
    tmp_path: Path,
) -> None:
    """A plain sync call cannot be interrupted: live, it runs on and is reported as an
    overrun once it returns; a charged one is the same (and takes no real time)."""
    log = rounds_log(tmp_path / "run.evlog", 3)
    timeouts: list[HandlerTimedOut] = []
    result = await replay_log(
        log,
        Slow(),
        subscribe=lambda bus: bus.subscribe(HandlerTimedOut, timeouts.append),
        costs={"Slow.after_report": 45.0},
        timeout=30.0,
    )
    assert [(t.handler, t.outcome) for t in timeouts] == [("Slow.after_report", "overrun")] * 3
    assert [t.elapsed for t in timeouts] == [pytest.approx(45.0)] * 3
    assert result.summary.handler("Slow.after_report").timed_out == 3


async def test_measured_costs_charge_each_call_its_wall_time(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 3)

    class Busy(UserCallback):
        def after_report(self, *args: Any) -> None:
            deadline = time.perf_counter() + 0.002
            while time.perf_counter() < deadline:  # busy, not asleep
                pass

    result = await replay_log(log, Busy(), costs="measured")
    assert result.summary.handler("Busy.after_report").total >= 3 * 0.002 * 0.99
    free = await replay_log(log, Busy())
    assert free.summary.handler("Busy.after_report").total == 0.0


# --- a replay against a live run ---------------------------------------------------------------


async def live_run(
    path: Path, policy: OverBudgetPolicy, costs: Sequence[float], step: float
) -> tuple[Verdicts, list[int]]:
    """A live run on virtual time: each round, the workers step (``step`` s), both ranks
    report, and they wait for the callbacks (``sync``); the slow callback takes its
    round's cost of the clock. Recorded to ``path``; its verdicts and the rounds the
    callback saw."""
    clock = VirtualClock(100.0)
    slow = slow_with(policy)(costs, clock)
    seen: list[Event] = []
    with LogRecorder(path, run_id="run", fsync="never") as recorder:
        async with EventBus(clock=clock, period=1.0) as bus:
            recorder.attach(bus)
            attach(bus, [slow])  # as replay_log attaches it (its capture of the hook too)
            bus.subscribe((BudgetReport, HandlerStateChanged), seen.append, name="seen")
            # At the start: the replay's clock starts where the log does (its first tick's
            # start, or its first event), so the run's first event is at its start.
            await bus.publish(RunStarted(run_id="run", name="run", world_size=2))
            await bus.wait_idle()
            for i in range(len(costs)):
                clock.advance(step)
                for event in report_rounds([i], world_size=2, metrics=lambda r, i: {"round": i}):
                    await bus.publish(event)
                await bus.wait_idle()
    return verdicts_of(seen), slow.rounds


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    policy=st.sampled_from(["warn", "coalesce", "disable"]),
    costs=st.lists(
        st.one_of(st.just(0.0), st.floats(0.0001, 0.3, allow_nan=False)), min_size=1, max_size=25
    ),
    step=st.sampled_from([0.05, 0.2, 0.45]),
)
async def test_a_replay_charged_the_costs_of_a_live_run_decides_what_the_live_run_did(
    policy: OverBudgetPolicy, costs: list[float], step: float
) -> None:
    """Property, over random callback costs: the live run's budget reports and state
    changes are the replay's, figure for figure, the last period's (cut short when the
    bus closed) included, and the callback sees the same rounds."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "live.evlog"
        live, live_rounds = await live_run(log, policy, costs, step)

        def cost(name: str, event: Event) -> float:
            if name == "Slow.after_report" and isinstance(event, RoundGathered):
                return costs[event.round]
            return 0.0

        replayed, slow = await replayed_verdicts(log, slow_with(policy)(), cost, period=1.0)
    assert slow.rounds == live_rounds
    assert unstamped(replayed) == unstamped(live)


# --- bad costs ---------------------------------------------------------------------------------


async def test_a_cost_for_a_handler_the_bus_has_not_names_it_and_lists_those_there_are(
    tmp_path: Path,
) -> None:
    log = rounds_log(tmp_path / "run.evlog", 2)
    with pytest.raises(OptionError) as raised:
        await replay_log(log, Slow(), costs={"Slwo.after_report": 0.05})
    message = str(raised.value)
    assert "no handler named 'Slwo.after_report'" in message
    assert "'Slow.after_report'" in message  # the names it could have meant


@pytest.mark.parametrize("value", [-0.01, math.nan, math.inf, -math.inf, 1e9, True, "0.05", None])
async def test_a_cost_out_of_range_is_refused_naming_the_handler(
    tmp_path: Path, value: Any
) -> None:
    log = rounds_log(tmp_path / "run.evlog", 2)
    with pytest.raises((OptionError, OptionTypeError)) as raised:
        await replay_log(log, Slow(), costs={"Slow.after_report": value})
    assert raised.value.option == "costs['Slow.after_report']"
    assert str(raised.value).startswith("costs['Slow.after_report'] must be a number of seconds")


async def test_a_cost_function_giving_a_bad_cost_ends_the_replay_naming_handler_and_event(
    tmp_path: Path,
) -> None:
    log = rounds_log(tmp_path / "run.evlog", 6)
    slow = Slow()
    with pytest.raises(OptionError) as raised:
        await replay_log(
            log, slow, costs=lambda name, event: -1.0 if name == "Slow.after_report" else 0.0
        )
    assert raised.value.option == "costs['Slow.after_report']"
    assert "costing Slow.after_report for RoundGathered" in "".join(raised.value.__notes__)
    assert len(slow.rounds) < 6  # stopped there, not replayed to the end


async def test_a_cost_function_that_raises_ends_the_replay_with_its_error(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 2)

    def cost(name: str, event: Event) -> float:
        raise KeyError("no such round")

    with pytest.raises(KeyError):
        await replay_log(log, Slow(), costs=cost)


async def test_an_async_callback_charged_its_deadline_is_refused(tmp_path: Path) -> None:
    """Live, an async call is cancelled at its deadline: a replay cannot charge past it."""
    log = rounds_log(tmp_path / "run.evlog", 2)

    class Waiting(UserCallback):
        async def after_report(self, *args: Any) -> None:
            pass

    with pytest.raises(OptionError, match=r"reaches the deadline of Waiting\.after_report"):
        await replay_log(log, Waiting(), costs={"Waiting.after_report": 30.0}, timeout=30.0)
    result = await replay_log(log, Waiting(), costs={"Waiting.after_report": 29.0}, timeout=30.0)
    assert result.summary.handler("Waiting.after_report").total == pytest.approx(58.0)


@pytest.mark.parametrize("costs", ["slow", 0.05, ["Slow.after_report"]])
async def test_costs_of_another_kind_are_refused(tmp_path: Path, costs: Any) -> None:
    log = rounds_log(tmp_path / "run.evlog", 2)
    with pytest.raises((OptionError, OptionTypeError), match="costs must be"):
        await replay_log(log, Slow(), costs=costs)


async def test_costs_need_an_instant_replay(tmp_path: Path) -> None:
    log = rounds_log(tmp_path / "run.evlog", 2, interval=0.001)
    with pytest.raises(OptionError, match="instant replay"):
        await replay_log(log, Slow(), costs={"Slow.after_report": 0.01}, speed=1000.0)
    with pytest.raises(OptionError, match="measures every call already"):
        await replay_log(log, Slow(), costs="measured", real_time=True)


# --- no real sleeps ----------------------------------------------------------------------------


class SleepCounter:
    """Counts the real sleeps of non-zero length asked of ``anyio.sleep`` (what the bus,
    its watchdog and the paced replay call), the backends' sleeps and ``time.sleep``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sleeps: list[float] = []
        for module in (anyio, asyncio, trio, time):
            monkeypatch.setattr(module, "sleep", self._counting(module.sleep))

    def _counting(self, sleep: Callable[[float], Any]) -> Callable[[float], Any]:
        def counted(seconds: float, *args: Any, **kwargs: Any) -> Any:
            if seconds > 0:
                self.sleeps.append(seconds)
            return sleep(seconds, *args, **kwargs)

        return counted


class AsyncSlow(Slow):
    async def on_event(self, run_context: TrainRunContext, event: Event) -> None:
        pass


async def test_a_budget_policy_replay_of_60_rounds_never_sleeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = rounds_log(tmp_path / "run.evlog", 60)
    counter = SleepCounter(monkeypatch)
    callbacks = [slow_with("warn")(), slow_with("coalesce")(), slow_with("disable")()]
    watcher = type("AsyncSlow", (AsyncSlow,), {"event_types": (Report,)})()
    costs = {"Slow.after_report": 0.05, "Slow.after_report#2": 0.05, "Slow.after_report#3": 0.05}
    costs["AsyncSlow.on_event"] = 0.01
    result = await replay_log(log, *callbacks, watcher, costs=costs, period=1.0)
    assert result.summary.handler("Slow.after_report").calls == 60
    assert result.summary.handler("Slow.after_report#3").skipped > 0  # its policy acted
    assert counter.sleeps == []
    # The counter does see a replay that sleeps: one paced on the real clock.
    paced = rounds_log(tmp_path / "paced.evlog", 2, interval=0.001)
    await replay_file(paced, lambda bus: None, speed=10.0)
    assert counter.sleeps


async def test_a_replay_in_real_time_still_keeps_pace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``speed=`` paces a replay on the real clock, as before: it sleeps between events."""
    log = rounds_log(tmp_path / "run.evlog", 3, interval=0.001)
    counter = SleepCounter(monkeypatch)
    summary = await replay_file(log, lambda bus: None, speed=1.0)
    assert summary.replayed == 6
    assert len(counter.sleeps) >= 1
