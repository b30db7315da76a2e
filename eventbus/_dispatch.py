"""The dispatcher: one task that takes the inbox as a batch, stamps copies, and hands the
batch to each handler in turn (*handler-major*; docs/performance.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import groupby

import anyio
import anyio.lowlevel
from msgspec.structs import replace

from ._bus_results import BusStats
from ._events import Event
from ._faults import FATAL
from ._lanes import MAX_BATCH
from ._logging import get_logger
from ._periods import Periods
from ._registry import Registry, Route
from ._runners import Runner
from ._subscription import Subscription
from ._tasks import event_maker
from ._text import describe

__all__ = ["Dispatcher", "Inbox"]

_log = get_logger("eventbus")

#: Batches emitted by handlers dispatched one after another before other tasks get a turn.
_CHAIN = 8


class Inbox(deque[Event]):
    """Events accepted and not yet taken: a deque, so publishing is one ``append`` and
    one flag read (``sleeping``: call ``wake_up()``)."""

    __slots__ = ("_room", "_wake", "new_event", "sleeping")

    def __init__(self) -> None:
        super().__init__()
        self.sleeping = False
        self.new_event: Callable[[], anyio.Event] = anyio.Event  # the loop's, once it runs
        self._wake = anyio.Event()
        self._room: anyio.Event | None = None

    def put(self, event: Event) -> None:

        self.append(event)
        if self.sleeping:
            self.wake_up()

    def put_many(self, events: list[Event]) -> None:

        self.extend(events)
        if self.sleeping:
            self.wake_up()

    def wake_up(self) -> None:
        """Events came in while the dispatcher sleeps."""
        self.sleeping = False
        self._wake.set()

    def going_to_sleep(self) -> anyio.Event:
        """What wakes the dispatcher (a plain call: no frame on every wake-up)."""
        self.sleeping = True
        self._wake = wake = self.new_event()
        return wake

    def take(self) -> list[Event]:
        """The next batch (at most ``MAX_BATCH``); publishers waiting for room go on."""
        if len(self) <= MAX_BATCH:
            batch = list(self)
            self.clear()
        else:
            batch = [self.popleft() for _ in range(MAX_BATCH)]
        self.wake_publishers()
        return batch

    def wake_publishers(self) -> None:
        """Publishers waiting for room look again: there is room, or the bus closed."""
        if self._room is not None:
            self._room.set()
            self._room = None

    async def room(self) -> None:
        """Wait until the dispatcher takes a batch."""
        if self._room is None:
            self._room = anyio.Event()
        await self._room.wait()


class Dispatcher:
    """Delivers what is published, in order, and knows what is still on the way."""

    __slots__ = (
        "_end_run",
        "_idle",
        "_inbox",
        "_now",
        "_periods",
        "_registry",
        "_runner",
        "_taps",
        "dispatching",
        "next_seq",
        "undispatched",
    )

    def __init__(
        self,
        inbox: Inbox,
        registry: Registry,
        periods: Periods,
        runner: Runner,
        now: Callable[[], float],
        *,
        end_run: Callable[[BaseException], None],
    ) -> None:
        self._inbox = inbox
        self._registry = registry
        self._periods = periods
        self._runner = runner
        self._now = now
        self._end_run = end_run
        self._taps: list[Callable[[list[Event]], None]] = []
        self._idle: anyio.Event | None = None
        self.dispatching = False
        self.undispatched = 0
        self.next_seq = 0

    def lane_took(self, count: int) -> None:
        """A lane queued ``count`` deliveries of the batch being dispatched."""
        self.undispatched -= count

    def add_tap(self, tap: Callable[[list[Event]], None]) -> Callable[[], None]:
        """Show every batch to ``tap`` (``EventBus.add_tap``); returns its remover."""
        self._taps.append(tap)
        return lambda: self._taps.remove(tap) if tap in self._taps else None

    def stats(self, *, abandoned: int) -> BusStats:
        """The bus's counters (``EventBus.stats``): what was published, delivered, ..."""
        subs = tuple(s.stats() for s in self._registry.subs)
        inbox = len(self._inbox)
        return BusStats(
            published=self.next_seq + inbox,
            delivered=sum(s.calls for s in subs),
            failed=sum(s.failed for s in subs),
            timed_out=sum(s.timed_out for s in subs),
            skipped=sum(s.skipped for s in subs),
            queued=inbox + self.undispatched + sum(s.queued for s in subs),
            abandoned=abandoned,
            subscriptions=subs,
        )

    # --- idle, and what is left ---------------------------------------------------

    def is_idle(self, lanes: Iterable[Subscription] | None = None) -> bool:
        """Whether every accepted event has been handled (of lanes, ``lanes`` only)."""
        if self._inbox or self.dispatching:
            return False
        if lanes is None:
            return all(not lane.queued for lane in self._registry.lanes.values())
        running = self._registry.lanes
        return all(not lane.queued for sub in lanes if (lane := running.get(sub)) is not None)

    def maybe_idle(self) -> None:
        """A task went to sleep: wake ``wait_idle`` if the dispatcher is done."""
        if self._idle is not None and not self._inbox and not self.dispatching:
            self._idle.set()
            self._idle = None

    async def wait_idle(self, lanes: tuple[Subscription, ...] | None = None) -> None:
        """Return once ``is_idle(lanes)`` (``lanes`` a tuple: it is read more than once)."""
        while not self.is_idle(lanes):
            if self._idle is None:
                self._idle = self._inbox.new_event()
            await self._idle.wait()

    def undelivered(self) -> int:
        """Deliveries not made, wherever they wait."""
        route = self._registry.route
        count = self.undispatched + self._runner.pending
        count += sum(len(route(type(event))) for event in self._inbox)
        return count + sum(lane.queued for lane in self._registry.lanes.values())

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:

        inbox = self._inbox
        routes = self._registry.routes
        barriers = self._registry.barriers
        route = self._registry.route
        periods = self._periods
        clock = self._now
        run = self._runner.run
        inbox.new_event = event_maker()
        chained = 0
        while True:
            if not inbox:
                self.dispatching = False
                self.maybe_idle()
                await inbox.going_to_sleep().wait()
                continue
            self.dispatching = True
            batch = inbox.take()
            now = clock()
            if now >= periods.end:
                periods.roll(now)
            # A stamped copy: the event published stays as it was (publishing it twice
            # is two deliveries); a publisher may bring its own time.
            seq = self.next_seq
            batch = [replace(e, seq=n, time=e.time or now) for n, e in enumerate(batch, seq)]
            self.next_seq = seq + len(batch)
            if self._taps:
                self._run_taps(batch)
            segments: list[tuple[Route, list[Event]]] = []
            for event_type, group in groupby(batch, type):
                targets = routes.get(event_type)
                if targets is None:
                    targets = route(event_type)
                if targets:
                    events = list(group)
                    if event_type in barriers:
                        segments.extend((targets, [event]) for event in events)
                    else:
                        segments.append((targets, events))
                    self.undispatched += len(targets) * len(events)
            for targets, events in segments:
                for sub, lane in targets:
                    if lane is not None:
                        await lane.put(events)
                    else:
                        self.undispatched -= len(events)
                        pending = run(sub, events)
                        if pending is not None:
                            await pending
            if inbox:
                # More came in (handlers emit): dispatch it now, but let other tasks run
                # every few batches, so no chain of emits starves them.
                chained += 1
                if chained >= _CHAIN:
                    chained = 0
                    await anyio.lowlevel.checkpoint()
            else:
                chained = 0

    def _run_taps(self, batch: list[Event]) -> None:
        """Show ``batch`` to each tap; one that raises is logged and removed."""
        for tap in tuple(self._taps):
            try:
                tap(batch)
            except BaseException as exc:
                if isinstance(exc, FATAL):
                    self._end_run(exc)
                    continue
                _log.error("event tap failed and was removed", tap=repr(tap), error=describe(exc))
                if tap in self._taps:
                    self._taps.remove(tap)
