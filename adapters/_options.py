"""An adapter's options: the bus's, plus how its thread takes the trainer's events."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from eventbus import BusOptions
from eventbus._options import BusKeywords, WaitSeconds
from handlers._options import EndSeconds

__all__ = ["AdapterKeywords", "AdapterOptions", "Backend", "BusRuns", "PollSeconds"]

Backend = Literal["asyncio", "trio"]

BusRuns = Literal["auto", "in_hooks", "in_thread"]
#: How often the bus looks for handed-off events: 0.1 ms to an hour.
PollSeconds = Annotated[float, Meta(ge=1e-4, le=3600.0, description="number of seconds")]


class AdapterOptions(BusOptions, frozen=True, kw_only=True):
    """How an adapter's bus runs beside a trainer (the keywords of ``EventBusCallback``).

    Attributes:
        drain_timeout: how long the run's end waits for what was handed off, seconds.
        handoff_timeout: how long a hook waits for room in a full hand-off before the
            event is dropped, and the longest a hook's step of the bus runs, seconds.
        poll_interval: how often the bus takes what the trainer handed off, seconds:
            the longest an event waits.
        backend: anyio's backend for the bus.
        bus_runs: ``"in_hooks"`` (stepped in the trainer's thread: no second thread to
            take the GIL; asyncio only), ``"in_thread"`` (a daemon thread the trainer
            never waits for), or ``"auto"``: in the hooks for Hugging Face on asyncio
            with no loop running in the trainer's thread, else in a thread.
    """

    drain_timeout: EndSeconds = 10.0
    handoff_timeout: WaitSeconds = 5.0
    poll_interval: PollSeconds = 0.1
    backend: Backend = "asyncio"
    bus_runs: BusRuns = "auto"


class AdapterKeywords(BusKeywords, total=False):
    """``AdapterOptions`` as keyword arguments."""

    handoff_timeout: float
    poll_interval: float
    backend: Backend
    bus_runs: BusRuns
