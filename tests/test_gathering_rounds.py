"""The gatherer's rounds are what the rules say: ranks far ahead, checkpoints in
rounds not yet due, ranks not required, already frozen metrics, an emit that
raises, the figures; and, against a plain FIFO-per-rank model, any interleaving."""

from __future__ import annotations

import tracemalloc
from collections import deque
from typing import Any

import pytest
from _builders import ranked_report as report
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus import (
    CheckpointMismatch,
    Event,
    EventBus,
    ReportRejected,
    RoundGathered,
    TrainRunContext,
    VirtualClock,
    WorkerGroupRestarted,
)
from handlers import UserCallback
from handlers._attach import attach_user_callbacks
from handlers._metric_values import FrozenDict
from handlers._reports import ReportCallbackHandler


class Rounds:
    """Takes what a gatherer emits; records rounds as (ranks, indexes, checkpoint), and
    the metrics lists themselves."""

    def __init__(self) -> None:
        self.rounds: list[tuple[list[int], list[int], str | None]] = []
        self.lists: list[list[dict[str, Any]]] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundGathered):
            metrics = event.metrics
            self.lists.append(metrics)
            self.rounds.append(
                ([m["rank"] for m in metrics], [m["i"] for m in metrics], event.checkpoint)
            )


def gatherer(world_size: int = 3, **kw: Any) -> tuple[ReportCallbackHandler, Rounds]:
    rounds = Rounds()
    return ReportCallbackHandler(world_size=world_size, emit=rounds, **kw), rounds


def test_a_rank_far_ahead_fills_rounds_not_yet_due_and_they_come_in_order() -> None:
    handler, out = gatherer()
    for i in range(6):  # rank 0 six rounds ahead, rank 2 three
        handler.handle(report(0, i))
    for i in range(3):
        handler.handle(report(2, i))
    assert handler.reports == 9 and out.rounds == []
    for i in range(5):
        handler.handle(report(1, i))
    assert [idx for _, idx, _ in out.rounds] == [[i, i, i] for i in range(3)]
    handler.handle(report(2, 3))  # round 3 completes as it comes
    handler.handle(report(2, 4))
    assert [idx for _, idx, _ in out.rounds][3:] == [[3, 3, 3], [4, 4, 4]]
    handler.handle(report(0, 6))  # rank 0's leftover lead, and one more
    handler.handle(report(1, 5))
    handler.handle(report(2, 5))
    assert out.rounds[-1] == ([0, 1, 2], [5, 5, 5], None)
    assert (handler.rounds, handler.reports) == (6, 19)


def test_checkpoints_named_ahead_stay_with_their_round() -> None:
    handler, out = gatherer(world_size=2)
    handler.handle(report(0, 0, world_size=2, checkpoint="c0"))
    handler.handle(report(0, 1, world_size=2, checkpoint="c1"))
    handler.handle(report(0, 2, world_size=2, checkpoint="c2"))
    handler.handle(report(1, 2, world_size=2))  # round 0: only rank 0 named one
    handler.handle(report(1, 3, world_size=2, checkpoint="other"))  # round 1: a mismatch
    handler.handle(report(1, 4, world_size=2, checkpoint="c2"))  # round 2: they agree
    assert [c for _, _, c in out.rounds] == ["c0", None, "c2"]
    assert handler.mismatches == 1 and handler.last_checkpoint == "c2"


@pytest.mark.anyio
async def test_a_mismatch_in_a_round_completed_ahead_names_every_rank() -> None:
    mismatches: list[CheckpointMismatch] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(CheckpointMismatch, mismatches.append)
        handler, _ = gatherer(world_size=3)
        handler.subscribe(bus)
        for rank, name in ((2, "b"), (0, "a")):
            await bus.publish(report(rank, 0, checkpoint=None))
            await bus.publish(report(rank, 1, checkpoint=name))
        await bus.publish(report(1, 0))
        await bus.publish(report(1, 1))
    assert [(m.round, m.checkpoints) for m in mismatches] == [(1, {0: "a", 1: None, 2: "b"})]


@pytest.mark.anyio
async def test_ranks_not_required_are_rejected_after_the_checks_that_come_first() -> None:
    rejected: list[ReportRejected] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(ReportRejected, rejected.append)
        handler, out = gatherer(world_size=4, required_ranks=[0, 2])
        handler.subscribe(bus)  # from now on its rounds go to the bus
        bus.subscribe(RoundGathered, out)
        await bus.publish(report(1, -1, world_size=4))  # the index is wrong before the rank is
        await bus.publish(report(1, 0, world_size=4))
        await bus.publish(report(3, 5, world_size=4))
        await bus.publish(report(2, 0, world_size=4))
        await bus.publish(report(0, 0, world_size=4))
    assert [(r.rank, r.field) for r in rejected] == [(1, "index"), (1, "rank"), (3, "rank")]
    assert "negative" in rejected[0].reason and "not required" in rejected[1].reason
    assert out.rounds == [([0, 2], [0, 0], None)]
    assert handler.reports == 2 and handler.rejected == 3


def test_frozen_metrics_are_taken_as_they_are_and_plain_ones_are_copied() -> None:
    handler, out = gatherer(world_size=2)
    frozen = FrozenDict({"rank": 0, "i": 0})
    plain = {"rank": 1, "i": 0}
    handler.handle(report(0, 0, world_size=2, metrics=frozen))
    handler.handle(report(1, 0, world_size=2, metrics=plain))
    (metrics,) = out.lists
    assert metrics[0] is frozen
    assert type(metrics[1]) is FrozenDict and metrics[1] == plain and metrics[1] is not plain
    plain["i"] = 99
    assert metrics[1]["i"] == 0


def test_bad_metrics_on_the_fast_path_are_rejected_and_the_index_stays_free() -> None:
    handler, out = gatherer(world_size=1)
    handler.handle(report(0, 0, world_size=1))  # the first report takes the slow path
    handler.handle(report(0, 1, world_size=1, metrics={"x": object()}))
    handler.handle(report(0, 1, world_size=1))
    assert handler.rejected == 1 and [idx for _, idx, _ in out.rounds] == [[0], [1]]


def test_an_emit_that_raises_leaves_the_gatherer_going() -> None:
    class Fails:
        def __init__(self) -> None:
            self.seen: list[int] = []

        def __call__(self, event: Event) -> None:
            assert isinstance(event, RoundGathered)
            self.seen.append(event.metrics[0]["i"])
            if event.metrics[0]["i"] == 0:
                raise RuntimeError("round 0")

    fails = Fails()
    handler = ReportCallbackHandler(world_size=2, emit=fails)
    for i in range(3):
        handler.handle(report(0, i, world_size=2))
    with pytest.raises(RuntimeError, match="round 0"):
        handler.handle(report(1, 0, world_size=2))
    handler.handle(report(1, 1, world_size=2))
    handler.handle(report(1, 2, world_size=2))
    assert fails.seen == [0, 1, 2] and (handler.rounds, handler.reports) == (3, 6)


def test_restart_discards_what_waits_in_every_open_round() -> None:
    handler, out = gatherer()
    for i in range(4):
        handler.handle(report(0, i))
    handler.handle(report(1, 0))
    handler.handle(report(1, 1))
    assert handler.reports == 6
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=2))
    assert (handler.discarded, handler.reports) == (6, 6)
    handler.handle(report(0, 0, world_size=2))
    handler.handle(report(0, 1, world_size=2))
    handler.handle(report(0, 2, world_size=2))
    handler.handle(report(1, 0, world_size=2))
    assert out.rounds == [([0, 1], [0, 0], None)]
    assert (handler.reports, handler.rounds, handler.discarded) == (10, 1, 6)


def test_a_restart_with_bad_ranks_keeps_the_group_and_ends_its_partial_rounds() -> None:
    handler, out = gatherer()
    handler.handle(report(0, 0))
    handler.handle(report(0, 1))
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=3, required_ranks=(7,)))
    assert (handler.rejected, handler.discarded) == (1, 2)
    for rank in range(3):
        handler.handle(report(rank, 5))
    assert out.rounds == [([0, 1, 2], [5, 5, 5], None)]


@pytest.mark.anyio
async def test_each_round_has_the_runs_context_whoever_completed_it() -> None:
    gathered: list[RoundGathered] = []
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        bus.subscribe(RoundGathered, gathered.append)
        handler, _ = gatherer(world_size=2)
        handler.subscribe(bus)
        for i in range(3):
            await bus.publish(report(1, i, world_size=2))
        for i in range(3):
            await bus.publish(report(0, i, world_size=2))
    assert [e.round for e in gathered] == [0, 1, 2]
    assert {(e.context.run_id, e.context.world_size) for e in gathered} == {("r", 2)}


# --- against a model: one FIFO per rank, as the rules are written ------------------------


class Model:
    """The rules in their plainest form: a deque per rank, rounds popped when all have one."""

    def __init__(self, world_size: int, required: list[int]) -> None:
        self.required = required
        self.queues: list[deque[tuple[int, str | None]]] = [deque() for _ in range(world_size)]
        self.last = [-1] * world_size
        self.rounds: list[tuple[list[int], str | None]] = []
        self.rejected = 0
        self.mismatches = 0

    def report(self, rank: int, index: int, checkpoint: str | None) -> None:
        if index <= self.last[rank] or rank not in self.required:
            self.rejected += 1
            return
        self.last[rank] = index
        self.queues[rank].append((index, checkpoint))
        while all(self.queues[r] for r in self.required):
            taken = [self.queues[r].popleft() for r in self.required]
            names = {name for _, name in taken if name is not None}
            self.mismatches += len(names) > 1
            self.rounds.append(([i for i, _ in taken], names.pop() if len(names) == 1 else None))


@given(data=st.data(), world_size=st.integers(1, 5))
@settings(max_examples=150, deadline=None)
def test_property_the_gatherer_does_what_a_fifo_per_rank_does(
    data: st.DataObject, world_size: int
) -> None:
    required = data.draw(
        st.lists(st.integers(0, world_size - 1), min_size=1, unique=True).map(sorted)
    )
    steps = data.draw(
        st.lists(
            st.tuples(
                st.integers(0, world_size - 1),  # rank
                st.integers(-1, 2),  # index step: 0 or -1 repeats or goes back
                st.sampled_from([None, None, None, "a", "b"]),  # checkpoint
            ),
            max_size=60,
        )
    )
    model = Model(world_size, required)
    rounds: list[tuple[list[int], str | None]] = []
    handler = ReportCallbackHandler(
        world_size=world_size,
        required_ranks=None if len(required) == world_size else required,
        emit=_Recorder(rounds),
    )
    next_index = [0] * world_size
    for rank, step, checkpoint in steps:
        index = next_index[rank] + step
        next_index[rank] = max(next_index[rank], index + 1)
        model.report(rank, index, checkpoint)
        handler.handle(report(rank, index, world_size, checkpoint=checkpoint, metrics={"i": index}))
    assert rounds == model.rounds
    assert (handler.rejected, handler.mismatches) == (model.rejected, model.mismatches)
    waiting = sum(len(q) for q in model.queues)
    assert handler.reports == len(model.rounds) * len(required) + waiting
    handler.handle(WorkerGroupRestarted(run_id="r", world_size=world_size))
    assert handler.discarded == waiting


class _Recorder:
    def __init__(self, rounds: list[tuple[list[int], str | None]]) -> None:
        self.rounds = rounds

    def __call__(self, event: Event) -> None:
        if isinstance(event, RoundGathered):
            self.rounds.append(([m["i"] for m in event.metrics], event.checkpoint))


def test_events_of_other_types_are_left_alone() -> None:
    handler, out = gatherer()
    handler.handle(Event())  # type: ignore[arg-type]
    assert (handler.reports, handler.rejected, out.rounds) == (0, 0, [])


def test_a_rank_far_ahead_in_a_large_world_costs_memory_per_report_not_per_round() -> None:
    """2,000 reports of one rank of 4,096: a slot list per round would take 65 MB."""
    handler, out = gatherer(world_size=4096)
    metrics = FrozenDict({"rank": 0, "i": 0})
    tracemalloc.start()
    try:
        for i in range(2000):
            handler.handle(report(0, i, world_size=4096, metrics=metrics))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert handler.reports == 2000 and out.rounds == []
    assert peak < 4_000_000


@pytest.mark.anyio
async def test_sync_after_report_callbacks_each_get_their_own_list_of_shared_metrics() -> None:
    class Mutates(UserCallback):
        def __init__(self) -> None:
            self.seen: list[list[dict[str, Any]]] = []

        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> None:
            self.seen.append(list(metrics))
            metrics.clear()  # its own list: the next callback still gets every rank's

    first, second = Mutates(), Mutates()
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attach_user_callbacks(bus, [first, second], world_size=2)
        for rank in (1, 0):
            await bus.publish(report(rank, 0, world_size=2, checkpoint="ck"))
    assert [len(m) for m in first.seen] == [len(m) for m in second.seen] == [2]
    assert first.seen[0][0] is second.seen[0][0]  # the read-only dicts are shared


@pytest.mark.anyio
async def test_a_sync_after_report_that_returns_a_coroutine_has_it_awaited() -> None:
    done: list[str | None] = []

    class ReturnsCoroutine(UserCallback):
        def after_report(
            self, run_context: TrainRunContext, metrics: list[dict[str, Any]], checkpoint: Any
        ) -> Any:
            async def later() -> None:
                done.append(checkpoint)

            return later()

    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        attach_user_callbacks(bus, [ReturnsCoroutine()], world_size=1)
        await bus.publish(report(0, 0, world_size=1, checkpoint="ck"))
    assert done == ["ck"]
