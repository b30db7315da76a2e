"""Report gathering and failure gathering, rule by rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from _builders import ranked_report as report
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import (
    CheckpointMismatch,
    Event,
    EventBus,
    HealthCheckTick,
    ReportRejected,
    RoundGathered,
    RunFinished,
    RunResult,
    RunStarted,
    TrainRunContext,
    VirtualClock,
    WorkerFailure,
    WorkerGroupRestarted,
)
from handlers import UserCallback, WorkerError
from handlers._attach import attach_user_callbacks
from handlers._reports import ReportCallbackHandler


class Rounds:
    """Takes what a gatherer emits; records its rounds as (ranks in order, indexes, checkpoint)."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[int], list[int], str | None]] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundGathered):
            metrics = event.metrics
            self.rounds.append(
                ([m["rank"] for m in metrics], [m["i"] for m in metrics], event.checkpoint)
            )


def gatherer(world_size: int | None = 3, **kw: Any) -> tuple[ReportCallbackHandler, Rounds]:
    rounds = Rounds()
    return ReportCallbackHandler(world_size=world_size, emit=rounds, **kw), rounds


# --- report gathering, without a bus -------------------------------------------


def test_round_waits_for_every_rank_and_takes_one_report_each_in_rank_order() -> None:
    handler, out = gatherer()
    for i in range(3):  # rank 0 is three reports ahead
        handler.handle(report(0, i))
    handler.handle(report(2, 0))
    assert out.rounds == []
    handler.handle(report(1, 0))
    assert out.rounds == [([0, 1, 2], [0, 0, 0], None)]
    handler.handle(report(1, 1))
    handler.handle(report(2, 1))
    assert out.rounds[-1] == ([0, 1, 2], [1, 1, 1], None)
    assert handler.rounds == 2 and handler.reports == 7


def test_late_rank_releases_several_rounds_at_once() -> None:
    handler, out = gatherer()
    for i in range(4):
        handler.handle(report(0, i))
        handler.handle(report(2, i))
    assert out.rounds == []
    for i in range(4):
        handler.handle(report(1, i))
    assert [idx for _, idx, _ in out.rounds] == [[i, i, i] for i in range(4)]


def test_world_size_comes_from_the_first_report_when_not_given() -> None:
    handler, out = gatherer(world_size=None)
    handler.handle(report(1, 0, world_size=2))
    handler.handle(report(0, 0, world_size=2))
    assert out.rounds == [([0, 1], [0, 0], None)]


def test_restart_discards_partial_rounds_and_shrinks_then_grows_required_ranks() -> None:
    handler, out = gatherer(world_size=4)
    handler.handle(report(0, 0, world_size=4))
    handler.handle(report(1, 0, world_size=4))
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=4, required_ranks=(0, 2)))
    assert handler.discarded == 2
    handler.handle(report(2, 1, world_size=4))
    handler.handle(report(0, 1, world_size=4))
    assert out.rounds == [([0, 2], [1, 1], None)]  # the pre-restart report of rank 0 is gone
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=4))  # back to every rank
    for rank in (3, 2, 1, 0):
        handler.handle(report(rank, 5, world_size=4))
    assert out.rounds[-1] == ([0, 1, 2, 3], [5, 5, 5, 5], None)


def test_restart_resets_report_indexes_so_a_resumed_worker_may_repeat_them() -> None:
    handler, out = gatherer(world_size=1)
    handler.handle(report(0, 7, world_size=1))
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=1))
    handler.handle(report(0, 5, world_size=1))
    assert handler.rejected == 0 and len(out.rounds) == 2


def test_restart_may_change_the_world_size() -> None:
    handler, out = gatherer(world_size=3)
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=2))
    handler.handle(report(0, 0, world_size=2))
    handler.handle(report(1, 0, world_size=2))
    assert out.rounds == [([0, 1], [0, 0], None)]


@given(
    world_size=st.integers(1, 6),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_property_any_interleaving_gives_in_order_rounds_of_one_report_per_rank(
    world_size: int, data: st.DataObject
) -> None:
    per_rank = data.draw(st.lists(st.integers(0, 6), min_size=world_size, max_size=world_size))
    schedule = [rank for rank, n in enumerate(per_rank) for _ in range(n)]
    order = data.draw(st.permutations(schedule))
    handler, out = gatherer(world_size=world_size)
    sent = [0] * world_size
    for rank in order:  # each rank's own reports stay in order; ranks interleave at random
        handler.handle(report(rank, sent[rank], world_size=world_size))
        sent[rank] += 1
    assert len(out.rounds) == min(per_rank)
    for k, (ranks, indexes, _) in enumerate(out.rounds):
        assert ranks == list(range(world_size))
        assert indexes == [k] * world_size


# --- through a bus: diagnostics and user callbacks ----------------------------------


class Recorder(UserCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def before_run(self, run_context: TrainRunContext) -> None:
        self.calls.append(("before_run", run_context.run_id, run_context.world_size))

    async def after_report(
        self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: str | None
    ) -> None:
        await anyio.lowlevel.checkpoint()
        self.calls.append(("after_report", [m.get("i") for m in metrics], checkpoint))

    def after_exception(
        self, run_context: TrainRunContext, worker_exceptions: dict[int, Exception]
    ) -> None:
        assert all(isinstance(e, WorkerError) for e in worker_exceptions.values())
        self.calls.append(
            ("after_exception", {r: str(e) for r, e in sorted(worker_exceptions.items())})
        )

    def after_run(self, run_context: TrainRunContext, result: RunResult) -> None:
        self.calls.append(("after_run", result.status, result.rounds, result.failures))


def of(calls: list[tuple[Any, ...]], kind: str) -> list[tuple[Any, ...]]:
    return [c[1:] for c in calls if c[0] == kind]


@pytest.mark.anyio
async def test_inconsistent_checkpoints_give_a_mismatch_event_and_no_checkpoint() -> None:
    rec = Recorder()
    mismatches: list[CheckpointMismatch] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(CheckpointMismatch, mismatches.append)
        attach_user_callbacks(bus, [rec], world_size=2)
        await bus.publish(report(0, 0, world_size=2, checkpoint="a"))
        await bus.publish(report(1, 0, world_size=2, checkpoint="b"))
        await bus.publish(report(0, 1, world_size=2, checkpoint="c"))
        await bus.publish(report(1, 1, world_size=2, checkpoint="c"))
    assert of(rec.calls, "after_report") == [([0, 0], None), ([1, 1], "c")]
    assert [(m.round, m.checkpoints) for m in mismatches] == [(0, {0: "a", 1: "b"})]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ((5, 0, {}), "rank"),
        ((-1, 0, {}), "rank"),
        ((0, -1, {}), "index"),
        ((0, 0, {"world_size": 4}), "world_size"),
        ((0, 0, {"metrics": [1, 2]}), "metrics"),
        ((0, 0, {"metrics": {"x": b"raw"}}), "metrics['x']"),
        ((0, 0, {"metrics": {"x": {"deep": [1, object()]}}}), "metrics['x']['deep'][1]"),
        ((0, 0, {"metrics": {"p": Path("/tmp")}}), "metrics['p']"),
        ((0, 0, {"metrics": {"big": 2**64}}), "metrics['big']"),
        ((0, 0, {"metrics": {1: 2}}), "metrics"),
        ((0, 0, {"metrics": None}), "metrics"),
        ((0, 0, {"run_id": "another-run"}), "run_id"),
        ((0, 0, {"checkpoint": 7}), "checkpoint"),
        (("0", 0, {}), "rank"),
        ((0, 1.5, {}), "index"),
    ],
)
async def test_bad_reports_are_rejected_by_rank_and_field_and_the_run_goes_on(
    bad: tuple[Any, Any, dict[str, Any]], field: str
) -> None:
    rank, index, fields = bad
    rec = Recorder()
    rejected: list[ReportRejected] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(ReportRejected, rejected.append)
        attach_user_callbacks(bus, [rec], world_size=3)
        await bus.publish(report(1, 0))  # gathered before the bad one: must not be lost
        await bus.publish(report(rank, index, **fields))
        await bus.publish(report(0, 0))
        await bus.publish(report(2, 0))
    assert [(r.rank, r.field) for r in rejected] == [(rank if type(rank) is int else -1, field)]
    assert rejected[0].reason
    assert of(rec.calls, "after_report") == [([0, 0, 0], None)]


@pytest.mark.anyio
async def test_non_increasing_index_is_rejected() -> None:
    rejected: list[ReportRejected] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(ReportRejected, rejected.append)
        attach_user_callbacks(bus, [], world_size=3)
        await bus.publish(report(1, 3))
        await bus.publish(report(1, 3))
        await bus.publish(report(1, 2))
    assert [(r.rank, r.field) for r in rejected] == [(1, "index"), (1, "index")]
    assert "not increasing" in rejected[0].reason


@pytest.mark.anyio
async def test_context_from_reports_when_the_log_has_no_run_started() -> None:
    rec = Recorder()
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attachment = attach_user_callbacks(bus, [rec])
        for rank in range(3):
            await bus.publish(report(rank, 0))
        await attachment.finish()
    assert rec.calls == [
        ("before_run", "r", 3),
        ("after_report", [0, 0, 0], None),
        ("after_run", "finished", 1, 0),
    ]


@pytest.mark.anyio
async def test_a_round_reaches_callbacks_as_one_event_carrying_its_context() -> None:
    gathered: list[RoundGathered] = []
    rec = Recorder()
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attach_user_callbacks(bus, [rec], world_size=2)
        bus.subscribe(RoundGathered, gathered.append)
        await bus.publish(RunStarted(run_id="r", name="n", world_size=2))
        for rank in (1, 0):
            await bus.publish(report(rank, 0, world_size=2, checkpoint="ck"))
        await bus.wait_idle()
    (event,) = gathered
    assert event.context.run_id == "r" and event.context.world_size == 2
    assert (event.round, event.ranks, event.checkpoint) == (0, (0, 1), "ck")
    assert [m["rank"] for m in event.metrics] == [0, 1]
    assert of(rec.calls, "after_report") == [([0, 0], "ck")]


@pytest.mark.anyio
async def test_replaying_a_run_with_its_callbacks_delivers_each_round_once(
    tmp_path: Path,
) -> None:
    """The log holds the gathered events of the run; a replay that gathers again
    leaves them out, so neither a callback nor a raw handler sees a round twice."""
    from eventbus.log import replay_file
    from handlers import open_run

    log = tmp_path / "run.evlog"

    async def worker(reporter: Any) -> None:
        for step in range(3):
            await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=f"ck{step}")

    async with open_run(world_size=2, callbacks=[], log=log, clock=VirtualClock()) as run:
        await run.workers(worker)

    rec = Recorder()
    raw: list[RoundGathered] = []

    def setup(bus: EventBus) -> None:
        attach_user_callbacks(bus, [rec])
        bus.subscribe(RoundGathered, raw.append)

    await replay_file(log, setup)
    assert [c[0] for c in rec.calls] == ["before_run", *["after_report"] * 3, "after_run"]
    assert [e.round for e in raw] == [0, 1, 2]
    alone: list[RoundGathered] = []  # no gathering on the bus: the recorded rounds
    await replay_file(log, lambda bus: bus.subscribe(RoundGathered, alone.append))
    assert [e.round for e in alone] == [0, 1, 2]


@pytest.mark.anyio
async def test_each_callback_method_is_its_own_subscription_with_its_own_deadline() -> None:
    class Slow(UserCallback):
        timeout = 0.05

        async def after_report(self, *args: Any) -> None:
            await anyio.sleep(10)

    rec = Recorder()
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attach_user_callbacks(bus, [Slow(), rec], world_size=1)
        await bus.publish(report(0, 0, world_size=1))
    names = {s.name: s for s in bus.stats().subscriptions}
    assert names["Slow.after_report"].timed_out == 1
    assert names["Recorder.after_report"].calls == 1
    assert of(rec.calls, "after_report") == [([0], None)]


# --- failure gathering per health-check period ------------------------------------


class Periods:
    """Drives health-check periods of a bus on a virtual clock, deterministically."""

    def __init__(self, bus: EventBus, clock: VirtualClock) -> None:
        self.bus, self.clock = bus, clock
        self.ticks: list[HealthCheckTick] = []
        bus.subscribe(HealthCheckTick, self.ticks.append)

    async def end_period(self) -> None:
        seen = len(self.ticks)
        self.clock.advance(self.bus.period)
        while len(self.ticks) == seen:
            await anyio.lowlevel.checkpoint()
        await self.bus.wait_idle()


def failure(rank: int, message: str = "boom") -> WorkerFailure:
    return WorkerFailure(run_id="r", rank=rank, error_type="RuntimeError", message=message)


@pytest.mark.anyio
async def test_failures_in_one_period_give_one_call_and_in_different_periods_several() -> None:
    rec = Recorder()
    clock = VirtualClock()
    async with EventBus(clock=clock, period=2.0) as bus:
        periods = Periods(bus, clock)
        attach_user_callbacks(bus, [rec], world_size=3)
        await bus.publish(RunStarted(run_id="r", name="n", world_size=3))
        await bus.publish(failure(0, "first"))
        await bus.publish(failure(2, "second"))
        await bus.publish(failure(0, "again"))  # same rank, same period: the first one stays
        await bus.wait_idle()  # events are stamped when dispatched: before the clock moves on
        assert of(rec.calls, "after_exception") == []  # the period is not over yet
        await periods.end_period()
        await periods.end_period()  # a period without failures: no call
        await bus.publish(failure(1, "third"))
        await bus.wait_idle()
        await periods.end_period()
    assert of(rec.calls, "after_exception") == [
        ({0: "RuntimeError: first", 2: "RuntimeError: second"},),
        ({1: "RuntimeError: third"},),
    ]


@pytest.mark.anyio
async def test_a_failure_stamped_after_the_period_end_belongs_to_the_next_period() -> None:
    rec = Recorder()
    clock = VirtualClock()
    async with EventBus(clock=clock, period=2.0) as bus:
        attach_user_callbacks(bus, [rec], world_size=2)
        await bus.publish(failure(0, "early"))
        await bus.wait_idle()
        clock.advance(2.5)  # the period ends; the tick is dispatched after the next batch
        await bus.publish(failure(1, "late"))
        await bus.wait_idle()
        assert of(rec.calls, "after_exception") == [({0: "RuntimeError: early"},)]
        await bus.publish(RunFinished(run_id="r", status="failed"))
    assert of(rec.calls, "after_exception")[-1] == ({1: "RuntimeError: late"},)
    assert rec.calls[-1][0] == "after_run"


@pytest.mark.anyio
async def test_pending_failures_are_delivered_before_after_run() -> None:
    rec = Recorder()
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attach_user_callbacks(bus, [rec], world_size=2)
        await bus.publish(RunStarted(run_id="r", name="n", world_size=2))
        await bus.publish(report(0, 0, world_size=2))
        await bus.publish(report(1, 0, world_size=2))
        await bus.publish(failure(1))
        await bus.publish(RunFinished(run_id="r", status="failed", error="x"))
    assert [c[0] for c in rec.calls] == [
        "before_run",
        "after_report",
        "after_exception",
        "after_run",
    ]
    assert rec.calls[-1] == ("after_run", "failed", 1, 1)


def test_worker_error_carries_type_message_and_traceback_text() -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        event = WorkerFailure.from_exception("r", 3, exc)
    err = WorkerError.from_failure(event)
    assert (err.rank, err.error_type, err.message) == (3, "KeyError", "'missing'")
    assert "raise KeyError" in err.traceback
    assert err.to_failure("r") == event
