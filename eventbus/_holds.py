"""Time the event loop spent in workers' code: a training step that awaits nothing holds
the loop, and an async handler call in flight meanwhile is not charged that time (as a
bus stepped in a trainer's hooks is not charged the trainer's compute between two
hooks). Deadlines stay real time: a call stuck beside such steps is still cancelled."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Generator
from typing import Any, Generic, TypeVar

__all__ = ["LoopHolds", "holding"]

T = TypeVar("T")


class LoopHolds:
    """Seconds the loop ran workers' code, counted by whoever runs the workers; read by
    the bus's runners (a call's charge, a timeout's advice). ``suspensions``: how often
    a worker gave the loop a turn (a report of a worker that gave none since its last
    gives one, ``Reporter.report``)."""

    __slots__ = ("seconds", "suspensions")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.suspensions = 0


class _Held(Generic[T]):
    """``work``, driven step by step, each step's time added to ``holds``."""

    __slots__ = ("_holds", "_work")

    def __init__(self, work: Awaitable[T], holds: LoopHolds) -> None:
        self._work = work
        self._holds = holds

    def __await__(self) -> Generator[Any, Any, T]:
        coro = self._work.__await__()
        holds = self._holds
        clock = time.perf_counter
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            started = clock()
            try:
                waits_on = coro.send(sent) if thrown is None else coro.throw(thrown)
            except StopIteration as returned:
                value: T = returned.value
                return value
            finally:
                holds.seconds += clock() - started
            holds.suspensions += 1
            try:
                sent, thrown = (yield waits_on), None
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # a cancellation, say: the worker's to handle
                sent, thrown = None, exc


async def holding(work: Awaitable[T], holds: LoopHolds) -> T:
    """Await ``work``, counting the time each of its steps holds the loop in ``holds``."""
    return await _Held(work, holds)
