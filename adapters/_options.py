"""An adapter's options: the bus's, plus how its thread takes the trainer's events."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from eventbus import BusOptions
from eventbus.options import BusKeywords, WaitSeconds
from handlers.options import EndSeconds

__all__ = ["AdapterKeywords", "AdapterOptions", "Backend", "PollSeconds"]

Backend = Literal["asyncio", "trio"]
#: How often the bus thread looks for handed-off events: 0.1 ms to an hour.
PollSeconds = Annotated[float, Meta(ge=1e-4, le=3600.0, description="number of seconds")]


class AdapterOptions(BusOptions, frozen=True, kw_only=True):
    """How an adapter's bus runs beside a trainer, checked when built (the keywords of
    ``EventBusCallback`` build one).

    Attributes:
        drain_timeout: how long the run's end waits for what was handed off to be
            handled, seconds (at least 0.1 s, as a run's).
        handoff_timeout: how long a trainer's hook waits for room in a full
            hand-off before the event is dropped (and counted), seconds.
        poll_interval: how often the bus's thread takes what the trainer handed
            off, seconds: the longest an event waits, and the most often the
            bus's thread interrupts the trainer.
        backend: anyio's backend for the bus's thread.
    """

    drain_timeout: EndSeconds = 10.0
    handoff_timeout: WaitSeconds = 5.0
    poll_interval: PollSeconds = 0.005
    backend: Backend = "asyncio"


class AdapterKeywords(BusKeywords, total=False):
    """``AdapterOptions`` as keyword arguments."""

    handoff_timeout: float
    poll_interval: float
    backend: Backend
