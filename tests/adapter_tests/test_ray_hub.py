"""The Ray engine's channel from Ray's controller to the driver, without a cluster.

The controller's forwarder batches rounds (one Ray call for several) and numbers
its batches; the hub takes them in that order whatever order an async actor
starts the calls in. A round lost or reordered here is a round the callbacks
never see (a benchmark once saw 599 of 600).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _ray_env import quiet_ray

quiet_ray()  # before ray is imported

pytest.importorskip("ray.train")

from adapters._ray_engine import _BATCH_S, _Forwarder, _Hub  # noqa: E402

STATUS: tuple[tuple[bool, bool], dict[str, Any], str | None] = ((False, False), {}, None)


def rounds(*steps: int) -> list[tuple[str, Any]]:
    return [("round", ([{"step": step}], None)) for step in steps]


def test_the_hub_takes_batches_in_the_controllers_order() -> None:
    async def main() -> None:
        hub = _Hub(STATUS, [0, 0])
        await hub.put(1, [*rounds(2), ("closed", None)])  # started first by the actor
        news, closed = await hub.take(0.0)
        assert news == [] and not closed  # batch 0 has not come: nothing, not closed
        await hub.put(0, [*rounds(0, 1), ("failures", {1: "boom"})])
        news, closed = await hub.take(0.0)
        assert news == [*rounds(0, 1), ("failures", {1: "boom"}), *rounds(2)]
        assert closed is False  # this take had news: the next one says closed
        assert await hub.take(0.0) == ([], True)

    asyncio.run(main())


def test_a_checkpoint_round_becomes_the_status_workers_resume_from() -> None:
    async def main() -> None:
        hub = _Hub(STATUS, [5, 5])
        await hub.put(0, [("round", ([{"step": 0}], "/runs/a/checkpoint_000005"))])
        attempt, received, first_index, status = hub.worker_started(1)
        assert (attempt, received, first_index) == (0, 1, 6)
        assert status[2] == "/runs/a/checkpoint_000005"

    asyncio.run(main())


class _Calls:
    """Stands in for the hub actor's ``put`` method: records each call."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[tuple[str, Any]]]] = []
        self.called = asyncio.Event()

    def remote(self, number: int, batch: list[tuple[str, Any]]) -> str:
        self.batches.append((number, batch))
        self.called.set()
        return f"ref-{number}"


class _FakeHub:
    def __init__(self) -> None:
        self.put = _Calls()


def test_rounds_after_a_quiet_spell_go_at_once_and_a_burst_goes_in_one_batch() -> None:
    async def main() -> list[tuple[int, list[tuple[str, Any]]]]:
        hub = _FakeHub()
        forwarder = _Forwarder(hub)
        for step in range(3):
            forwarder.after_report(None, [{"step": step}], None)
        assert [number for number, _ in hub.put.batches] == [0]  # the first, at once
        hub.put.called.clear()
        async with asyncio.timeout(10):  # the window's end sends the two others
            await hub.put.called.wait()
        forwarder._sent_at -= 2 * _BATCH_S  # a quiet spell, whatever the loop's delays
        forwarder.after_report(None, [{"step": 3}], None)  # so it goes at once
        forwarder.after_report(None, [{"step": 4}], None)  # waits, then goes with:
        forwarder.after_exception(None, {1: ValueError("boom")})
        assert forwarder.send(("closed", None)) == "ref-4"
        assert forwarder.send() is None  # nothing waits: no call
        return hub.put.batches

    batches = asyncio.run(main())
    assert [number for number, _ in batches] == [0, 1, 2, 3, 4]
    kinds = [[kind for kind, _ in batch] for _, batch in batches]
    assert kinds == [["round"], ["round", "round"], ["round"], ["round", "failures"], ["closed"]]
    steps = [p[0][0]["step"] for _, batch in batches for kind, p in batch if kind == "round"]
    assert steps == [0, 1, 2, 3, 4]
    (failures,) = [p for _, batch in batches for kind, p in batch if kind == "failures"]
    assert isinstance(failures[1], ValueError)
