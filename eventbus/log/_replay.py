"""Replaying a recorded log into a bus: instantly and deterministically on virtual time, or
at recorded speed (docs/guides/testing.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any

import anyio
import msgspec

from .._bus import BusStats, EventBus
from .._clock import FastForwardClock, MonotonicClock, VirtualClock
from .._eventfilter import EventFilter
from .._events import (
    BudgetReport,
    Event,
    EventPlaceholder,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HealthCheckTick,
    is_derived,
)
from .._options import BusOptions
from ..options import OptionError, checked
from ._costs import Charges, Costs
from ._format import TruncatedTail
from ._history import Rollbacks, rollbacks
from ._reader import LogReader, require_file

__all__ = [
    "BUS_DIAGNOSTICS",
    "HandlerSummary",
    "LogTiming",
    "ReplaySummary",
    "Speed",
    "log_timing",
    "replay",
    "replay_file",
]

#: Events a bus makes itself; a replay bus makes its own, so recorded ones are skipped.
BUS_DIAGNOSTICS: tuple[type[Event], ...] = (
    HealthCheckTick,
    BudgetReport,
    HandlerFailed,
    HandlerTimedOut,
    HandlerStateChanged,
)

Source = str | os.PathLike[str] | Iterable[Event]

#: How fast a replay at recorded pace goes: 1 is as recorded, 2 twice as fast.
Speed = Annotated[float, msgspec.Meta(gt=0, le=1e6, description="multiple of recorded speed")]


class HandlerSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One handler over a replay; ``total``/``max``: seconds on the bus's clock (zero on a
    virtual clock unless ``costs=`` charged some)."""

    name: str
    calls: int
    failed: int
    timed_out: int
    skipped: int
    state: str
    total: float
    max: float


class ReplaySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a replay delivered: ``replayed`` events published, ``filtered`` left out,
    ``placeholders`` and ``rolled_back`` (by a recorded resume) skipped."""

    replayed: int
    filtered: int
    first_time: float | None
    last_time: float | None
    handlers: tuple[HandlerSummary, ...]
    bus: BusStats
    truncated: TruncatedTail | None = None
    skipped_corrupt: int = 0
    #: Real seconds the replay took, handlers included.
    wall_time: float = 0.0
    placeholders: int = 0
    rolled_back: int = 0

    @property
    def failed(self) -> int:
        return self.bus.failed

    @property
    def timed_out(self) -> int:
        return self.bus.timed_out

    def handler(self, name: str) -> HandlerSummary:
        for summary in self.handlers:
            if summary.name == name:
                return summary
        raise KeyError(f"no handler named {name!r}; handlers: {[h.name for h in self.handlers]}")


async def replay(
    bus: EventBus,
    source: Source,
    *,
    speed: float | None = None,
    filter: EventFilter | None = None,
    include_diagnostics: bool = False,
    skip_corrupt: bool = False,
    costs: Costs | None = None,
) -> ReplaySummary:
    """Publish the events of ``source`` into a running ``bus``, and return once every
    replayed event was handled.

    Args:
        bus: the bus; an instant replay needs a ``VirtualClock``.
        source: a log's path, or events.
        speed: ``None`` replays instantly, keeping the recorded times; a number
            replays at that multiple of the recorded pace on a real clock.
        filter: only the events it keeps are published.
        include_diagnostics: publish the bus's own recorded diagnostics too (ticks,
            budget reports, faults), which the replay bus otherwise makes again.
        skip_corrupt: go on past damaged records instead of raising.
        costs: seconds each handler call is charged on the virtual clock (by handler
            name, a function of name and event, or ``"measured"``; instant replays
            only). ``OptionError`` for an unknown name, a cost out of range, or one
            that reaches an async or blocking handler's deadline.
    """
    if speed is not None:
        speed = checked("speed", speed, Speed)
        if costs is not None:
            raise OptionError("costs", "costs= is for an instant replay (speed=None)")
    elif not isinstance(bus.clock, VirtualClock):
        raise ValueError("an instant replay needs a bus with a VirtualClock (or give speed=)")
    charges: Charges | None = None
    if costs is not None:
        assert isinstance(bus.clock, VirtualClock)
        if isinstance(costs, str) and isinstance(bus.clock, FastForwardClock):
            raise OptionError(
                "costs",
                f"costs={costs!r} on a FastForwardClock: its clock measures every call already",
            )
        charges = Charges(costs, bus.subscriptions, bus.clock)
        if not charges.wrapped:
            charges = None  # nothing to charge: the replay goes as without costs
    reader: LogReader | None = None
    events: Iterable[Event]
    plan: Rollbacks | None = None
    if isinstance(source, str | os.PathLike):
        plan = rollbacks(source)
        events = reader = LogReader(source, skip_corrupt=skip_corrupt)
    else:
        events = source
    keep = None if filter is None or filter.empty else filter

    derived = bus.gathering is not None  # the bus makes the derived events again
    selection = _Selection(events, keep, include_diagnostics, derived, plan=plan)
    started = time.perf_counter()
    try:
        if speed is None:
            assert isinstance(bus.clock, VirtualClock)
            await _replay_instant(bus, bus.clock, selection, charges)
        else:
            now = bus.clock.now
            start = now()
            for event in selection:
                assert selection.first_time is not None
                delay = start + (event.time - selection.first_time) / speed - now()
                if delay > 0:
                    await anyio.sleep(delay)
                await bus.publish(msgspec.structs.replace(event, seq=-1, time=0.0))
        await bus.wait_idle()
    finally:
        if reader is not None:
            reader.close()
        if charges is not None:
            charges.remove()
    if charges is not None and charges.error is not None:
        raise charges.error
    stats = bus.stats()
    handlers = msgspec.convert(
        stats.subscriptions, tuple[HandlerSummary, ...], from_attributes=True
    )
    return ReplaySummary(
        replayed=selection.replayed,
        filtered=selection.filtered,
        first_time=selection.first_time,
        last_time=selection.last_time,
        handlers=handlers,
        bus=stats,
        truncated=reader.truncated if reader is not None else None,
        skipped_corrupt=reader.skipped if reader is not None else 0,
        wall_time=time.perf_counter() - started,
        placeholders=selection.placeholders,
        rolled_back=selection.rolled_back,
    )


async def _replay_instant(
    bus: EventBus, clock: VirtualClock, selection: _Selection, charges: Charges | None
) -> None:
    """Publish each event at its recorded time, moving the virtual clock to it (with
    ``charges``, an event may wait behind slow handlers, as in a live run). Events
    recorded at one time are published together, as one batch again."""
    now = clock.now
    publish = bus.publish
    held = charges is not None and charges.hold_the_trainer
    last = None  # the recorded time of the event published before
    for event in selection:
        t = event.time
        if charges is not None:
            if t > now():
                await bus.wait_idle()
            elif held and t != last:
                await bus.wait_idle(lanes=())
            last = t
            if charges.error is not None:
                return  # raised by ``replay``, once the bus is idle
        if t > now():
            if t < bus.period_end:
                clock.set(t)
            elif charges is None:
                await _cross_period(bus, clock, t, event)
                continue
            else:  # not alone: the events recorded with it go in its batch
                await _cross_period(bus, clock, t, None)
        await publish(event)
    if charges is not None:
        await bus.wait_idle()  # the last charges move the clock
        if charges.error is not None:
            return
    last_time = selection.last_time
    if last_time is not None and last_time > now():
        # The recorded run went on (its last ticks): roll the periods as it did.
        await _cross_period(bus, clock, last_time, None)


class _Selection:
    """The events to replay, in order, counting what was left out; ``plan``: the log's
    rollbacks."""

    def __init__(
        self,
        events: Iterable[Event],
        keep: EventFilter | None,
        include_diagnostics: bool,
        derived: bool,
        *,
        plan: Rollbacks | None = None,
    ) -> None:
        self.events = events
        self.plan = plan
        self.keep = keep
        self.diagnostics = () if include_diagnostics else BUS_DIAGNOSTICS
        self.derived = derived
        self.replayed = self.filtered = self.placeholders = self.rolled_back = 0
        self.first_time: float | None = None
        self.last_time: float | None = None

    def __iter__(self) -> Iterator[Event]:
        keep = self.keep
        # Decided once per type: a dict lookup is cheaper than ``isinstance`` per event.
        left_out: dict[type, bool] = {}
        rolled_back = None if self.plan is None else self.plan.is_rolled_back
        for event in self.events:
            kind = type(event)
            if rolled_back is not None and rolled_back(event):
                self.rolled_back += 1
            elif kind is EventPlaceholder:  # its time may be unknown (0.0)
                self.placeholders += 1
            else:
                if self.first_time is None:
                    self.first_time = event.time
                self.last_time = event.time
                left = left_out.get(kind)
                if left is None:
                    left = issubclass(kind, self.diagnostics) or (self.derived and is_derived(kind))
                    left_out[kind] = left
                if left or (keep is not None and not keep(event)):
                    self.filtered += 1
                else:
                    self.replayed += 1
                    yield event


async def _cross_period(bus: EventBus, clock: VirtualClock, t: float, event: Event | None) -> None:
    """Move past a period end with the bus idle before and after, so its tick and budget
    report fall at the same place on every replay."""
    await bus.wait_idle()
    clock.set(t)
    if event is not None:
        await bus.publish(event)
    await bus.wait_idle()


class LogTiming(msgspec.Struct, frozen=True, kw_only=True):
    """When the recorded bus started and its period (``None`` if the log has no tick)."""

    start: float
    period: float | None


def log_timing(path: str | os.PathLike[str], *, skip_corrupt: bool = False) -> LogTiming:
    """Read a log until its first period report: the start and period a replay bus needs
    to roll its periods where the recorded bus did."""
    first: float | None = None
    with LogReader(path, skip_corrupt=skip_corrupt) as reader:
        for event in reader:
            if isinstance(event, EventPlaceholder):
                continue
            if first is None:
                first = event.time
            if (
                isinstance(event, HealthCheckTick | BudgetReport)
                and event.end > event.start
                and not getattr(event, "partial", False)  # a closing bus's cut period
            ):
                return LogTiming(start=event.start, period=event.end - event.start)
    return LogTiming(start=first or 0.0, period=None)


async def replay_file(
    path: str | os.PathLike[str],
    setup: Callable[[EventBus], Any],
    *,
    speed: float | None = None,
    period: float | None = None,
    filter: EventFilter | None = None,
    include_diagnostics: bool = False,
    skip_corrupt: bool = False,
    real_time: bool = False,
    costs: Costs | None = None,
    **bus_options: Any,
) -> ReplaySummary:
    """Replay a log into a fresh bus whose clock starts where the recorded bus's did, so
    its ticks and budget reports fall where the recorded ones fell.

    Args:
        path: the log.
        setup: called with the new bus before the replay, to subscribe the handlers.
        speed: as for ``replay`` (as are ``filter``, ``include_diagnostics``,
            ``skip_corrupt`` and ``costs``): ``None`` is instant, on a ``VirtualClock``.
        period: the replay bus's health-check period (the recorded one by default).
        real_time: time the handlers in real time (idle gaps still skipped).
        **bus_options: the rest of the bus's options (``EventBus``).
    """
    require_file(path, "a replay")
    recorded = False  # the period is the log's, not one given here
    if speed is None:
        timing = log_timing(path, skip_corrupt=skip_corrupt)
        clock: VirtualClock | MonotonicClock = (
            FastForwardClock(timing.start) if real_time else VirtualClock(timing.start)
        )
        if period is None:
            period, recorded = timing.period, timing.period is not None
    else:
        clock = MonotonicClock()
    if period is not None:
        bus_options["period"] = period
    try:
        options = BusOptions.build(None, **bus_options)
    except OptionError as exc:
        if not (recorded and exc.option == "period"):
            raise
        raise OptionError(
            "period", f"{path}: its recorded health-check period: {exc}; give period="
        ) from None
    async with EventBus(options, clock=clock) as bus:
        setup(bus)
        summary = await replay(
            bus,
            path,
            speed=speed,
            filter=filter,
            include_diagnostics=include_diagnostics,
            skip_corrupt=skip_corrupt,
            costs=costs,
        )
    return summary
