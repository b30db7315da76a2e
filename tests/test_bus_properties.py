"""Property: whatever the subscriptions, latencies, faults and interleavings,
every handler gets exactly its matching events, in publish order, each one
handled, failed or timed out, and the bus's counts add up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus import CheckpointSaved, Event, EventBus, Report

pytestmark = pytest.mark.anyio

Action = Literal["ok", "raise", "hang", "yield"]
TOPICS: dict[str, tuple[type[Event], ...]] = {
    "reports": (Report,),
    "checkpoints": (CheckpointSaved,),
    "all": (Report, CheckpointSaved),
}


@dataclass
class Spec:
    topic: str
    mode: Literal["inline", "lane"]
    order: int
    is_async: bool
    actions: list[Action]  # action for the k-th event this handler receives (cycled)
    received: list[int] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=lambda: {"ok": 0, "raise": 0, "hang": 0})

    def action(self, k: int) -> Action:
        return self.actions[k % len(self.actions)]

    def make_handler(self) -> Any:
        def record(event: Event) -> Action:
            action = self.action(len(self.received))
            self.received.append(event.seq)
            return action

        if not self.is_async:

            def sync_handler(event: Event) -> None:
                if record(event) == "raise":
                    raise RuntimeError("injected")

            return sync_handler

        async def async_handler(event: Event) -> None:
            action = record(event)
            if action == "yield":
                await anyio.lowlevel.checkpoint()
            elif action == "raise":
                raise RuntimeError("injected")
            elif action == "hang":
                await anyio.sleep_forever()

        return async_handler

    def expected_outcome(self, k: int) -> str:
        action = self.action(k)
        if action == "hang" and not self.is_async:
            return "ok"
        return "ok" if action == "yield" else action


def sub_specs() -> st.SearchStrategy[Spec]:
    return st.builds(
        Spec,
        topic=st.sampled_from(sorted(TOPICS)),
        mode=st.sampled_from(["inline", "lane"]),
        order=st.integers(0, 2),
        is_async=st.booleans(),
        actions=st.lists(
            st.sampled_from(["ok", "ok", "ok", "yield", "raise", "hang"]), min_size=1, max_size=6
        ),
    )


def events_for(producer: int, count: int, kinds: list[bool]) -> list[Event]:
    out: list[Event] = []
    for i in range(count):
        if kinds[i % len(kinds)]:
            out.append(CheckpointSaved(run_id=f"p{producer}", checkpoint=f"c{i}", index=i))
        else:
            out.append(
                Report(run_id=f"p{producer}", rank=producer, world_size=4, index=i, metrics={})
            )
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(sub_specs(), min_size=1, max_size=5),
    producers=st.lists(
        st.tuples(
            st.integers(0, 12),
            st.lists(st.booleans(), min_size=1, max_size=4),
            st.lists(st.booleans(), min_size=1, max_size=5),
        ),
        min_size=1,
        max_size=3,
    ),
    buffer=st.integers(1, 8),
)
async def test_every_handler_gets_its_events_in_order_and_counts_add_up(
    specs: list[Spec], producers: list[tuple[int, list[bool], list[bool]]], buffer: int
) -> None:
    # Hangs are only for async handlers, and a few per example keep it fast.
    hanging = 0
    for spec in specs:
        hangs = 0
        for i, action in enumerate(spec.actions):
            if action == "hang":
                hangs += 1
                if hangs > 1 or hanging >= 2 or not spec.is_async:
                    spec.actions[i] = "ok"
        hanging += "hang" in spec.actions

    dispatched: list[Event] = []  # every event, as handlers get it: stamped
    # The deadline is far above what a non-hanging call takes even on a loaded machine.
    async with EventBus(buffer=buffer, timeout=0.1) as bus:
        bus.add_tap(dispatched.extend)
        subs = [
            bus.subscribe(
                TOPICS[s.topic],
                s.make_handler(),
                name=f"h{i}",
                delivery=s.mode,
                order=s.order,
                buffer=buffer,
            )
            for i, s in enumerate(specs)
        ]

        async def produce(index: int, count: int, kinds: list[bool], pauses: list[bool]) -> None:
            for i, event in enumerate(events_for(index, count, kinds)):
                await bus.publish(event)
                if pauses[i % len(pauses)]:
                    await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as tg:
            for index, (count, kinds, pauses) in enumerate(producers):
                tg.start_soon(produce, index, count, kinds, pauses)
        await bus.wait_idle()
        stats = {s.name: s for s in bus.stats().subscriptions}

    published = [e for e in dispatched if isinstance(e, Report | CheckpointSaved)]
    assert len(published) == sum(count for count, _, _ in producers)
    # Diagnostics take sequence numbers too, so published events' seqs are unique, not dense.
    assert len({e.seq for e in published}) == len(published)
    assert all(e.seq >= 0 for e in published)
    # Each producer's events were accepted in the order it published them.
    for index, (count, _, _) in enumerate(producers):
        mine = [e for e in published if e.run_id == f"p{index}"]
        assert [e.index for e in mine] == list(range(count))
        assert [e.seq for e in mine] == sorted(e.seq for e in mine)

    for i, (spec, sub) in enumerate(zip(specs, subs, strict=True)):
        expected = [
            e.seq
            for e in sorted(published, key=lambda e: e.seq)
            if isinstance(e, TOPICS[spec.topic])
        ]
        assert spec.received == expected, f"h{i} ({spec.mode}) got a different sequence"
        outcomes = [spec.expected_outcome(k) for k in range(len(expected))]
        figures = stats[sub.name]
        assert figures.calls == len(expected)
        assert figures.failed == outcomes.count("raise")
        assert figures.timed_out == outcomes.count("hang")
        assert figures.skipped == 0 and figures.queued == 0
    totals = bus.stats()
    assert totals.delivered == sum(len(s.received) for s in specs)
    assert totals.abandoned == 0
