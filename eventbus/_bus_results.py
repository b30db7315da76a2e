"""What the bus answers with: its counters, its close report, and its refusals."""

from __future__ import annotations

import anyio
import msgspec

from ._subscription import SubscriptionStats

__all__ = ["BusClosed", "BusFull", "BusStats", "CloseReport", "is_fresh", "refusal"]


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


def is_fresh(event: object) -> bool:
    """An event not published yet (``EventBus.publish`` checks the same, written out)."""
    seq = getattr(event, "seq", None)
    return isinstance(seq, int) and seq < 0


def refusal(event: object, *, started: bool) -> Exception:
    """Why the bus does not take ``event``: it is no event, it was published already,
    or the bus is not open."""
    seq = getattr(event, "seq", None)
    if not isinstance(seq, int):
        return TypeError(f"only Event instances can be published, got {event!r}")
    if seq >= 0:
        return ValueError(f"{type(event).__name__} seq={seq} was already published")
    if started:
        return BusClosed("the bus is closed")
    return BusClosed("the bus is not running: use `async with EventBus() as bus`")
