"""The dispatcher: one task that takes the inbox as a batch and delivers it.

It stamps sequence numbers and the time, shows the batch to the taps, and
hands it to each handler in turn (*handler-major*): handler A gets every
event of the batch, then handler B. Both ordering guarantees hold (each
handler sees publish order; for one event, handlers run by ``order`` then
registration), and the per-event work is the handler call itself. Inline
handlers run here, through the dispatcher's ``Runner``; lane handlers get
the batch put into their lane.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from itertools import groupby
from operator import attrgetter

import anyio
import anyio.lowlevel
from msgspec.structs import force_setattr

from ._bus_results import BusStats, is_fresh, refusal
from ._events import Event
from ._faults import FATAL
from ._lanes import MAX_BATCH, Lane
from ._logging import get_logger
from ._periods import Periods
from ._registry import Registry, Route
from ._runners import Runner
from ._subscription import Subscription
from ._text import describe

__all__ = ["Dispatcher", "Inbox"]

_log = get_logger("eventbus")

_seq_of = attrgetter("seq")


class Inbox(deque[Event]):
    """Events accepted and not yet taken by the dispatcher.

    A deque itself, so that publishing stays one ``append`` and one flag
    read: a publisher that finds ``sleeping`` set calls ``wake_up()``.
    Publishers that wait for room wait in ``room()``.
    """

    __slots__ = ("_room", "_wake", "sleeping")

    def __init__(self) -> None:
        super().__init__()
        self.sleeping = False
        self._wake = anyio.Event()
        self._room: anyio.Event | None = None

    def put(self, event: Event) -> None:
        """Accept ``event`` (what ``EventBus.publish`` does inline, for speed)."""
        self.append(event)
        if self.sleeping:
            self.wake_up()

    def put_many(self, events: list[Event], start: int, room: int) -> int:
        """Accept up to ``room`` of ``events`` from ``start`` on; how many were.

        Each must be an event not published yet, checked in one pass from C;
        the first that is not is refused as ``publish`` refuses it, after the
        ones before it are accepted.
        """
        chunk = events[start : start + room]
        try:
            fresh = max(map(_seq_of, chunk), default=-1) < 0
        except Exception:  # no event (no ``seq``), or a ``seq`` that is no number
            fresh = False
        if not fresh:
            bad = next(i for i, event in enumerate(chunk) if not is_fresh(event))
            self.extend(chunk[:bad])
            self.wake_up()
            raise refusal(chunk[bad], started=True)
        self.extend(chunk)
        if self.sleeping:
            self.wake_up()
        return len(chunk)

    def wake_up(self) -> None:
        """Events came in while the dispatcher sleeps."""
        self.sleeping = False
        self._wake.set()

    def going_to_sleep(self) -> anyio.Event:
        """The dispatcher is about to wait for events: what wakes it (a plain call,
        not a coroutine, to keep a frame off every wake-up)."""
        self.sleeping = True
        self._wake = wake = anyio.Event()
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
    """Delivers what is published, in order, and knows what is still on the way.

    ``seq`` is the next sequence number; ``in_hand`` counts the deliveries of
    the batch being dispatched not yet handed to a runner or a lane.
    """

    __slots__ = (
        "_fail",
        "_idle",
        "_inbox",
        "_now",
        "_periods",
        "_registry",
        "_runner",
        "_taps",
        "dispatching",
        "in_hand",
        "seq",
    )

    def __init__(
        self,
        inbox: Inbox,
        registry: Registry,
        periods: Periods,
        runner: Runner,
        now: Callable[[], float],
        *,
        fail: Callable[[BaseException], None],
    ) -> None:
        self._inbox = inbox
        self._registry = registry
        self._periods = periods
        self._runner = runner
        self._now = now
        self._fail = fail
        self._taps: list[Callable[[list[Event]], None]] = []
        self._idle: anyio.Event | None = None
        self.dispatching = False
        self.in_hand = 0
        self.seq = 0

    def handed(self, count: int) -> None:
        """A lane took ``count`` deliveries off the dispatcher's hands."""
        self.in_hand -= count

    def new_lane(self, sub: Subscription, runner: Runner, capacity: int) -> Lane:
        """A lane for ``sub`` that this dispatcher feeds, running its batches in ``runner``."""
        return Lane(
            sub,
            runner,
            capacity,
            handed=self.handed,
            idle=self.maybe_idle,
            ended=self._registry.lane_ended,
        )

    def add_tap(self, tap: Callable[[list[Event]], None]) -> Callable[[], None]:
        self._taps.append(tap)
        return lambda: self._taps.remove(tap) if tap in self._taps else None

    def stats(self, *, abandoned: int) -> BusStats:
        """The bus's counters (``EventBus.stats``): what was published, delivered, ..."""
        subs = tuple(s.stats() for s in self._registry.subs)
        inbox = len(self._inbox)
        return BusStats(
            published=self.seq + inbox,
            delivered=sum(s.calls for s in subs),
            failed=sum(s.failed for s in subs),
            timed_out=sum(s.timed_out for s in subs),
            skipped=sum(s.skipped for s in subs),
            queued=inbox + self.in_hand + sum(s.queued for s in subs),
            abandoned=abandoned,
            subscriptions=subs,
        )

    # --- idle, and what is left ---------------------------------------------------

    def is_idle(self) -> bool:
        if self._inbox or self.dispatching:
            return False
        return all(not lane.queued for lane in self._registry.lanes.values())

    def maybe_idle(self) -> None:
        """A task went to sleep: wake ``wait_idle`` if everything is done."""
        if self._idle is not None and self.is_idle():
            self._idle.set()
            self._idle = None

    async def wait_idle(self) -> None:
        while not self.is_idle():
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()

    def undelivered(self) -> int:
        """Deliveries not made: in the inbox, in the batch being dispatched, queued in
        lanes, and left in a runner's batch when it was stopped."""
        route = self._registry.route
        count = self.in_hand + self._runner.pending
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
            # Stamped in place: publishing hands the event over (see ``EventBus``);
            # a stamped copy per event would cost about a third of a K=1 delivery.
            start = seq = self.seq
            for event in batch:
                if event.seq >= 0:  # handed over twice before this: see ``_once``
                    break
                force_setattr(event, "seq", seq)
                if not event.time:  # a publisher (a replay) may bring its own time
                    force_setattr(event, "time", now)
                seq += 1
            if seq - start != len(batch):
                batch, seq = _once(batch, seq - start, seq, now)
            self.seq = seq
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
                    self.in_hand += len(targets) * len(events)
            for targets, events in segments:
                for sub, lane in targets:
                    if lane is not None:
                        await lane.put(events)
                    else:
                        self.in_hand -= len(events)
                        await run(sub, events)
            if inbox:
                # More came in while this batch was handled (handlers emit): let the
                # other tasks run before the next batch, so that no chain of events
                # can starve them.
                await anyio.lowlevel.checkpoint()

    def _run_taps(self, batch: list[Event]) -> None:
        for tap in tuple(self._taps):
            try:
                tap(batch)
            except BaseException as exc:
                if isinstance(exc, FATAL):
                    self._fail(exc)
                    continue
                _log.error("event tap failed and was removed", tap=repr(tap), error=describe(exc))
                if tap in self._taps:
                    self._taps.remove(tap)


def _once(batch: list[Event], stamped: int, seq: int, now: float) -> tuple[list[Event], int]:
    """The batch with each event once: the same object was handed over twice before
    it was dispatched (``publish`` refuses it only once it is). The first ``stamped``
    events are stamped already; returns the batch and the next sequence number."""
    kept = batch[:stamped]
    for event in batch[stamped:]:
        if event.seq >= 0:
            _log.error(
                "the same event was published twice; it is delivered once",
                event_type=type(event).__name__,
                event_seq=event.seq,
            )
            continue
        force_setattr(event, "seq", seq)
        if not event.time:
            force_setattr(event, "time", now)
        seq += 1
        kept.append(event)
    return kept, seq
