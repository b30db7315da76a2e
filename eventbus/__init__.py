"""eventbus: the runtime that carries a training run's events to its callbacks.

What it is: the event vocabulary of a training run (what workers report,
what the bus says about its handlers, what the gathering derives for
callbacks), an ordered bus with deadlines, budgets per
health-check period and bounded buffers (``EventBus``), clocks, the event log
(``eventbus.log``), the callback-state store (``eventbus.state``) and test
helpers (``eventbus.testing``). What it is not: it does not gather ranks into
rounds or call training callbacks (``handlers`` does, on top of it), and it
knows no training framework (``adapters`` does).
"""

from importlib.metadata import PackageNotFoundError, version

from ._bus import BusClosed, BusFull, EventBus
from ._clock import VirtualClock
from ._eventfilter import EventFilter
from ._events import (
    AfterRun,
    BeforeRun,
    BudgetReport,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    EventPlaceholder,
    FailuresGathered,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HealthCheckTick,
    RankRecovered,
    RankStalled,
    Report,
    ReportRejected,
    RoundGathered,
    RunFinished,
    RunResult,
    RunResumed,
    RunStarted,
    RunStatus,
    StateRestored,
    StateSnapshotted,
    TrainRunContext,
    WorkerFailure,
    WorkerGroupRestarted,
)
from ._logging import configure_logging
from ._observers import HandlerCall
from ._options import BusOptions
from .state._model import StatefulCallback

try:
    __version__ = version("train-eventbus")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
    "AfterRun",
    "BeforeRun",
    "BudgetReport",
    "BusClosed",
    "BusFull",
    "BusOptions",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Event",
    "EventBus",
    "EventFilter",
    "EventPlaceholder",
    "FailuresGathered",
    "HandlerCall",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HealthCheckTick",
    "RankRecovered",
    "RankStalled",
    "Report",
    "ReportRejected",
    "RoundGathered",
    "RunFinished",
    "RunResult",
    "RunResumed",
    "RunStarted",
    "RunStatus",
    "StateRestored",
    "StateSnapshotted",
    "StatefulCallback",
    "TrainRunContext",
    "VirtualClock",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "__version__",
    "configure_logging",
]
