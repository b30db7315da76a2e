"""The testing helpers (the public face is ``eventbus.testing``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from itertools import islice
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from .._bus import EventBus
from .._clock import VirtualClock
from .._events import Event, Report
from .._subscription import attacher_of, handler_name, is_async_callable
from ..log._costs import Costs
from ..log._format import LogFormat
from ..log._reader import read_log
from ..log._recorder import LogRecorder
from ..log._replay import ReplaySummary, replay_file

E = TypeVar("E", bound=Event)
Handler = Callable[[Any], Any]


# --- building events and logs ---------------------------------------------------------


def report_rounds(
    rounds: int | Iterable[int],
    *,
    world_size: int = 2,
    run_id: str = "run",
    metrics: Callable[[int, int], dict[str, Any]] | None = None,
) -> list[Report]:
    """``Report`` events of every rank for each round, round by round; ``metrics(rank,
    index)`` gives each report's metrics (default: a loss that falls with the round)."""
    indices = range(rounds) if isinstance(rounds, int) else rounds
    make = metrics or (lambda rank, index: {"loss": 1.0 / (index + 1), "rank": rank})
    return [
        Report(
            run_id=run_id, rank=rank, world_size=world_size, index=index, metrics=make(rank, index)
        )
        for index in indices
        for rank in range(world_size)
    ]


def write_log(
    path: str | os.PathLike[str],
    events: Iterable[Event],
    *,
    run_id: str = "test",
    format: LogFormat | None = None,
    start: float = 0.0,
    interval: float = 0.1,
) -> Path:
    """Write ``events`` as a log (JSON Lines for a ``.jsonl`` name), numbering unpublished
    ones and timing those without a time ``start + i * interval``, as a bus would."""
    with LogRecorder(path, run_id=run_id, format=format, fsync="never") as recorder:
        # A batch per recorder call, as a bus's tap gets them.
        given = iter(events)
        i = 0
        while True:
            batch: list[Event] = []
            try:
                batch.extend(islice(given, _WRITE_BATCH))
            finally:  # what came before an exception of ``events`` is still written
                if batch:
                    recorder.write_many(_stamped(batch, i, start, interval))
                    i += len(batch)
            if len(batch) < _WRITE_BATCH:
                return Path(path)


_WRITE_BATCH = 1024


def _stamped(batch: list[Event], first: int, start: float, interval: float) -> list[Event]:
    """``batch`` with sequence numbers and times given where missing (copies: the caller's
    events are never changed)."""
    return [
        given
        if given.seq >= 0 and given.time
        else msgspec.structs.replace(
            given,
            seq=given.seq if given.seq >= 0 else i,
            time=given.time or start + i * interval,
        )
        for i, given in enumerate(batch, first)
    ]


# --- handlers that remember -------------------------------------------------------------


def _capturing(handler: Handler, sink: list[Event]) -> Handler:

    if is_async_callable(handler):

        async def capture_async(event: Event) -> Any:
            sink.append(event)
            return await handler(event)

        return capture_async

    def capture(event: Event) -> Any:
        sink.append(event)
        return handler(event)

    return capture


def attach(
    bus: EventBus,
    handlers: Sequence[object],
    types: type[Event] | tuple[type[Event], ...] = Event,
) -> tuple[list[Event], ...]:
    """Attach each of ``handlers`` to ``bus``; per handler, a list that keeps what it gets.

    A bus handler is subscribed to ``types``; training callbacks are attached as a live
    run attaches them, gathering included. Anything else raises ``TypeError`` at once.
    """
    received: tuple[list[Event], ...] = tuple([] for _ in handlers)
    groups: dict[Any, tuple[Any, list[tuple[object, list[Event]]]]] = {}
    for handler, sink in zip(handlers, received, strict=True):
        attacher = attacher_of(handler)
        if attacher is not None:
            # One group per attaching function: all training callbacks share one gathering.
            key = getattr(attacher, "__func__", attacher)
            groups.setdefault(key, (attacher, []))[1].append((handler, sink))
        elif callable(handler):
            bus.subscribe(types, _capturing(handler, sink), name=handler_name(handler))
        else:
            raise TypeError(
                f"{handler!r} is neither a bus handler (a callable taking an event) nor a "
                "training callback: subclass handlers.UserCallback for after_report and "
                "the other hooks, or give a callable"
            )
    for attacher, members in groups.values():
        per_callback = attacher(bus, [callback for callback, _ in members])
        for (_, sink), subscriptions in zip(members, per_callback, strict=True):
            hooked = tuple({t: None for sub in subscriptions for t in sub.types})
            if hooked:
                bus.subscribe(hooked, sink.append, name="eventbus.testing.capture")
    return received


class ReplayResult(msgspec.Struct, frozen=True, kw_only=True):
    """A replay's summary and, per handler passed (same order), the events it received."""

    summary: ReplaySummary
    received: tuple[list[Event], ...]
    handlers: tuple[object, ...]

    def events_of(self, handler: object) -> list[Event]:
        """What ``handler`` received; an equal handler will do (``seen.append``)."""
        for candidate, events in zip(self.handlers, self.received, strict=True):
            if candidate is handler:
                return events
        for candidate, events in zip(self.handlers, self.received, strict=True):
            with contextlib.suppress(Exception):
                if candidate == handler:
                    return events
        raise KeyError(f"{handler!r} was not one of the replayed handlers")


async def replay_log(
    path: str | os.PathLike[str],
    *handlers: object,
    types: type[Event] | tuple[type[Event], ...] = Event,
    subscribe: Callable[[EventBus], Any] | None = None,
    costs: Costs | None = None,
    **options: Any,
) -> ReplayResult:
    """Replay the log at ``path`` into a fresh bus on a ``VirtualClock``.

    ``handlers`` are attached as ``attach`` does, in order; what each receives is in
    ``result.events_of(handler)``. ``subscribe(bus)`` may wire anything more; ``options``
    go to ``eventbus.log.replay_file``. ``costs`` charges handlers virtual time, to test a
    budget policy: ``{"Slow.after_report": 0.05}`` (seconds per call, by handler name),
    or a function of (handler name, event); an unknown name is an ``OptionError``.
    """
    received: tuple[list[Event], ...] = ()

    def setup(bus: EventBus) -> None:
        nonlocal received
        received = attach(bus, handlers, types)
        if subscribe is not None:
            subscribe(bus)

    summary = await replay_file(path, setup, costs=costs, **options)
    return ReplayResult(summary=summary, received=received, handlers=handlers)


class BusRecording:
    """Runs buses whose every event is recorded to ``path``; read them back after.

    ``async with recording(*handlers, **bus_options) as bus:`` gives a started ``EventBus``
    (on a ``VirtualClock`` unless ``clock=`` is passed) with ``handlers`` attached as
    ``replay_log`` attaches them; ``received`` keeps what each got. After the block,
    ``events`` holds everything the bus carried, read back from the log.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._events: list[Event] | None = None
        self.received: tuple[list[Event], ...] = ()

    @asynccontextmanager
    async def __call__(self, *handlers: object, **bus_options: Any) -> AsyncIterator[EventBus]:
        bus_options.setdefault("clock", VirtualClock())
        self._events = None
        with LogRecorder(self.path, fsync="never") as recorder:
            bus = EventBus(**bus_options)
            recorder.attach(bus)
            async with bus:
                self.received = attach(bus, handlers)
                yield bus

    @property
    def events(self) -> list[Event]:
        if self._events is None:
            contents = read_log(self.path)
            assert contents.truncated is None, contents.truncated
            self._events = contents.events
        return self._events

    def of_type(self, cls: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, cls)]


# --- assertions --------------------------------------------------------------------------


def assert_rounds(
    events: Iterable[Event],
    rounds: Iterable[int],
    *,
    ranks: Sequence[int] | None = None,
    run_id: str | None = None,
) -> None:
    """Assert that the ``Report`` events seen cover exactly ``rounds`` for every rank
    (default: every rank that reported); the error names the rounds missing and extra."""
    seen: dict[int, list[int]] = {}
    for event in events:
        if isinstance(event, Report) and (run_id is None or event.run_id == run_id):
            seen.setdefault(event.rank, []).append(event.index)
    expected = sorted(rounds)
    problems = []
    for rank in ranks if ranks is not None else sorted(seen):
        got = seen.get(rank, [])
        if got != expected:
            missing = sorted(set(expected) - set(got))
            extra = sorted(set(got) - set(expected))
            repeated = sorted({i for i in got if got.count(i) > 1})
            problems.append(
                f"rank {rank}: saw rounds {got}"
                + (f", missing {missing}" if missing else "")
                + (f", unexpected {extra}" if extra else "")
                + (f", repeated {repeated}" if repeated else "")
            )
    if not seen and ranks is None and expected:
        problems.append("no Report events at all")
    if problems:
        raise AssertionError(f"expected rounds {expected}; " + "; ".join(problems))
