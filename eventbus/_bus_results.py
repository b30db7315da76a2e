"""What the bus answers with: its counters, its close report, and its refusals."""

from __future__ import annotations

import anyio
import msgspec

from ._events import Event
from ._subscription import SubscriptionStats

__all__ = ["BusClosed", "BusFull", "BusStats", "CloseReport", "refusal"]


class BusClosed(RuntimeError):
    """The bus is closed (or not started): it accepts no more events."""


class BusFull(anyio.WouldBlock):
    """``publish_nowait`` found the inbox full; nothing was dropped."""


class BusStats(msgspec.Struct, frozen=True, kw_only=True):
    """The bus's counters since it started (``EventBus.stats()``), and each subscription's."""

    published: int
    delivered: int
    failed: int
    timed_out: int
    skipped: int
    queued: int
    abandoned: int
    subscriptions: tuple[SubscriptionStats, ...]


class CloseReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``aclose`` did: ``abandoned`` deliveries were never made."""

    drained: bool
    abandoned: int
    published: int
    delivered: int


def refusal(thing: object, *, started: bool) -> Exception:
    """Why the bus does not take ``thing``: it is no event, or the bus is not open."""
    if not isinstance(thing, Event):
        return TypeError(f"only Event instances can be published, got {thing!r}")
    if started:
        return BusClosed("the bus is closed")
    return BusClosed("the bus is not running: use `async with EventBus() as bus`")
