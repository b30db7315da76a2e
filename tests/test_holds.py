"""A worker driven through ``holding``: its steps' time in the loop counted, and nothing
else about it changed (its result, its exception, a cancellation, on both backends)."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import pytest

from eventbus._holds import LoopHolds, holding

pytestmark = pytest.mark.anyio


def compute(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def test_each_step_in_the_loop_is_counted_and_no_await() -> None:
    holds = LoopHolds()

    async def worker() -> str:
        compute(0.02)  # holds the loop
        await anyio.sleep(0.3)  # leaves it free
        compute(0.02)
        return "done"

    assert await holding(worker(), holds) == "done"
    # At least the two computations; counted with the sleep it would be 0.34 or more.
    assert 0.04 <= holds.seconds < 0.3, holds.seconds


async def test_an_exception_and_a_cancellation_pass_through_as_themselves() -> None:
    holds, ended = LoopHolds(), []

    async def fails() -> None:
        await anyio.lowlevel.checkpoint()
        raise KeyError("the worker's own")

    with pytest.raises(KeyError, match="the worker's own"):
        await holding(fails(), holds)

    async def waits() -> None:
        try:
            await anyio.sleep(10)
        finally:
            ended.append("cleaned up")

    with anyio.move_on_after(0.01) as scope:
        await holding(waits(), holds)
    assert scope.cancelled_caught and ended == ["cleaned up"]
