"""eventbus: the runtime that carries a training run's events to its callbacks.

What it is: the event vocabulary of a training run (what workers report,
what the bus says about its handlers, what the gathering derives for
callbacks; ``eventbus.events``), an ordered bus with deadlines, budgets per
health-check period and bounded buffers (``EventBus``), clocks, the event log
(``eventbus.log``), the callback-state store (``eventbus.state``) and test
helpers (``eventbus.testing``). What it is not: it does not gather ranks into
rounds or call training callbacks (``handlers`` does, on top of it), and it
knows no training framework (``adapters`` does).
"""

from importlib.metadata import PackageNotFoundError, version

from ._bus import BusClosed, BusFull, BusStats, CloseReport, EventBus
from ._clock import Clock, FastForwardClock, MonotonicClock, VirtualClock
from ._eventfilter import EventFilter
from ._events import (
    BudgetReport,
    CheckpointMismatch,
    CheckpointSaved,
    Event,
    HandlerFailed,
    HandlerStateChanged,
    HandlerTimedOut,
    HandlerUsage,
    HealthCheckTick,
    Report,
    ReportRejected,
    RunFinished,
    RunStarted,
    StateRestored,
    StateSnapshotted,
    WorkerFailure,
    WorkerGroupRestarted,
)
from ._logging import configure_logging, get_logger
from ._stages import Stage
from ._subscription import (
    DeliveryMode,
    ErrorPolicy,
    OverBudgetPolicy,
    Subscription,
    SubscriptionStats,
)
from ._text import describe as describe_exception
from .options import BusOptions
from .state._model import Stateful, StatefulCallback

try:
    __version__ = version("train-eventbus")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0"

__all__ = [
    "BudgetReport",
    "BusClosed",
    "BusFull",
    "BusOptions",
    "BusStats",
    "CheckpointMismatch",
    "CheckpointSaved",
    "Clock",
    "CloseReport",
    "DeliveryMode",
    "ErrorPolicy",
    "Event",
    "EventBus",
    "EventFilter",
    "FastForwardClock",
    "HandlerFailed",
    "HandlerStateChanged",
    "HandlerTimedOut",
    "HandlerUsage",
    "HealthCheckTick",
    "MonotonicClock",
    "OverBudgetPolicy",
    "Report",
    "ReportRejected",
    "RunFinished",
    "RunStarted",
    "Stage",
    "StateRestored",
    "StateSnapshotted",
    "Stateful",
    "StatefulCallback",
    "Subscription",
    "SubscriptionStats",
    "VirtualClock",
    "WorkerFailure",
    "WorkerGroupRestarted",
    "__version__",
    "configure_logging",
    "describe_exception",
    "get_logger",
]
