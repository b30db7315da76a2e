"""Derived events, declared once on their class: which they are, what a bus's gathering
changes for a replay, and the renamed run events whose log tags stayed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from _builders import sample_event

import handlers
from eventbus import (
    AfterRun,
    BeforeRun,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventBus,
    FailuresGathered,
    Report,
    ReportRejected,
    RoundGathered,
    StateSnapshotted,
    VirtualClock,
)
from eventbus._codec import decode_json, encode_json
from eventbus._events import event_types, is_derived
from eventbus.log import read_log
from eventbus.testing import replay_log
from handlers import UserCallback, open_run
from handlers._attach import attach_user_callbacks

pytestmark = pytest.mark.anyio

DERIVED: set[type[Event]] = {
    RoundGathered,
    ReportRejected,
    CheckpointMismatch,
    FailuresGathered,
    BeforeRun,
    AfterRun,
}


def test_the_gathering_s_events_are_derived_and_only_they() -> None:
    ours = {c for c in event_types() if c.__module__.startswith("eventbus")}
    assert {c for c in ours if is_derived(c)} == DERIVED
    assert all(c.derived for c in DERIVED)
    # A checkpoint is announced by the gathering in a live run, or published by a
    # worker: the class cannot say which, so it is not derived (see test below).
    assert not is_derived(CheckpointSaved) and not is_derived(StateSnapshotted)
    assert not is_derived(Report) and not is_derived(dict)


def test_run_events_renamed_keep_their_recorded_tags() -> None:
    for cls, tag in ((BeforeRun, "RunBegan"), (AfterRun, "RunEnded")):
        event = sample_event(cls)
        line = encode_json(event)
        assert line.startswith(f'{{"type":"{tag}"'.encode())
        assert type(decode_json(line)) is cls


class Rounds(UserCallback):
    def __init__(self) -> None:
        self.checkpoints: list[str | None] = []

    def after_report(self, run_context: Any, metrics: Any, checkpoint: str | None) -> None:
        self.checkpoints.append(checkpoint)


async def test_a_bus_s_gathering_is_its_attachment_s_until_cancelled() -> None:
    async with EventBus(clock=VirtualClock(), period=1000) as bus:
        assert bus.gathering is None
        attachment = attach_user_callbacks(bus, [Rounds()])
        assert bus.gathering is not None and bus.gathering in attachment.subscriptions
        before = len(bus.subscriptions)
        with pytest.raises(ValueError, match="already gathers reports"):
            attach_user_callbacks(bus, [Rounds()])
        assert len(bus.subscriptions) == before  # the refused one subscribed nothing
        attachment.cancel()
        assert bus.gathering is None
        attach_user_callbacks(bus, [Rounds()])  # the bus gathers again
        assert bus.gathering is not None


async def test_a_replay_gets_every_recorded_checkpoint_whoever_announced_it(
    tmp_path: Path,
) -> None:
    """A live run's gathering announces each round's checkpoint (``CheckpointSaved``);
    a worker may announce one itself (``Run.checkpoint_saved``). A replay's gathering
    announces none (it has the recorded ones), so a replay delivers every recorded
    ``CheckpointSaved``, as before, while it leaves the recorded rounds out."""
    log = tmp_path / "run.evlog"

    async def worker(reporter: handlers.Reporter) -> None:
        for step in range(4):
            await reporter.report({"loss": 1.0 / (step + 1)}, checkpoint=f"ck{step % 2}")

    async with open_run(world_size=2, log=log, clock=VirtualClock()) as run:
        await run.workers(worker)
        await run.checkpoint_saved("by-a-worker", index=99)
    recorded = [e.checkpoint for e in read_log(log).events if isinstance(e, CheckpointSaved)]
    # The worker's announcement races the last rounds' (both are published while they run).
    assert sorted(recorded) == ["by-a-worker", "ck0", "ck0", "ck1", "ck1"]

    rounds = Rounds()
    seen: list[str] = []

    def see(bus: EventBus) -> None:
        bus.subscribe(CheckpointSaved, lambda e: seen.append(e.checkpoint))

    result = await replay_log(log, rounds, subscribe=see)
    assert rounds.checkpoints == ["ck0", "ck1", "ck0", "ck1"]  # each round once
    assert seen == recorded
    assert [type(e) for e in result.events_of(rounds)] == [RoundGathered] * 4


async def test_a_bench_from_a_log_leaves_its_derived_events_to_the_gathering(
    tmp_path: Path,
) -> None:
    from adapters.cli._bench_runner import run_bench

    log = tmp_path / "run.evlog"

    async def worker(reporter: handlers.Reporter) -> None:
        for _ in range(5):
            await reporter.report({"loss": 1.0})

    async with open_run(world_size=2, log=log, clock=VirtualClock()) as run:
        await run.workers(worker)
    events = read_log(log).events
    assert any(is_derived(type(e)) for e in events)
    made: list[Rounds] = []

    def make() -> list[Any]:
        made.append(Rounds())
        return [made[-1]]

    result = await anyio.to_thread.run_sync(lambda: run_bench(make, events, repeats=1))
    assert result.rounds == 5 and len(made[0].checkpoints) == 5  # each round once
    assert result.events == sum(not is_derived(type(e)) for e in events) - sum(
        type(e).__name__ in ("HealthCheckTick", "BudgetReport") for e in events
    )
