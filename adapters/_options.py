"""An adapter's options: the bus's, plus how its thread takes the trainer's events."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from eventbus import BusOptions
from eventbus._options import BusKeywords, WaitSeconds
from handlers._options import EndSeconds

__all__ = ["AdapterKeywords", "AdapterOptions", "Backend", "BusRuns", "PollSeconds"]

Backend = Literal["asyncio", "trio"]
#: Where an adapter's bus runs: ``"in_hooks"``, stepped in the trainer's thread at its
#: hooks; ``"in_thread"``, in a thread of its own; ``"auto"``, the adapter's choice.
BusRuns = Literal["auto", "in_hooks", "in_thread"]
#: How often the bus looks for handed-off events: 0.1 ms to an hour.
PollSeconds = Annotated[float, Meta(ge=1e-4, le=3600.0, description="number of seconds")]


class AdapterOptions(BusOptions, frozen=True, kw_only=True):
    """How an adapter's bus runs beside a trainer, checked when built (the keywords of
    ``EventBusCallback`` build one).

    Attributes:
        drain_timeout: how long the run's end waits for what was handed off to be
            handled, seconds (at least 0.1 s, as a run's).
        handoff_timeout: how long a trainer's hook waits for room in a full
            hand-off before the event is dropped (and counted), and the longest
            a hook's step of a bus stepped in the hooks runs, seconds.
        poll_interval: how often the bus takes what the trainer handed off,
            seconds: the longest an event waits (between the trainer's hooks,
            for a bus stepped in them), and the most often the bus interrupts
            the trainer.
        backend: anyio's backend for the bus.
        bus_runs: where the bus runs. ``"in_hooks"``: in the trainer's own
            thread, a step of its loop in the trainer's hooks (no second thread
            to take the GIL from the trainer; callbacks run as the framework's
            own do; asyncio only). ``"in_thread"``: in a daemon thread of its
            own, which the trainer never waits for. ``"auto"`` (the default):
            in the hooks for the Hugging Face adapter on asyncio with no event
            loop running in the trainer's thread (a notebook's), else in a thread.
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
